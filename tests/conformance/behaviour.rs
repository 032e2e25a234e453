//! The conformance suite: the behaviour every store promises for every lock kind, the same
//! test bodies run on every store — a single `redis-server`, a primary found through Sentinel,
//! a 3-primary/3-replica Redis Cluster, Redlock over three independent masters, and the
//! in-process store. Tests about holding a lock run once per kind (`on_every_store_and_kind!`):
//! the holder takes the kind under test, and the rivals take the write lock, which every kind
//! excludes. Tests about one kind alone (fencing of writes, sharing among readers, writer
//! preference) run once per store (`on_every_store!`). The Sentinel setup, the Cluster and the
//! Redlock masters are shared by the tests of this binary, each test under a key prefix of its
//! own, so tests stay independent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::stores::Harness;
use distlock::{Client, FencingToken, LockError, LockMode, LockRequest};
use tokio::time::Instant;

/// A request for the side `mode` of the lock `key`.
fn take(client: &Client, mode: LockMode, key: &str) -> LockRequest {
    match mode {
        LockMode::Write => client.write_lock(key),
        LockMode::Read => client.read_lock(key),
        LockMode::Semaphore => client.semaphore(key, 2),
    }
}

/// Asserts that `request`, tried once, finds the lock held.
async fn assert_held(request: LockRequest) {
    let result = request.wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{result:?}"
    );
}

/// One store's module of tests taking the harness and the kind, once per kind.
macro_rules! store_kind_tests {
    ($store:ident, $harness:ident, [$($name:ident),*]) => {
        mod $store {
            mod write {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $name() {
                        crate::behaviour::$name(
                            crate::support::stores::Harness::$harness(),
                            distlock::LockMode::Write,
                        )
                        .await
                    }
                )*
            }
            mod read {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $name() {
                        crate::behaviour::$name(
                            crate::support::stores::Harness::$harness(),
                            distlock::LockMode::Read,
                        )
                        .await
                    }
                )*
            }
        }
    };
}

macro_rules! on_every_store_and_kind {
    ($($name:ident),* $(,)?) => {
        mod every_kind {
            store_kind_tests!(redis_store, redis, [$($name),*]);
            store_kind_tests!(sentinel_store, sentinel, [$($name),*]);
            store_kind_tests!(cluster_store, cluster, [$($name),*]);
            store_kind_tests!(redlock_store, redlock, [$($name),*]);
            store_kind_tests!(in_memory_store, in_memory, [$($name),*]);
        }
    };
}

crate::support::stores::on_every_store!(
    sixteen_tasks_doing_read_modify_write_under_the_lock_lose_no_update,
    fencing_tokens_strictly_increase_across_successive_holders,
    bad_requests_are_clear_errors,
    readers_share_the_lock_and_writers_exclude_them,
    one_readers_expiry_or_release_never_frees_another,
    a_waiting_writer_keeps_new_readers_out,
    read_grants_carry_a_token_between_the_write_tokens_around_them,
    a_writer_gets_in_within_a_second_under_fifty_tasks_of_overlapping_reads,
    the_lock_and_write_lock_are_the_same_lock,
    grants_without_fencing_exclude_each_other_and_carry_no_token,
    the_wait_deadline_is_honoured_at_the_default_backoff,
    a_waiting_writer_keeps_new_readers_out_at_the_default_backoff,
    a_writer_gets_in_within_a_second_under_fifty_tasks_of_overlapping_reads_at_the_default_backoff,
);

/// Waiting without a wake-up: a lock freed without an announcement (its key deleted behind the
/// holder's back, or its lease run out), which only the backoff finds.
mod lost_wake_ups {
    use super::*;

    crate::support::stores::on_every_redis_store!(
        a_lock_freed_without_an_announcement_is_taken_within_one_default_backoff_step,
        a_waiters_backoff_is_capped_by_the_holders_remaining_lease,
    );
}

on_every_store_and_kind!(
    an_unrenewed_lease_frees_the_lock_within_the_lease,
    the_watchdog_holds_a_lock_for_more_than_three_leases,
    releasing_a_lock_that_expired_and_was_taken_over_returns_false,
    the_wait_deadline_is_honoured,
    a_zero_wait_fails_at_once_when_the_lock_is_held,
    a_dropped_guard_releases_the_lock_in_the_background,
    a_hard_lease_without_watchdog_is_reported_lost_when_it_runs_out,
    a_lock_held_for_its_max_hold_is_lost_and_no_longer_renewed,
);

async fn sixteen_tasks_doing_read_modify_write_under_the_lock_lose_no_update(h: Harness) {
    const TASKS: u64 = 16;
    const ROUNDS: u64 = 10;
    let counter = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(Vec::<FencingToken>::new()));
    let clients: Vec<Client> = (0..4).map(|_| h.client()).collect();
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let client = clients[(i % 4) as usize].clone();
        let counter = counter.clone();
        let tokens = tokens.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = client
                    .lock("counter")
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .expect("acquire");
                // A deliberately non-atomic read-modify-write with a suspension in the middle.
                let read = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_micros(200)).await;
                counter.store(read + 1, Ordering::SeqCst);
                tokens
                    .lock()
                    .unwrap()
                    .push(guard.fencing_token().expect("fenced"));
                assert!(guard.release().await.expect("release"));
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(counter.load(Ordering::SeqCst), TASKS * ROUNDS);
    let tokens = tokens.lock().unwrap();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens in commit order must strictly increase: {tokens:?}"
    );
}

async fn fencing_tokens_strictly_increase_across_successive_holders(h: Harness) {
    let mut previous: Option<FencingToken> = None;
    for _ in 0..10 {
        // New clients, as successive holders in different processes would be.
        let client = h.client();
        let guard = client.lock("fenced").acquire().await.expect("acquire");
        let token = guard.fencing_token().expect("fenced");
        if let Some(previous) = previous {
            assert!(token > previous, "{token} after {previous}");
        }
        previous = Some(token);
        guard.release().await.expect("release");
    }
}

/// The efficiency mode (`fencing(false)` on a request, or on the config): the same exclusion,
/// no token. A contended request goes on past its bare first `SET NX PX` through the scripts.
async fn grants_without_fencing_exclude_each_other_and_carry_no_token(h: Harness) {
    let client = h.client();
    let plain = client
        .lock("plain")
        .fencing(false)
        .lease(Duration::from_millis(500))
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    assert_eq!(plain.fencing_token(), None, "no token to invent");
    assert_held(client.lock("plain").fencing(false)).await;
    assert_held(client.lock("plain")).await;
    assert_held(client.read_lock("plain")).await;
    // Waiting: refused first (the holder keeps it for its whole 500 ms lease), then granted
    // on a scripted try once the lease has run out.
    let unfenced = Client::new(h.config.clone().fencing(false)).expect("valid config");
    let guard = unfenced
        .lock("plain")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire after the holder's lease ran out");
    assert_eq!(
        guard.fencing_token(),
        None,
        "Config::fencing(false) is the default of its requests"
    );
    assert!(
        !plain.release().await.expect("release"),
        "its lease ran out"
    );
    assert!(guard.release().await.expect("release"));
    // Readers without fencing keep writers out, and carry no token either.
    let reader = client
        .read_lock("plain")
        .fencing(false)
        .acquire()
        .await
        .expect("read");
    assert_eq!(reader.fencing_token(), None);
    assert_held(client.lock("plain").fencing(false)).await;
    assert!(reader.release().await.expect("release"));
    // A fenced grant after unfenced ones still gets a token.
    let fenced = client.lock("plain").acquire().await.expect("acquire");
    assert!(fenced.fencing_token().is_some());
    assert!(fenced.release().await.expect("release"));
}

async fn an_unrenewed_lease_frees_the_lock_within_the_lease(h: Harness, mode: LockMode) {
    let lease = Duration::from_millis(400);
    let holder = h.client();
    let guard = take(&holder, mode, "vanishing")
        .lease(lease)
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    let taken_at = Instant::now();
    // The holder vanishes: nothing releases the lock and nothing renews it.
    std::mem::forget(guard);
    let next = h
        .client()
        .lock("vanishing")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the lock is free again once the lease ran out");
    let freed_after = taken_at.elapsed();
    assert!(
        freed_after <= lease + Duration::from_millis(300),
        "freed after {freed_after:?}, lease {lease:?}"
    );
    next.release().await.expect("release");
}

async fn the_watchdog_holds_a_lock_for_more_than_three_leases(h: Harness, mode: LockMode) {
    let lease = Duration::from_millis(300);
    let holder = h.client();
    let rival = h.client();
    let guard = take(&holder, mode, "long-job")
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");
    let started = Instant::now();
    while started.elapsed() < lease * 4 {
        // The holder "works"; the rival keeps finding the lock taken.
        tokio::time::sleep(lease / 4).await;
        let rival_try = rival.lock("long-job").wait(Duration::ZERO).acquire().await;
        assert!(
            matches!(rival_try, Err(LockError::Timeout { .. })),
            "the rival got the lock after {:?}: {rival_try:?}",
            started.elapsed()
        );
        assert!(guard.is_held());
    }
    assert!(
        guard.release().await.expect("release"),
        "still ours at the end"
    );
}

async fn releasing_a_lock_that_expired_and_was_taken_over_returns_false(
    h: Harness,
    mode: LockMode,
) {
    let first = take(&h.client(), mode, "taken-over")
        .lease(Duration::from_millis(150))
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    let rival = h.client();
    let second = rival
        .lock("taken-over")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the rival takes the lock once the first lease expires");
    assert!(!first.is_held());
    assert!(
        !first.release().await.expect("release"),
        "the first holder's release must report that the lock was no longer its own"
    );
    let third = h
        .client()
        .lock("taken-over")
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(third, Err(LockError::Timeout { .. })),
        "the late release must leave the new holder's key intact: {third:?}"
    );
    assert!(second.release().await.expect("release"));
}

async fn the_wait_deadline_is_honoured(h: Harness, mode: LockMode) {
    let holder = take(&h.client(), mode, "busy")
        .acquire()
        .await
        .expect("acquire");
    let wait = Duration::from_millis(500);
    let started = Instant::now();
    let err = h
        .client()
        .lock("busy")
        .wait(wait)
        .acquire()
        .await
        .expect_err("the lock is held throughout");
    let waited = started.elapsed();
    match &err {
        LockError::Timeout {
            key,
            waited: reported,
        } => {
            assert_eq!(key, "busy");
            assert!(*reported >= wait, "reported {reported:?}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(waited >= wait, "gave up early, after {waited:?}");
    assert!(
        waited <= wait + Duration::from_millis(300),
        "overslept the deadline: {waited:?}"
    );
    assert!(err.to_string().contains("raise `wait`"), "{err}");
    holder.release().await.expect("release");
}

/// [`the_wait_deadline_is_honoured`] at `Config`'s default backoff (5–200 ms) instead of the
/// harness's 1–20 ms: the pause before the last try is cut at the deadline, so a wait on a
/// lock held throughout ends as timed out neither before its wait nor more than a try's round
/// trip after it, whatever the backoff step. Shown to fail on every store (a 1 s wait ended
/// after 0.90–0.98 s) with the acquire loop (`Plan::pause`) giving up when the next backoff
/// step would pass the deadline instead of pausing until it.
async fn the_wait_deadline_is_honoured_at_the_default_backoff(h: Harness) {
    let holder = h.client().lock("busy").acquire().await.expect("acquire");
    let config = h
        .config
        .clone()
        .backoff(distlock::DEFAULT_BACKOFF_MIN, distlock::DEFAULT_BACKOFF_MAX);
    let waiter = Client::new(config).expect("valid config");
    // Connected before the clock starts: the bound is for the wait, not the first connects.
    assert_held(waiter.lock("busy")).await;
    for wait in [Duration::from_millis(1000), Duration::from_millis(1500)] {
        let started = Instant::now();
        let err = waiter
            .lock("busy")
            .wait(wait)
            .acquire()
            .await
            .expect_err("the lock is held throughout");
        let waited = started.elapsed();
        assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
        assert!(
            waited >= wait,
            "a {wait:?} wait gave up early, after {waited:?}"
        );
        // One try's round trip past the deadline, with slack for a loaded machine.
        assert!(
            waited <= wait + Duration::from_millis(400),
            "a {wait:?} wait overslept its deadline: {waited:?}"
        );
    }
    assert!(holder.release().await.expect("release"));
}

/// "A lost wake-up costs one backoff step" (how-it-works.md), at the default backoff
/// (5–200 ms): a waiter that has waited long enough for its step to reach 200 ms finds a lock
/// whose key was deleted behind the holder's back (no release, so no announcement) within one
/// step and a try's round trip. Seen: 45–162 ms. Shown to fail on every Redis store (0.60–
/// 1.46 s) with `Backoff::next_delay` letting the step grow past the configured maximum.
async fn a_lock_freed_without_an_announcement_is_taken_within_one_default_backoff_step(h: Harness) {
    let held = h.client().lock("quiet").acquire().await.expect("free");
    let config = h
        .config
        .clone()
        .backoff(distlock::DEFAULT_BACKOFF_MIN, distlock::DEFAULT_BACKOFF_MAX);
    let waiter = Client::new(config).expect("valid config");
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .lock("quiet")
            .wait(Duration::from_secs(20))
            .acquire()
            .await;
        (guard, Instant::now())
    });
    // Long enough for the steps (5, 10, … ms, each drawn from none to all of it) to reach
    // their 200 ms ceiling.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter got in while the lock was held"
    );
    let freed = Instant::now();
    h.raw(redis::cmd("DEL").arg(h.lock_key("quiet")));
    let (guard, granted_at) = waiting.await.expect("task");
    let guard = guard.expect("granted once the key is gone");
    let stall = granted_at - freed;
    assert!(
        stall <= distlock::DEFAULT_BACKOFF_MAX + Duration::from_millis(250),
        "a lock freed without an announcement was taken {stall:?} later: more than one \
         backoff step ({:?}) and a round trip",
        distlock::DEFAULT_BACKOFF_MAX
    );
    assert!(guard.release().await.expect("release"));
    drop(held);
}

/// The backoff is "capped by the holder's remaining TTL" (how-it-works.md): with backoff steps
/// of 10 s, a waiter still takes a 1 s lease that runs out unrenewed (no announcement) within
/// the lease and a round trip, not a step later. Seen: 1.005–1.014 s. Shown to fail on every
/// Redis store (1.6 s to the 8 s wait's end) with the cap taken out of `Plan::pause`.
async fn a_waiters_backoff_is_capped_by_the_holders_remaining_lease(h: Harness) {
    let lease = Duration::from_secs(1);
    let started = Instant::now();
    let held = h
        .client()
        .lock("capped")
        .lease(lease)
        .watchdog(false)
        .acquire()
        .await
        .expect("free");
    let step = Duration::from_secs(10);
    let waiter = Client::new(h.config.clone().backoff(step, step)).expect("valid config");
    let guard = waiter
        .lock("capped")
        .wait(Duration::from_secs(8))
        .acquire()
        .await
        .expect("granted once the lease ran out");
    let took = started.elapsed();
    assert!(
        took <= lease + Duration::from_millis(500),
        "a {lease:?} lease run out was taken {took:?} after its grant (backoff steps of \
         {step:?})"
    );
    assert!(guard.release().await.expect("release"));
    drop(held);
}

async fn a_zero_wait_fails_at_once_when_the_lock_is_held(h: Harness, mode: LockMode) {
    let holder = take(&h.client(), mode, "once")
        .acquire()
        .await
        .expect("acquire");
    // Connected before the clock starts: the bound is for the try, not a Cluster's or
    // Redlock's first connections.
    let client = h.client();
    assert!(client.is_locked("once").await.expect("is_locked"));
    let started = Instant::now();
    let result = client.lock("once").wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    holder.release().await.expect("release");
    let free = h.client().lock("once").wait(Duration::ZERO).acquire().await;
    assert!(
        free.is_ok(),
        "a free lock is taken on the single try: {free:?}"
    );
}

async fn a_dropped_guard_releases_the_lock_in_the_background(h: Harness, mode: LockMode) {
    let client = h.client();
    let guard = take(&client, mode, "dropped")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .expect("acquire");
    drop(guard);
    // Far sooner than the 30 s lease: the drop released it.
    let again = client
        .lock("dropped")
        .wait(Duration::from_secs(5))
        .acquire()
        .await;
    assert!(again.is_ok(), "{again:?}");
}

async fn a_hard_lease_without_watchdog_is_reported_lost_when_it_runs_out(
    h: Harness,
    mode: LockMode,
) {
    let lease = Duration::from_millis(300);
    let guard = take(&h.client(), mode, "hard")
        .lease(lease)
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    assert!(guard.is_held());
    tokio::time::timeout(lease * 3, guard.lost())
        .await
        .expect("lost() fires when a hard lease runs out");
    assert!(!guard.is_held());
}

async fn a_lock_held_for_its_max_hold_is_lost_and_no_longer_renewed(h: Harness, mode: LockMode) {
    let lease = Duration::from_millis(200);
    let max_hold = Duration::from_millis(600);
    let holder = h.client();
    let rival = h.client();
    let started = Instant::now();
    let guard = take(&holder, mode, "hung")
        .lease(lease)
        .max_hold(max_hold)
        .acquire()
        .await
        .expect("acquire");
    // Renewed past its first lease: max_hold does not cut the lease short.
    tokio::time::sleep(lease * 2).await;
    assert!(guard.is_held(), "renewed until max_hold");
    tokio::time::timeout(max_hold * 3, guard.lost())
        .await
        .expect("lost() fires once max_hold has passed");
    let lost_after = started.elapsed();
    assert!(
        lost_after >= max_hold - Duration::from_millis(50),
        "lost after {lost_after:?}, before max_hold {max_hold:?}"
    );
    assert!(!guard.is_held());
    // No renewal after max_hold: the key expires within a lease, though the guard lives.
    let next = rival
        .lock("hung")
        .wait(lease * 3)
        .acquire()
        .await
        .expect("the lock is free within a lease after max_hold");
    assert!(next.fencing_token().expect("fenced") > guard.fencing_token().expect("fenced"));
    next.release().await.expect("release");
    drop(guard);
}

async fn bad_requests_are_clear_errors(h: Harness) {
    let client = h.client();
    let empty = client.lock("").acquire().await;
    assert!(
        matches!(empty, Err(LockError::InvalidKey { .. })),
        "{empty:?}"
    );
    let huge = client.lock("k".repeat(1 << 20)).acquire().await;
    match huge {
        Err(err @ LockError::InvalidKey { .. }) => assert!(err.to_string().len() < 500),
        other => panic!("expected InvalidKey, got {other:?}"),
    }
    let short = client
        .lock("m")
        .lease(Duration::from_secs(1))
        .max_hold(Duration::from_millis(500))
        .acquire()
        .await;
    match short {
        Err(LockError::Config(message)) => assert!(message.contains("max_hold"), "{message}"),
        other => panic!("expected Config for max_hold < lease, got {other:?}"),
    }
    for lease in [Duration::ZERO, Duration::from_millis(1), Duration::MAX] {
        let bad = client.lock("z").lease(lease).acquire().await;
        assert!(
            matches!(bad, Err(LockError::Config(_))),
            "{lease:?}: {bad:?}"
        );
    }
    let unbounded = Client::new(
        h.config
            .clone()
            .backoff(Duration::from_millis(1), Duration::MAX),
    )
    .expect("an unbounded backoff is allowed");
    let holder = client
        .lock("b")
        .lease(Duration::from_millis(100))
        .watchdog(false)
        .acquire()
        .await;
    let waiter = unbounded
        .lock("b")
        .wait(h.expired_within(Duration::from_millis(100)) + Duration::from_secs(2))
        .acquire()
        .await;
    assert!(waiter.is_ok(), "{waiter:?}");
    drop(holder);
    let odd = client.lock("ключ {with} braces & spaces").acquire().await;
    assert!(odd
        .expect("odd but valid keys work")
        .release()
        .await
        .unwrap());
}

/// A try that must find the lock held.
async fn assert_held_against(request: LockRequest, what: &str) {
    let result = request.wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{what}: {result:?}"
    );
}

async fn readers_share_the_lock_and_writers_exclude_them(h: Harness) {
    let (a, b, c) = (h.client(), h.client(), h.client());
    let mut readers = Vec::new();
    for client in [&a, &b, &c] {
        let guard = client
            .read_lock("shared")
            .wait(Duration::ZERO)
            .acquire()
            .await
            .expect("readers share the lock");
        assert_eq!(guard.mode(), LockMode::Read);
        readers.push(guard);
    }
    assert_held_against(
        h.client().write_lock("shared"),
        "a writer got in among readers",
    )
    .await;
    assert_held_against(h.client().lock("shared"), "lock() got in among readers").await;
    for guard in readers {
        assert!(guard.release().await.expect("release"));
    }
    let writer = h
        .client()
        .write_lock("shared")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("free once every reader left");
    assert_eq!(writer.mode(), LockMode::Write);
    assert_held_against(a.read_lock("shared"), "a reader got in beside a writer").await;
    assert_held_against(a.write_lock("shared"), "a second writer got in").await;
    assert!(writer.release().await.expect("release"));
    let reader = a
        .read_lock("shared")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("a reader gets in after the writer left");
    assert!(reader.release().await.expect("release"));
}

async fn one_readers_expiry_or_release_never_frees_another(h: Harness) {
    let short = Duration::from_millis(200);
    let long = h
        .client()
        .read_lock("readers")
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .expect("first reader");
    let expiring = h
        .client()
        .read_lock("readers")
        .lease(short)
        .watchdog(false)
        .acquire()
        .await
        .expect("second reader");
    let released = h
        .client()
        .read_lock("readers")
        .acquire()
        .await
        .expect("third reader");
    // One reader releases, one expires; the renewed one still keeps writers out.
    assert!(released.release().await.expect("release"));
    tokio::time::timeout(short * 5, expiring.lost())
        .await
        .expect("the unrenewed reader's lease runs out");
    // `lost()` fires a drift margin (a few ms) before the store lets the lease go; expiry is a
    // matter of time, not an event.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !expiring.release().await.expect("release"),
        "an expired reader's release says it was no longer a reader"
    );
    for _ in 0..3 {
        assert_held_against(
            h.client().write_lock("readers"),
            "a writer got in while a renewed reader held",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(long.is_held());
    assert!(long.release().await.expect("release"));
    let writer = h
        .client()
        .write_lock("readers")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("free once the last reader left");
    writer.release().await.expect("release");
}

async fn a_waiting_writer_keeps_new_readers_out(h: Harness) {
    let reader = h
        .client()
        .read_lock("preferred")
        .acquire()
        .await
        .expect("reader");
    let writers = h.client();
    let writer = tokio::spawn(async move {
        let guard = writers
            .write_lock("preferred")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .expect("the writer gets in once the reader leaves");
        let token = guard.fencing_token().expect("fenced");
        guard.release().await.expect("release");
        token
    });
    // New readers get in until the writer's first try has marked it waiting, and from then on
    // not at all while it waits.
    let newcomers = h.client();
    let started = Instant::now();
    loop {
        match newcomers
            .read_lock("preferred")
            .wait(Duration::ZERO)
            .acquire()
            .await
        {
            Ok(guard) => assert!(guard.release().await.expect("release")),
            Err(LockError::Timeout { .. }) => break,
            Err(err) => panic!("{err}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "readers kept entering while a writer waited"
        );
        tokio::task::yield_now().await;
    }
    for _ in 0..5 {
        assert_held_against(
            newcomers.read_lock("preferred"),
            "a reader got in while a writer waited",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!writer.is_finished(), "the writer got in beside a reader");
    assert!(reader.release().await.expect("release"));
    writer.await.expect("writer task");
    let after = newcomers
        .read_lock("preferred")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("readers get in again after the writer");
    after.release().await.expect("release");
}

/// The harness's backoff (`Harness::config`) set back to `Config`'s default (5–200 ms).
fn at_the_default_backoff(mut h: Harness) -> Harness {
    h.config = h
        .config
        .backoff(distlock::DEFAULT_BACKOFF_MIN, distlock::DEFAULT_BACKOFF_MAX);
    h
}

/// [`a_waiting_writer_keeps_new_readers_out`] with every client at the default backoff, whose
/// pauses (up to 200 ms, ten times the harness's) the writer's waiting mark must outlast.
/// Shown to fail on every store (a reader got in while the writer waited) with
/// `writer_waiting_mark` a fixed 60 ms — enough for the harness's 20 ms steps, whose test
/// still passed so, not for the default's 200 ms.
async fn a_waiting_writer_keeps_new_readers_out_at_the_default_backoff(h: Harness) {
    a_waiting_writer_keeps_new_readers_out(at_the_default_backoff(h)).await;
}

/// [`a_writer_gets_in_within_a_second_under_fifty_tasks_of_overlapping_reads`] with every
/// client at the default backoff. Shown to fail on every store (the writer starved: `Timeout`
/// after 10 s) with no waiting mark at all; the fixed 60 ms mark above did not starve it here
/// (the last reader's release wakes it).
async fn a_writer_gets_in_within_a_second_under_fifty_tasks_of_overlapping_reads_at_the_default_backoff(
    h: Harness,
) {
    a_writer_gets_in_within_a_second_under_fifty_tasks_of_overlapping_reads(
        at_the_default_backoff(h),
    )
    .await;
}

/// A read grant takes no token of its own: its token sorts between the write tokens around
/// it (the server clock at the read; on Redlock and in-process, the latest write token while
/// the key's counter lives).
async fn read_grants_carry_a_token_between_the_write_tokens_around_them(h: Harness) {
    let client = h.client();
    let write = client
        .write_lock("fenced-rw")
        .acquire()
        .await
        .expect("write");
    let first = write.fencing_token().expect("fenced");
    write.release().await.expect("release");
    let a = client.read_lock("fenced-rw").acquire().await.expect("read");
    let b = h
        .client()
        .read_lock("fenced-rw")
        .acquire()
        .await
        .expect("read");
    let (a_token, b_token) = (
        a.fencing_token().expect("fenced"),
        b.fencing_token().expect("fenced"),
    );
    assert!(
        a_token >= first,
        "a read {a_token} below the write {first} before it"
    );
    assert!(
        b_token >= first,
        "a read {b_token} below the write {first} before it"
    );
    a.release().await.expect("release");
    b.release().await.expect("release");
    let write = client
        .write_lock("fenced-rw")
        .acquire()
        .await
        .expect("write");
    let second = write.fencing_token().expect("fenced");
    assert!(
        second > a_token.max(b_token),
        "the write {second} after the reads {a_token} and {b_token}"
    );
    write.release().await.expect("release");
    let c = client.read_lock("fenced-rw").acquire().await.expect("read");
    let c_token = c.fencing_token().expect("fenced");
    assert!(
        c_token >= second,
        "a read {c_token} below the write {second} before it"
    );
    c.release().await.expect("release");
}

async fn a_writer_gets_in_within_a_second_under_fifty_tasks_of_overlapping_reads(h: Harness) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let clients: Vec<Client> = (0..5).map(|_| h.client()).collect();
    let mut readers = Vec::new();
    for i in 0..50 {
        let client = clients[i % clients.len()].clone();
        let (stop, reads) = (stop.clone(), reads.clone());
        readers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let guard = client
                    .read_lock("hot")
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .expect("read");
                tokio::time::sleep(Duration::from_millis(20)).await;
                guard.release().await.expect("release");
                reads.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Wait until the readers overlap without pause.
    let warm = Instant::now();
    while reads.load(Ordering::Relaxed) < 100 {
        assert!(
            warm.elapsed() < Duration::from_secs(10),
            "readers never got going"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let writer = h.client();
    let mut slowest = Duration::ZERO;
    for _ in 0..3 {
        let started = Instant::now();
        let guard = writer
            .write_lock("hot")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .expect("the writer is not starved");
        slowest = slowest.max(started.elapsed());
        guard.release().await.expect("release");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.await.expect("reader task");
    }
    // Its wait is the readers' 20 ms and a wake-up; the bound is for a loaded machine (a
    // starved writer would wait out its 10 s).
    assert!(
        slowest <= Duration::from_secs(1),
        "a writer waited {slowest:?} among 50 overlapping readers"
    );
}

async fn the_lock_and_write_lock_are_the_same_lock(h: Harness) {
    let client = h.client();
    let exclusive = client.lock("same").acquire().await.expect("lock");
    assert_eq!(exclusive.mode(), LockMode::Write);
    assert_held_against(h.client().write_lock("same"), "write_lock beside lock").await;
    assert_held_against(h.client().read_lock("same"), "read_lock beside lock").await;
    let first = exclusive.fencing_token().expect("fenced");
    exclusive.release().await.expect("release");
    let write = client.write_lock("same").acquire().await.expect("write");
    assert!(
        write.fencing_token().expect("fenced") > first,
        "one fencing counter for both"
    );
    assert_held_against(h.client().lock("same"), "lock beside write_lock").await;
    write.release().await.expect("release");
}
