//! In-process backend: the same contract as Redis (leases expire, fencing tokens increase,
//! compare-and-delete), kept in a map behind a mutex. Chosen only by
//! [`Config::in_memory`](crate::Config::in_memory).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{AcquireReply, LockBackend, LockKey, Renewal};
use crate::error::LockError;
use crate::FencingToken;

/// Locks held in this process. Shared by every client made from clones of one config.
#[derive(Default)]
pub(crate) struct MemoryStore {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    held: HashMap<String, Held>,
    fences: HashMap<String, u64>,
}

struct Held {
    owner: String,
    expires_at: Instant,
}

impl State {
    /// The live holder of `key`, dropping one whose lease has run out.
    fn holder(&mut self, key: &str, now: Instant) -> Option<&mut Held> {
        if self.held.get(key).is_some_and(|h| h.expires_at <= now) {
            self.held.remove(key);
        }
        self.held.get_mut(key)
    }
}

pub(crate) struct MemoryBackend {
    store: Arc<MemoryStore>,
}

impl MemoryBackend {
    pub(crate) fn new(store: Arc<MemoryStore>) -> Self {
        Self { store }
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self
            .store
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner))
    }
}

/// Microseconds since the Unix epoch: the seed of a new fencing counter, as on Redis.
fn clock_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl LockBackend for MemoryBackend {
    async fn acquire(
        &self,
        key: &LockKey,
        owner: &str,
        lease: Duration,
    ) -> Result<AcquireReply, LockError> {
        let now = Instant::now();
        Ok(self.with_state(|state| {
            if let Some(holder) = state.holder(&key.lock, now) {
                return AcquireReply::Held(Some(holder.expires_at - now));
            }
            state.held.insert(
                key.lock.clone(),
                Held {
                    owner: owner.to_owned(),
                    expires_at: now + lease,
                },
            );
            let fence = state
                .fences
                .entry(key.fence.clone())
                .or_insert_with(clock_seed);
            *fence += 1;
            AcquireReply::Acquired(FencingToken(*fence))
        }))
    }

    async fn release(&self, key: &LockKey, owner: &str) -> Result<bool, LockError> {
        let now = Instant::now();
        Ok(self.with_state(|state| {
            let ours = state
                .holder(&key.lock, now)
                .is_some_and(|h| h.owner == owner);
            if ours {
                state.held.remove(&key.lock);
            }
            ours
        }))
    }

    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let now = Instant::now();
        Ok(self.with_state(|state| {
            leases
                .iter()
                .map(|r| match state.holder(&r.key.lock, now) {
                    Some(holder) if holder.owner == r.owner => {
                        holder.expires_at = now + r.lease;
                        true
                    }
                    _ => false,
                })
                .collect()
        }))
    }
}
