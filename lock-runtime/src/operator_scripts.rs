//! The operator's scripts — not a lock kind, but two operations on a key's lock written once
//! for every kind (the lock key's type says which side holds it): a read-only view ([`inspect_call`]) and a forced release
//! ([`force_unlock_call`]) that also hands out a fencing token above every earlier one.
//! Scripts: `scripts/operator/{inspect,force_unlock}.lua`; the in-process twins are
//! [`TwinEntry::view`] and the memory store's force-unlock. Neighbours: the stores in
//! `store/` run these calls and merge per-master views (Redlock); `inspect.rs` turns a
//! [`RawView`] into the public [`LockState`](crate::LockState).

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use crate::script::{LuaScript, ScriptCall};

use crate::error::{BackendError, BackendErrorKind, LockError};
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
pub(crate) fn inspect_call(key: &LockKey, announce: Announce, tokens: Tokens) -> ScriptCall {
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
pub(crate) fn force_unlock_call(key: &LockKey, announce: Announce, tokens: Tokens) -> ScriptCall {
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
    Option<(String, String, Option<Vec<u8>>)>,
);

/// Reads the inspect script's reply.
pub(crate) fn read_inspect_reply(key: &LockKey, reply: InspectReply) -> Result<RawView, LockError> {
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
        record: record.and_then(|(epoch, owner, value)| {
            Some(RawRecord {
                epoch: epoch.parse().ok()?,
                owner,
                value,
            })
        }),
    })
}

/// Reads the force-unlock script's reply: the evicted holders and the fresh token.
pub(crate) fn read_force_unlock_reply(
    (holders, token): (Vec<(String, i64)>, u64),
) -> (Vec<RawHolder>, u64) {
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
