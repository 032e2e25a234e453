//! In-process store: the same contract as Redis (leases expire, fencing tokens increase,
//! compare-and-delete), kept in a map behind a mutex. Chosen only by
//! [`Config::in_memory`](crate::Config::in_memory). It only runs twins under its mutex: every
//! kind's (`kind/twins.rs` states a try, a release and a renewal once; `kind/multi.rs` the
//! multi-key pair) and every key operation's (`key_operation.rs`). As on Redis, entries expire: holders with their lease, a fencing counter one lease after
//! its last grant; tokens never fall below the clock in microseconds, so they keep increasing
//! after a counter was forgotten, and a read grant with no counter left carries the clock.
//! Expired entries are swept after as many grants as the store had entries at the last sweep
//! (at least `kind::twins::MIN_SWEEP_AFTER`): amortised O(1) per grant, and the store's size follows the
//! locks in use, not every key ever locked.
//!
//! Its time is tokio's clock of the runtime each request runs on ([`tokio_now`]): in a test
//! with a paused clock, `tokio::time::advance` past a lease frees the lock, as time passing
//! frees it on Redis. A sweep keeps whatever is live on that clock or on the real one, so tests
//! that share one store (the global client) while each moves its own paused clock do not sweep
//! each other's locks as long as their clocks are ahead of real time (any advance puts them
//! there).

use std::sync::Arc;

use super::glob::glob_matches;
use super::wake::ReleaseListener;
use super::{Found, Store};
use crate::clock::{tokio_now, Clock};
use crate::error::LockError;
use crate::key_operation::KeyOperation;
use crate::kind::multi::{MultiReply, MultiTry};
use crate::kind::twins::{State, Twins};
use crate::kind::{Holding, Renewal, Try};
use crate::protocol::{AcquireReply, LockKey, Renewed};

pub(crate) struct MemoryStore {
    twins: Arc<Twins>,
}

impl MemoryStore {
    pub(crate) fn new(twins: Arc<Twins>) -> Self {
        Self { twins }
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.twins.lock())
    }
}

/// Each operation is its twin (`kind/`), run under the store's mutex at tokio's time.
impl Store for MemoryStore {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        let now = tokio_now();
        self.with_state(|state| state.try_grant(attempt, now))
    }

    async fn release(
        &self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
    ) -> Result<bool, LockError> {
        let now = tokio_now();
        Ok(self.with_state(|state| state.give_back(holding, key, owner, now)))
    }

    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        let now = tokio_now();
        Ok(self.with_state(|state| leases.iter().map(|r| state.renew(r, now)).collect()))
    }

    /// Every key is looked at before any is taken, under one hold of the store's mutex.
    async fn acquire_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        let now = tokio_now();
        Ok(self.with_state(|state| state.try_grant_all(attempt, now)))
    }

    async fn release_all(&self, keys: &[&LockKey], owner: &str) -> Result<bool, LockError> {
        let now = tokio_now();
        Ok(self.with_state(|state| state.give_back_all(keys, owner, now)))
    }

    /// The operation's twin, under the store's mutex.
    async fn run<O: KeyOperation>(&self, operation: &O) -> Result<O::Output, LockError> {
        let now = tokio_now();
        Ok(self.with_state(|state| operation.twin(state, now)))
    }

    /// The lock keys held now that match `pattern`.
    async fn scan_into(&self, pattern: &str, found: &mut Found) -> Result<(), LockError> {
        let matches = |key: &str| glob_matches(pattern.as_bytes(), key.as_bytes());
        // As the sweep judges: a caller whose paused clock ran ahead must not purge the live
        // locks of tests on other clocks.
        let now = tokio_now().min(std::time::Instant::now());
        let wanted = found.wanted();
        found.extend(self.with_state(|state| {
            state
                .locks
                .iter_mut()
                .filter_map(|(lock, entry)| {
                    (matches(lock) && !entry.view(now).holders.is_empty()).then(|| lock.clone())
                })
                .take(wanted)
                .collect::<Vec<_>>()
        }));
        Ok(())
    }

    /// Always: the store is this process.
    async fn ping(&self) -> Result<(), LockError> {
        Ok(())
    }

    /// None: waiters in this process try again after their backoff.
    fn waker(&self) -> Option<&ReleaseListener> {
        None
    }

    /// Tokio's: users' tests pause it.
    fn clock(&self) -> Clock {
        Clock::Tokio
    }

    /// A try answers at once.
    fn cuts_tries(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use crate::kind::Kind;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::kind::twins::{clock_micros, counter_expiry, Fence};
    use crate::protocol::FencingToken;

    fn store() -> MemoryStore {
        MemoryStore::new(Arc::new(Twins::default()))
    }

    fn key(name: impl Into<String>) -> LockKey {
        LockKey::new("test:", name.into()).expect("valid key")
    }

    impl MemoryStore {
        fn entries(&self) -> usize {
            self.with_state(|state| state.entries())
        }
    }

    async fn grant(store: &MemoryStore, key: &LockKey, lease: Duration) -> u64 {
        let attempt = Try {
            kind: Kind::Write,
            key,
            owner: "owner",
            lease,
            writer_waiting: Duration::from_millis(100),
            refused_before: false,
            fencing: true,
            seat: None,
            proposed: None,
            deadline: None,
            cut: None,
        };
        match store.acquire(&attempt).await.expect("acquire") {
            AcquireReply::Acquired(Some(FencingToken(token))) => token,
            AcquireReply::Acquired(None) => panic!("a grant without a token"),
            AcquireReply::Held(_) | AcquireReply::Queued { .. } | AcquireReply::TooLow(_) => {
                panic!("{} is held", key.name)
            }
        }
    }

    /// Grant-and-release cycles on one key: enough of them for every sweep to come due.
    async fn churn_one_key(store: &MemoryStore, cycles: usize) {
        let key = key("busy");
        for _ in 0..cycles {
            grant(store, &key, Duration::from_millis(400)).await;
            assert!(store
                .release(Holding::Grant(Kind::Write), &key, "owner")
                .await
                .expect("release"));
        }
    }

    #[tokio::test]
    async fn the_store_follows_the_locks_in_use_not_every_key_ever_locked() {
        let store = store();
        for i in 0..200_000 {
            let key = key(format!("k{i}"));
            grant(&store, &key, Duration::from_millis(400)).await;
            assert!(store
                .release(Holding::Grant(Kind::Write), &key, "owner")
                .await
                .expect("release"));
        }
        // Expiry is a matter of time here, not an event: let every counter (kept one 400 ms
        // lease after its grant) expire.
        std::thread::sleep(Duration::from_millis(500));
        churn_one_key(&store, 2 * 200_000).await;
        let entries = store.entries();
        assert!(
            entries <= 2,
            "{entries} entries left after 200,000 keys were locked, released and expired"
        );
    }

    #[tokio::test]
    async fn locks_whose_lease_ran_out_unreleased_are_forgotten() {
        let store = store();
        for i in 0..50_000 {
            grant(
                &store,
                &key(format!("abandoned-{i}")),
                Duration::from_millis(10),
            )
            .await;
        }
        std::thread::sleep(Duration::from_millis(100));
        churn_one_key(&store, 2 * 100_000).await;
        let entries = store.entries();
        assert!(
            entries <= 2,
            "{entries} entries left of 50,000 abandoned locks"
        );
    }

    #[test]
    fn a_sweep_on_a_clock_hours_ahead_keeps_the_locks_of_callers_on_real_time() {
        let store = store();
        let live = key("live");
        let runtime = |paused| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(paused)
                .build()
                .expect("runtime")
        };
        // Taken on a running clock, for a minute.
        runtime(false).block_on(grant(&store, &live, Duration::from_secs(60)));
        // Another test's paused clock, two hours ahead, sweeps the store.
        runtime(true).block_on(async {
            tokio::time::advance(Duration::from_secs(2 * 3600)).await;
            store.with_state(|state| state.grants_to_sweep = 1);
            grant(&store, &key("ahead"), Duration::from_secs(60)).await;
        });
        let held = runtime(false).block_on(store.acquire(&Try {
            kind: Kind::Write,
            key: &live,
            owner: "rival",
            lease: Duration::from_secs(60),
            writer_waiting: Duration::ZERO,
            refused_before: false,
            fencing: true,
            seat: None,
            proposed: None,
            deadline: None,
            cut: None,
        }));
        assert!(
            matches!(held, Ok(AcquireReply::Held(_))),
            "a sweep on a clock hours ahead freed a live lock: {held:?}"
        );
    }

    #[tokio::test]
    async fn tokens_keep_increasing_after_a_counter_expired() {
        let store = store();
        let key = key("k");
        let lease = Duration::from_millis(100); // kept from grant to release on a loaded machine
                                                // Many grants in a row, then a wait past the counter's keep time.
        let mut last = 0;
        for _ in 0..10_000 {
            let token = grant(&store, &key, lease).await;
            assert!(token > last, "{token} after {last}");
            last = token;
            assert!(store
                .release(Holding::Grant(Kind::Write), &key, "owner")
                .await
                .expect("release"));
        }
        std::thread::sleep(lease + Duration::from_millis(50));
        // Force a sweep so the counter is really forgotten, not just stale.
        store.with_state(|state| state.grants_to_sweep = 1);
        let after = grant(&store, &key, lease).await;
        assert!(
            store.with_state(|state| state.fences.len()) == 1,
            "the old counter was swept and a new one made"
        );
        assert!(after > last, "{after} after an expired counter's {last}");
    }

    #[tokio::test]
    async fn tokens_strictly_increase_across_rapid_grants_of_one_key() {
        let store = store();
        let key = key("rapid");
        let lease = Duration::from_millis(100); // kept from grant to release on a loaded machine
        let mut last = 0;
        for _ in 0..10_000 {
            let token = grant(&store, &key, lease).await;
            assert!(token > last, "token {token} after {last}");
            last = token;
            assert!(store
                .release(Holding::Grant(Kind::Write), &key, "owner")
                .await
                .expect("release"));
        }
        // Grants under one hold of the mutex come several to a microsecond, so many share a
        // clock reading and only the counter keeps their tokens apart.
        store.with_state(|state| {
            for _ in 0..100_000 {
                let token = state.next_token(&key.fence(), lease, Instant::now());
                assert!(
                    token > last,
                    "token {token} after {last} in the same microsecond"
                );
                last = token;
            }
        });
        // Grants that outpace the clock leave a live counter ahead of it: the counter goes on.
        let ahead = clock_micros() + 60_000_000;
        store.with_state(|state| {
            let fence = Fence {
                last: ahead,
                expires_at: counter_expiry(lease, Instant::now()),
            };
            state.fences.insert(key.fence().clone(), fence);
        });
        let token = grant(&store, &key, lease).await;
        assert_eq!(
            token,
            ahead + 1,
            "a live counter ahead of the clock was not followed"
        );
    }

    #[tokio::test]
    async fn a_read_after_the_counter_expired_sorts_between_the_write_tokens() {
        let store = store();
        let key = key("read-after");
        let lease = Duration::from_millis(20);
        let written = grant(&store, &key, lease).await;
        assert!(store
            .release(Holding::Grant(Kind::Write), &key, "owner")
            .await
            .expect("release"));
        std::thread::sleep(lease + Duration::from_millis(30));
        let read = match store
            .acquire(&Try {
                kind: Kind::Read,
                key: &key,
                owner: "reader",
                lease,
                writer_waiting: Duration::ZERO,
                refused_before: false,
                fencing: true,
                seat: None,
                proposed: None,
                deadline: None,
                cut: None,
            })
            .await
            .expect("read")
        {
            AcquireReply::Acquired(Some(token)) => token.0,
            AcquireReply::Acquired(None) => panic!("a grant without a token"),
            AcquireReply::Held(_) | AcquireReply::Queued { .. } | AcquireReply::TooLow(_) => {
                panic!("nobody holds the lock")
            }
        };
        assert!(read > written, "read {read} after write {written}");
        assert!(store
            .release(Holding::Grant(Kind::Read), &key, "reader")
            .await
            .expect("release"));
        let next = grant(&store, &key, lease).await;
        assert!(next > read, "write {next} after read {read}");
    }
}
