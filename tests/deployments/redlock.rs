//! Redlock over independent masters, against real `redis-server` processes: grants need a
//! majority within the validity, a short quorum is undone everywhere and reported with how
//! many masters answered, renewals need a majority, a replica is refused as a master, and
//! fencing tokens strictly increase across quorums — also when a master's counter runs ahead
//! of the others and then goes down, which the largest token of a quorum alone gets wrong.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support;
use crate::support::masters::start_masters;
use crate::support::RedisServer;
use distlock::{Client, Config, LockError};

fn redlock(masters: &[RedisServer]) -> Config {
    Config::redlock(masters.iter().map(RedisServer::url))
        .expect("valid urls")
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
        // Generous for a loaded 2-core machine; still far below the leases used here.
        .node_timeout(Duration::from_millis(200))
}

/// Lock keys (of any lock) left on a master.
fn lock_keys(server: &RedisServer) -> Vec<String> {
    let mut redis = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("distlock:*")
        .query(&mut redis)
        .expect("KEYS");
    keys.into_iter()
        .filter(|key| !key.ends_with(":fence"))
        .collect()
}

/// Asserts that no master keeps a grant (a lock key of any lock; fencing counters aside).
fn assert_no_grant_left(masters: &[RedisServer]) {
    for master in masters {
        let left = lock_keys(master);
        assert!(
            left.is_empty(),
            "a grant stayed behind on the master at port {}: {left:?}",
            master.port()
        );
    }
}

fn now_micros() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_micros(),
    )
    .expect("fits")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_grants_while_a_minority_is_down() {
    let mut masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    let first = client.lock("job").acquire().await.expect("all up");
    let first_token = first.fencing_token().expect("fenced");
    assert!(first.release().await.expect("release"));
    masters[2].stop();
    let second = client
        .lock("job")
        .acquire()
        .await
        .expect("two of three form a majority");
    assert!(second.fencing_token().expect("fenced") > first_token);
    assert_eq!(lock_keys(&masters[0]).len(), 1);
    assert!(second.release().await.expect("release"));
    assert!(lock_keys(&masters[0]).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_majority_nothing_is_granted_and_the_error_says_how_many_answered() {
    let mut masters = start_masters(3);
    masters[1].stop();
    masters[2].stop();
    let client = Client::new(redlock(&masters)).expect("client");
    let err = client
        .lock("job")
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .expect_err("one master is no majority");
    match &err {
        LockError::QuorumUnavailable {
            answered,
            granted,
            needed,
            nodes,
            ..
        } => {
            assert_eq!(
                (*answered, *granted, *needed, *nodes),
                (1, 1, 2, 3),
                "{err}"
            );
        }
        other => panic!("expected QuorumUnavailable, got {other:?}"),
    }
    assert!(err.to_string().contains("only 1 answered in time"), "{err}");
    // The one master that granted had its grant undone.
    assert!(lock_keys(&masters[0]).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_short_because_masters_are_frozen_is_undone_on_every_master() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    // Connect everywhere first, so the frozen masters have the requests queued.
    client
        .lock("warm")
        .acquire()
        .await
        .expect("all up")
        .release()
        .await
        .expect("release");
    masters[1].signal("STOP");
    masters[2].signal("STOP");
    let err = client
        .lock("job")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect_err("frozen masters do not answer");
    assert!(
        matches!(err, LockError::QuorumUnavailable { .. }),
        "{err:?}"
    );
    masters[1].signal("CONT");
    masters[2].signal("CONT");
    // The frozen masters run the queued grant and then the queued undo, in order.
    for master in &masters {
        support::wait_until("the undo to run", Duration::from_secs(5), || {
            let left = lock_keys(master);
            left.is_empty()
                .then_some(())
                .ok_or(format!("{left:?} left"))
        });
    }
    // And the lock is free.
    let guard = client.lock("job").acquire().await.expect("free again");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_need_a_majority() {
    let mut masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    let guard = client
        .lock("job")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .expect("all up");
    masters[1].stop();
    // One master down: renewals still reach a majority, the lease is kept past its end.
    tokio::time::timeout(Duration::from_millis(1500), guard.lost())
        .await
        .expect_err("a majority renews the lease");
    masters[2].stop();
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("without a majority the lease is lost within the lease");
    assert!(!guard.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_refused_as_a_master() {
    let masters = start_masters(2);
    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &masters[0].port().to_string()]);
    let config =
        Config::redlock([masters[0].url(), masters[1].url(), replica.url()]).expect("valid urls");
    let client = Client::new(config).expect("client");
    let err = client
        .lock("job")
        .acquire()
        .await
        .expect_err("a replica defeats Redlock");
    let message = err.to_string();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    assert!(
        message.contains("role `slave`") && message.contains("replication defeats"),
        "{message}"
    );
}

/// The overlap argument, made concrete: master 0's counter runs far ahead (a fast clock, or
/// many grants it took part in). A grant with all three masters takes its token. With master
/// 0 down, the next quorum is {1, 2}, whose own counters are far behind: only because the
/// first grant raised a majority's counters to its token is the next token larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_quorum_without_the_master_that_ran_ahead_still_hands_out_a_larger_token() {
    let mut masters = start_masters(3);
    let ahead = now_micros() + 3_600_000_000; // an hour of microseconds ahead
    let _: () = redis::cmd("SET")
        .arg("distlock:{job}:fence")
        .arg(ahead)
        .query(&mut masters[0].connection())
        .expect("SET");
    let client = Client::new(redlock(&masters)).expect("client");
    let first = client.lock("job").acquire().await.expect("all up");
    let first_token = first.fencing_token().expect("fenced");
    assert!(first_token.get() > ahead, "the largest token wins");
    first.release().await.expect("release");
    masters[0].stop();
    let second = client.lock("job").acquire().await.expect("majority up");
    assert!(
        second.fencing_token().expect("fenced") > first_token,
        "{first_token} then {}: a later quorum went back",
        second.fencing_token().expect("fenced")
    );
    second.release().await.expect("release");
}

/// Sets `key`'s fencing counter on `master` behind the store's back.
fn set_counter(master: &RedisServer, key: &str, value: u64) {
    let () = redis::cmd("SET")
        .arg(format!("distlock:{{{key}}}:fence"))
        .arg(value)
        .query(&mut master.connection())
        .expect("SET");
}

/// Counters pushed ahead on a majority (by hand here; a client whose clock runs ahead leaves
/// the same) refuse the token a grant proposes, and nothing is written; the same try proposes
/// again above them at once (`wait(0)`: one try), so its token is larger than theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_takes_a_token_above_counters_pushed_ahead_on_a_majority() {
    let masters = start_masters(3);
    let ahead = now_micros() + 10_000_000; // ten seconds of microseconds ahead
    for master in &masters[..2] {
        set_counter(master, "job", ahead);
    }
    let client = Client::new(redlock(&masters)).expect("client");
    let first = client
        .lock("job")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("a second round within the one try");
    let first_token = first.fencing_token().expect("fenced").get();
    assert!(first_token > ahead, "{first_token} not above {ahead}");
    assert!(first.release().await.expect("release"));
    let second = client
        .lock("job")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("free");
    let second_token = second.fencing_token().expect("fenced").get();
    assert!(
        second_token > first_token,
        "{second_token} after {first_token}"
    );
    assert!(second.release().await.expect("release"));
    // The 10 s did not become this client's lead (it keeps at most `MAX_TOKEN_LEAD`, a
    // second): another key's token stays near the clock, so its counter does not live 10 s.
    let other = client
        .lock("other")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("free");
    let other_token = other.fencing_token().expect("fenced").get();
    let near = now_micros() + 2_000_000;
    assert!(
        other_token < near,
        "{other_token} is more than 2 s ahead of the clock ({near}): the lead grew unbounded"
    );
    assert!(other.release().await.expect("release"));
}

/// An uncontended fenced grant is one request to each master: the token is proposed, and no
/// second round writes it back (at `0f0a22d` the masters that had not handed out the quorum's
/// largest token ran `raise_fence.lua` after the grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_fenced_grant_is_one_request_to_each_master() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    // Connections made and scripts loaded.
    let warm = client.lock("job").acquire().await.expect("all up");
    assert!(warm.release().await.expect("release"));
    for master in &masters {
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut master.connection())
            .expect("CONFIG RESETSTAT");
    }
    let guard = client.lock("job").acquire().await.expect("all up");
    assert!(guard.fencing_token().is_some());
    let calls: Vec<u64> = masters.iter().map(RedisServer::script_calls).collect();
    assert_eq!(calls, [1, 1, 1], "script calls per master for one grant");
    assert!(guard.release().await.expect("release"));
}

/// Quorums that differ, and a client whose proposals start far below the last token: a grant
/// on {0, 1} takes a token above counters pushed ahead there; master 2, stopped meanwhile,
/// comes back empty; with master 0 down, a new client's grant on {1, 2} proposes its own
/// clock, which master 1 refuses (its counter holds the earlier token), so its token is
/// still larger. (Accepting a token below the counter hands out the smaller one here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_quorum_that_differs_takes_a_larger_token_from_a_client_whose_clock_is_behind() {
    let mut masters = start_masters(3);
    let ahead = now_micros() + 10_000_000;
    for master in &masters[..2] {
        set_counter(master, "job", ahead);
    }
    masters[2].stop();
    let first_client = Client::new(redlock(&masters)).expect("client");
    let first = first_client
        .lock("job")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("{0, 1} is a majority");
    let first_token = first.fencing_token().expect("fenced").get();
    assert!(first_token > ahead);
    assert!(first.release().await.expect("release"));
    masters[2].restart();
    masters[0].stop();
    let second_client = Client::new(redlock(&masters)).expect("client");
    let second = second_client
        .lock("job")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("{1, 2} is a majority");
    let second_token = second.fencing_token().expect("fenced").get();
    assert!(
        second_token > first_token,
        "{first_token} on {{0, 1}}, then {second_token} on {{1, 2}}: a later quorum went back"
    );
    assert!(second.release().await.expect("release"));
}

/// Thousands of grants while random minorities of five masters are down or restarted empty,
/// and random masters' counters are pushed ahead of the others: every grant succeeds (a
/// majority is always up) and every token is larger than the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_over_thousands_of_grants_while_minorities_come_and_go() {
    const GRANTS: usize = 3000;
    const ROUND: usize = 100;
    let mut masters = start_masters(5);
    // Stopped masters refuse at once; with two down a release needs all three live ones to
    // answer within the timeout, which a loaded machine may miss at 200 ms.
    let config = redlock(&masters).node_timeout(Duration::from_secs(1));
    let client = Client::new(config).expect("client");
    let mut last = 0u64;
    let mut restarts = 0;
    let mut pushed_ahead = 0;
    for round in 0..GRANTS / ROUND {
        // Bring everyone back, then take a random minority (0, 1 or 2 masters) down; a master
        // that comes back has lost everything (no persistence).
        for master in masters.iter_mut().filter(|m| !m.is_running()) {
            master.restart();
            restarts += 1;
        }
        let mut order: Vec<usize> = (0..masters.len()).collect();
        fastrand::shuffle(&mut order);
        // Now and then a live master's counter runs ahead of the rest.
        if round % 3 == 1 {
            let runner = order[4];
            let _: () = redis::cmd("SET")
                .arg("distlock:{job}:fence")
                .arg(last + fastrand::u64(1..1_000_000_000))
                .query(&mut masters[runner].connection())
                .expect("SET");
            pushed_ahead += 1;
        }
        for &down in order.iter().take(fastrand::usize(0..=2)) {
            masters[down].stop();
        }
        for _ in 0..ROUND {
            let guard = client
                .lock("job")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .expect("a majority is up");
            let token = guard.fencing_token().expect("fenced").get();
            assert!(token > last, "token {token} after {last} in round {round}");
            last = token;
            guard.release().await.expect("release");
        }
    }
    assert!(restarts > 10 && pushed_ahead >= 9, "{restarts} restarts");
}

/// A master that accepts connections and never answers (a frozen host, a black-holed
/// network) costs each grant at most the node timeout: the others grant, and reconnecting to
/// the silent one happens in the background, not on every try's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_master_does_not_hold_up_grants() {
    const GRANTS: u32 = 10;
    let masters = start_masters(2);
    // Bound and listening, never accepting: connections complete in the kernel's backlog and
    // then hear nothing.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent_url = format!("redis://{}", silent.local_addr().expect("addr"));
    let connect_timeout = Duration::from_secs(1);
    let config = Config::redlock([masters[0].url(), masters[1].url(), silent_url])
        .expect("valid urls")
        .connect_timeout(connect_timeout)
        .node_timeout(Duration::from_millis(150));
    let client = Client::new(config).expect("client");
    let started = std::time::Instant::now();
    for _ in 0..GRANTS {
        let guard = client
            .lock("job")
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .expect("two of three answer");
        guard.release().await.expect("release");
    }
    // Waiting out the connect timeout on every try would take GRANTS seconds; the first use
    // may wait it once.
    let took = started.elapsed();
    assert!(
        took < connect_timeout * (GRANTS / 2),
        "{GRANTS} grants took {took:?}"
    );
}

/// Starts a request of `waiter` for `name` that waits up to 20 s (its result and when it
/// ended), and returns once `waiter` listens for the lock's release on each of `live`.
async fn waiting_on_every_live_master(
    waiter: &Client,
    name: &str,
    live: &[RedisServer],
) -> tokio::task::JoinHandle<(Result<distlock::LockGuard, LockError>, std::time::Instant)> {
    let waiting = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.to_owned());
        async move {
            let guard = waiter
                .lock(&name)
                .wait(Duration::from_secs(20))
                .acquire()
                .await;
            (guard, std::time::Instant::now())
        }
    });
    let channel = format!("distlock:{{{name}}}:released");
    support::wait_until_async("the waiter to listen", Duration::from_secs(10), || {
        let listening = live.iter().all(|master| {
            let (_, count): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query(&mut master.connection())
                .expect("PUBSUB NUMSUB");
            count > 0
        });
        listening
            .then_some(())
            .ok_or_else(|| "not subscribed on every live master yet".to_owned())
    })
    .await;
    waiting
}

/// Every master announces a release, and a waiter listens on every master that answers: with
/// the first master down, a release still wakes a waiter whose backoff would otherwise keep it
/// asleep for seconds — also when the first announcement it hears comes before the other
/// master has released (its try then falls short of a quorum, and that master's announcement
/// wakes it again; listening on one master only, this failed about once in 15 runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_while_the_first_master_is_down() {
    let mut masters = start_masters(3);
    masters[0].stop();
    let config = redlock(&masters).backoff(Duration::from_secs(10), Duration::from_secs(10));
    let holder = Client::new(config.clone()).expect("client");
    let waiter = Client::new(config).expect("client");
    for round in 0..3 {
        // A lock of its own each round: a subscription left from the round before (kept a
        // moment after its last waiter) would not show that this round's waiter waits yet, and
        // a release before its first try was refused would find nobody to wake.
        let name = format!("job-{round}");
        let guard = holder.lock(&name).acquire().await.expect("majority up");
        let waiting = waiting_on_every_live_master(&waiter, &name, &masters[1..]).await;
        let released = std::time::Instant::now();
        assert!(guard.release().await.expect("release"));
        let (granted, at) = waiting.await.expect("task");
        let granted = granted.expect("the waiter gets the lock");
        let handoff = at - released;
        assert!(
            handoff < Duration::from_secs(1),
            "round {round}: handoff took {handoff:?}, as if no release woke the waiter"
        );
        granted.release().await.expect("release");
    }
}

/// The release on the last master of a majority is what frees the lock to a quorum, and it
/// wakes the waiter too: with one master down and the holder's release held up on its way to
/// another, the waiter woken by the first master's announcement is refused (no quorum), and
/// the late master's own announcement wakes it — not its 10 s backoff. Listening on one master
/// only, that second wake-up never came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_reaches_a_master_late_wakes_the_waiter_when_it_does() {
    use crate::support::proxy::{Mode, Proxy};

    let mut masters = start_masters(3);
    masters[0].stop();
    // The holder reaches master 2 through a proxy that can hold its release up; with the
    // longest node timeout `Config` accepts (1 s) it waits for it instead of giving the
    // connection up (the release is held up only until the waiter's try has reached master 2).
    let proxy = Proxy::start(masters[2].port());
    let holder = Client::new(
        Config::redlock([masters[0].url(), masters[1].url(), proxy.url()])
            .expect("valid urls")
            .node_timeout(distlock::MAX_NODE_TIMEOUT)
            .response_timeout(Duration::from_secs(20)),
    )
    .expect("client");
    let waiter =
        Client::new(redlock(&masters).backoff(Duration::from_secs(10), Duration::from_secs(10)))
            .expect("client");
    let guard = holder.lock("late").acquire().await.expect("majority up");
    let waiting = waiting_on_every_live_master(&waiter, "late", &masters[1..]).await;

    proxy.set_mode(Mode::Stall);
    let tries_before = masters[2].script_calls();
    let releasing = tokio::spawn(async move { guard.release().await });
    // Master 1 announces the release; the waiter it wakes tries master 2, still held there.
    support::wait_until_async("the woken waiter's try", Duration::from_secs(10), || {
        let tries = masters[2].script_calls() - tries_before;
        (tries > 0)
            .then_some(())
            .ok_or_else(|| "no try on master 2 yet".to_owned())
    })
    .await;
    assert!(
        !waiting.is_finished(),
        "granted with one master down and the holder's on another: {:?}",
        waiting.await
    );
    let late = std::time::Instant::now();
    proxy.set_mode(Mode::Pass);
    assert!(
        releasing.await.expect("task").expect("release"),
        "the holder's release reached a majority"
    );
    let (granted, at) = waiting.await.expect("task");
    let granted = granted.expect("the waiter gets the lock");
    let after = at - late;
    assert!(
        after < Duration::from_secs(2),
        "granted {after:?} after the release reached master 2, as if its announcement did \
         not wake the waiter"
    );
    granted.release().await.expect("release");
}

/// A try that falls short gives its grants back without announcing a release: the lock was
/// free there only for that try. Announced, the give-back woke the waiter that gave it back
/// (and every other waiter listening there): while a minority of masters held the lock, with
/// too few others up for a quorum, a waiter tried again every millisecond or so (25,441 tries
/// in a 20 s wait) instead of waiting for the holder's lease or release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_kept_out_by_a_minority_does_not_wake_itself_by_giving_back() {
    let mut masters = start_masters(3);
    masters[0].stop();
    let holder = Client::new(redlock(&masters)).expect("client");
    let held = holder
        .lock("minority")
        .acquire()
        .await
        .expect("majority up");
    // Master 1 loses the grant (as an emptied master would): only master 2 holds the lock,
    // and with master 0 down nobody can have a quorum until its lease ends.
    let _: i64 = redis::cmd("DEL")
        .arg("distlock:{minority}")
        .query(&mut masters[1].connection())
        .expect("DEL");
    let waiter = Client::new(
        redlock(&masters).backoff(Duration::from_millis(200), Duration::from_millis(400)),
    )
    .expect("client");
    // Subscribed (so that an announced give-back would wake it) before the count starts.
    let warm = waiter
        .lock("minority")
        .wait(Duration::from_millis(300))
        .acquire()
        .await;
    assert!(matches!(warm, Err(LockError::Timeout { .. })), "{warm:?}");
    let before = masters[1].script_calls();
    let refused = waiter
        .lock("minority")
        .wait(Duration::from_secs(2))
        .acquire()
        .await;
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "{refused:?}"
    );
    // Each try is a grant and its give-back on master 1; a backoff of 200–400 ms allows about
    // ten tries in 2 s.
    let calls = masters[1].script_calls() - before;
    assert!(
        calls <= 40,
        "{calls} script calls on master 1 in a 2 s wait: the waiter did not wait between tries"
    );
    drop(held);
}

/// A frozen master (SIGSTOP) holds the waker's connection and subscription to it up until they
/// time out; a waiter's wait still ends when its wait does, not when that connect gives up.
/// (The waker once waited for that master's subscription state past the wait: 3 s here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_does_not_stretch_a_waiters_wait() {
    let masters = start_masters(3);
    let slow_to_give_up = Duration::from_secs(3);
    let config = redlock(&masters)
        .connect_timeout(slow_to_give_up)
        .response_timeout(slow_to_give_up);
    let holder = Client::new(config.clone()).expect("client");
    let waiter = Client::new(config).expect("client");
    // The waiter's lock connections are made while every master is up.
    let warm = waiter.lock("warm").acquire().await.expect("all up");
    assert!(warm.release().await.expect("release"));
    let held = holder.lock("frozen-wait").acquire().await.expect("all up");

    masters[2].signal("STOP");
    let wait = Duration::from_secs(1);
    let started = std::time::Instant::now();
    let refused = waiter.lock("frozen-wait").wait(wait).acquire().await;
    let took = started.elapsed();
    masters[2].signal("CONT");
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "{refused:?}"
    );
    // The wait, and one node timeout (200 ms) for the try that first meets the frozen master;
    // far less than the 3 s a connect to it or a subscription on it takes to give up.
    assert!(
        took < Duration::from_secs(2),
        "a {wait:?} wait took {took:?}"
    );
    assert!(held.release().await.expect("release"));
}

/// A renewal that a majority neither confirms nor denies (one master lost the grant, one
/// does not answer in time) is tried again, not taken for a loss: the lease lives on once the
/// silent master answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_left_undecided_by_a_silent_master_is_retried_not_lost() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    let guard = client
        .lock("job")
        .lease(Duration::from_millis(900))
        .acquire()
        .await
        .expect("all up");
    // Master 1 loses the grant; master 2 goes silent across at least one renewal (every
    // 300 ms): master 0 alone renews, master 1 denies, master 2 says nothing.
    let _: () = redis::cmd("DEL")
        .arg("distlock:{job}")
        .query(&mut masters[1].connection())
        .expect("DEL");
    masters[2].signal("STOP");
    tokio::time::timeout(Duration::from_millis(450), guard.lost())
        .await
        .expect_err("an undecided renewal is not a loss");
    masters[2].signal("CONT");
    // Masters 0 and 2 renew again: a majority.
    tokio::time::timeout(Duration::from_millis(1500), guard.lost())
        .await
        .expect_err("the lease lives on");
    assert!(guard.is_held());
    assert!(guard.release().await.expect("release"));
}

/// Another application's data at a master's counter key (a list, a string): the script undoes
/// its grant there and refuses with `NotALock`, which ends the request, and nothing is left
/// behind or overwritten (on `7364a2a` a string there was overwritten with a token, and the
/// grant stood).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_fencing_counter_is_an_error_that_leaves_no_grant_behind() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    let string: String = redis::cmd("SET")
        .arg("distlock:{user-data}:fence")
        .arg("user-data")
        .query(&mut masters[0].connection())
        .expect("SET");
    assert_eq!(string, "OK");
    let err = client
        .lock("user-data")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect_err("a master's counter holds a string of someone else's");
    assert!(
        matches!(&err, LockError::NotALock { holds, .. } if holds == "string"),
        "{err:?}"
    );
    let kept: String = redis::cmd("GET")
        .arg("distlock:{user-data}:fence")
        .query(&mut masters[0].connection())
        .expect("GET");
    assert_eq!(kept, "user-data", "the string is left as it was");
    for master in &masters {
        let () = redis::cmd("RPUSH")
            .arg("distlock:{corrupt}:fence")
            .arg("x")
            .query(&mut master.connection())
            .expect("RPUSH");
    }
    let err = client
        .lock("corrupt")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect_err("corrupt counters");
    assert!(
        matches!(&err, LockError::NotALock { holds, .. } if holds == "list"),
        "{err:?}"
    );
    assert_no_grant_left(&masters);
}

/// A frozen master (SIGSTOP: it keeps its connections and takes requests, and answers none)
/// costs the first request that meets it its node timeout; the requests after it do not wait
/// for it while the other two settle each outcome, and once it runs again the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_costs_one_request_its_node_timeout_and_the_rest_nothing() {
    let masters = start_masters(3);
    // Far above what a live master needs, so that waiting for the frozen one would show: the
    // longest `Config` accepts.
    let node_timeout = distlock::MAX_NODE_TIMEOUT;
    let client = Client::new(redlock(&masters).node_timeout(node_timeout)).expect("client");
    let warm = client.lock("frozen").acquire().await.expect("all up");
    assert!(warm.release().await.expect("release"));

    masters[2].signal("STOP");
    let started = std::time::Instant::now();
    const CYCLES: u32 = 20;
    for _ in 0..CYCLES {
        let guard = client
            .lock("frozen")
            .lease(Duration::from_secs(60))
            .acquire()
            .await
            .expect("a majority is up");
        assert!(guard.release().await.expect("release"));
    }
    // Waiting for the frozen master would take a node timeout per acquire and per release
    // (40 s); not waiting, one node timeout and round trips.
    let took = started.elapsed();
    assert!(
        took < node_timeout * CYCLES / 2,
        "{CYCLES} cycles took {took:?}"
    );

    // Resumed, it runs what was queued. A grant it takes late may stay there until its lease
    // ends when its give-back could not follow it on the same connection (a minority grant,
    // as Redlock allows): the lock is free on a majority at once.
    masters[2].signal("CONT");
    let guard = client
        .lock("frozen")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("free on a majority");
    assert!(guard.release().await.expect("release"));
}

/// The readiness check needs a majority: one master of three down still answers; two down is
/// an error that names each master that did not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_needs_a_majority_and_names_the_masters_that_did_not_answer() {
    let mut masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    client.ping().await.expect("all up");
    masters[0].stop();
    client.ping().await.expect("a majority is up");
    masters[1].stop();
    let err = client.ping().await.expect_err("one of three");
    let message = err.to_string();
    assert!(
        message.contains("1 of 3 Redlock masters answered, 2 needed")
            && message.contains(&format!("127.0.0.1:{}", masters[0].port()))
            && message.contains(&format!("127.0.0.1:{}", masters[1].port())),
        "{message}"
    );
}

/// A try's rounds are bounded by its request's wait. Two of three masters answer late (each
/// reply 600 ms late, a 1 s node timeout: the longest `Config` accepts) and master 0's counter
/// (and in the second case master 1's) is pushed ahead, so the first round proposes a token
/// too low for it and could end only past the 0.5 s wait. The acquire loop cuts the try off
/// there (issue 35, item 5): neither a late quorum's grant nor an undo and a second round
/// keeps the request past it, and what the late masters granted is given back. At `cdaf1e9`
/// the undo and a second round followed, each as late: 6 s; at `f597559` the request ended
/// within one node timeout of its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_round_is_not_sent_past_the_requests_wait() {
    use crate::support::proxy::Proxy;
    use crate::support::wait_until_async;
    use distlock::BackendErrorKind;

    let masters = start_masters(3);
    let proxies: Vec<Proxy> = masters[1..]
        .iter()
        .map(|master| Proxy::start(master.port()))
        .collect();
    let urls = [masters[0].url(), proxies[0].url(), proxies[1].url()];
    let node_timeout = distlock::MAX_NODE_TIMEOUT;
    let response_timeout = node_timeout * 2;
    let late = Duration::from_millis(600);
    let wait = Duration::from_millis(500);
    let config = Config::redlock(urls)
        .expect("valid urls")
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
        .node_timeout(node_timeout)
        .response_timeout(response_timeout);
    let client = Client::new(config).expect("client");
    // Connections made and scripts loaded while the replies are on time.
    let warm = client.lock("warm").acquire().await.expect("all up");
    assert!(warm.release().await.expect("release"));

    let ahead = now_micros() + 60_000_000;
    set_counter(&masters[0], "granted", ahead);
    set_counter(&masters[0], "refused", ahead);
    set_counter(&masters[1], "refused", ahead);
    for proxy in &proxies {
        proxy.delay_replies(late);
    }
    // The first try's floor, and what a loaded 2-core machine adds.
    let bound = wait.max(response_timeout / 10) + Duration::from_millis(300);

    // Masters 1 and 2 grant the first round's token, late; master 2 alone, in the second.
    for key in ["granted", "refused"] {
        let started = std::time::Instant::now();
        let result = client
            .lock(key)
            .lease(Duration::from_secs(60))
            .wait(wait)
            .acquire()
            .await;
        let took = started.elapsed();
        assert!(took < bound, "{key}: took {took:?}, the bound is {bound:?}");
        match result {
            Err(LockError::Backend(err)) if err.kind() == BackendErrorKind::Timeout => {}
            other => panic!("{key}: expected the try cut off at the wait, got {other:?}"),
        }
    }
    // What the late masters granted is given back (the give-back follows each try on its
    // connection; only the replies are late).
    wait_until_async(
        "the late grants given back",
        Duration::from_secs(10),
        || {
            let left: Vec<String> = masters.iter().flat_map(lock_keys).collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    )
    .await;
}

/// A fencing counter at 2^53 or more (the masters' scripts compare tokens as doubles, which
/// cannot count past it) is refused at once with an error that names the key and says what
/// to do, and no grant is left behind: on a majority of masters (at `cdaf1e9` every proposal
/// was refused as too low until the wait ended) and on one master (at `cdaf1e9` granted with
/// a token at 2^53, which every later grant's proposal then fell short of).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_counter_past_2_pow_53_is_refused_at_once_with_what_to_do() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    let huge = (1u64 << 53) + 5;
    for master in &masters[..2] {
        set_counter(master, "huge", huge);
    }
    set_counter(&masters[2], "huge-on-one", huge);
    for key in ["huge", "huge-on-one"] {
        let started = std::time::Instant::now();
        let err = client
            .lock(key)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .expect_err("no token above the counter can be granted");
        let took = started.elapsed();
        assert!(
            matches!(&err, LockError::FencingCounterTooLarge { redis_key, value }
                if *redis_key == format!("distlock:{{{key}}}:fence") && *value == huge.to_string()),
            "{key}: {err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("2^53") && message.contains("DEL"),
            "{message}"
        );
        assert!(took < Duration::from_secs(2), "{key}: took {took:?}");
    }
    assert_no_grant_left(&masters);
}

/// A fair waiter behind another waiter on a majority of masters waits as a waiter behind
/// others, also when the master where it is the head (the lock free there) refuses its token
/// as too low, every time (that master's counter is a minute ahead, past the lead a client
/// learns). At `7c83078` that refusal made each try's reply "try again at once", and the
/// waiter sent thousands of tries in its one-second wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_behind_others_waits_though_a_master_where_it_leads_refuses_its_token() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    // Connections made and the fair scripts loaded.
    let warm = client.lock("warm").fair().acquire().await.expect("all up");
    assert!(warm.release().await.expect("release"));

    set_counter(&masters[0], "queued", now_micros() + 60_000_000);
    // A waiter that came first (place 1) and stays a minute, on masters 1 and 2 only.
    let ahead = "a".repeat(24);
    let deadline_ms = now_micros() / 1000 + 60_000;
    for master in &masters[1..] {
        let mut redis = master.connection();
        let () = redis::pipe()
            .cmd("ZADD")
            .arg("distlock:{queued}:queue")
            .arg(1)
            .arg(&ahead)
            .ignore()
            .cmd("ZADD")
            .arg("distlock:{queued}:queue-deadlines")
            .arg(deadline_ms)
            .arg(&ahead)
            .ignore()
            .cmd("CONFIG")
            .arg("RESETSTAT")
            .ignore()
            .query(&mut redis)
            .expect("ZADD");
    }
    let err = client
        .lock("queued")
        .fair()
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .expect_err("behind a waiter that stays");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let tries = masters[1].script_calls();
    assert!(tries < 100, "{tries} tries in a one-second wait");
}

/// Another application's data at the fencing counter key — a list on one master, a string on
/// every master — makes a read lock and a semaphore fail at once with `NotALock`, and the data
/// is left as it was, with no grant behind on any master. (The read and semaphore scripts read
/// the counter with a bare `GET`: a list failed on its master after the grant was written
/// there while the other two granted, and a string was taken for no counter, the clock giving
/// the token.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_lock_or_a_semaphore_over_someone_elses_counter_key_fails_at_once_and_leaves_it() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    for name in ["read-list", "permit-list"] {
        let pushed: i64 = redis::cmd("RPUSH")
            .arg(format!("distlock:{{{name}}}:fence"))
            .arg("their-item")
            .query(&mut masters[0].connection())
            .expect("RPUSH");
        assert_eq!(pushed, 1);
    }
    for name in ["read-string", "permit-string"] {
        for master in &masters {
            let () = redis::cmd("SET")
                .arg(format!("distlock:{{{name}}}:fence"))
                .arg("their-value")
                .query(&mut master.connection())
                .expect("SET");
        }
    }
    for (name, holds) in [
        ("read-list", "list"),
        ("read-string", "string"),
        ("permit-list", "list"),
        ("permit-string", "string"),
    ] {
        let started = std::time::Instant::now();
        let result = if name.starts_with("read") {
            client
                .read_lock(name)
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        } else {
            client
                .semaphore(name, 2)
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        };
        let err = result.expect_err("the counter key holds someone else's data");
        assert!(
            matches!(&err, LockError::NotALock { holds: found, redis_key }
                if found == holds && *redis_key == format!("distlock:{{{name}}}:fence")),
            "{name}: {err:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{name}: took {:?}",
            started.elapsed()
        );
    }
    for name in ["read-list", "permit-list"] {
        let kept: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("distlock:{{{name}}}:fence"))
            .arg(0)
            .arg(-1)
            .query(&mut masters[0].connection())
            .expect("LRANGE");
        assert_eq!(kept, ["their-item"], "{name}: the list is left as it was");
    }
    for name in ["read-string", "permit-string"] {
        for master in &masters {
            let (kept, ttl): (String, i64) = redis::pipe()
                .cmd("GET")
                .arg(format!("distlock:{{{name}}}:fence"))
                .cmd("PTTL")
                .arg(format!("distlock:{{{name}}}:fence"))
                .query(&mut master.connection())
                .expect("GET");
            assert_eq!(
                (kept.as_str(), ttl),
                ("their-value", -1),
                "{name}: the string is left as it was"
            );
        }
    }
    assert_no_grant_left(&masters);
}

/// A counter key holding a string that Lua also reads as a number but that no distlock
/// counter ever is (written `%d`: decimal digits only) — an exponent, hex, a sign, a fraction
/// — is another application's data: a write lock, a read lock and `inspect` refuse it at once
/// with `NotALock`, and it is left as it was. (Read as numbers, `1e3` and `0x10` were counters
/// of 1000 and 16.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_key_holding_a_number_not_written_by_distlock_is_not_a_lock() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    for (at, foreign) in ["1e3", "0x10", "-5", "12.5"].into_iter().enumerate() {
        let name = format!("number-like-{at}");
        let fence = format!("distlock:{{{name}}}:fence");
        for master in &masters {
            let () = redis::cmd("SET")
                .arg(&fence)
                .arg(foreign)
                .query(&mut master.connection())
                .expect("SET");
        }
        let not_a_lock = |err: &LockError| {
            matches!(err, LockError::NotALock { holds, redis_key }
                if holds == "string" && *redis_key == fence)
        };
        let write = client
            .lock(name.as_str())
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .expect_err("a write lock over someone else's counter");
        assert!(not_a_lock(&write), "{foreign:?}, write: {write:?}");
        let read = client
            .read_lock(name.as_str())
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .expect_err("a read lock over someone else's counter");
        assert!(not_a_lock(&read), "{foreign:?}, read: {read:?}");
        let inspected = client
            .inspect(name.as_str())
            .await
            .expect_err("inspect over someone else's counter");
        assert!(
            not_a_lock(&inspected),
            "{foreign:?}, inspect: {inspected:?}"
        );
        for master in &masters {
            let (kept, ttl): (String, i64) = redis::pipe()
                .cmd("GET")
                .arg(&fence)
                .cmd("PTTL")
                .arg(&fence)
                .query(&mut master.connection())
                .expect("GET");
            assert_eq!((kept.as_str(), ttl), (foreign, -1), "left as it was");
        }
    }
    assert_no_grant_left(&masters);
}

/// A read lock over a counter at 2^53 or more (on one master) is refused at once with
/// `FencingCounterTooLarge`, naming the key and the exact value, and nothing is left behind:
/// a double cannot hold such a token (the read script handed out the counter rounded, here
/// 2^53 + 4 for 2^53 + 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_lock_over_a_fencing_counter_past_2_pow_53_is_refused_at_once() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    let huge = (1u64 << 53) + 5;
    set_counter(&masters[0], "huge-read", huge);
    let started = std::time::Instant::now();
    let err = client
        .read_lock("huge-read")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect_err("no read token can stand for the counter");
    assert!(
        matches!(&err, LockError::FencingCounterTooLarge { redis_key, value }
            if redis_key == "distlock:{huge-read}:fence" && *value == huge.to_string()),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    assert_no_grant_left(&masters);
}

/// A semaphore over a counter at 2^53 or more — on a majority of masters and on one master —
/// is refused at once with `FencingCounterTooLarge`, naming the key and the exact value, and
/// nothing changes: no permit is left on any master and every counter holds what it held (the
/// semaphore's script reads the counter for its token, read/acquire.lua's rule, so a double
/// would round it: 2^53 + 4 for 2^53 + 5). Shown to fail with `semaphore/acquire.lua` not
/// reading the counter (its token from the clock): the semaphore over the majority's counters
/// was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_over_a_fencing_counter_past_2_pow_53_is_refused_at_once() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    let huge = (1u64 << 53) + 5;
    for master in &masters[..2] {
        set_counter(master, "huge-permits", huge);
    }
    set_counter(&masters[2], "huge-permit-on-one", huge);
    let counters = |key: &str| -> Vec<(Option<String>, i64)> {
        masters
            .iter()
            .map(|master| {
                let mut redis = master.connection();
                let fence = format!("distlock:{{{key}}}:fence");
                let value: Option<String> = redis::cmd("GET")
                    .arg(&fence)
                    .query(&mut redis)
                    .expect("GET");
                let ttl: i64 = redis::cmd("PTTL")
                    .arg(&fence)
                    .query(&mut redis)
                    .expect("PTTL");
                (value, ttl)
            })
            .collect()
    };
    for key in ["huge-permits", "huge-permit-on-one"] {
        let before = counters(key);
        let started = std::time::Instant::now();
        let err = client
            .semaphore(key, 3)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .expect_err("no permit's token can stand for the counter");
        let took = started.elapsed();
        assert!(
            matches!(&err, LockError::FencingCounterTooLarge { redis_key, value }
                if *redis_key == format!("distlock:{{{key}}}:fence") && *value == huge.to_string()),
            "{key}: {err:?}"
        );
        assert!(took < Duration::from_secs(2), "{key}: took {took:?}");
        assert_eq!(counters(key), before, "{key}: the counters were changed");
    }
    assert_no_grant_left(&masters);
}

/// `force_unlock` over a counter at 2^53 or more on one master is refused with
/// `FencingCounterTooLarge`, and the other masters' counters are not raised past 2^53 (the
/// raise compared as doubles and wrote the huge token + 1 to every other master, after which
/// no grant could be made there either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_over_a_fencing_counter_past_2_pow_53_raises_no_counter_past_it() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    let huge = (1u64 << 53) + 5;
    let small = now_micros();
    set_counter(&masters[0], "huge-forced", huge);
    for master in &masters[1..] {
        set_counter(master, "huge-forced", small);
    }
    let err = client
        .force_unlock("huge-forced")
        .await
        .expect_err("no token above the counter can be handed out");
    assert!(
        matches!(&err, LockError::FencingCounterTooLarge { redis_key, value }
            if redis_key == "distlock:{huge-forced}:fence" && *value == huge.to_string()),
        "{err:?}"
    );
    for (i, master) in masters.iter().enumerate() {
        let counter: u64 = redis::cmd("GET")
            .arg("distlock:{huge-forced}:fence")
            .query(&mut master.connection())
            .expect("GET");
        let expected = if i == 0 { huge } else { small };
        assert_eq!(counter, expected, "master {i}'s counter is left as it was");
    }
}

/// With a majority of masters unreachable (their connections accepted and never answered)
/// and a connect timeout far above the wait, a fresh client's request ends within its wait
/// and one node timeout: the wait for connects before a try lasts until the request's
/// deadline at most (before, the first try waited the whole connect timeout for them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_waits_for_connects_no_longer_than_its_requests_wait() {
    use crate::support::proxy::{Mode, Proxy};

    let masters = start_masters(3);
    let proxies: Vec<Proxy> = masters[1..]
        .iter()
        .map(|master| Proxy::start(master.port()))
        .collect();
    for proxy in &proxies {
        proxy.set_mode(Mode::Stall);
    }
    let urls = [masters[0].url(), proxies[0].url(), proxies[1].url()];
    let node_timeout = Duration::from_millis(200);
    let wait = Duration::from_millis(500);
    let config = Config::redlock(urls)
        .expect("valid urls")
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
        .node_timeout(node_timeout)
        .connect_timeout(Duration::from_secs(20));
    let client = Client::new(config).expect("client");
    let started = std::time::Instant::now();
    let err = client
        .lock("unreachable")
        .wait(wait)
        .acquire()
        .await
        .expect_err("a majority is unreachable");
    let took = started.elapsed();
    let bound = wait + node_timeout + Duration::from_secs(1);
    assert!(
        took < bound,
        "took {took:?}, the bound is {bound:?}: {err:?}"
    );
}

/// A plain waiter behind a holder on a majority waits for the holder when the one free master
/// refuses its token as too low (its counter a minute ahead, past the lead a client learns):
/// that refusal and no grant make no quorum, so it is no reason to try again at once. (Every
/// such reply read "held for no time": 590 tries in a one-second wait.) The fair twin is
/// `a_fair_waiter_behind_others_waits_though_a_master_where_it_leads_refuses_its_token`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_waiter_waits_for_the_holder_though_a_free_master_refuses_its_token() {
    let masters = start_masters(3);
    let holder = Client::new(redlock(&masters)).expect("client");
    let waiter = Client::new(redlock(&masters)).expect("client");
    let warm = waiter.lock("warm").acquire().await.expect("all up");
    assert!(warm.release().await.expect("release"));
    let held = holder
        .lock("spin")
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .expect("held");
    // Free on master 0, its counter a minute ahead.
    let () = redis::cmd("DEL")
        .arg("distlock:{spin}")
        .query(&mut masters[0].connection())
        .expect("DEL");
    set_counter(&masters[0], "spin", now_micros() + 60_000_000);
    for master in &masters {
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut master.connection())
            .expect("RESETSTAT");
    }
    let err = waiter
        .lock("spin")
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .expect_err("held on a majority");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let tries = masters[1].script_calls();
    assert!(tries < 100, "{tries} tries in a one-second wait");
    assert!(held.release().await.expect("release"));
}

/// A fencing counter on `master` (`None`: none).
fn counter(master: &RedisServer, key: &str) -> Option<u64> {
    redis::cmd("GET")
        .arg(format!("distlock:{{{key}}}:fence"))
        .query(&mut master.connection())
        .expect("GET")
}

/// How long a fencing counter on `master` lives yet, on the master's clock.
fn counter_ttl(master: &RedisServer, key: &str) -> Duration {
    let ms: i64 = redis::cmd("PTTL")
        .arg(format!("distlock:{{{key}}}:fence"))
        .query(&mut master.connection())
        .expect("PTTL");
    Duration::from_millis(u64::try_from(ms).unwrap_or_else(|_| panic!("PTTL {ms}: no expiry")))
}

/// The largest setting the token lead grows with: the longest node timeout `Config` accepts.
fn at_largest_node_timeout(masters: &[RedisServer]) -> Config {
    redlock(masters).node_timeout(distlock::MAX_NODE_TIMEOUT)
}

/// A client with the default node timeout: the shortest lead there is by default.
fn at_default_node_timeout(masters: &[RedisServer]) -> Client {
    Client::new(
        Config::redlock(masters.iter().map(RedisServer::url))
            .expect("valid urls")
            .backoff(Duration::from_millis(1), Duration::from_millis(20)),
    )
    .expect("client")
}

/// Raises `client`'s lead as far as it goes: counters a minute ahead on the masters given
/// (by hand here; a client or master whose clock runs ahead leaves the same) refuse its first
/// proposal, and it learns from their hints all it may.
async fn push_lead_to_its_cap(client: &Client, masters: &[RedisServer]) {
    let ahead = now_micros() + 60_000_000;
    for master in masters {
        set_counter(master, "push-lead", ahead);
    }
    let guard = client
        .lock("push-lead")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("a second round above the counters");
    assert!(guard.fencing_token().expect("fenced").get() > ahead);
    assert!(guard.release().await.expect("release"));
}

fn micros_of(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).expect("fits")
}

/// Issue 35 (a): a released grant's counter lives at most a lease and `MAX_TOKEN_LEAD` (1 s)
/// after the grant, at the largest node timeout `Config` accepts and with the client's lead
/// raised as far as it goes, on the default 30 s lease. At `f597559` the lead started at the
/// node timeout and grew a second past it: 31.997 s here (32.997 s with a 3 s node timeout,
/// which `Config` accepted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_grants_counter_lives_at_most_a_lease_and_the_token_lead() {
    let masters = start_masters(3);
    let client = Client::new(at_largest_node_timeout(&masters)).expect("client");
    push_lead_to_its_cap(&client, &masters).await;
    let before = now_micros();
    let guard = client
        .lock("job")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("free");
    let token = guard.fencing_token().expect("fenced").get();
    assert!(guard.release().await.expect("release"));
    // The lead is as large as it goes: the worst case is the one measured.
    assert!(
        token > before + micros_of(distlock::MAX_TOKEN_LEAD) / 2,
        "token {token} only {} µs ahead: the lead was not raised",
        token.saturating_sub(before)
    );
    let bound = distlock::DEFAULT_LEASE + distlock::MAX_TOKEN_LEAD;
    for master in &masters {
        let left = counter_ttl(master, "job");
        assert!(
            left <= bound,
            "master {}: the counter lives {left:?} after the release, past a lease and the \
             token lead ({bound:?})",
            master.port()
        );
    }
}

/// Issue 35 (b): a write try undone for want of a quorum leaves its token in the counter of
/// the one master that granted it; a later write whose quorum avoids that master (frozen)
/// takes a smaller token, and a read whose quorum includes it carries the undone one. It
/// exceeds the later write token by less than `MAX_TOKEN_LEAD`, with the undone try's client
/// at the largest node timeout `Config` accepts and its lead raised as far as it goes, and
/// the later writer at the default node timeout (the smallest lead by default). At
/// `f597559`: by 1.9 s here (1.945 s, 8.945 s with node timeouts of 3 s, 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_exceeds_a_later_write_token_by_less_than_the_token_lead() {
    let masters = start_masters(3);
    let early = Client::new(at_largest_node_timeout(&masters)).expect("client");
    push_lead_to_its_cap(&early, &masters).await;
    let later = at_default_node_timeout(&masters);
    let warm = later
        .lock("warm")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("all up");
    assert!(warm.release().await.expect("release"));

    // Someone else holds the lock on masters 1 and 2 (by hand): the early try is granted on
    // master 0 alone, falls short and is undone there; its token stays in the counter.
    for master in &masters[1..] {
        let () = redis::cmd("SET")
            .arg("distlock:{job}")
            .arg("0123456789abcdef0123456789abcdef:1:by-hand")
            .arg("PX")
            .arg(60_000)
            .query(&mut master.connection())
            .expect("SET");
    }
    let refused = early.lock("job").wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "{refused:?}"
    );
    let undone = counter(&masters[0], "job").expect("the undone try's token stays");
    assert!(lock_keys(&masters[0]).is_empty(), "the try was undone");
    for master in &masters[1..] {
        let () = redis::cmd("DEL")
            .arg("distlock:{job}")
            .query(&mut master.connection())
            .expect("DEL");
    }

    // The later write, on masters 1 and 2 only.
    masters[0].signal("STOP");
    let written = later
        .lock("job")
        .wait(Duration::from_secs(10))
        .acquire()
        .await;
    masters[0].signal("CONT");
    let written = written.expect("masters 1 and 2 are a majority");
    let write_token = written.fencing_token().expect("fenced").get();
    assert!(written.release().await.expect("release"));

    // A read whose quorum includes master 0 (a fresh client waits for every master).
    let reader = Client::new(redlock(&masters)).expect("client");
    let read = reader
        .read_lock("job")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("free");
    let read_token = read.fencing_token().expect("fenced").get();
    assert!(read.release().await.expect("release"));
    assert_eq!(read_token, undone.max(write_token));
    assert!(
        read_token > write_token,
        "the read token {read_token} is not above the later write token {write_token}: the \
         case was not made (the undone try's token {undone} came too long before)"
    );
    let exceeds = read_token - write_token;
    assert!(
        exceeds < micros_of(distlock::MAX_TOKEN_LEAD),
        "the read token exceeds the later write token by {exceeds} µs, not less than the \
         token lead ({:?})",
        distlock::MAX_TOKEN_LEAD
    );
}

/// Issue 35 (c): a master restarted empty a lease and `MAX_TOKEN_LEAD` (plus 100 ms) after a
/// grant it took part in (README: "a lease plus a second") gives a later holder, whose quorum
/// is that master and one that never saw the grant, a token above the earlier, stalled
/// holder's — with the earlier client at the largest node timeout `Config` accepts and its
/// lead raised as far as it goes, and the later one at the default node timeout (the
/// smallest lead by default). At `f597559` the later token was 0.5 s below the earlier one
/// here (6.73 s with a 10 s node timeout, which `Config` accepted): a fenced store then
/// refuses the live holder and admits the stale one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_empty_a_lease_and_the_token_lead_after_a_grant_hands_out_no_smaller_token(
) {
    let mut masters = start_masters(3);
    let lease = Duration::from_millis(300);
    masters[2].stop();
    let early =
        Client::new(at_largest_node_timeout(&masters).default_lease(lease)).expect("client");
    push_lead_to_its_cap(&early, &masters[..2]).await;
    let stalled = early
        .lock("job")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("masters 0 and 1 are a majority");
    let granted_by = std::time::Instant::now();
    let early_token = stalled.fencing_token().expect("fenced").get();

    // Master 0 goes down for good (its counter holds the token), master 1 down and back
    // empty a lease and the token lead after the grant, master 2 back (it never saw it).
    masters[0].stop();
    masters[1].stop();
    let restart_at = granted_by + lease + distlock::MAX_TOKEN_LEAD + Duration::from_millis(100);
    tokio::time::sleep_until(restart_at.into()).await;
    masters[1].restart();
    masters[2].restart();
    let later = at_default_node_timeout(&masters);
    let taken = later
        .lock("job")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("masters 1 and 2 are a majority");
    let later_token = taken.fencing_token().expect("fenced").get();
    assert!(
        later_token > early_token,
        "the later holder's token {later_token} is {} µs below the stalled holder's \
         {early_token}",
        early_token - later_token
    );
    assert!(taken.release().await.expect("release"));
    drop(stalled);
}

/// Issue 35, item 3: counters set by hand just below 2^53 are raised by grants up to 2^53 − 1
/// and never to 2^53 or past it: the try after that is `FencingCounterTooLarge` naming the
/// counter, and nothing of the counters changes from then on; the same for a fair lock and
/// for `lock_all`. Each counter's time to live is what the rule needs (until the master's
/// clock passes the token, and a lease; whole milliseconds rounded on both ends), never
/// without expiry. At `f597559` the third grant wrote 2^53 (its counter
/// set to live 229 years) and every later try was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_just_below_2_pow_53_are_never_raised_to_it() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    let limit = 1u64 << 53;
    let lease = distlock::DEFAULT_LEASE;
    for master in &masters {
        set_counter(master, "near", limit - 3);
        set_counter(master, "near-fair", limit - 3);
        set_counter(master, "near-a", limit - 4);
        set_counter(master, "near-b", limit - 3);
    }
    // Every counter lives until its master's clock has passed its token, and a lease: no
    // longer, and not forever.
    let assert_ttls = |key: &str, token: u64| {
        let ahead = Duration::from_micros(token - now_micros());
        for master in &masters {
            let left = counter_ttl(master, key);
            assert!(
                left <= ahead + lease + Duration::from_millis(2),
                "{key} on master {}: lives {left:?}, past its token ({ahead:?} ahead) and a lease",
                master.port()
            );
        }
    };
    let counters = |key: &str| {
        masters
            .iter()
            .map(|master| counter(master, key))
            .collect::<Vec<_>>()
    };

    let refused_as_too_large = |err: &LockError, key: &str| {
        matches!(err, LockError::FencingCounterTooLarge { redis_key, value }
            if *redis_key == format!("distlock:{{{key}}}:fence")
                && *value == (limit - 1).to_string())
    };
    let request = |key: &str| {
        let request = client.lock(key);
        if key == "near-fair" {
            request.fair()
        } else {
            request
        }
    };

    for key in ["near", "near-fair"] {
        let mut tokens = Vec::new();
        let err = loop {
            match request(key).wait(Duration::from_secs(5)).acquire().await {
                Ok(guard) => {
                    let token = guard.fencing_token().expect("fenced").get();
                    assert!(guard.release().await.expect("release"));
                    assert!(token < limit, "{key}: granted {token}, at or past 2^53");
                    assert_ttls(key, token);
                    tokens.push(token);
                    assert!(tokens.len() <= 2, "{key}: tokens {tokens:?}");
                }
                Err(err) => break err,
            }
        };
        assert_eq!(tokens, [limit - 2, limit - 1], "{key}");
        assert!(refused_as_too_large(&err, key), "{key}: {err:?}");
        let ttls: Vec<Duration> = masters.iter().map(|m| counter_ttl(m, key)).collect();
        for _ in 0..2 {
            let err = request(key)
                .wait(Duration::from_secs(1))
                .acquire()
                .await
                .expect_err("no token above 2^53 - 1");
            assert!(refused_as_too_large(&err, key), "{key}: {err:?}");
        }
        assert_eq!(counters(key), vec![Some(limit - 1); 3], "{key}");
        for (master, before) in masters.iter().zip(ttls) {
            assert!(
                counter_ttl(master, key) <= before,
                "{key}: a refusal wrote the counter"
            );
        }
    }

    // lock_all: both keys take one token each grant, the larger counter's hint.
    let mut tokens = Vec::new();
    let err = loop {
        match client
            .lock_all(["near-a", "near-b"])
            .wait(Duration::from_secs(5))
            .acquire()
            .await
        {
            Ok(guard) => {
                let token = guard.fencing_token_of("near-a").expect("fenced").get();
                assert_eq!(
                    guard.fencing_token_of("near-b").map(|t| t.get()),
                    Some(token)
                );
                assert!(guard.release().await.expect("release"));
                assert!(token < limit, "granted {token}, at or past 2^53");
                assert_ttls("near-a", token);
                assert_ttls("near-b", token);
                tokens.push(token);
                assert!(tokens.len() <= 2, "tokens {tokens:?}");
            }
            Err(err) => break err,
        }
    };
    assert_eq!(tokens, [limit - 2, limit - 1]);
    assert!(
        refused_as_too_large(&err, "near-a") || refused_as_too_large(&err, "near-b"),
        "{err:?}"
    );
    assert_eq!(counters("near-a"), vec![Some(limit - 1); 3]);
    assert_eq!(counters("near-b"), vec![Some(limit - 1); 3]);
    assert_no_grant_left(&masters);
}

/// No counter script writes a proposal at 2^53 or past it, whatever the client sends: the
/// write and multi-key grants (the scripts as the runtime loads them, run on a master with
/// no counter, where nothing else would refuse it) answer FENCETOOLARGE with the proposal,
/// and neither the lock nor the counter is written. At `f597559` both granted it and set
/// the counter to 2^53.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_at_2_pow_53_is_refused_by_every_script_that_writes_a_counter() {
    let masters = start_masters(3);
    let master = &masters[0];
    let lock_key = include_str!("../../lock-runtime/scripts/lock_key.lua");
    let write = redis::Script::new(&format!(
        "{lock_key}\n{}",
        include_str!("../../lock-runtime/scripts/write/acquire.lua")
    ));
    let multi = redis::Script::new(&format!(
        "{lock_key}\n{}",
        include_str!("../../lock-runtime/scripts/multi/acquire.lua")
    ));
    let owner = format!("{:032x}:1:proposal", 9);
    let mut redis = master.connection();
    for proposed in [1u64 << 53, (1u64 << 53) + 1, u64::MAX / 2] {
        let token = format!("{proposed}:1000");
        let refused_write = write
            .key("distlock:{limit}")
            .key("distlock:{limit}:fence")
            .arg(&owner)
            .arg(1_000)
            .arg(&token)
            .arg(0)
            .arg(0)
            .arg("distlock:{limit}:writer-waiting")
            .invoke::<redis::Value>(&mut redis);
        let refused_multi = multi
            .key("distlock:{limit}")
            .key("distlock:{limit}:fence")
            .arg(&owner)
            .arg(1_000)
            .arg(&token)
            .arg(0)
            .arg(0)
            .arg(2)
            .arg("distlock:{limit}:writer-waiting")
            .invoke::<redis::Value>(&mut redis);
        for (script, refused) in [("write", refused_write), ("multi", refused_multi)] {
            let err = refused.expect_err("no token at or past 2^53 is granted");
            let message = err.to_string();
            assert!(
                message.contains("FENCETOOLARGE")
                    && message.contains(&format!("{proposed} at distlock:{{limit}}:fence")),
                "{script}, {proposed}: {message}"
            );
            assert!(
                lock_keys(master).is_empty() && counter(master, "limit").is_none(),
                "{script}, {proposed}: something was written"
            );
        }
    }
}

/// `Leadership::proclaim` on Redlock (issue 37): it stands when a majority takes it, a master
/// that missed it does not bring an older value back into `leader()`, a majority that no
/// longer holds the leader's lock makes it `LeadershipLost`, and a minority is too few.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_stands_with_a_majority_and_the_latest_value_is_the_leaders() {
    let mut masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    let election = client
        .election("leader")
        .lease(Duration::from_secs(30))
        .value("v0");
    let leading = election.campaign().await.expect("all up");
    leading.proclaim("v1").await.expect("all up");

    // A master that missed the proclaim (its record of the same leader is the campaign's).
    let mut stale = masters[0].connection();
    let _: () = redis::cmd("HSET")
        .arg("distlock:{leader}:leader")
        .arg("value")
        .arg("v0")
        .arg("revision")
        .arg(0)
        .query(&mut stale)
        .expect("HSET");
    for _ in 0..5 {
        let leader = election.leader().await.expect("read").expect("a leader");
        assert_eq!(leader.value(), Some(&b"v1"[..]), "never the older value");
    }

    // The lock gone from one master: the other two still make a majority.
    let _: () = redis::cmd("DEL")
        .arg("distlock:{leader}")
        .query(&mut stale)
        .expect("DEL");
    leading
        .proclaim("v2")
        .await
        .expect("a majority holds the lock");
    let leader = election.leader().await.expect("read").expect("a leader");
    assert_eq!(leader.value(), Some(&b"v2"[..]));

    // One master down besides: one master holding the lock is too few.
    masters[2].stop();
    let err = leading.proclaim("v3").await.expect_err("no majority");
    assert!(
        matches!(
            err,
            LockError::QuorumUnavailable {
                needed: 2,
                nodes: 3,
                ..
            }
        ),
        "{err:?}"
    );
    masters[2].restart();

    // A majority of masters without the leader's lock: deposed.
    let mut second = masters[1].connection();
    let _: () = redis::cmd("DEL")
        .arg("distlock:{leader}")
        .query(&mut second)
        .expect("DEL");
    let err = leading.proclaim("v4").await.expect_err("deposed");
    assert!(matches!(err, LockError::LeadershipLost { .. }), "{err:?}");
    let value: Option<Vec<u8>> = redis::cmd("HGET")
        .arg("distlock:{leader}:leader")
        .arg("value")
        .query(&mut second)
        .expect("HGET");
    // The failed `v3` stayed where it was written (a proclaim short of a majority is not
    // undone); `v4` was written nowhere.
    assert_eq!(value.as_deref(), Some(&b"v3"[..]), "nothing written");
    drop(leading);
}
