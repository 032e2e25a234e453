//! A connection between a lock holder and Redis that stalls (packets stop, the socket stays
//! open) or is cut, played out with the fault-injecting proxy of `support::proxy` in front of a
//! real `redis-server`. Client A talks to Redis through the proxy; client B, when there is one,
//! talks to Redis directly and plays everybody else. The properties: A learns that it lost the
//! lease before Redis frees the key, nobody else gets the key while A might still hold it, a cut
//! gives clear errors and heals, and critical sections of different holders never overlap.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::support;
use crate::support::proxy::{Mode, Proxy};
use crate::support::RedisServer;
use distlock::{BackendErrorKind, Client, Config, FencingToken, LockError, LockGuard};
use tokio::time::{sleep, timeout, Instant};

/// Response and connect timeout of the clients: short, so a stall shows up as failed requests
/// well within the leases below.
const IO_TIMEOUT: Duration = Duration::from_millis(200);

/// Redis keeps expiry times in whole milliseconds; allow for that when comparing its expiry
/// with this process's clock.
const CLOCK_GRAIN: Duration = Duration::from_millis(2);

fn client_through(proxy: &Proxy) -> Client {
    client_for(&proxy.url())
}

fn client_direct(server: &RedisServer) -> Client {
    client_for(&server.url())
}

fn client_for(url: &str) -> Client {
    let config = Config::from_url(url)
        .expect("valid url")
        .response_timeout(IO_TIMEOUT)
        .connect_timeout(IO_TIMEOUT);
    Client::new(config).expect("valid config")
}

fn lock_key(key: &str) -> String {
    format!("distlock:{{{key}}}")
}

fn get(redis: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(redis).expect("GET")
}

fn pttl(redis: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(redis).expect("PTTL")
}

/// When the server will expire `key` (which must be live and unrenewable from now on), as an
/// interval of this process's clock: no sooner than the first, no later than the second.
fn server_expiry(redis: &mut redis::Connection, key: &str) -> (Instant, Instant) {
    let before = Instant::now();
    let remaining = pttl(redis, key);
    let after = Instant::now();
    assert!(remaining > 0, "`{key}` should be live, PTTL = {remaining}");
    let remaining = Duration::from_millis(remaining.unsigned_abs());
    (
        before + remaining - CLOCK_GRAIN,
        after + remaining + CLOCK_GRAIN,
    )
}

/// Tries `key` once (wait 0) every 50 ms until `until`, asserting that every try finds it held
/// by someone else. Returns the number of tries.
async fn assert_kept_out_until(client: &Client, key: &str, until: Instant) -> usize {
    let mut tries = 0;
    while Instant::now() < until {
        match client.lock(key).wait(Duration::ZERO).acquire().await {
            Err(LockError::Timeout { .. }) => tries += 1,
            Ok(guard) => panic!(
                "got `{key}` (token {}) {:?} before the stalled holder's lease could have expired",
                guard.fencing_token().expect("fenced"),
                until.saturating_duration_since(Instant::now())
            ),
            Err(other) => panic!("a try for `{key}` failed unexpectedly: {other}"),
        }
        sleep(Duration::from_millis(50)).await;
    }
    tries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_connection_fires_lost_before_the_server_side_key_expires() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let a = client_through(&proxy);
    let mut redis = server.connection();
    let key = lock_key("stalled");
    // Long enough that the margin the library keeps for clock drift (1% + 2 ms: 82 ms here)
    // dwarfs the delay, on a busy 2-core machine, between the deadline passing and this task
    // running to read the clock (32 ms, with a 3 s lease, was too little at times).
    let lease = Duration::from_secs(8);

    let acquired_at = Instant::now();
    let guard = a
        .lock("stalled")
        .lease(lease)
        .acquire()
        .await
        .expect("acquire through the proxy");
    assert!(
        proxy.accepted() >= 1,
        "A must reach Redis through the proxy"
    );

    // Halfway between the renewals due at lease/3 and 2·lease/3: one has got through (the
    // watchdog works through the proxy) and none is under way when the stall begins, so the
    // server's expiry and A's deadline both count from that renewal.
    sleep(lease / 2).await;
    let remaining = Duration::from_millis(pttl(&mut redis, &key).unsigned_abs());
    assert!(
        remaining > lease / 2 + Duration::from_millis(200),
        "the lease was not renewed through the proxy: PTTL {remaining:?} {:?} after acquiring",
        acquired_at.elapsed()
    );

    proxy.set_mode(Mode::Stall);
    let stalled_at = Instant::now();
    // Whatever the proxy had already forwarded has reached Redis by now; nothing more will,
    // so the key's expiry is fixed.
    sleep(Duration::from_millis(100)).await;
    let (expires_no_sooner_than, _) = server_expiry(&mut redis, &key);
    assert!(guard.is_held(), "a 100 ms stall must not cost the lease");

    timeout(lease * 2, guard.lost())
        .await
        .expect("lost() fires when renewals stop getting through");
    let lost_at = Instant::now();
    eprintln!(
        "lost() fired {:?} into the stall, {:?} before the server-side expiry",
        lost_at - stalled_at,
        expires_no_sooner_than.saturating_duration_since(lost_at)
    );

    assert!(
        lost_at < expires_no_sooner_than,
        "lost() fired {:?} after Redis could have freed the key (someone else may already hold it)",
        lost_at - expires_no_sooner_than
    );
    assert!(!guard.is_held());
    // The deadline counts from the last successful renewal, at most lease/3 before the stall:
    // a holder that gives up at the first failed renewal would not survive a short hiccup.
    assert!(
        lost_at - stalled_at >= lease / 2,
        "lost() fired only {:?} into the stall, with a {lease:?} lease renewed every {:?}",
        lost_at - stalled_at,
        lease / 3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shorter_than_the_remaining_lease_does_not_lose_the_lock() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let a = client_through(&proxy);
    let mut redis = server.connection();
    let key = lock_key("hiccup");
    let lease = Duration::from_millis(1500);

    let guard = a
        .lock("hiccup")
        .lease(lease)
        .acquire()
        .await
        .expect("acquire through the proxy");
    let owner = get(&mut redis, &key).expect("the lock key holds A's owner id");

    // A stall across the first renewal (due at lease/3), shorter than the lease.
    sleep(lease / 4).await;
    proxy.set_mode(Mode::Stall);
    sleep(lease / 3).await;
    proxy.set_mode(Mode::Pass);

    tokio::select! {
        () = guard.lost() => panic!("the lease was lost over a {:?} stall", lease / 3),
        () = sleep(lease * 2) => {}
    }
    assert!(guard.is_held());
    assert_eq!(
        get(&mut redis, &key),
        Some(owner),
        "A still owns the key on the server, renewed past its original lease"
    );
    assert!(pttl(&mut redis, &key) > 0);
    assert!(guard.release().await.expect("release after the stall"));
    assert_eq!(get(&mut redis, &key), None);
}

/// A holds `key` through the proxy, the proxy stalls, and B (direct) keeps trying: every try
/// must find the lock held until Redis expires A's key, and B must get it soon after.
async fn stalled_holder_keeps_others_out(key: &str, watchdog: bool) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let a = client_through(&proxy);
    let b = client_direct(&server);
    let mut redis = server.connection();
    let lease = Duration::from_millis(1500);

    let sent_at = Instant::now();
    let held = a
        .lock(key)
        .lease(lease)
        .watchdog(watchdog)
        .acquire()
        .await
        .expect("A acquires through the proxy");
    if watchdog {
        // Let a renewal through first, so the lease no longer counts from the acquire; stall
        // between two renewals.
        sleep(lease / 2).await;
    }
    proxy.set_mode(Mode::Stall);
    sleep(Duration::from_millis(100)).await;
    let (free_no_sooner_than, free_no_later_than) = server_expiry(&mut redis, &lock_key(key));
    if !watchdog {
        // Without renewals, the lease counts from A's acquire: a bound needing no server clock.
        assert!(free_no_sooner_than + CLOCK_GRAIN * 2 >= sent_at + lease);
    }

    let tries =
        assert_kept_out_until(&b, key, free_no_sooner_than - Duration::from_millis(150)).await;
    assert!(tries >= 5, "B tried only {tries} times while A was stalled");

    let taken = b
        .lock(key)
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .expect("B gets the lock once A's lease has expired");
    let taken_at = Instant::now();
    assert!(
        taken_at >= free_no_sooner_than,
        "B got the lock {:?} before A's key could have expired on the server",
        free_no_sooner_than - taken_at
    );
    assert!(
        taken_at <= free_no_later_than + Duration::from_secs(1),
        "B got the lock only {:?} after A's key expired",
        taken_at - free_no_later_than
    );
    assert!(taken.fencing_token().expect("fenced") > held.fencing_token().expect("fenced"));
    assert!(
        !held.is_held(),
        "A's guard still claims the lock B now holds"
    );
    timeout(Duration::from_secs(1), held.lost())
        .await
        .expect("A's guard reports the loss");
    assert!(taken.release().await.expect("B releases"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_else_gets_the_lock_before_it_expires_while_the_holder_is_stalled() {
    stalled_holder_keeps_others_out("stalled-hard-lease", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_else_gets_the_lock_before_its_last_renewal_expires_while_the_holder_is_stalled() {
    stalled_holder_keeps_others_out("stalled-renewed-lease", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_gives_clear_errors_and_recovers() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    // A cut is seen as the connection's end at once; the timeouts are far above that (not the
    // file's 200 ms), so that a loaded machine that holds up the I/O thread cannot let a
    // timeout fire before the end of the connection is read (seen once in a full run).
    let a = Client::new(
        Config::from_url(&proxy.url())
            .expect("valid url")
            .response_timeout(Duration::from_secs(1))
            .connect_timeout(Duration::from_secs(1)),
    )
    .expect("valid config");
    let mut redis = server.connection();
    let lease = Duration::from_secs(1);

    let held = a
        .lock("cut")
        .lease(lease)
        .acquire()
        .await
        .expect("acquire through the proxy");
    let held_token = held.fencing_token().expect("fenced");

    proxy.set_mode(Mode::Drop);
    let started = Instant::now();
    match held.release().await {
        Err(LockError::Backend(err)) => assert_eq!(err.kind(), BackendErrorKind::Connection),
        other => panic!("release over a cut connection should fail cleanly, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));

    for _ in 0..5 {
        let started = Instant::now();
        match a
            .lock("cut")
            .lease(lease)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
        {
            Err(LockError::Backend(err)) => {
                assert_eq!(err.kind(), BackendErrorKind::Connection, "{err}");
                let message = err.to_string();
                assert!(
                    message.contains("check that Redis is running"),
                    "the message should say what to do: {message}"
                );
            }
            Ok(guard) => panic!(
                "acquired `cut` (token {}) with the connection cut",
                guard.fencing_token().expect("fenced")
            ),
            Err(other) => panic!("expected a backend error, got {other}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "a cut connection should fail fast, not wait out the 5 s wait: {:?}",
            started.elapsed()
        );
    }

    proxy.set_mode(Mode::Pass);
    let healed_at = Instant::now();
    let guard = loop {
        match a
            .lock("cut")
            .lease(lease)
            .wait(Duration::from_secs(3))
            .acquire()
            .await
        {
            Ok(guard) => break guard,
            Err(LockError::Backend(err)) if healed_at.elapsed() < Duration::from_secs(5) => {
                eprintln!("while the connection comes back: {err}");
                sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!(
                "no recovery {:?} after the cut: {other}",
                healed_at.elapsed()
            ),
        }
    };
    assert!(guard.fencing_token().expect("fenced") > held_token);
    let left = pttl(&mut redis, &lock_key("cut"));
    assert!(
        left > 0 && guard.is_held(),
        "the grant after recovery is a real one on the server (PTTL {left})"
    );
    assert!(pttl(&mut redis, &lock_key("cut")) > 0);
    assert!(guard.release().await.expect("release after recovery"));
}

/// One stretch of time during which a holder believed it held the lock.
#[derive(Debug, Clone, Copy)]
struct Section {
    holder: &'static str,
    token: FencingToken,
    start: Instant,
    end: Instant,
    lost: bool,
}

/// The critical sections of every holder, as an in-process stand-in for the resource the lock
/// protects.
#[derive(Clone, Default)]
struct Store(Arc<Mutex<Vec<Section>>>);

impl Store {
    fn record(&self, section: Section) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(section);
    }

    fn sections(&self) -> Vec<Section> {
        let mut sections = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        sections.sort_by_key(|section| section.start);
        sections
    }
}

/// Holds `guard` (taken at `start`) for `hold` or until its lease is lost, whichever comes
/// first, and records the section. A section ends when `lost()` fires or just before release.
async fn hold(
    store: &Store,
    holder: &'static str,
    guard: LockGuard,
    start: Instant,
    hold: Duration,
) {
    let lost = tokio::select! {
        () = guard.lost() => true,
        () = sleep(hold) => false,
    };
    store.record(Section {
        holder,
        token: guard.fencing_token().expect("fenced"),
        start,
        end: Instant::now(),
        lost,
    });
    if !lost {
        // It may fail while the connection is cut; the lease then frees the lock.
        let _ = guard.release().await;
    }
}

/// Takes `key` again and again until `until`, holding it for `hold` each time.
async fn contend(
    store: Store,
    holder: &'static str,
    client: Client,
    key: &'static str,
    lease: Duration,
    hold_for: Duration,
    until: Instant,
) {
    while Instant::now() < until {
        match client
            .lock(key)
            .lease(lease)
            .wait(Duration::from_secs(1))
            .acquire()
            .await
        {
            Ok(guard) => {
                let start = Instant::now();
                hold(&store, holder, guard, start, hold_for).await;
                // Give the other holder a fair chance at the lock.
                sleep(Duration::from_millis(30)).await;
            }
            Err(LockError::Timeout { .. } | LockError::Backend(_)) => {
                sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("{holder}: unexpected error {other}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critical_sections_of_different_holders_never_overlap_while_a_holder_is_stalled_and_cut() {
    const KEY: &str = "shared-resource";
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let a = client_through(&proxy);
    let b = client_direct(&server);
    let store = Store::default();
    // As above: a drift margin (1% + 2 ms) well above scheduling delays.
    let lease = Duration::from_secs(3);

    // A takes the lock first and means to keep it past the start of the stall.
    let first = a
        .lock(KEY)
        .lease(lease)
        .acquire()
        .await
        .expect("A acquires through the proxy");
    let t0 = Instant::now();
    // The stall outlasts A's lease; the cut is shorter than it.
    let stall = (
        t0 + Duration::from_millis(500),
        t0 + Duration::from_millis(4500),
    );
    let cut = (
        t0 + Duration::from_millis(5500),
        t0 + Duration::from_millis(6000),
    );
    let until = t0 + Duration::from_millis(7500);

    let a_first = tokio::spawn({
        let store = store.clone();
        async move { hold(&store, "A", first, t0, lease * 2).await }
    });
    let a_rest = tokio::spawn({
        let store = store.clone();
        async move {
            a_first.await.expect("A's first section");
            contend(store, "A", a, KEY, lease, Duration::from_millis(200), until).await;
        }
    });
    let b_all = tokio::spawn(contend(
        store.clone(),
        "B",
        b,
        KEY,
        lease,
        Duration::from_millis(200),
        until,
    ));

    tokio::time::sleep_until(stall.0).await;
    proxy.set_mode(Mode::Stall);
    tokio::time::sleep_until(stall.1).await;
    proxy.set_mode(Mode::Pass);
    tokio::time::sleep_until(cut.0).await;
    proxy.set_mode(Mode::Drop);
    tokio::time::sleep_until(cut.1).await;
    proxy.set_mode(Mode::Pass);

    a_rest.await.expect("A's worker");
    b_all.await.expect("B's worker");

    let sections = store.sections();
    let listing: Vec<String> = sections
        .iter()
        .map(|s| {
            format!(
                "{} token {} {:?}..{:?}{}",
                s.holder,
                s.token,
                s.start - t0,
                s.end - t0,
                if s.lost { " (lost)" } else { "" }
            )
        })
        .collect();
    let listing = listing.join("\n");
    eprintln!("critical sections:\n{listing}");

    for (i, x) in sections.iter().enumerate() {
        for y in &sections[i + 1..] {
            assert!(
                x.end <= y.start,
                "sections overlap by {:?}:\n{listing}",
                x.end - y.start
            );
        }
    }
    for pair in sections.windows(2) {
        assert!(
            pair[0].token < pair[1].token,
            "fencing tokens must grow with every new holder:\n{listing}"
        );
    }

    // The scenario really happened: A lost its first lease to the stall, B took over while A
    // was still stalled, and A got the lock again through the healed connection.
    let a_first = sections
        .iter()
        .find(|s| s.holder == "A")
        .expect("A's first section");
    assert!(
        a_first.lost,
        "A's first section should end with the stall:\n{listing}"
    );
    assert!(
        sections
            .iter()
            .any(|s| s.holder == "B" && s.start > a_first.end && s.start < stall.1),
        "B should take over while A is stalled:\n{listing}"
    );
    assert!(
        sections
            .iter()
            .any(|s| s.holder == "A" && s.start > stall.1),
        "A should get the lock again after the stall:\n{listing}"
    );
}

#[tokio::test]
async fn a_grant_whose_reply_arrives_after_its_lease_is_not_handed_out() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    // A response timeout long enough to outlast the stall.
    let client = Client::new(
        Config::from_url(&proxy.url())
            .expect("url")
            .response_timeout(Duration::from_secs(5)),
    )
    .expect("client");
    let warm = client.lock("warm").acquire().await.expect("warm up");
    assert!(warm.release().await.expect("release"));

    proxy.set_mode(Mode::Stall);
    let late = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock("late")
                .lease(Duration::from_millis(50))
                .wait(Duration::ZERO)
                .acquire()
                .await
        }
    });
    // The request waits in the proxy for 300 ms: far longer than the 50 ms lease it asks for.
    sleep(Duration::from_millis(300)).await;
    proxy.set_mode(Mode::Pass);
    let result = late.await.expect("task");
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "a grant with no lease left must not become a guard: {result:?}"
    );
}

#[tokio::test]
async fn the_grant_taken_after_a_late_reply_is_a_fresh_one_not_the_late_one() {
    // A grant whose reply came after its lease is given back in the background while the
    // acquire loop tries again. Were the next try to carry the late try's owner token, it could
    // be granted the late grant just before the give-back deletes it: a guard would then say
    // "held" for a key another client can take.
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = Client::new(
        Config::from_url(&proxy.url())
            .expect("url")
            .response_timeout(Duration::from_secs(5))
            .backoff(Duration::from_millis(1), Duration::from_millis(5)),
    )
    .expect("client");
    let warm = client.lock("warm").acquire().await.expect("warm up");
    assert!(warm.release().await.expect("release"));
    let monitor = support::monitor::Monitor::start(&server);

    proxy.set_mode(Mode::Stall);
    let late = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock("late-then-fresh")
                .lease(Duration::from_millis(200))
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        }
    });
    // The first try waits in the proxy far longer than the 200 ms lease it asks for.
    sleep(Duration::from_millis(500)).await;
    proxy.set_mode(Mode::Pass);
    let guard = late
        .await
        .expect("task")
        .expect("a later try takes the lock");

    // The tries: the first is `SET key owner NX PX lease GET` (in a transaction), later ones
    // the acquire script (`EVALSHA sha numkeys key… owner …`).
    let owner_of = |args: &[String]| -> Option<String> {
        match args.first()?.to_ascii_uppercase().as_str() {
            "SET" if args.get(1)? == "distlock:{late-then-fresh}" => args.get(2).cloned(),
            "EVALSHA" if args.get(3)? == "distlock:{late-then-fresh}" => {
                let keys: usize = args.get(2)?.parse().ok()?;
                args.get(3 + keys).cloned()
            }
            _ => None,
        }
    };
    // MONITOR's lines arrive on a connection of their own, maybe after the guard: wait for the
    // first try to show.
    let late_owner = support::wait_until_async(
        "the late try ran on the server",
        Duration::from_secs(5),
        || {
            monitor
                .lines()
                .iter()
                .find_map(|line| owner_of(&support::monitor::arguments(line)))
                .ok_or_else(|| "no try on MONITOR yet".to_owned())
        },
    )
    .await;
    let holder: String = redis::cmd("GET")
        .arg("distlock:{late-then-fresh}")
        .query(&mut server.connection())
        .expect("GET");
    assert_ne!(
        holder, late_owner,
        "the guard holds the late grant, which its give-back deletes"
    );
    assert!(guard.is_held());
    assert!(guard.release().await.expect("release"));
}

/// Connects to a server that takes the TCP connection and then answers nothing, and checks
/// that the error comes within the connect timeout with advice that fits such a server, not
/// only an unreachable one.
async fn assert_frozen_server_advice(client: &Client, key: &str) {
    let started = Instant::now();
    let result = client
        .lock(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await;
    let elapsed = started.elapsed();
    match result {
        Err(LockError::Backend(err)) => {
            let message = err.to_string();
            assert_eq!(err.operation(), "connect", "{message}");
            for advice in ["frozen", "SIGSTOP", "PING", "connect_timeout"] {
                assert!(
                    message.contains(advice),
                    "should mention {advice}: {message}"
                );
            }
            assert!(
                !message.contains("check that Redis is running"),
                "a running but frozen server gets other advice: {message}"
            );
        }
        Ok(guard) => panic!(
            "acquired `{key}` (token {:?}) from a server that answers nothing",
            guard.fencing_token()
        ),
        Err(other) => panic!("expected a backend error, got {other}"),
    }
    assert!(
        elapsed < Duration::from_secs(3),
        "the connect timeout ({IO_TIMEOUT:?}) should bound the wait, not the 5 s wait: {elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_a_stopped_server_gives_advice_for_a_frozen_server() {
    let server = RedisServer::start();
    server.signal("STOP");
    let client = client_direct(&server);
    assert_frozen_server_advice(&client, "frozen").await;
    // The health check says the same, once.
    match client.ping().await {
        Err(LockError::Backend(err)) => {
            let message = err.to_string();
            assert_eq!(err.operation(), "ping", "{message}");
            assert!(message.contains("SIGSTOP"), "{message}");
            assert_eq!(message.matches("SIGSTOP").count(), 1, "{message}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    server.signal("CONT");
    // Thawed, it serves again.
    let guard = client
        .lock("frozen")
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .expect("acquire once the server runs again");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_through_a_proxy_that_forwards_nothing_gives_advice_for_a_frozen_server() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_mode(Mode::Stall);
    let client = client_through(&proxy);
    assert_frozen_server_advice(&client, "silent-proxy").await;
}

/// The release of a guard already reported lost returns at once, without asking a server that
/// froze (the usual reason the lease was lost): there is nothing of the holder's left to
/// delete, and the caller must not wait out timeouts for it (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_guard_reported_lost_does_not_wait_for_a_frozen_server() {
    let server = RedisServer::start();
    // Long timeouts: asking the frozen server would hold the release up for seconds.
    let slow = Duration::from_secs(5);
    let config = Config::from_url(&server.url())
        .expect("valid url")
        .response_timeout(slow)
        .connect_timeout(slow);
    let client = Client::new(config).expect("client");
    let guard = client
        .lock("lost-then-released")
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .expect("free");
    server.signal("STOP");
    timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the watchdog reports the loss when the deadline passes");
    let started = Instant::now();
    let released = guard.release().await;
    let took = started.elapsed();
    server.signal("CONT");
    assert!(matches!(released, Ok(false)), "{released:?}");
    assert!(took < slow / 2, "the release of a lost guard took {took:?}");
}
