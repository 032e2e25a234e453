//! Semaphores on every store (a single `redis-server`, Sentinel, the 3+3 Cluster, Redlock over
//! three masters, in-process): never more than N holders, also under contention; a different
//! count for a key in use is a clear error; a release, also a repeated one, frees only its own
//! permit, and a permit that expired is not freed by its late release; a key is a semaphore or
//! a read/write lock at a time; waiters are woken by a release (the Redis stores). Redlock: a
//! permit needs more than a majority of masters (`q > N·M/(N+1)`), so with three masters a
//! semaphore of 2 permits is refused while one is down, while a plain lock still works. The
//! crash of permit holders is `tests/crash.rs` (`semaphore` scenario) and the torture suite's
//! semaphore mode.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support;
use crate::support::masters::start_masters;
use crate::support::stores::Harness;
use crate::support::RedisServer;
use distlock::{Client, Config, LockError, LockMode, LockRequest};
use tokio::time::Instant;

mod every_store {
    use super::*;

    crate::support::stores::on_every_store!(
        twelve_tasks_never_exceed_five_permits_and_fill_them,
        a_different_count_for_a_key_in_use_is_a_clear_error,
        a_repeated_release_frees_only_its_own_permit,
        a_permit_that_expired_is_not_freed_by_its_late_release,
        zero_permits_is_a_config_error_naming_the_key,
        a_key_is_a_semaphore_or_a_read_write_lock_at_a_time,
        the_watchdog_keeps_a_permit_for_more_than_three_leases,
    );
}

mod wake_ups {
    use super::*;

    crate::support::stores::on_every_redis_store!(
        each_released_permit_wakes_a_waiter_of_the_waiting_process
    );
}

/// Asserts that `request`, tried once, finds every permit taken.
async fn assert_full(request: LockRequest, what: &str) {
    let result = request.wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{what}: {result:?}"
    );
}

/// Twelve tasks over three clients (three processes, as far as the store can tell) take one
/// of five permits again and again. Shown to fail (6 and more inside) with the purge-and-count
/// check taken out of `semaphore/acquire.lua`.
async fn twelve_tasks_never_exceed_five_permits_and_fill_them(h: Harness) {
    const PERMITS: u32 = 5;
    let clients: Vec<Client> = (0..3).map(|_| h.client()).collect();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let client = clients[i % clients.len()].clone();
            let (inside, most) = (inside.clone(), most.clone());
            tokio::spawn(async move {
                for _ in 0..4 {
                    let permit = client
                        .semaphore("pool", PERMITS)
                        .lease(Duration::from_secs(10))
                        .wait(Duration::from_secs(30))
                        .acquire()
                        .await
                        .expect("a permit within the wait");
                    assert_eq!(permit.permits(), Some(PERMITS));
                    assert_eq!(permit.mode(), LockMode::Semaphore);
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(permit.release().await.expect("release"), "was ours");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= PERMITS as usize,
        "{most} holders at once, permits {PERMITS}"
    );
    assert_eq!(
        most, PERMITS as usize,
        "twelve tasks never filled the permits"
    );
    let state = h.client().inspect("pool").await.expect("inspect");
    assert!(!state.is_locked(), "every permit given back: {state:?}");
}

/// Shown to fail (a silent resize: the second count granted) with the count check taken out
/// of `semaphore/acquire.lua`.
async fn a_different_count_for_a_key_in_use_is_a_clear_error(h: Harness) {
    let (a, b) = (h.client(), h.client());
    let held = a.semaphore("api", 3).acquire().await.expect("permit");
    for asked in [2, 4] {
        let err = b
            .semaphore("api", asked)
            .wait(Duration::from_secs(1))
            .acquire()
            .await
            .expect_err("another count for a key in use");
        // Its own variant, which a program can match (issue 25), and a message that says it.
        assert!(
            matches!(&err, LockError::PermitsMismatch { key, asked: a, held: Some(3) }
                if key == "api" && *a == asked),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("`api` is a semaphore of 3 permits")
                && message.contains(&format!("asked for {asked}")),
            "{message}"
        );
    }
    let state = b.inspect("api").await.expect("inspect");
    assert_eq!(
        (state.mode, state.permits, state.holders.len()),
        (Some(LockMode::Semaphore), Some(3), 1),
        "{state:?}"
    );
    // The same count is fine.
    let second = b.semaphore("api", 3).acquire().await.expect("same count");
    assert!(held.release().await.expect("release"));
    assert!(second.release().await.expect("release"));
    // Once no permit is held, the key takes a new count.
    let four: Vec<_> = futures_util::future::join_all(
        (0..4).map(|_| b.semaphore("api", 4).wait(Duration::ZERO).acquire()),
    )
    .await
    .into_iter()
    .map(|permit| permit.expect("four permits now"))
    .collect();
    assert_eq!(b.inspect("api").await.expect("inspect").permits, Some(4));
    assert_full(b.semaphore("api", 4), "a fifth of four").await;
    drop(four);
}

/// A client shut down has given its permit back; the guard's release then sends the same
/// release again (as a retried release does), which must free nothing: shown to fail (the
/// other holder's permit freed, a third taken over capacity) with a release script that
/// drops the key's oldest permit when the caller's is gone.
async fn a_repeated_release_frees_only_its_own_permit(h: Harness) {
    let (a, b, c) = (h.client(), h.client(), h.client());
    let first = a.semaphore("twice", 2).acquire().await.expect("permit");
    let second = b.semaphore("twice", 2).acquire().await.expect("permit");
    assert_full(c.semaphore("twice", 2), "both taken").await;
    assert_eq!(a.shutdown().await.expect("shutdown"), 1, "released once");
    assert!(
        !first.release().await.expect("release again"),
        "the second release found nothing of its own"
    );
    let state = c.inspect("twice").await.expect("inspect");
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert!(second.is_held());
    let third = c
        .semaphore("twice", 2)
        .acquire()
        .await
        .expect("the freed permit");
    assert_full(
        h.client().semaphore("twice", 2),
        "the other permit is still held",
    )
    .await;
    assert!(second.release().await.expect("release"));
    assert!(third.release().await.expect("release"));
}

/// Shown to fail with a release script that frees a permit whether or not the caller's was
/// still live.
async fn a_permit_that_expired_is_not_freed_by_its_late_release(h: Harness) {
    let (a, b) = (h.client(), h.client());
    let lease = Duration::from_millis(400);
    let late = a
        .semaphore("late", 2)
        .lease(lease)
        .watchdog(false)
        .acquire()
        .await
        .expect("permit");
    tokio::time::timeout(Duration::from_secs(10), late.lost())
        .await
        .expect("an unrenewed permit is lost");
    // Its lease has run out on the store too (the local deadline comes first, by the drift).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let taken: Vec<_> = vec![
        b.semaphore("late", 2).acquire().await.expect("permit"),
        b.semaphore("late", 2)
            .acquire()
            .await
            .expect("the expired one's permit"),
    ];
    assert!(
        !late.release().await.expect("late release"),
        "not ours any more"
    );
    assert_full(a.semaphore("late", 2), "the late release freed nothing").await;
    let state = b.inspect("late").await.expect("inspect");
    assert_eq!(state.holders.len(), 2, "{state:?}");
    for permit in taken {
        assert!(permit.release().await.expect("release"));
    }
}

async fn zero_permits_is_a_config_error_naming_the_key(h: Harness) {
    let err = h
        .client()
        .semaphore("nothing", 0)
        .acquire()
        .await
        .expect_err("zero permits");
    let LockError::Config(message) = &err else {
        panic!("not a config error: {err:?}");
    };
    assert!(
        message.contains("`nothing`") && message.contains("at least 1 permit"),
        "{message}"
    );
}

/// While permits are held, writers and readers wait; while a writer or readers hold the key,
/// permits wait: nothing is corrupted. Shown to fail (a reader joining the permits) without
/// the marker check in `read/acquire.lua`.
async fn a_key_is_a_semaphore_or_a_read_write_lock_at_a_time(h: Harness) {
    let (a, b) = (h.client(), h.client());
    let permit = a.semaphore("mixed", 3).acquire().await.expect("permit");
    assert_full(b.write_lock("mixed"), "a writer beside a permit").await;
    assert_full(b.read_lock("mixed"), "a reader beside a permit").await;
    let state = b.inspect("mixed").await.expect("inspect");
    assert_eq!(state.mode, Some(LockMode::Semaphore), "{state:?}");
    assert_eq!(state.holders.len(), 1, "the marker is no holder: {state:?}");
    assert!(!state.holders[0].owner.starts_with('#'));
    assert_eq!(b.list("mix*", 10).await.expect("list"), ["mixed"]);
    assert!(permit.release().await.expect("release"));
    assert!(!b.is_locked("mixed").await.expect("is_locked"));

    let writer = b.write_lock("mixed").acquire().await.expect("write");
    assert_full(a.semaphore("mixed", 3), "a permit beside a writer").await;
    assert!(writer.release().await.expect("release"));
    let reader = b.read_lock("mixed").acquire().await.expect("read");
    assert_full(a.semaphore("mixed", 3), "a permit beside a reader").await;
    let state = b.inspect("mixed").await.expect("inspect");
    assert_eq!(
        (state.mode, state.permits),
        (Some(LockMode::Read), None),
        "{state:?}"
    );
    assert!(reader.release().await.expect("release"));

    // force_unlock evicts the permit holders, never the marker.
    let permits = [
        a.semaphore("mixed", 3).acquire().await.expect("permit"),
        a.semaphore("mixed", 3).acquire().await.expect("permit"),
    ];
    let forced = b.force_unlock("mixed").await.expect("force_unlock");
    assert_eq!(forced.evicted.len(), 2, "{forced:?}");
    assert!(forced.evicted.iter().all(|h| !h.owner.starts_with('#')));
    assert!(!b.is_locked("mixed").await.expect("is_locked"));
    let writer = b
        .write_lock("mixed")
        .acquire()
        .await
        .expect("free after force_unlock");
    assert!(writer.release().await.expect("release"));
    for permit in permits {
        assert!(!permit.release().await.expect("release"), "evicted");
    }
}

async fn the_watchdog_keeps_a_permit_for_more_than_three_leases(h: Harness) {
    let (a, b) = (h.client(), h.client());
    let lease = Duration::from_millis(600);
    let permit = a
        .semaphore("kept", 1)
        .lease(lease)
        .acquire()
        .await
        .expect("permit");
    let until = Instant::now() + lease * 3 + lease / 2;
    while Instant::now() < until {
        assert_full(b.semaphore("kept", 1), "renewed").await;
        tokio::time::sleep(lease / 3).await;
    }
    assert!(permit.is_held());
    assert!(permit.release().await.expect("release"), "still ours");
}

/// Waiters back off for up to 20 s and the holders' leases are renewed, so only the releases'
/// announcements let both waiters (of one process) in within a second — one per freed
/// permit. Shown to fail with the `PUBLISH` taken out of `semaphore/release.lua`.
async fn each_released_permit_wakes_a_waiter_of_the_waiting_process(h: Harness) {
    let holders = h.client();
    let waiting = Client::new(
        h.config
            .clone()
            .backoff(Duration::from_secs(20), Duration::from_secs(20)),
    )
    .expect("valid config");
    let lease = Duration::from_secs(30);
    let held = [
        holders
            .semaphore("wake", 2)
            .lease(lease)
            .acquire()
            .await
            .unwrap(),
        holders
            .semaphore("wake", 2)
            .lease(lease)
            .acquire()
            .await
            .unwrap(),
    ];
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let waiting = waiting.clone();
            tokio::spawn(async move {
                let permit = waiting
                    .semaphore("wake", 2)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await;
                (permit, Instant::now())
            })
        })
        .collect();
    // Both have tried once and listen for releases.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = holders.inspect("wake").await.unwrap();
        if state.waiting_processes >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "nobody listened: {state:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    for permit in held {
        assert!(permit.release().await.unwrap());
    }
    for waiter in waiters {
        let (permit, granted_at) = tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .expect("the waiter got in")
            .unwrap();
        let permit = permit.expect("granted");
        let waited = granted_at - released_at;
        assert!(
            waited < Duration::from_secs(1),
            "not woken: in after {waited:?}"
        );
        assert!(permit.release().await.unwrap());
    }
}

fn redlock(masters: &[RedisServer]) -> Config {
    Config::redlock(masters.iter().map(RedisServer::url))
        .expect("valid urls")
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
        .node_timeout(Duration::from_millis(200))
}

/// With three masters a permit of a semaphore of 2 needs all three: one down, it is refused
/// at once with how many were needed, while a plain lock (a majority) and a semaphore of one
/// permit (a majority too) are granted. Shown to fail (granted by two) with a majority as
/// the semaphore's quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_a_semaphore_of_two_with_one_of_three_masters_down() {
    let mut masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    let permit = client.semaphore("sem", 2).acquire().await.expect("all up");
    assert!(permit.release().await.expect("release"));
    masters[2].stop();
    let err = client
        .semaphore("sem", 2)
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .expect_err("one master down");
    match &err {
        LockError::QuorumUnavailable {
            needed: 3,
            nodes: 3,
            answered: 2,
            ..
        } => {}
        other => panic!("not the quorum error: {other:?}"),
    }
    assert!(
        err.to_string().contains("one master down"),
        "the message says why: {err}"
    );
    let lock = client.lock("plain").acquire().await.expect("a majority");
    assert!(lock.release().await.expect("release"));
    let one = client
        .semaphore("one", 1)
        .acquire()
        .await
        .expect("a majority");
    assert!(one.release().await.expect("release"));
}

/// Five masters, two permits: a permit needs four (2·5/3 < 4), so it survives one master
/// down but not two, while a plain lock needs three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_with_five_masters_keeps_a_semaphore_of_two_with_one_down_not_two() {
    let mut masters = start_masters(5);
    let client = Client::new(redlock(&masters)).expect("client");
    masters[4].stop();
    let permits = [
        client
            .semaphore("sem", 2)
            .acquire()
            .await
            .expect("four of five"),
        client
            .semaphore("sem", 2)
            .acquire()
            .await
            .expect("four of five"),
    ];
    assert_full(client.semaphore("sem", 2), "both permits taken").await;
    for permit in permits {
        assert!(permit.release().await.expect("release"));
    }
    masters[3].stop();
    let err = client
        .semaphore("sem", 2)
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .expect_err("two masters down");
    assert!(
        matches!(
            err,
            LockError::QuorumUnavailable {
                needed: 4,
                nodes: 5,
                ..
            }
        ),
        "{err:?}"
    );
    let lock = client.lock("plain").acquire().await.expect("three of five");
    assert!(lock.release().await.expect("release"));
}

/// Permits left on different pairs of three masters (as majorities would take them) are
/// not enough for a new permit: a semaphore of 2 with one holder on masters {0,1} and one on
/// {1,2} — master 1 full — grants no third on {0,2}. Shown to fail with a majority as quorum
/// (the third granted by masters 0 and 2: three holders of a semaphore of two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_permits_split_over_masters_admit_no_more_holders_than_permits() {
    let masters = start_masters(3);
    let client = Client::new(redlock(&masters)).expect("client");
    // Two permits held on all three masters; then each loses one master, by hand.
    let first = client
        .semaphore("split", 2)
        .acquire()
        .await
        .expect("permit");
    let second = client
        .semaphore("split", 2)
        .acquire()
        .await
        .expect("permit");
    let owners: Vec<String> = client
        .inspect("split")
        .await
        .expect("inspect")
        .holders
        .into_iter()
        .map(|holder| holder.owner)
        .collect();
    assert_eq!(owners.len(), 2);
    for (master, owner) in [(&masters[2], &owners[0]), (&masters[0], &owners[1])] {
        let removed: i64 = redis::cmd("ZREM")
            .arg("distlock:{split}")
            .arg(owner)
            .query(&mut master.connection())
            .expect("ZREM");
        assert_eq!(removed, 1);
    }
    // Masters 0 and 2 have a free place each; master 1 has none.
    assert_full(
        client.semaphore("split", 2),
        "two free places on a majority are no permit",
    )
    .await;
    drop((first, second));
}

/// Spans and metrics label a permit's mode `semaphore` (`telemetry.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permits_spans_are_labelled_semaphore() {
    let captured = support::capture::install();
    let client = Harness::in_memory().client();
    let key = "semaphore:spans";
    let permit = client.semaphore(key, 2).acquire().await.expect("permit");
    assert!(permit.release().await.expect("release"));
    for name in ["acquire", "hold"] {
        let span = support::wait_until_async("the span to close", Duration::from_secs(10), || {
            captured
                .about("key", key)
                .into_iter()
                .find(|record| record.kind == "span" && record.name == name)
                .ok_or_else(|| format!("no closed `{name}` span"))
        })
        .await;
        assert_eq!(span.field("mode"), Some("semaphore"), "{span:?}");
    }
}
