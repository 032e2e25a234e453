//! The operator's operations — not a lock kind, but two operations on a key's lock written
//! once for every kind (the lock key's type says which side holds it), each a
//! [`KeyOperation`] that every store runs: a read-only view ([`Inspect`]) and a forced release
//! ([`ForceUnlock`]) that also hands out a fencing token above every earlier one. Scripts:
//! `scripts/operator/{inspect,force_unlock}.lua`; the in-process twins are [`TwinEntry::view`]
//! and [`TwinEntry::evict`]; how Redlock's masters' views make one is [`merge_views`].
//! Neighbours: the stores in `store/` run these (Redlock raises its fencing counters around a
//! forced release, `store/redlock/fencing.rs`); `inspect.rs` turns a [`RawView`] into the
//! public [`LockState`](crate::LockState).

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use crate::script::{LuaScript, ScriptCall};

use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::key_operation::{quorum_answered, KeyOperation, NoAgreement};
use crate::kind::twins::State;
use crate::kind::{millis, Tokens, TwinEntry};
use crate::protocol::LockMode;
use crate::protocol::{Announce, LockKey, RawRecord};

static INSPECT: LazyLock<LuaScript> =
    LazyLock::new(|| crate::kind::script(include_str!("../scripts/operator/inspect.lua")));
static FORCE_UNLOCK: LazyLock<LuaScript> =
    LazyLock::new(|| crate::kind::script(include_str!("../scripts/operator/force_unlock.lua")));

/// How long a fencing counter raised by a force-unlock lives at least ([`Tokens::Counter`]):
/// long enough that the clock of every master has passed the token when it lapses, as long as
/// the masters' clocks agree within it.
pub(crate) const FORCED_FENCE_TTL: Duration = Duration::from_secs(60);

/// One holder as a store sees it: its owner token and how long its lease has left (`None`:
/// no expiry).
pub(crate) type RawHolder = (String, Option<Duration>);

/// What one node (or the in-process store) says of a lock.
#[derive(Debug, Clone, Default)]
pub(crate) struct RawView {
    /// Which side holds it, if any.
    pub(crate) mode: Option<LockMode>,
    /// The writer, or every live reader.
    pub(crate) holders: Vec<RawHolder>,
    /// The lock key's remaining time to live (`None`: not held, or no expiry).
    pub(crate) remaining: Option<Duration>,
    /// A writer's waiting mark is set.
    pub(crate) writer_waiting: bool,
    /// Clients subscribed to the release channel.
    pub(crate) subscribers: u64,
    /// A value no token handed out so far exceeds: the clock in µs, or the counter if higher.
    pub(crate) token_ceiling: u64,
    /// The count of a semaphore key (`None`: not a semaphore).
    pub(crate) permits: Option<u32>,
    /// Fair waiters in the key's queue.
    pub(crate) queued: u64,
    /// The leader record beside the lock, if the key is an election's; trusted only while
    /// its owner is the holder ([`LeaderInfo::from_view`](crate::LeaderInfo)).
    pub(crate) record: Option<RawRecord>,
}

/// The view's script call. `announce` chooses how subscribers are counted (sharded on Cluster).
fn inspect_call(key: &LockKey, announce: Announce, tokens: Tokens) -> ScriptCall {
    let mut call = INSPECT.prepare_invoke();
    crate::kind::lock_keys(&mut call, key, tokens);
    call.arg(match announce {
        Announce::Publish => "NUMSUB",
        Announce::ShardedPublish => "SHARDNUMSUB",
    })
    .arg(key.writer_waiting())
    .arg(key.channel())
    .arg(key.queue_deadlines())
    .arg(key.leader());
    call
}

/// The force-unlock's script call.
fn force_unlock_call(key: &LockKey, announce: Announce, tokens: Tokens) -> ScriptCall {
    let mut call = FORCE_UNLOCK.prepare_invoke();
    crate::kind::lock_keys(&mut call, key, tokens);
    call.arg(announce.command())
        .arg(millis(FORCED_FENCE_TTL))
        .arg(key.writer_waiting())
        .arg(key.channel());
    call
}

/// The inspect script's reply, as its header describes it.
type InspectReply = (
    String,
    i64,
    Vec<(String, i64)>,
    i64,
    u64,
    u64,
    u64,
    Option<String>,
    Option<u32>,
    u64,
    Option<(String, String, Option<Vec<u8>>, Option<String>)>,
);

/// Reads the inspect script's reply.
fn read_inspect_reply(key: &LockKey, reply: InspectReply) -> Result<RawView, LockError> {
    let (
        held,
        pttl,
        holders,
        waiting,
        subscribers,
        seconds,
        micros,
        counter,
        permits,
        queued,
        record,
    ) = reply;
    let mode = match held.as_str() {
        "none" => None,
        "string" => Some(LockMode::Write),
        "zset" if permits.is_some() => Some(LockMode::Semaphore),
        "zset" => Some(LockMode::Read),
        other => return Err(not_a_lock(key, other)),
    };
    let holders = read_holders(holders);
    let clock = seconds.saturating_mul(1_000_000).saturating_add(micros);
    // Decimal digits (the script refuses anything else): only a value past `u64` fails to
    // parse, and it is above every token.
    let counter = counter.map_or(0, |c| c.parse::<u64>().unwrap_or(u64::MAX));
    Ok(RawView {
        // A readers' set whose every lease ended is no lock any more.
        mode: mode.filter(|_| !holders.is_empty()),
        holders,
        remaining: remaining(pttl),
        writer_waiting: waiting != -2,
        subscribers,
        token_ceiling: clock.max(counter),
        permits,
        queued,
        record: record.and_then(|(epoch, owner, value, revision)| {
            Some(RawRecord {
                epoch: epoch.parse().ok()?,
                owner,
                value,
                // A record written before revisions: its campaign's.
                revision: revision.map_or(Ok(0), |r| r.parse()).ok()?,
            })
        }),
    })
}

/// Reads the force-unlock script's reply: the evicted holders and the fresh token.
fn read_force_unlock_reply((holders, token): (Vec<(String, i64)>, u64)) -> (Vec<RawHolder>, u64) {
    (read_holders(holders), token)
}

fn read_holders(holders: Vec<(String, i64)>) -> Vec<RawHolder> {
    holders
        .into_iter()
        .map(|(owner, ms)| (owner, remaining(ms)))
        .collect()
}

/// A PTTL as a remaining time: `None` for -1 (no expiry) and -2 (no key).
fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

fn not_a_lock(key: &LockKey, held: &str) -> LockError {
    BackendError::new(
        "inspect",
        BackendErrorKind::Server,
        format!(
            "the Redis key `{}` of lock `{}` holds a {held}, not a lock; another application \
             uses the same key (choose another `Config::key_prefix`)",
            key.lock, key.name
        ),
    )
    .into()
}

/// What the store says of a key's lock, read-only (`Client::inspect`); on Redlock, what a
/// majority of the masters agree on ([`merge_views`]).
pub(crate) struct Inspect<'a>(pub(crate) &'a LockKey);

impl KeyOperation for Inspect<'_> {
    const NAME: &'static str = "inspect";
    type Reply = InspectReply;
    type Output = RawView;

    fn key(&self) -> &LockKey {
        self.0
    }

    fn call(&self, announce: Announce, tokens: Tokens) -> ScriptCall {
        inspect_call(self.0, announce, tokens)
    }

    fn read(&self, reply: InspectReply, _: bool) -> Result<RawView, LockError> {
        read_inspect_reply(self.0, reply)
    }

    fn twin(&self, state: &mut State, now: Instant) -> RawView {
        let key = self.0;
        let mut view = state.with_entry(&key.lock, |entry| entry.view(now));
        view.token_ceiling = state.token_ceiling(&key.fence(), now);
        view.record = state.records.get(&key.lock).cloned();
        view
    }

    fn agree(
        &self,
        answers: Vec<Result<RawView, LockError>>,
        quorum: usize,
    ) -> Result<RawView, NoAgreement> {
        Ok(merge_views(&quorum_answered(answers, quorum)?, quorum))
    }
}

/// Frees a key's lock whatever holds it and wakes its waiters (`Client::force_unlock`): the
/// evicted holders, and a fencing token above every token handed out for the key so far,
/// which the counter keeps (so every later grant's token is greater).
pub(crate) struct ForceUnlock<'a>(pub(crate) &'a LockKey);

impl KeyOperation for ForceUnlock<'_> {
    const NAME: &'static str = "force unlock";
    type Reply = (Vec<(String, i64)>, u64);
    type Output = (Vec<RawHolder>, u64);

    fn key(&self) -> &LockKey {
        self.0
    }

    fn call(&self, announce: Announce, tokens: Tokens) -> ScriptCall {
        force_unlock_call(self.0, announce, tokens)
    }

    fn read(&self, reply: Self::Reply, _: bool) -> Result<Self::Output, LockError> {
        Ok(read_force_unlock_reply(reply))
    }

    fn twin(&self, state: &mut State, now: Instant) -> Self::Output {
        let key = self.0;
        let evicted = state.with_entry(&key.lock, |entry| entry.evict(now));
        (
            evicted,
            state.next_token(&key.fence(), FORCED_FENCE_TTL, now),
        )
    }

    /// The evicted are the holders a quorum had, as `inspect` shows them (a stale grant on a
    /// minority of masters held nothing; it is deleted all the same); the token is the
    /// largest a master answered, which is above its counter.
    fn agree(
        &self,
        answers: Vec<Result<Self::Output, LockError>>,
        quorum: usize,
    ) -> Result<Self::Output, NoAgreement> {
        let freed = quorum_answered(answers, quorum)?;
        let token = freed.iter().map(|(_, t)| *t).max().unwrap_or(0);
        let mut seen: Vec<(RawHolder, usize)> = Vec::new();
        for (holders, _) in freed {
            for (owner, remaining) in holders {
                match seen.iter_mut().find(|((o, _), _)| *o == owner) {
                    Some((known, count)) => {
                        known.1 = known.1.max(remaining);
                        *count += 1;
                    }
                    None => seen.push(((owner, remaining), 1)),
                }
            }
        }
        let evicted: Vec<RawHolder> = seen
            .into_iter()
            .filter(|(_, count)| *count >= quorum)
            .map(|(holder, _)| holder)
            .collect();
        Ok((evicted, token))
    }
}

/// One view of a lock from several views of it (Redlock's masters'): a holder counts when at
/// least `quorum` views have its owner token, with the lease that quorum keeps (the
/// `quorum`-th longest of its remaining leases); the waiting processes are the most any view
/// counts (each listens on every master it reaches), the fair waiters are the most any view
/// queues, the writer-waiting mark counts when any view has it, and the token ceiling is the
/// highest.
pub(crate) fn merge_views(views: &[RawView], quorum: usize) -> RawView {
    let mut seen: Vec<(&str, Vec<Option<Duration>>)> = Vec::new();
    for view in views {
        for (owner, remaining) in &view.holders {
            match seen.iter_mut().find(|(o, _)| o == owner) {
                Some((_, leases)) => leases.push(*remaining),
                None => seen.push((owner, vec![*remaining])),
            }
        }
    }
    let holders: Vec<RawHolder> = seen
        .into_iter()
        .filter(|(_, leases)| leases.len() >= quorum)
        .map(|(owner, mut leases)| {
            // `None` (no expiry) sorts first: longest first after the reversal.
            leases.sort_unstable_by(|a, b| match (a, b) {
                (None, None) => std::cmp::Ordering::Equal,
                (None, _) => std::cmp::Ordering::Less,
                (_, None) => std::cmp::Ordering::Greater,
                (Some(a), Some(b)) => b.cmp(a),
            });
            (owner.to_owned(), leases[quorum - 1])
        })
        .collect();
    let mode = views
        .iter()
        .find(|view| {
            view.holders
                .iter()
                .any(|(owner, _)| holders.iter().any(|(h, _)| h == owner))
        })
        .and_then(|view| view.mode);
    let permits = views
        .iter()
        .find(|view| view.mode == mode && view.permits.is_some())
        .and_then(|view| view.permits)
        .filter(|_| mode.is_some());
    // The leader's record, from a master where the quorum's holder wrote it; a stale minority
    // record is not the leader's. Of its revisions the latest: a majority's answers include a
    // master of every majority that took a `proclaim` (a master that missed one keeps an older
    // value; a proclaim that reached only a minority may show too).
    let record = views
        .iter()
        .filter_map(|view| view.record.as_ref())
        .filter(|record| holders.iter().any(|(owner, _)| *owner == record.owner))
        .max_by_key(|record| record.revision)
        .cloned();
    RawView {
        mode,
        permits,
        remaining: holders.iter().filter_map(|(_, r)| *r).max(),
        holders,
        writer_waiting: views.iter().any(|view| view.writer_waiting),
        subscribers: views.iter().map(|view| view.subscribers).max().unwrap_or(0),
        // A fair waiter queues on every master it reaches.
        queued: views.iter().map(|view| view.queued).max().unwrap_or(0),
        token_ceiling: views
            .iter()
            .map(|view| view.token_ceiling)
            .max()
            .unwrap_or(0),
        record,
    }
}

impl TwinEntry {
    /// The in-process view of this entry: the twin of the inspect script (no subscribers: the
    /// in-process store has no pub/sub). `token_ceiling` is the store's to fill in.
    pub(crate) fn view(&mut self, now: Instant) -> RawView {
        self.purge(now);
        let left = |until: Instant| Some(until.saturating_duration_since(now));
        let (mode, holders): (_, Vec<RawHolder>) = match &self.writer {
            Some((owner, until)) => (Some(LockMode::Write), vec![(owner.clone(), left(*until))]),
            None if !self.readers.is_empty() => {
                let mut readers: Vec<RawHolder> = self
                    .readers
                    .iter()
                    .map(|(owner, &until)| (owner.clone(), left(until)))
                    .collect();
                readers.sort();
                (Some(LockMode::Read), readers)
            }
            None if self.permits.is_some() => {
                let mut holders: Vec<RawHolder> = self
                    .permits
                    .iter()
                    .flat_map(|permits| &permits.holders)
                    .map(|(owner, &until)| (owner.clone(), left(until)))
                    .collect();
                holders.sort();
                (Some(LockMode::Semaphore), holders)
            }
            None => (None, Vec::new()),
        };
        RawView {
            mode,
            remaining: holders.iter().filter_map(|h| h.1).max(),
            holders,
            writer_waiting: self.writer_waiting.is_some(),
            subscribers: 0,
            token_ceiling: 0,
            permits: self.permits.as_ref().map(|permits| permits.count),
            queued: self
                .queue
                .as_ref()
                .map_or(0, |queue| queue.len().try_into().unwrap_or(u64::MAX)),
            // The store's to fill in, as `token_ceiling`: records are kept beside the entries.
            record: None,
        }
    }

    /// Drops every holder and the writer-waiting mark: the twin of the force-unlock script.
    /// Returns the evicted holders.
    pub(crate) fn evict(&mut self, now: Instant) -> Vec<RawHolder> {
        let holders = self.view(now).holders;
        *self = TwinEntry::default();
        holders
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(mode: Option<LockMode>, holders: &[(&str, u64)], subscribers: u64) -> RawView {
        RawView {
            mode,
            holders: holders
                .iter()
                .map(|&(owner, ms)| (owner.to_owned(), Some(Duration::from_millis(ms))))
                .collect(),
            remaining: holders
                .iter()
                .map(|&(_, ms)| Duration::from_millis(ms))
                .max(),
            writer_waiting: false,
            subscribers,
            token_ceiling: subscribers * 10,
            permits: None,
            queued: 0,
            record: None,
        }
    }

    #[test]
    fn a_holder_counts_when_a_quorum_of_masters_has_it_with_the_lease_the_quorum_keeps() {
        let w = Some(LockMode::Write);
        let views = [
            view(w, &[("a", 900)], 1),
            view(w, &[("a", 700)], 0),
            // A stale grant left on one master only is no holder.
            view(w, &[("stale", 5000)], 2),
        ];
        let merged = merge_views(&views, 2);
        assert_eq!(merged.mode, w);
        assert_eq!(
            merged.holders,
            [("a".to_owned(), Some(Duration::from_millis(700)))]
        );
        assert_eq!(merged.remaining, Some(Duration::from_millis(700)));
        assert_eq!((merged.subscribers, merged.token_ceiling), (2, 20));

        let split = [
            view(w, &[("a", 900)], 0),
            view(w, &[("b", 900)], 0),
            view(None, &[], 0),
        ];
        let merged = merge_views(&split, 2);
        assert!(
            merged.holders.is_empty() && merged.mode.is_none(),
            "{merged:?}"
        );
    }
}
