//! The in-process state of one key ([`TwinEntry`]), on which every kind's twin runs, and what a
//! twin's try found ([`TwinReply`]). The twins are the reference statement of the kinds' rules
//! (`kind/mod.rs`). Neighbours: each kind's file changes an entry as its scripts change the
//! keys; `twins.rs` keeps the entries of every key; the in-process store (`store/memory.rs`)
//! runs the twins.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{fair, semaphore};

/// The in-process state of one key, which every kind's twin reads and changes: the in-process
/// counterpart of the lock key (its writer or its readers) and the writer-waiting mark.
#[derive(Debug, Default, Clone)]
pub(crate) struct TwinEntry {
    /// The writer and when its lease ends.
    pub(crate) writer: Option<(String, Instant)>,
    /// Every reader and when its lease ends.
    pub(crate) readers: HashMap<String, Instant>,
    /// Until when a waiting writer keeps new readers out.
    pub(crate) writer_waiting: Option<Instant>,
    /// The count and the holders while the key is a semaphore with permits held.
    pub(crate) permits: Option<semaphore::Permits>,
    /// The fair waiters, while any waits.
    pub(crate) queue: Option<fair::FairQueue>,
}

impl TwinEntry {
    /// Drops every holder and mark whose time has run out.
    pub(crate) fn purge(&mut self, now: Instant) {
        if self.writer.as_ref().is_some_and(|&(_, until)| until <= now) {
            self.writer = None;
        }
        self.readers.retain(|_, &mut until| until > now);
        if self.writer_waiting.is_some_and(|until| until <= now) {
            self.writer_waiting = None;
        }
        if let Some(permits) = &mut self.permits {
            permits.holders.retain(|_, &mut until| until > now);
            if permits.holders.is_empty() {
                self.permits = None;
            }
        }
        if let Some(queue) = &mut self.queue {
            queue.purge(now);
            if queue.is_empty() {
                self.queue = None;
            }
        }
    }

    /// What keeps a writer out of this key — the one rule for every grant of the write side
    /// (the exclusive lock, a fair grant, each key of `lock_all`): another writer, readers, or
    /// semaphore permits. When the last of them ends; `None` when the key is free for `owner`
    /// (free, or `owner`'s own write grant: the same try sent again). Purge first.
    pub(crate) fn writer_blocked_until(&self, owner: &str) -> Option<Instant> {
        let writer = match &self.writer {
            Some((holder, until)) if holder != owner => Some(*until),
            _ => None,
        };
        [
            writer,
            self.readers.values().max().copied(),
            self.permits_until(),
        ]
        .into_iter()
        .flatten()
        .max()
    }

    /// A writer's try found the key held: keep new readers out for `mark` (zero: the writer's
    /// last try, no mark), as the scripts' writer-waiting mark does.
    pub(crate) fn mark_writer_waiting(&mut self, mark: Duration, now: Instant) {
        if !mark.is_zero() {
            self.writer_waiting = Some(now + mark);
        }
    }

    /// Nothing left in it: the store may forget the key (its fencing counter is kept apart).
    pub(crate) fn is_empty(&self) -> bool {
        self.writer.is_none()
            && self.readers.is_empty()
            && self.writer_waiting.is_none()
            && self.permits.is_none()
            && self.queue.is_none()
    }
}

/// What a twin's try found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TwinReply {
    /// Granted: a write grant takes the next fencing token, a read grant shows the latest.
    Granted,
    /// Held, for at most this long.
    Held(Duration),
    /// A fair try refused: behind other waiters, or the head while the lock is held (for at
    /// most `remaining`); its place in the queue.
    Queued {
        place: u64,
        behind: bool,
        remaining: Duration,
    },
    /// The key is a semaphore of this many permits, some held, not the count asked for.
    Mismatch(u32),
}
