//! Redis Sentinel and the failover guard, against real processes (a primary, two replicas and
//! three sentinels; see `support/sentinel.rs`):
//!
//! - a Sentinel client follows a failover, after a SIGKILL of the primary and after a demotion
//!   of a live primary (`SENTINEL FAILOVER`), without being rebuilt: its first request after
//!   the failover succeeds and lands on the new primary; a primary demoted behind the
//!   sentinels' back answers `READONLY`, and the client drops the connection and checks the
//!   role of the next one;
//! - the failover guard (`Config::replicas`): the primary is SIGKILLed right after a grant
//!   whose replication was cut, in a loop. Without the guard the promoted replica hands the
//!   lock out a second time while the first holder still holds it (the test detects this, so
//!   it can fail); with the guard no such grant is handed out, and grants that replicas did
//!   acknowledge survive the failover;
//! - the guard on a single primary with replicas: grants need the replicas, and renewals that
//!   no replica acknowledges do not count, so the lease is reported lost; a grant whose `WAIT`
//!   waits for frozen replicas holds up none of the client's other requests (it runs on a
//!   connection of its own);
//! - a request with `wait` left rides out a failover (SIGKILLed primary) without an error: its
//!   tries are retried (`Config::retry`) until the sentinels name the new primary;
//! - wake-ups on release follow a failover: a waiter whose backoff is a minute is still woken
//!   at once by a release on the new primary;
//! - a failover is told as an INFO event (target `distlock`) naming the old and new primary;
//! - configuration errors: an unknown master name, `replicas(0, …)`, a guard timeout not below
//!   the response timeout.
//!
//! Failovers take a few seconds, so the loops are short; each iteration has a deployment of
//! its own.

use std::time::{Duration, Instant};

use crate::support;
use crate::support::sentinel::SentinelSetup;
use crate::support::{info_field, query_port, wait_until, RedisServer, Role};
use distlock::{BackendErrorKind, Client, Config, LockError, LockGuard};

/// How long a failover may take, SIGKILL to a new primary with its replicas in sync.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

fn sentinel_config(setup: &SentinelSetup) -> Config {
    Config::sentinel(setup.sentinel_urls(), setup.master_name())
        .expect("valid urls")
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
}

/// Whether the lock `name` (default prefix) exists on the server on `port`.
fn has_lock(port: u16, name: &str) -> bool {
    let exists: i64 = query_port(
        port,
        redis::cmd("EXISTS").arg(format!("distlock:{{{name}}}")),
    )
    .expect("EXISTS");
    exists == 1
}

/// Takes and releases `name` once; the error of a failed try is returned.
async fn lock_once(client: &Client, name: &str) -> Result<(), LockError> {
    let guard = client
        .lock(name)
        .wait(Duration::from_millis(500))
        .acquire()
        .await?;
    assert!(guard.release().await?, "the grant of `{name}` was ours");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_client_follows_a_failover_after_the_primary_is_killed() {
    let captured = support::capture::install();
    let mut setup = SentinelSetup::start("killed");
    let client = Client::new(sentinel_config(&setup)).expect("client");
    for round in 0..3 {
        lock_once(&client, &format!("before-{round}"))
            .await
            .expect("the primary is up");
    }
    let old_port = setup.kill_primary();
    let new_port = setup.wait_for_failover(old_port);
    // No request went out during the failover: the client's connection to the killed
    // primary is broken, and the first request after the failover must still succeed (it is
    // sent again on a new connection, which asks the sentinels anew).
    let guard = client
        .lock("after")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("the first request after the failover reaches the new primary");
    assert!(
        has_lock(new_port, "after"),
        "the grant is on the new primary"
    );
    assert!(guard.release().await.expect("release"));
    assert!(!has_lock(new_port, "after"));
    for round in 0..3 {
        lock_once(&client, &format!("after-{round}"))
            .await
            .expect("the new primary serves locks");
    }
    // The operator is told, once, under the target `distlock`.
    let told: Vec<_> = captured
        .records()
        .into_iter()
        .filter(|record| record.name.contains("Sentinel failover"))
        .filter(|record| {
            record
                .field("to")
                .is_some_and(|to| to.ends_with(&format!(":{new_port}")))
        })
        .collect();
    assert_eq!(told.len(), 1, "{told:#?}");
    assert_eq!(told[0].target, "distlock");
    assert_eq!(told[0].level, tracing::Level::INFO);
    assert!(
        told[0]
            .field("from")
            .is_some_and(|from| from.ends_with(&format!(":{old_port}"))),
        "{told:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_client_follows_a_demoted_primary_with_errors_only_during_the_failover() {
    let setup = SentinelSetup::start("demoted");
    let client = Client::new(sentinel_config(&setup)).expect("client");
    lock_once(&client, "before")
        .await
        .expect("the primary is up");
    let old_port = setup.current_primary_port();
    let sentinel = setup.sentinels()[0].port();
    let _: String = query_port(
        sentinel,
        redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(setup.master_name()),
    )
    .expect("SENTINEL FAILOVER");
    // Keep taking locks while the failover runs: errors are allowed until the sentinels
    // name the new primary and it says it is one (the old one, still running, turns into a
    // replica).
    let started = Instant::now();
    let mut errors = Vec::new();
    let mut tries = 0;
    while settled_primary(&setup, old_port).is_none() {
        assert!(
            started.elapsed() < FAILOVER_TIMEOUT,
            "the failover did not happen"
        );
        tries += 1;
        if let Err(err) = lock_once(&client, &format!("during-{tries}")).await {
            errors.push(err.to_string());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let new_port = setup.wait_for_failover(old_port);
    assert_eq!(
        setup.server(old_port).role(),
        Some(Role::Replica {
            primary_port: new_port
        }),
        "the old primary runs on as a replica"
    );
    for err in &errors {
        assert!(
            !err.contains("invalid distlock configuration"),
            "only the failover may cause errors: {err}"
        );
    }
    let guard = client
        .lock("after")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("the new primary serves locks");
    assert!(
        has_lock(new_port, "after"),
        "the grant is on the new primary"
    );
    assert!(guard.release().await.expect("release"));
    eprintln!(
        "demotion: {} errors during the failover ({tries} tries): {errors:?}",
        errors.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_wait_left_rides_out_a_failover_without_an_error() {
    let mut setup = SentinelSetup::start("rides-out");
    let client = Client::new(
        sentinel_config(&setup)
            .connect_timeout(Duration::from_millis(500))
            .retry(12, Duration::from_millis(200)),
    )
    .expect("client");
    lock_once(&client, "before")
        .await
        .expect("the primary is up");
    let old_port = setup.kill_primary();
    let guard = client
        .lock("during")
        .wait(FAILOVER_TIMEOUT)
        .acquire()
        .await
        .expect("the request's tries are retried until the new primary serves them");
    setup.wait_for_failover(old_port);
    // Not asserted: that the new primary still has the grant. Under load a failover attempt
    // can time out and be retried with the other replica, which never had it — the hazard the
    // failover guard is for (`with_the_failover_guard_no_lock_is_granted_twice_…`).
    guard
        .release()
        .await
        .expect("the release reaches the new primary");
}

/// Hands `name` from `holder` to a waiter of `waiter` (whose backoff is a minute), once the
/// waiter listens for the release on one of `ports`, and says whether the release woke it
/// (within a few seconds; its backoff would take far longer).
async fn handed_over_by_a_wake_up(holder: &Client, waiter: &Client, name: &str, ports: &[u16]) {
    let held = holder
        .lock(name)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the holder takes it");
    let waiting = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.to_owned());
        async move {
            waiter
                .lock(&name)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
        }
    });
    let channel = format!("distlock:{{{name}}}:released");
    let ports = ports.to_vec();
    support::wait_until_async("the waiter to listen", FAILOVER_TIMEOUT, || {
        let mut listeners = 0;
        for &port in &ports {
            if let Ok((_, n)) =
                query_port::<(String, u64)>(port, redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel))
            {
                listeners += n;
            }
        }
        (listeners > 0)
            .then_some(())
            .ok_or_else(|| "nobody subscribed yet".to_owned())
    })
    .await;
    assert!(
        held.release().await.expect("release"),
        "it was the holder's"
    );
    let granted = tokio::time::timeout(Duration::from_secs(8), waiting)
        .await
        .unwrap_or_else(|_| panic!("the release of `{name}` did not wake the waiter"))
        .expect("task")
        .expect("granted");
    granted.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_a_release_still_wakes_the_waiters() {
    let setup = SentinelSetup::start("wakeups");
    let holder = Client::new(sentinel_config(&setup)).expect("client");
    let waiter = Client::new(
        sentinel_config(&setup).backoff(Duration::from_secs(60), Duration::from_secs(60)),
    )
    .expect("client");
    let ports = setup.server_ports();
    handed_over_by_a_wake_up(&holder, &waiter, "before", &ports).await;

    let old_port = setup.current_primary_port();
    let _: String = query_port(
        setup.sentinels()[0].port(),
        redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(setup.master_name()),
    )
    .expect("SENTINEL FAILOVER");
    setup.wait_for_failover(old_port);
    // Both clients find the new primary with their next requests.
    handed_over_by_a_wake_up(&holder, &waiter, "after", &ports).await;
}

/// Sentinel closes a demoted primary's client connections (`CLIENT KILL TYPE normal` with its
/// `REPLICAOF`), so a `READONLY` reply is seen when a primary is demoted some other way (an
/// operator's `REPLICAOF`, say) while the sentinels still name it: the connection is dropped,
/// the request retried on a new one, whose role check refuses the replica; once the server is
/// a primary again, the next request works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readonly_reply_drops_the_connection_and_the_role_is_checked_again() {
    let setup = SentinelSetup::start("readonly");
    let client = Client::new(sentinel_config(&setup)).expect("client");
    lock_once(&client, "before")
        .await
        .expect("the primary is up");
    let primary = setup.current_primary_port();
    // Demote it for a moment, to a primary nobody runs: it stays a read-only replica.
    let nowhere = support::free_port().to_string();
    let _: String = query_port(
        primary,
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg(&nowhere),
    )
    .expect("REPLICAOF");
    let err = client
        .lock("demoted")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect_err("a replica takes no locks");
    let _: String = query_port(primary, redis::cmd("REPLICAOF").arg("NO").arg("ONE"))
        .expect("REPLICAOF NO ONE");
    let message = err.to_string();
    assert!(
        message.contains("reports the role `slave`") && message.contains("not the primary"),
        "the retry's role check refuses the replica: {message}"
    );
    assert!(!has_lock(primary, "demoted"));
    let guard = client
        .lock("promoted")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("a primary again");
    assert!(has_lock(primary, "promoted"));
    assert!(guard.release().await.expect("release"));
}

/// The new primary once every sentinel names it and it says it is a primary.
fn settled_primary(setup: &SentinelSetup, old_port: u16) -> Option<u16> {
    let port = setup.current_primary_port();
    (port != old_port && support::role_of(port) == Some(Role::Primary)).then_some(port)
}

/// Cuts replication from the current primary: freezes both replicas (so they cannot
/// reconnect) and has the primary close their links. Writes from now on reach no replica.
fn cut_replication(setup: &SentinelSetup, primary: u16) -> Vec<u16> {
    let replicas: Vec<u16> = setup
        .server_ports()
        .into_iter()
        .filter(|&port| port != primary && setup.server(port).is_running())
        .collect();
    for &port in &replicas {
        setup.server(port).signal("STOP");
    }
    let _: i64 = query_port(
        primary,
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"),
    )
    .expect("CLIENT KILL TYPE replica");
    wait_until("the primary to have no replicas", FAILOVER_TIMEOUT, || {
        let info: String = query_port(primary, redis::cmd("INFO").arg("replication"))?;
        match info_field(&info, "connected_slaves") {
            Some("0") => Ok(()),
            other => Err(format!("connected_slaves: {other:?}")),
        }
    });
    replicas
}

/// What one run of the failover loop saw.
#[derive(Debug, Default)]
struct Outcome {
    iterations: usize,
    /// A second client was granted a lock the first client still held.
    double_grants: usize,
    /// Grants taken while replication was cut.
    unreplicated_grants: usize,
    /// Grants taken with the replicas up, all still held after the failover.
    replicated_grants: usize,
}

/// The failover loop: each iteration takes a lock with the replicas up (`held-N`), then cuts
/// replication and asks for a second lock (`cut-N`), SIGKILLs the primary at once, lets the
/// sentinels promote a replica, and has a second client ask for both locks. A grant to the
/// second client of a lock the first still holds is a double grant.
async fn failover_loop(name: &str, guard: bool, iterations: usize) -> Outcome {
    let mut outcome = Outcome::default();
    for iteration in 0..iterations {
        // A fresh deployment each time: the sentinels would not fail the same master over
        // again within twice their failover timeout, and a second failover soon after the
        // first sometimes left one sentinel naming the old primary for good.
        let mut setup = SentinelSetup::start(&format!("{name}-{iteration}"));
        let mut config = sentinel_config(&setup);
        if guard {
            config = config.replicas(1, Duration::from_millis(500));
        }
        let first = Client::new(config.clone()).expect("client");
        outcome.iterations += 1;
        let primary = setup.current_primary_port();
        // Long leases: no renewal falls inside an iteration, so the first client goes on
        // believing it holds what it was granted.
        let held = first
            .lock(format!("held-{iteration}"))
            .lease(Duration::from_secs(60))
            .wait(Duration::from_secs(2))
            .acquire()
            .await
            .expect("a grant with the replicas up");
        let frozen = cut_replication(&setup, primary);
        let cut: Option<LockGuard> = match first
            .lock(format!("cut-{iteration}"))
            .lease(Duration::from_secs(60))
            .wait(Duration::from_millis(250))
            .acquire()
            .await
        {
            Ok(granted) => Some(granted),
            Err(LockError::Timeout { .. }) if guard => None,
            // On a loaded machine the `WAIT` and the give-back of the unacknowledged grant
            // may not fit in what is left of the wait: the try is cut off unanswered, which
            // grants nothing (the acquire loop gives the key back in the background).
            Err(LockError::Backend(err)) if guard && err.kind() == BackendErrorKind::Timeout => {
                None
            }
            Err(err) => panic!("iteration {iteration}: unexpected error {err}"),
        };
        let old_port = setup.kill_primary();
        for &port in &frozen {
            setup.server(port).signal("CONT");
        }
        let new_port = setup.wait_for_failover(old_port);
        if cut.is_some() {
            outcome.unreplicated_grants += 1;
            assert!(
                !has_lock(new_port, &format!("cut-{iteration}")),
                "iteration {iteration}: the promoted replica never saw the cut grant"
            );
        }

        let second = Client::new(config.clone()).expect("client");
        for (name, first_guard) in [
            (format!("held-{iteration}"), Some(&held)),
            (format!("cut-{iteration}"), cut.as_ref()),
        ] {
            match second.lock(&name).wait(Duration::ZERO).acquire().await {
                Ok(granted) => {
                    if first_guard.is_some_and(LockGuard::is_held) {
                        eprintln!(
                            "{name}: granted twice (guard {}, iteration {iteration})",
                            if guard { "on" } else { "off" }
                        );
                        outcome.double_grants += 1;
                    }
                    drop(granted);
                }
                Err(LockError::Timeout { .. }) => {}
                Err(err) => panic!("iteration {iteration}: `{name}` failed: {err}"),
            }
        }
        if held.is_held() && has_lock(new_port, &format!("held-{iteration}")) {
            outcome.replicated_grants += 1;
        }
        drop(held);
        drop(cut);
    }
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_failover_guard_no_lock_is_granted_twice_across_failovers() {
    let outcome = failover_loop("guarded", true, 3).await;
    eprintln!("guard on: {outcome:?}");
    assert_eq!(outcome.double_grants, 0, "{outcome:?}");
    assert_eq!(
        outcome.unreplicated_grants, 0,
        "no grant is handed out while no replica acknowledges: {outcome:?}"
    );
    assert_eq!(
        outcome.replicated_grants, outcome.iterations,
        "acknowledged grants survive the failover: {outcome:?}"
    );
}

/// Proves the guarded test can fail: the same loop without the guard grants locks twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_failover_guard_a_failover_can_grant_a_lock_twice() {
    let outcome = failover_loop("unguarded", false, 3).await;
    eprintln!("guard off: {outcome:?}");
    assert!(outcome.double_grants >= 1, "{outcome:?}");
}

/// A primary with two replicas in sync, without sentinels.
fn primary_with_replicas() -> (RedisServer, Vec<RedisServer>) {
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let replicas: Vec<RedisServer> = (0..2)
        .map(|_| RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]))
        .collect();
    wait_until("both replicas to be in sync", FAILOVER_TIMEOUT, || {
        for replica in &replicas {
            let info: String = query_port(replica.port(), redis::cmd("INFO").arg("replication"))?;
            if info_field(&info, "master_link_status") != Some("up") {
                return Err(format!("port {} is not in sync", replica.port()));
            }
        }
        // In sync is not yet acknowledging: a replica fresh from its first sync may not
        // answer the primary's GETACK for a while.
        let mut connection = primary.connection();
        let acknowledged: i64 = redis::pipe()
            .cmd("SET")
            .arg("sync-probe")
            .arg(1)
            .ignore()
            .cmd("WAIT")
            .arg(2)
            .arg(200)
            .query::<(i64,)>(&mut connection)
            .map_err(|err| err.to_string())?
            .0;
        if acknowledged < 2 {
            return Err(format!("{acknowledged} of 2 replicas acknowledge writes"));
        }
        Ok(())
    });
    (primary, replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_on_a_single_primary_needs_its_replicas_for_grants_and_renewals() {
    let (primary, replicas) = primary_with_replicas();
    let client = Client::new(
        Config::from_url(&primary.url())
            .expect("valid url")
            .backoff(Duration::from_millis(1), Duration::from_millis(20))
            .replicas(2, Duration::from_millis(500)),
    )
    .expect("client");
    lock_once(&client, "up")
        .await
        .expect("both replicas acknowledge");
    let renewed = client
        .lock("renewed")
        .lease(Duration::from_millis(900))
        .acquire()
        .await
        .expect("both replicas acknowledge");

    for replica in &replicas {
        replica.signal("STOP");
    }
    let wait = Duration::from_millis(400);
    let started = Instant::now();
    let err = client
        .lock("frozen")
        .wait(wait)
        .acquire()
        .await
        .expect_err("no replica acknowledges");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert!(
        started.elapsed() < wait + Duration::from_secs(2),
        "the acquire ended near its wait: {:?}",
        started.elapsed()
    );
    // Given back by the try that learnt it too few replicas had it, or, for a try the wait's
    // end cut off, in the background right after.
    wait_until(
        "unacknowledged grants to be given back",
        Duration::from_secs(5),
        || {
            if has_lock(primary.port(), "frozen") {
                Err("the lock key is still there".to_owned())
            } else {
                Ok(())
            }
        },
    );
    // The renewals of `renewed` go unacknowledged from now on, so none counts.
    tokio::time::timeout(Duration::from_secs(5), renewed.lost())
        .await
        .expect("the lease is reported lost");
    assert!(!renewed.is_held());

    for replica in &replicas {
        replica.signal("CONT");
    }
    lock_once(&client, "thawed")
        .await
        .expect("the replicas acknowledge again");
}

/// Whether a client of the server on `port` is blocked in `WAIT` now.
fn waiting_in_wait(port: u16) -> Result<(), String> {
    let clients: String = query_port(port, redis::cmd("CLIENT").arg("LIST"))?;
    if clients.lines().any(|client| client.contains(" cmd=wait ")) {
        Ok(())
    } else {
        Err("no client is in WAIT".to_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_waiting_for_lagging_replicas_holds_up_none_of_the_clients_other_requests() {
    let (primary, replicas) = primary_with_replicas();
    let guard_timeout = Duration::from_secs(4);
    let client = Client::new(
        Config::from_url(&primary.url())
            .expect("valid url")
            .response_timeout(Duration::from_secs(10))
            .replicas(2, guard_timeout),
    )
    .expect("client");
    let other = Client::new(Config::from_url(&primary.url()).expect("valid url")).expect("client");
    let held = client
        .lock("held")
        .acquire()
        .await
        .expect("replicas in sync");
    let _busy = other.lock("busy").acquire().await.expect("free");

    for replica in &replicas {
        replica.signal("STOP");
    }
    let slow = tokio::spawn({
        let client = client.clone();
        async move { client.lock("slow").wait(Duration::ZERO).acquire().await }
    });
    let port = primary.port();
    tokio::task::spawn_blocking(move || {
        wait_until(
            "the grant of `slow` to wait for its replicas",
            Duration::from_secs(3),
            || waiting_in_wait(port),
        )
    })
    .await
    .expect("watcher");

    // Each of these would wait behind the `WAIT` on a shared connection: for seconds.
    let quick = Duration::from_secs(1);
    let started = Instant::now();
    assert!(held.release().await.expect("released"), "it was ours");
    let released_in = started.elapsed();
    let started = Instant::now();
    let refused = client.lock("busy").wait(Duration::ZERO).acquire().await;
    let refused_in = started.elapsed();
    let started = Instant::now();
    client.ping().await.expect("the primary answers");
    let pinged_in = started.elapsed();
    let still_waiting = waiting_in_wait(port).is_ok();
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "{refused:?}"
    );
    assert!(
        released_in < quick && refused_in < quick && pinged_in < quick,
        "release {released_in:?}, refused try {refused_in:?}, ping {pinged_in:?}: held up by \
         another request's WAIT"
    );
    assert!(
        still_waiting,
        "the measurements ran while `slow` waited for its replicas"
    );

    let slow = slow.await.expect("task");
    assert!(matches!(slow, Err(LockError::Timeout { .. })), "{slow:?}");
    assert!(
        !has_lock(port, "slow"),
        "an unacknowledged grant is given back"
    );
    for replica in &replicas {
        replica.signal("CONT");
    }
    lock_once(&client, "thawed")
        .await
        .expect("the replicas acknowledge again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_master_name_is_an_error_that_says_so() {
    let setup = SentinelSetup::start("known");
    let client =
        Client::new(Config::sentinel(setup.sentinel_urls(), "no-such-master").expect("valid urls"))
            .expect("client");
    let err = client
        .lock("job")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect_err("no sentinel monitors that name");
    let message = err.to_string();
    assert!(
        message.contains("does not monitor a master named `no-such-master`"),
        "{message}"
    );
}

#[test]
fn a_guard_of_zero_replicas_or_a_timeout_not_below_the_response_timeout_is_refused() {
    let config = || Config::sentinel(["redis://127.0.0.1:1"], "mymaster").expect("valid url");
    let zero = Client::new(config().replicas(0, Duration::from_millis(100)))
        .expect_err("zero replicas guard nothing");
    assert!(matches!(zero, LockError::Config(_)), "{zero:?}");
    assert!(zero.to_string().contains("at least one replica"), "{zero}");
    for timeout in [Duration::from_secs(1), Duration::from_secs(5)] {
        let slow = Client::new(
            config()
                .response_timeout(Duration::from_secs(1))
                .replicas(1, timeout),
        )
        .expect_err("WAIT would outlast the response timeout");
        assert!(matches!(slow, LockError::Config(_)), "{slow:?}");
        assert!(
            slow.to_string()
                .contains("must be shorter than the response timeout"),
            "{slow}"
        );
    }
}
