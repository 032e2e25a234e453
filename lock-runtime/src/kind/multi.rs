//! Multi-key locks ([`lock_all`](crate::lock_all)): the write lock of several keys taken all
//! together or not at all, under one owner token, each key with a fencing token of its own.
//! Every key stays an ordinary write lock key (`write.rs`), so renewals (`extend_many.lua`),
//! `inspect`, `force_unlock` and `list` work on it as on any other; only taking and giving
//! back differ: `scripts/multi/{acquire,release}.lua` look at every key of one node (or one
//! Cluster slot) before writing any, and the in-process twin does the same in one critical
//! section. Neighbours: the stores (`store/`) run these calls — Cluster one per slot, in a
//! fixed order, undoing a partial grant; Redlock on every master — and `crate::multi` runs the
//! acquire loop.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use crate::script::{LuaScript, ScriptCall};

use super::twins::State;
use super::{millis, Holding, Kind, Tokens, TwinEntry};
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::protocol::FencingToken;
use crate::protocol::{Announce, LockKey, TooLow};
use redis::cluster_routing::Slot;

static ACQUIRE: LazyLock<LuaScript> =
    LazyLock::new(|| super::script(include_str!("../../scripts/multi/acquire.lua")));
static RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("../../scripts/multi/release.lua")));

/// One try to take every key of a multi-key lock, as the acquire loop sends it to a store.
/// The fields mean what [`Try`](super::Try)'s do, for every key at once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MultiTry<'a> {
    /// The keys, deduplicated, in the fixed order they are taken in.
    pub(crate) keys: &'a [LockKey],
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
    pub(crate) writer_waiting: Duration,
    pub(crate) refused_before: bool,
    pub(crate) fencing: bool,
    /// Every key's token, where tokens come from a counter (as [`Try`](super::Try)'s).
    pub(crate) proposed: Option<FencingToken>,
    /// When the request's wait ends (as [`Try`](super::Try)'s).
    pub(crate) deadline: Option<Instant>,
    /// When the acquire loop cuts this try off (as [`Try`](super::Try)'s).
    pub(crate) cut: Option<Instant>,
}

impl<'a> MultiTry<'a> {
    /// The same try for a part of its keys (one Cluster slot's).
    pub(crate) fn part(&self, keys: &'a [LockKey]) -> Self {
        Self { keys, ..*self }
    }
}

/// What one try of a multi-key lock found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MultiReply {
    /// Every key granted, with a token per key in the try's order (`None` without fencing).
    Acquired(Vec<Option<FencingToken>>),
    /// Nothing taken: a key was held. The longest any held key is kept (`None`: unknown), and
    /// the position of a held key, whose release the caller may wait for.
    Held(Option<Duration>, usize),
    /// Nothing taken: no key was held, but the proposed token was too low for a key's
    /// counter or the server's clock ([`AcquireReply::TooLow`](crate::protocol::AcquireReply::TooLow)).
    TooLow(TooLow),
}

/// The script call of one try, for keys that share a node (or a Cluster slot).
pub(crate) fn acquire_call(attempt: &MultiTry<'_>, tokens: Tokens) -> ScriptCall {
    let mut call = ACQUIRE.prepare_invoke();
    for key in attempt.keys {
        super::lock_keys(&mut call, key, tokens);
    }
    call.arg(attempt.owner).arg(millis(attempt.lease));
    super::token_source(
        &mut call,
        attempt.fencing,
        tokens,
        attempt.lease,
        attempt.proposed,
    );
    super::writer_waiting_args(&mut call, attempt.writer_waiting, attempt.refused_before);
    call.arg(if tokens == Tokens::Counter { 2 } else { 1 });
    for key in attempt.keys {
        call.arg(key.writer_waiting());
    }
    call
}

/// Reads the acquire script's reply: `{1, token…}`, `{0, ms, position}` or `{2, hint, clock}`.
pub(crate) fn read_acquire_reply(
    attempt: &MultiTry<'_>,
    reply: &[i64],
) -> Result<MultiReply, LockError> {
    let unexpected = || {
        LockError::from(BackendError::new(
            "acquire",
            BackendErrorKind::Server,
            format!("unexpected reply to a multi-key acquire: {reply:?}"),
        ))
    };
    match reply {
        [1, tokens @ ..] if tokens.len() == attempt.keys.len() => {
            if !attempt.fencing {
                return Ok(MultiReply::Acquired(vec![None; tokens.len()]));
            }
            tokens
                .iter()
                .map(|&token| u64::try_from(token).map(|t| Some(FencingToken(t))))
                .collect::<Result<_, _>>()
                .map(MultiReply::Acquired)
                .map_err(|_| unexpected())
        }
        [2, hint, clock] => Ok(MultiReply::TooLow(TooLow::read(*hint, *clock))),
        [0, ms, position] => {
            let remaining = u64::try_from(*ms).ok().map(Duration::from_millis);
            // -2: every held key vanished meanwhile; try again at once.
            let remaining = if *ms == -2 {
                Some(Duration::ZERO)
            } else {
                remaining
            };
            let position = usize::try_from(*position)
                .ok()
                .and_then(|p| p.checked_sub(1))
                .filter(|&p| p < attempt.keys.len())
                .ok_or_else(unexpected)?;
            Ok(MultiReply::Held(remaining, position))
        }
        _ => Err(unexpected()),
    }
}

/// The script call that gives `owner`'s grant of every key in `keys` back (keys that share a
/// node or a Cluster slot), announcing each freed key as `announce` says (`None`: to nobody).
pub(crate) fn release_call<'k>(
    keys: impl IntoIterator<Item = &'k LockKey>,
    owner: &str,
    announce: Option<Announce>,
) -> ScriptCall {
    let keys: Vec<&LockKey> = keys.into_iter().collect();
    let mut call = RELEASE.prepare_invoke();
    for key in &keys {
        call.key(&key.lock);
    }
    call.arg(owner).arg(Announce::argument(announce));
    for key in &keys {
        call.arg(key.channel());
    }
    call
}

/// The in-process twin of a multi-key try and its release.
impl State {
    /// Looks at every key before taking any (all or none, as the script does): held when any
    /// is, for as long as the longest of them (the writer-waiting mark set on each, as the
    /// script sets it), at the first held key; else every key's write lock, each with the next
    /// fencing token.
    pub(crate) fn try_grant_all(&mut self, attempt: &MultiTry<'_>, now: Instant) -> MultiReply {
        let mut held: Option<(Duration, usize)> = None;
        for (i, key) in attempt.keys.iter().enumerate() {
            let blocked = self.with_entry(&key.lock, |entry| blocked_twin(entry, attempt, now));
            if let Some(remaining) = blocked {
                held = Some(held.map_or((remaining, i), |(r, first)| (r.max(remaining), first)));
            }
        }
        if let Some((remaining, first)) = held {
            return MultiReply::Held(Some(remaining), first);
        }
        let mut tokens = Vec::with_capacity(attempt.keys.len());
        for key in attempt.keys {
            self.with_entry(&key.lock, |entry| grant_twin(entry, attempt, now));
            self.count_grant_and_sweep(now);
            tokens.push(
                attempt
                    .fencing
                    .then(|| FencingToken(self.next_token(&key.fence(), attempt.lease, now))),
            );
        }
        MultiReply::Acquired(tokens)
    }

    /// Gives back `owner`'s write lock of each of `keys`: whether every one was still ours.
    pub(crate) fn give_back_all(&mut self, keys: &[&LockKey], owner: &str, now: Instant) -> bool {
        let mut all = true;
        for key in keys {
            all &= self.give_back(Holding::Grant(Kind::Write), key, owner, now);
        }
        all
    }
}

/// The twin's first half, on one key's entry: `None` when the key is free or `owner`'s, else
/// how long its holders keep it (and the writer-waiting mark is set, as the script sets it).
fn blocked_twin(entry: &mut TwinEntry, attempt: &MultiTry<'_>, now: Instant) -> Option<Duration> {
    entry.purge(now);
    let until = entry.writer_blocked_until(attempt.owner)?;
    entry.mark_writer_waiting(attempt.writer_waiting, now);
    Some(until - now)
}

/// The twin's second half, once no key is blocked: takes one key's write lock.
fn grant_twin(entry: &mut TwinEntry, attempt: &MultiTry<'_>, now: Instant) {
    entry.writer = Some((attempt.owner.to_owned(), now + attempt.lease));
    if attempt.refused_before {
        entry.writer_waiting = None;
    }
}

/// The keys of a multi-key request in the order every request takes them: sorted by lock
/// key, duplicates once, then the keys of one Cluster slot moved next to the first of them (so
/// each slot's keys go in one script; the slots' order follows from the sorted keys, the same
/// for every request).
pub(crate) fn ordered_keys(prefix: &str, names: Vec<String>) -> Result<Vec<LockKey>, LockError> {
    let mut keys = names
        .into_iter()
        .map(|name| LockKey::new(prefix, name))
        .collect::<Result<Vec<_>, _>>()?;
    keys.sort_by(|a, b| a.lock.cmp(&b.lock));
    keys.dedup_by(|a, b| a.lock == b.lock);
    let mut slots: Vec<(Slot, Vec<LockKey>)> = Vec::new();
    for key in keys {
        let slot = Slot::for_key(&key.lock);
        match slots.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(key),
            None => slots.push((slot, vec![key])),
        }
    }
    Ok(slots.into_iter().flat_map(|(_, group)| group).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_taken_in_one_order_whatever_order_they_are_given_in() {
        let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let a = ordered_keys("p:", names(&["b", "a", "c", "a"])).unwrap();
        let b = ordered_keys("p:", names(&["c", "a", "b"])).unwrap();
        let locks = |keys: &[LockKey]| keys.iter().map(|k| k.lock.clone()).collect::<Vec<_>>();
        assert_eq!(locks(&a), locks(&b));
        assert_eq!(a.len(), 3, "duplicates are taken once");
        assert!(matches!(
            ordered_keys("p:", names(&["a", ""])),
            Err(LockError::InvalidKey { .. })
        ));
    }
}
