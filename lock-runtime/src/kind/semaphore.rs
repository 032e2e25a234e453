//! Semaphores ([`semaphore`](crate::semaphore)): at most N holders of a key at once, each with
//! a permit of its own — its own owner token and lease, renewed by the watchdog — so a crashed
//! holder's permit comes back when its lease ends and no release frees another's. On Redis
//! the lock key is a sorted set of the permit owners scored by lease end on the server clock,
//! purged before counting, plus a `#permits:N` marker that keeps the count while the key lives
//! (`scripts/semaphore/{acquire,release}.lua`); renewals share the read branch of
//! `scripts/extend_many.lua`, which resets one member's score as for a reader. The in-process
//! twin is [`Permits`] on the key's [`TwinEntry`]. A key is either a semaphore or a read/write
//! lock at any one time: a writer or reader waits while permits are held, and a permit waits
//! while a writer or readers hold the key. Neighbours: `kind/mod.rs` dispatches here;
//! `store/redlock.rs` asks [`quorum`] how many masters a permit needs.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Instant;

use crate::script::{LuaScript, ScriptCall};

use super::{Tokens, Try, TwinEntry, TwinReply};
use crate::error::LockError;
use crate::protocol::LockKey;

static ACQUIRE: LazyLock<LuaScript> =
    LazyLock::new(|| super::script(include_str!("../../scripts/semaphore/acquire.lua")));
pub(super) static RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("../../scripts/semaphore/release.lua")));

/// How many of `masters` Redlock masters must grant a permit of a semaphore of `permits`: a
/// quorum `q` with `q > permits · masters / (permits + 1)`. Each master holds at most
/// `permits` owners, so `h` holders that each hold `q` masters need `h · q ≤ permits ·
/// masters`; with this `q`, `permits + 1` holders cannot. A majority per permit is not enough:
/// with 3 masters and 5 permits, 7 holders could each hold 2 masters. With one permit it is
/// the usual majority; with 3 masters and 2 permits or more, every master must grant — so a
/// semaphore over 3 masters is unavailable while one of them is down.
pub(crate) fn quorum(permits: u32, masters: usize) -> usize {
    let permits = u64::from(permits.max(1));
    let masters_u64 = u64::try_from(masters).unwrap_or(u64::MAX);
    let bound = permits.saturating_mul(masters_u64) / (permits + 1) + 1;
    usize::try_from(bound)
        .unwrap_or(masters)
        .min(masters)
        .max(masters / 2 + 1)
}

pub(super) fn acquire_call(attempt: &Try<'_>, permits: u32, tokens: Tokens) -> ScriptCall {
    let mut call = super::acquire_invocation(&ACQUIRE, attempt, tokens);
    call.arg(permits);
    call
}

/// The error for a request naming `asked` permits of a key that is a semaphore of `held`
/// permits while some are held: a count is never changed silently.
pub(crate) fn count_mismatch(key: &LockKey, asked: u32, held: i64) -> LockError {
    LockError::PermitsMismatch {
        key: key.name.clone(),
        asked,
        held: u32::try_from(held).ok(),
    }
}

/// The error for a semaphore of zero permits.
pub(crate) fn no_permits(key: &LockKey) -> LockError {
    LockError::Config(format!(
        "lock `{}` was requested as a semaphore of 0 permits, which nobody could ever take; \
         ask for at least 1 permit",
        key.name
    ))
}

/// The in-process twin of a semaphore key: its count and every permit holder with when its
/// lease ends (the twin of the sorted set and its marker).
#[derive(Debug, Clone)]
pub(crate) struct Permits {
    pub(crate) count: u32,
    pub(crate) holders: HashMap<String, Instant>,
}

impl TwinEntry {
    /// When the last permit of a semaphore key ends, if permits are held.
    pub(crate) fn permits_until(&self) -> Option<Instant> {
        self.permits
            .as_ref()
            .and_then(|permits| permits.holders.values().max().copied())
    }
}

pub(super) fn acquire_twin(
    entry: &mut TwinEntry,
    attempt: &Try<'_>,
    permits: u32,
    now: Instant,
) -> TwinReply {
    entry.purge(now);
    if let Some((_, until)) = &entry.writer {
        return TwinReply::Held(*until - now);
    }
    if let Some(until) = entry.readers.values().max() {
        return TwinReply::Held(*until - now);
    }
    let semaphore = entry.permits.get_or_insert_with(|| Permits {
        count: permits,
        holders: HashMap::new(),
    });
    if semaphore.count != permits {
        if !semaphore.holders.is_empty() {
            return TwinReply::Mismatch(semaphore.count);
        }
        semaphore.count = permits;
    }
    let full = semaphore.holders.len() >= usize::try_from(permits).unwrap_or(usize::MAX);
    if full && !semaphore.holders.contains_key(attempt.owner) {
        let first = semaphore.holders.values().min().copied().unwrap_or(now);
        return TwinReply::Held(first.saturating_duration_since(now));
    }
    semaphore
        .holders
        .insert(attempt.owner.to_owned(), now + attempt.lease);
    TwinReply::Granted
}

pub(super) fn release_twin(entry: &mut TwinEntry, owner: &str, now: Instant) -> bool {
    entry.purge(now);
    let Some(semaphore) = entry.permits.as_mut() else {
        return false;
    };
    let ours = semaphore.holders.remove(owner).is_some();
    entry.purge(now);
    ours
}

#[cfg(test)]
mod tests {
    use super::quorum;

    #[test]
    fn a_permit_needs_more_than_permits_times_masters_over_permits_plus_one_masters() {
        // One permit: the usual majority.
        assert_eq!(quorum(1, 3), 2);
        assert_eq!(quorum(1, 5), 3);
        // Three masters, two permits or more: every master.
        for permits in [2, 5, 100, u32::MAX] {
            assert_eq!(quorum(permits, 3), 3, "{permits} permits");
        }
        assert_eq!(quorum(2, 5), 4);
        assert_eq!(quorum(3, 5), 4);
        assert_eq!(quorum(4, 5), 5);
        assert_eq!(quorum(2, 7), 5);
        // The bound holds: permits + 1 holders, each on `q` masters, do not fit on the
        // masters' `permits` places each; and `q` is the smallest such count.
        for masters in 1..=9usize {
            for permits in 1..=12u32 {
                let q = quorum(permits, masters);
                let n = permits as usize;
                assert!(
                    (n + 1) * q > n * masters,
                    "{permits} permits, {masters} masters"
                );
                assert!(q <= masters);
                if q > masters / 2 + 1 {
                    assert!((n + 1) * (q - 1) <= n * masters, "{q} is not the smallest");
                }
            }
        }
    }
}
