//! Multi-key locks (`lock_all`) on every store (a single `redis-server`, Sentinel, the 3+3
//! Cluster, Redlock over three masters, in-process): two requests naming the same keys in
//! opposite orders, 1,000 times each at once, never deadlock and never overlap; a try takes
//! every key or none (on Cluster the keys are in different slots, and a partial grant is given
//! back before the request backs off); a fencing token per key; the guard is lost when one key
//! is; a release frees every key.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::stores::Harness;
use distlock::{Client, LockError};
use redis::cluster_routing::Slot;

crate::support::stores::on_every_store!(
    opposite_orders_a_thousand_times_each_neither_deadlock_nor_overlap,
    a_try_takes_every_key_or_none,
    a_partial_grant_is_given_back_while_the_request_waits,
    every_key_has_a_fencing_token_of_its_own,
    the_guard_is_lost_when_one_key_is_lost,
    a_release_frees_every_key,
    an_empty_list_is_a_config_error_and_duplicates_are_taken_once,
    a_key_held_by_a_permit_or_a_reader_keeps_lock_all_out,
);

/// Two account keys in different Cluster slots (a lock key's slot is its name's).
fn accounts() -> (&'static str, &'static str) {
    let (from, to) = ("acct:from", "acct:to");
    let slot = |name: &str| Slot::for_key(format!("{{{name}}}"));
    assert_ne!(slot(from), slot(to), "the test's keys must be in two slots");
    (from, to)
}

/// Two clients (two processes, as far as the store can tell) take `{from, to}` and
/// `{to, from}` 1,000 times each, at once. Keys taken one by one in the caller's order, the
/// earlier ones held while waiting for the later (Redisson's `MultiLock`), deadlock here within
/// a few rounds: the wait runs out (shown by taking the keys with two single locks in list
/// order).
async fn opposite_orders_a_thousand_times_each_neither_deadlock_nor_overlap(h: Harness) {
    const ROUNDS: usize = 1000;
    let (from, to) = accounts();
    let inside = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let overlaps = Arc::new(AtomicUsize::new(0));
    let orders = [[from, to], [to, from]];
    let tasks: Vec<_> = orders
        .into_iter()
        .map(|order| {
            let client = h.client();
            let (inside, overlaps) = (inside.clone(), overlaps.clone());
            tokio::spawn(async move {
                let mut done = 0;
                for _ in 0..ROUNDS {
                    let guard = client
                        .lock_all(order)
                        .lease(Duration::from_secs(10))
                        .wait(Duration::from_secs(20))
                        .acquire()
                        .await
                        .expect("both keys within the wait: no deadlock");
                    for count in inside.iter() {
                        if count.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    tokio::task::yield_now().await;
                    for count in inside.iter() {
                        count.fetch_sub(1, Ordering::SeqCst);
                    }
                    assert!(guard.release().await.expect("release"), "both were ours");
                    done += 1;
                }
                done
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.expect("task"), ROUNDS);
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "a key was held twice at once"
    );
}

/// With `to` held by someone else, a request for both tried once times out and leaves `from`
/// free; once `to` is free, it takes both.
async fn a_try_takes_every_key_or_none(h: Harness) {
    let (from, to) = accounts();
    let (client, other) = (h.client(), h.client());
    let held = other.lock(to).acquire().await.expect("lock to");
    let result = client
        .lock_all([from, to])
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{result:?}"
    );
    assert!(
        !client.is_locked(from).await.expect("inspect"),
        "`{from}` was left taken by a refused request"
    );
    assert!(held.release().await.expect("release"));
    let both = client
        .lock_all([from, to])
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("both free");
    assert!(client.is_locked(from).await.expect("inspect"));
    assert!(client.is_locked(to).await.expect("inspect"));
    assert!(both.release().await.expect("release"));
}

/// While `to` is held, a request for both waits: each of its tries marks `to` (a writer
/// waits), and `from` — on Cluster in another slot, taken by a script of its own and given
/// back when `to`'s is refused — is free while the request backs off. Sampled 40 times over
/// about 400 ms against pauses of up to 300 ms, `from` is seen held at most in the moment
/// between a try's two scripts (on Cluster; never on the other stores); a request that kept
/// `from` while waiting would show it held every time. Released, `to` goes to the request.
async fn a_partial_grant_is_given_back_while_the_request_waits(h: Harness) {
    let (from, to) = accounts();
    let (other, observer) = (h.client(), h.client());
    let slow = Client::new(
        h.config
            .clone()
            .backoff(Duration::from_millis(300), Duration::from_millis(300)),
    )
    .expect("client");
    let held = other.lock(to).acquire().await.expect("lock to");
    let waiting = tokio::spawn(async move {
        slow.lock_all([from, to])
            .wait(Duration::from_secs(20))
            .acquire()
            .await
    });
    // The request has tried at least once when `to` carries its writer-waiting mark.
    let started = tokio::time::Instant::now();
    while !observer.inspect(to).await.expect("inspect").writer_waiting {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the request never tried"
        );
        tokio::task::yield_now().await;
    }
    let mut free = 0;
    for _ in 0..40 {
        if !observer.is_locked(from).await.expect("inspect") {
            free += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        free >= 30,
        "`{from}` was held in {} of 40 looks while the request waited for `{to}`",
        40 - free
    );
    assert!(!waiting.is_finished(), "granted while `{to}` was held");
    assert!(held.release().await.expect("release"));
    let guard = waiting
        .await
        .expect("task")
        .expect("both once `to` was released");
    assert_eq!(guard.keys().count(), 2);
    assert!(guard.release().await.expect("release"));
}

/// Each key of a multi-key grant has its own token, greater than every earlier write token of
/// that key and below every later one.
async fn every_key_has_a_fencing_token_of_its_own(h: Harness) {
    let (from, to) = accounts();
    let client = h.client();
    let before = client.lock(from).acquire().await.expect("lock from");
    let before_token = before.fencing_token().expect("a token");
    assert!(before.release().await.expect("release"));
    let both = client.lock_all([to, from]).acquire().await.expect("both");
    let (from_token, to_token) = (
        both.fencing_token_of(from).expect("from's token"),
        both.fencing_token_of(to).expect("to's token"),
    );
    assert!(
        from_token > before_token,
        "{from_token:?} after {before_token:?}"
    );
    assert_eq!(both.fencing_token_of("acct:other"), None);
    assert_eq!(both.keys().collect::<Vec<_>>().len(), 2);
    assert!(both.release().await.expect("release"));
    let after = client.lock(to).acquire().await.expect("lock to");
    assert!(
        after.fencing_token().expect("a token") > to_token,
        "a later write token of `{to}` must be greater"
    );
    assert!(after.release().await.expect("release"));
}

/// One key of the grant freed by force: the guard reports the lease lost (at its next
/// renewal) and is no longer held.
async fn the_guard_is_lost_when_one_key_is_lost(h: Harness) {
    let (from, to) = accounts();
    let (client, operator) = (h.client(), h.client());
    let guard = client
        .lock_all([from, to])
        .lease(Duration::from_millis(900))
        .acquire()
        .await
        .expect("both");
    let forced = operator.force_unlock(to).await.expect("force_unlock");
    assert_eq!(forced.evicted.len(), 1);
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the guard learns that `to` is gone");
    assert!(!guard.is_held());
    // Its release gives back what is still its own, and says not all was.
    assert!(!guard.release().await.expect("release"));
    assert!(!operator.is_locked(from).await.expect("inspect"));
}

/// A release frees every key: each can be taken at once by another client.
async fn a_release_frees_every_key(h: Harness) {
    let keys = ["sku:1", "sku:2", "sku:3", "sku:4"];
    let (client, other) = (h.client(), h.client());
    let guard = client.lock_all(keys).acquire().await.expect("all");
    for key in keys {
        let refused = other.lock(key).wait(Duration::ZERO).acquire().await;
        assert!(
            matches!(refused, Err(LockError::Timeout { .. })),
            "{key}: {refused:?}"
        );
    }
    assert!(
        guard.release().await.expect("release"),
        "every key was ours"
    );
    for key in keys {
        let single = other
            .lock(key)
            .wait(Duration::ZERO)
            .acquire()
            .await
            .unwrap_or_else(|err| panic!("{key} still held after the release: {err}"));
        assert!(single.release().await.expect("release"));
    }
}

async fn an_empty_list_is_a_config_error_and_duplicates_are_taken_once(h: Harness) {
    let client: Client = h.client();
    let empty = client.lock_all(Vec::<String>::new()).acquire().await;
    assert!(
        matches!(&empty, Err(LockError::Config(msg)) if msg.contains("no key")),
        "{empty:?}"
    );
    let guard = client
        .lock_all(["b", "a", "b"])
        .acquire()
        .await
        .expect("a and b");
    assert_eq!(guard.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert!(guard.release().await.expect("release"));
}

/// A semaphore permit or a reader on one of the keys keeps `lock_all` out, as it keeps a
/// single writer out: the one rule of what blocks a writer (issue 23, item 1: the in-process
/// store granted `lock_all(["k", "j"])` while a permit of `k` was held, failing on `7364a2a`).
/// Once the permit or reader is given back, the keys are granted.
async fn a_key_held_by_a_permit_or_a_reader_keeps_lock_all_out(h: Harness) {
    let (k, j) = accounts();
    let client = h.client();
    let other = h.client();
    for holder in ["permit", "reader"] {
        let held = match holder {
            "permit" => {
                other
                    .semaphore(k, 2)
                    .lease(Duration::from_secs(10))
                    .acquire()
                    .await
            }
            _ => {
                other
                    .read_lock(k)
                    .lease(Duration::from_secs(10))
                    .acquire()
                    .await
            }
        }
        .expect("the holder is granted");
        let refused = client
            .lock_all([k, j])
            .lease(Duration::from_secs(10))
            .wait(Duration::ZERO)
            .acquire()
            .await;
        assert!(
            matches!(refused, Err(LockError::Timeout { .. })),
            "lock_all granted while a {holder} holds `{k}`: {refused:?}"
        );
        let single = client
            .lock(k)
            .lease(Duration::from_secs(10))
            .wait(Duration::ZERO)
            .acquire()
            .await;
        assert!(
            matches!(single, Err(LockError::Timeout { .. })),
            "the write lock granted while a {holder} holds `{k}`: {single:?}"
        );
        assert!(
            held.release().await.expect("release"),
            "the {holder} was held"
        );
        let both = client
            .lock_all([k, j])
            .lease(Duration::from_secs(10))
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .expect("granted once the holder is gone");
        assert!(both.release().await.expect("release"));
    }
}
