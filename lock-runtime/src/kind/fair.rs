//! Fair locks ([`LockRequest::fair`](crate::LockRequest::fair)): the exclusive lock, granted in
//! request order among the key's fair waiters. Fairness is not a kind of its own: it is a write
//! try with a [`Seat`] in the key's queue, and the grant it gets is the write side of the key's
//! lock — the same lock key, renewed and fenced as a write grant ([`super::write`]) — so fair
//! and unfair requests for a key exclude each other (an unfair request does not queue: it takes
//! the lock whenever it finds it free). Beside the lock key, a queue of waiter ids scored by
//! their place, and their deadlines on the server clock: every try of a waiter keeps its place
//! and pushes its deadline one and a half heartbeats ahead; a waiter that stops trying
//! (crashed, frozen, cut off) is dropped once its deadline has passed by the next try of a
//! waiter that waits (one behind it, or a newcomer); only the head may take the lock, and the
//! grant's release — leaving the queue, as a waiter that gives up does
//! ([`Holding::Seat`](super::Holding::Seat)) — wakes the head alone
//! (`scripts/fair/{acquire,leave}.lua`). A waiter's id is the first [`WAITER_ID_LEN`]
//! characters of its owner tokens, which a request's tries share. The in-process twin is
//! [`FairQueue`] on the key's [`TwinEntry`]. Neighbours: `kind/mod.rs` dispatches here;
//! `acquire/fair_wait.rs` runs the heartbeat (a fair waiter tries at least every half heartbeat) and
//! leaves the queue when the request ends without a grant; `store/wake.rs` wakes a waiter by
//! its id.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use crate::script::{LuaScript, ScriptCall};

use super::{millis, write, Tokens, Try, TwinEntry, TwinReply};
use crate::protocol::Announce;

static ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| super::script(&acquire_script()));

/// Where `scripts/fair/acquire.lua` takes the write side's try.
const WRITE_TRY: &str = "--[[ write/acquire.lua ]]";

/// `scripts/fair/acquire.lua` with the write side's acquire script in it: the head's try is
/// the write side's, written once.
fn acquire_script() -> String {
    include_str!("../../scripts/fair/acquire.lua").replacen(
        WRITE_TRY,
        include_str!("../../scripts/write/acquire.lua"),
        1,
    )
}
/// Leaving the queue ([`Holding::Seat`](super::Holding::Seat)): a waiter that gives up, and the
/// release of a grant taken through a seat, which must also wake the queue's new head.
pub(super) static LEAVE: LazyLock<LuaScript> =
    LazyLock::new(|| super::script(include_str!("../../scripts/fair/leave.lua")));

/// How many leading characters of a fair request's owner tokens name its waiter (hex digits
/// of the token's random part, see `client::new_fair_owner`).
pub(crate) const WAITER_ID_LEN: usize = 24;

/// The payload prefix of a wake-up meant for one fair waiter: `f:` and its id.
pub(crate) const WAKE_PREFIX: &[u8] = b"f:";

/// A fair try's place in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seat {
    /// How often the waiter shows it is alive ([`Config::fair_heartbeat`](crate::Config::fair_heartbeat)).
    pub(crate) heartbeat: Duration,
    /// The caller's clock in microseconds when the request started: the waiter's place on
    /// a store with [`Tokens::Counter`] (Redlock), the same on every master.
    pub(crate) requested_at: u64,
    /// The place an earlier reply gave the waiter (0: none yet), asked for again should the
    /// waiter have to join again (dropped while alive, or its late grant undone).
    pub(crate) place: u64,
}

impl Default for Seat {
    fn default() -> Self {
        Self {
            heartbeat: crate::config::DEFAULT_FAIR_HEARTBEAT,
            requested_at: 0,
            place: 0,
        }
    }
}

/// The waiter id in an owner token.
pub(crate) fn waiter_of(owner: &str) -> &str {
    owner.get(..WAITER_ID_LEN).unwrap_or(owner)
}

pub(super) fn acquire_call(attempt: &Try<'_>, tokens: Tokens, announce: Announce) -> ScriptCall {
    let key = attempt.key;
    let seat = attempt.seat.unwrap_or_default();
    let mut call = super::acquire_invocation(&ACQUIRE, attempt, tokens);
    super::token_source(
        &mut call,
        attempt.fencing,
        tokens,
        attempt.lease,
        attempt.proposed,
    );
    super::writer_waiting_args(&mut call, attempt.writer_waiting, attempt.refused_before);
    call.arg(key.writer_waiting())
        .arg(millis(seat.heartbeat))
        .arg(match (seat.place, tokens) {
            (0, Tokens::Counter) => seat.requested_at.max(1),
            // One server, first try: the order in which the waiters reach it.
            (0, Tokens::Clock) => 0,
            (place, _) => place,
        })
        .arg(announce.command())
        .arg(key.queue())
        .arg(key.queue_deadlines())
        .arg(key.channel());
    call
}

/// The in-process twin of a key's queue: each waiter's place and deadline.
#[derive(Debug, Default, Clone)]
pub(crate) struct FairQueue {
    /// Waiters in order: by ticket, then id.
    order: BTreeSet<(u64, String)>,
    /// Each waiter's ticket and the instant it is dropped unless it tries again.
    waiters: HashMap<String, (u64, Instant)>,
}

impl FairQueue {
    /// Drops every waiter whose deadline has passed.
    pub(crate) fn purge(&mut self, now: Instant) {
        let order = &mut self.order;
        self.waiters.retain(|waiter, &mut (ticket, deadline)| {
            let alive = deadline > now;
            if !alive {
                order.remove(&(ticket, waiter.clone()));
            }
            alive
        });
    }

    /// How many wait.
    pub(crate) fn len(&self) -> usize {
        self.waiters.len()
    }

    /// Nobody waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// Keeps `waiter`'s place until `deadline`, or gives it `place` (0: one at the back);
    /// returns its place.
    fn join(&mut self, waiter: &str, place: u64, deadline: Instant) -> u64 {
        if let Some((ticket, until)) = self.waiters.get_mut(waiter) {
            *until = deadline;
            return *ticket;
        }
        // The in-process store's "server clock" for places: one count for every queue, so a
        // waiter coming back with its place sorts among the others as it did.
        static NEXT_PLACE: AtomicU64 = AtomicU64::new(1);
        let ticket = match place {
            0 => NEXT_PLACE.fetch_add(1, Ordering::Relaxed),
            place => place,
        };
        self.order.insert((ticket, waiter.to_owned()));
        self.waiters.insert(waiter.to_owned(), (ticket, deadline));
        ticket
    }

    // For a store that keeps the queue in a database (PostgreSQL, a cargo feature).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    /// Each waiter: its id, its ticket and when it is dropped unless it tries again (for a
    /// store that keeps the queue elsewhere: `store/key_state.rs`).
    pub(crate) fn waiters(&self) -> impl Iterator<Item = (&str, u64, Instant)> {
        self.waiters
            .iter()
            .map(|(waiter, &(ticket, deadline))| (waiter.as_str(), ticket, deadline))
    }

    // For a store that keeps the queue in a database (PostgreSQL, a cargo feature).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    /// The queue of these waiters (id, ticket, deadline), as [`waiters`](Self::waiters)
    /// listed them.
    pub(crate) fn from_waiters(waiters: impl IntoIterator<Item = (String, u64, Instant)>) -> Self {
        let mut queue = Self::default();
        for (waiter, ticket, deadline) in waiters {
            queue.order.insert((ticket, waiter.clone()));
            queue.waiters.insert(waiter, (ticket, deadline));
        }
        queue
    }

    // For a store that keeps the queue in a database (PostgreSQL, a cargo feature).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    /// The waiter at the head of the queue, if any.
    pub(crate) fn first(&self) -> Option<&str> {
        self.head()
    }

    fn leave(&mut self, waiter: &str) {
        if let Some((ticket, _)) = self.waiters.remove(waiter) {
            self.order.remove(&(ticket, waiter.to_owned()));
        }
    }

    fn head(&self) -> Option<&str> {
        self.order.first().map(|(_, waiter)| waiter.as_str())
    }
}

pub(super) fn acquire_twin(entry: &mut TwinEntry, attempt: &Try<'_>, now: Instant) -> TwinReply {
    entry.purge(now);
    let seat = attempt.seat.unwrap_or_default();
    let waiter = waiter_of(attempt.owner);
    let queue = entry.queue.get_or_insert_with(FairQueue::default);
    let place = queue.join(waiter, seat.place, now + seat.heartbeat * 3 / 2);
    if queue.head() != Some(waiter) {
        return TwinReply::Queued {
            place,
            behind: true,
            remaining: Duration::ZERO,
        };
    }
    match write::acquire_twin(entry, attempt, now) {
        TwinReply::Granted => {
            leave_queue(entry, waiter);
            TwinReply::Granted
        }
        TwinReply::Held(remaining) => TwinReply::Queued {
            place,
            behind: false,
            remaining,
        },
        other => other,
    }
}

fn leave_queue(entry: &mut TwinEntry, waiter: &str) {
    if let Some(queue) = &mut entry.queue {
        queue.leave(waiter);
        if queue.is_empty() {
            entry.queue = None;
        }
    }
}

/// The in-process twin of `leave.lua`: the waiter leaves the queue, and gives back the write
/// grant `owner` may hold.
pub(super) fn leave_twin(entry: &mut TwinEntry, owner: &str, now: Instant) -> bool {
    leave_queue(entry, waiter_of(owner));
    write::release_twin(entry, owner, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heads_try_is_the_write_sides_script() {
        let script = acquire_script();
        assert!(
            !script.contains(WRITE_TRY),
            "the write side's try was not inserted"
        );
        assert!(script.contains(include_str!("../../scripts/write/acquire.lua")));
    }
}
