//! A lock's directory of etcd keys as one read found it ([`Directory`]: its bookkeeping and
//! its grants' keys) and how it maps to the twins' [`TwinEntry`]: the grants whose keys etcd
//! has become the entry's holders ([`with_holders`]), an entry's holders are listed back by
//! side ([`holders`]) and left out of the bookkeeping ([`bookkeeping`]), and a try that only
//! pushes times not yet due writes nothing ([`unpushed`]). Neighbours: `transaction.rs`
//! reads directories and writes what changed; `layout.rs` names the keys.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::kind::fair::FairQueue;
use crate::kind::semaphore::Permits;
use crate::kind::TwinEntry;
use crate::store::key_state::KeyState;

/// One grant's key as a read found it.
#[derive(Debug, Clone)]
pub(super) struct HolderKey {
    /// `w`, `r` or `p`: writer, reader, permit.
    pub(super) side: char,
    /// The key (`layout.rs`).
    pub(super) path: String,
    pub(super) create_revision: i64,
    pub(super) lease: i64,
    /// The lease it was granted with, in seconds.
    pub(super) ttl: i64,
    /// A permit's semaphore's count (0 for the other sides).
    pub(super) permits: u32,
}

/// One lock key's etcd keys as a read found them.
#[derive(Debug, Default)]
pub(super) struct Directory {
    /// The bookkeeping's revision (0: none) and JSON.
    pub(super) state: Option<(i64, serde_json::Value)>,
    pub(super) holders: HashMap<String, HolderKey>,
}

/// The holders of an entry, by owner: when each lease ends, its side (`w`, `r`, `p`) and
/// a permit's semaphore's count.
pub(super) fn holders(entry: &TwinEntry) -> HashMap<String, (Instant, char, u32)> {
    let mut all = HashMap::new();
    if let Some((owner, until)) = &entry.writer {
        all.insert(owner.clone(), (*until, 'w', 0));
    }
    for (owner, until) in &entry.readers {
        all.insert(owner.clone(), (*until, 'r', 0));
    }
    if let Some(permits) = &entry.permits {
        for (owner, until) in &permits.holders {
            all.insert(owner.clone(), (*until, 'p', permits.count));
        }
    }
    all
}

/// `state` without its holders: what the bookkeeping key keeps (the holders are keys of
/// their own).
pub(super) fn bookkeeping(state: &KeyState) -> KeyState {
    let mut kept = state.clone();
    kept.entry.writer = None;
    kept.entry.readers.clear();
    kept.entry.permits = None;
    kept
}

/// `after` with each fair waiter's deadline and the writer-waiting mark as `before` had them
/// wherever the push is not needed yet: where the old time is still more than five sixths of
/// the new one's distance from `now` ahead of it, i.e. it was pushed within the last sixth of
/// that distance (a quarter heartbeat for a fair waiter's one and a half). A try that only
/// pushes such times writes nothing, so that a burst of tries (waiters woken by each release)
/// does not keep rewriting the key under the head's own try; a waiter's periodic try, every
/// half heartbeat, always pushes, and keeps the slack it has on the other stores (a
/// heartbeat). Keeping pushes due within half the distance left a quarter heartbeat of slack:
/// a live head whose try came that late on a loaded machine was dropped and passed.
pub(super) fn unpushed(after: &KeyState, before: &KeyState, now: Instant) -> KeyState {
    let keep = |old: Instant, new: Instant| {
        let recent = new.saturating_duration_since(now) * 5 / 6;
        (old <= new && old > now + recent).then_some(old)
    };
    let mut kept = after.clone();
    if let (Some(new), Some(old)) = (after.entry.writer_waiting, before.entry.writer_waiting) {
        if let Some(old) = keep(old, new) {
            kept.entry.writer_waiting = Some(old);
        }
    }
    if let (Some(queue), Some(old_queue)) = (&after.entry.queue, &before.entry.queue) {
        let old: HashMap<&str, (u64, Instant)> = old_queue
            .waiters()
            .map(|(waiter, ticket, deadline)| (waiter, (ticket, deadline)))
            .collect();
        kept.entry.queue = Some(FairQueue::from_waiters(queue.waiters().map(
            |(waiter, ticket, deadline)| {
                let deadline = match old.get(waiter) {
                    Some(&(old_ticket, old_deadline)) if old_ticket == ticket => {
                        keep(old_deadline, deadline).unwrap_or(deadline)
                    }
                    _ => deadline,
                };
                (waiter.to_owned(), ticket, deadline)
            },
        )));
    }
    kept
}

/// Puts in `entry` the grants whose keys etcd has, each until a lease from `now` (the
/// server ends it, not this time).
pub(super) fn with_holders(
    entry: &mut TwinEntry,
    live: &HashMap<String, HolderKey>,
    now: Instant,
) -> Result<(), &'static str> {
    entry.writer = None;
    entry.readers.clear();
    entry.permits = None;
    for (owner, key) in live {
        let until = now + Duration::from_secs(u64::try_from(key.ttl).unwrap_or(1));
        match key.side {
            'w' if entry.writer.is_some() => return Err("two writers at once"),
            'w' => entry.writer = Some((owner.clone(), until)),
            'r' => {
                entry.readers.insert(owner.clone(), until);
            }
            _ => {
                entry
                    .permits
                    .get_or_insert_with(|| Permits {
                        count: key.permits,
                        holders: HashMap::new(),
                    })
                    .holders
                    .insert(owner.clone(), until);
            }
        }
    }
    Ok(())
}
