//! The in-process state every kind's twin runs on: a [`TwinEntry`] per locked key and the
//! fencing counters, behind one mutex ([`Twins`], shared by every client made from
//! clones of one [`Config::in_memory`](crate::Config::in_memory)). Expired entries are swept
//! after as many grants as the state had entries at the last sweep (at least
//! [`MIN_SWEEP_AFTER`]): amortised O(1) per grant. What a try, a release and a renewal do to
//! this state is stated here, once, for the in-process store to run under its mutex: a try
//! runs its kind's twin and takes the token its rule gives ([`State::try_grant`]), a renewal
//! resets one lease, whatever the kind ([`TwinEntry::extend`]). Neighbours: the kinds' twins
//! (`kind/*.rs`) change one entry (`multi.rs`: several keys, all or none); the in-process
//! store (`store/memory.rs`) keeps the store contract over this state; `config.rs` makes it,
//! so it lives below both.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::semaphore::count_mismatch;
use super::{Holding, Kind, Renewal, TokenRule, Try, TwinEntry, TwinReply};
use crate::error::LockError;
use crate::protocol::{AcquireReply, FencingToken, LockKey, RawRecord, Renewed};

/// Grants between two sweeps, at least.
pub(crate) const MIN_SWEEP_AFTER: usize = 1024;

/// Locks held in this process. Shared by every client made from clones of one config.
#[derive(Default)]
pub(crate) struct Twins {
    state: Mutex<State>,
}

impl Twins {
    /// The state, locked (a panic while it was held leaves it usable: every change to it is
    /// made whole before the lock is let go).
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) struct State {
    /// Holders and marks of each key that has any, by lock key.
    pub(crate) locks: HashMap<String, TwinEntry>,
    pub(crate) fences: HashMap<String, Fence>,
    /// Elections' leader records, by lock key (kept like Redis keeps them: until the next
    /// leader's record or its leader's resignation; trusted only beside their holder).
    pub(crate) records: HashMap<String, RawRecord>,
    /// Grants left before the next sweep.
    pub(crate) grants_to_sweep: usize,
    /// Where fencing tokens come from.
    pub(crate) tokens: TokenSource,
}

/// Where a [`State`]'s fencing tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenSource {
    /// Its counters, never below the clock (the in-process store).
    Counters,
    // Taken by the PostgreSQL store, a cargo feature.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    /// The store that loaded this state takes them when it writes the grant (PostgreSQL: a
    /// sequence, read by the statement that commits the grant). A twin that takes one gets
    /// a placeholder, the count of tokens taken so far (1, 2, …), which the store replaces by
    /// its own (ascending, in the same order); `last` is the highest token handed out before
    /// the state was read, what an operator's view reports.
    Store { taken: u64, last: u64 },
}

impl Default for State {
    fn default() -> Self {
        Self {
            locks: HashMap::new(),
            fences: HashMap::new(),
            records: HashMap::new(),
            grants_to_sweep: MIN_SWEEP_AFTER,
            tokens: TokenSource::Counters,
        }
    }
}

/// A key's fencing counter: the last token handed out, kept until `expires_at`.
pub(crate) struct Fence {
    pub(crate) last: u64,
    pub(crate) expires_at: Instant,
}

impl State {
    /// The token a read grant carries: the latest of `key`'s live counter, else the clock
    /// (above every earlier write token, below every later one).
    pub(crate) fn current_token(&mut self, key: &str, now: Instant) -> u64 {
        if let Some(placeholder) = self.store_token() {
            return placeholder;
        }
        self.fences
            .get(key)
            .filter(|fence| fence.expires_at > now)
            .map_or_else(clock_micros, |fence| fence.last)
    }

    /// Runs `f` on `key`'s entry, and forgets the entry if it is left empty.
    pub(crate) fn with_entry<T>(&mut self, key: &str, f: impl FnOnce(&mut TwinEntry) -> T) -> T {
        let entry = self.locks.entry(key.to_owned()).or_default();
        let result = f(entry);
        if entry.is_empty() {
            self.locks.remove(key);
        }
        result
    }

    /// The next fencing token of `key`: above its live counter, and never below the clock in
    /// microseconds, so that a counter forgotten after it expired does not restart low.
    pub(crate) fn next_token(&mut self, key: &str, lease: Duration, now: Instant) -> u64 {
        if let Some(placeholder) = self.store_token() {
            return placeholder;
        }
        let expires_at = counter_expiry(lease, now);
        let live = self
            .fences
            .get(key)
            .filter(|fence| fence.expires_at > now)
            .map_or(0, |fence| fence.last);
        let token = live.saturating_add(1).max(clock_micros());
        self.fences.insert(
            key.to_owned(),
            Fence {
                last: token,
                expires_at,
            },
        );
        token
    }

    /// A placeholder for the token the store takes, when it takes them ([`TokenSource::Store`]).
    fn store_token(&mut self) -> Option<u64> {
        match &mut self.tokens {
            TokenSource::Counters => None,
            TokenSource::Store { taken, .. } => {
                *taken += 1;
                Some(*taken)
            }
        }
    }

    /// No token handed out for `key` so far is above this: its live counter, else the clock;
    /// the store's highest where the store takes them.
    pub(crate) fn token_ceiling(&self, key: &str, now: Instant) -> u64 {
        if let TokenSource::Store { last, .. } = self.tokens {
            return last;
        }
        self.fences
            .get(key)
            .filter(|fence| fence.expires_at > now)
            .map_or(0, |fence| fence.last)
            .max(clock_micros())
    }

    pub(crate) fn entries(&self) -> usize {
        self.locks.len() + self.fences.len()
    }

    /// Counts a grant, and once enough have passed drops expired locks and counters. A sweep
    /// costs the store's size and runs after that many grants, so it is O(1) per grant
    /// amortised, with no background task; the store holds at most its live entries plus the
    /// grants since the last sweep, twice its live size at most.
    pub(crate) fn count_grant_and_sweep(&mut self, now: Instant) {
        self.grants_to_sweep = self.grants_to_sweep.saturating_sub(1);
        if self.grants_to_sweep > 0 {
            return;
        }
        // The caller's clock may be a test's paused one, hours ahead of another test's.
        let now = now.min(Instant::now());
        self.locks.retain(|_, entry| {
            entry.purge(now);
            !entry.is_empty()
        });
        self.fences.retain(|_, fence| fence.expires_at > now);
        self.grants_to_sweep = self.entries().max(MIN_SWEEP_AFTER);
    }
}

/// A grant's life in process, for every kind.
impl State {
    /// A one-key try on its key's entry: its kind's twin, and a grant takes the token its
    /// kind's rule gives. A semaphore of another count with permits held is an error, as the
    /// script's refusal is.
    pub(crate) fn try_grant(
        &mut self,
        attempt: &Try<'_>,
        now: Instant,
    ) -> Result<AcquireReply, LockError> {
        let key = attempt.key;
        let reply = self.with_entry(&key.lock, |entry| attempt.take_twin(entry, now));
        Ok(match reply {
            TwinReply::Held(remaining) => AcquireReply::Held(Some(remaining)),
            TwinReply::Queued {
                place,
                behind,
                remaining,
            } => AcquireReply::Queued {
                place,
                behind,
                // Behind others the holder's lease says nothing of the next try.
                remaining: (!behind).then_some(remaining),
            },
            TwinReply::Mismatch(held) => {
                return Err(count_mismatch(key, attempt.kind.permits(), i64::from(held)));
            }
            TwinReply::Granted => {
                self.count_grant_and_sweep(now);
                let token = match attempt.kind.token_rule() {
                    _ if !attempt.fencing => None,
                    TokenRule::Fresh => Some(self.next_token(&key.fence(), attempt.lease, now)),
                    TokenRule::Latest => Some(self.current_token(&key.fence(), now)),
                };
                AcquireReply::Acquired(token.map(FencingToken))
            }
        })
    }

    /// Gives back `owner`'s grant (or seat) at `key`: whether it was still ours.
    pub(crate) fn give_back(
        &mut self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
        now: Instant,
    ) -> bool {
        self.with_entry(&key.lock, |entry| holding.release_twin(entry, owner, now))
    }

    /// Renews one lease: what became of it.
    pub(crate) fn renew(&mut self, renewal: &Renewal<'_>, now: Instant) -> Renewed {
        Renewed::from(self.with_entry(&renewal.key.lock, |entry| {
            entry.extend(renewal.kind, renewal.owner, renewal.lease, now)
        }))
    }
}

impl TwinEntry {
    /// Resets `owner`'s lease of a grant of `kind` here to end `lease` after `now` — a
    /// renewal, for every kind (and a write lock kept for the rest of its `hold_at_least`,
    /// `keep.lua`'s twin); `false` when `owner` holds no such grant.
    pub(crate) fn extend(
        &mut self,
        kind: Kind,
        owner: &str,
        lease: Duration,
        now: Instant,
    ) -> bool {
        self.purge(now);
        let until = match kind {
            Kind::Write => self
                .writer
                .as_mut()
                .filter(|(holder, _)| holder == owner)
                .map(|(_, until)| until),
            Kind::Read => self.readers.get_mut(owner),
            Kind::Semaphore(_) => self
                .permits
                .as_mut()
                .and_then(|semaphore| semaphore.holders.get_mut(owner)),
        };
        match until {
            Some(until) => {
                *until = now + lease;
                true
            }
            None => false,
        }
    }
}

/// When a counter last used at `now` for a lock of `lease` may be forgotten: one lease later,
/// as on Redis (`scripts/write/acquire.lua`).
pub(crate) fn counter_expiry(lease: Duration, now: Instant) -> Instant {
    now.checked_add(lease).unwrap_or(now)
}

/// Microseconds since the Unix epoch: the floor of every fencing token, as on Redis.
pub(crate) fn clock_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
