//! A fair request's seat in its key's queue while the acquire loop (`acquire/mod.rs`) runs:
//! the waiter id its owner tokens start with, its place, how long to pause between tries (at
//! most half a heartbeat, which keeps the place), and leaving the queue when the request ends
//! without a grant. The queue's rules are in `kind/fair.rs`.

use std::sync::Arc;
use std::time::Duration;

use super::backoff::Backoff;
use crate::inspect::HolderTag;
use crate::kind::fair::{self, Seat};
use crate::kind::Holding;
use crate::protocol::LockKey;
use crate::release::Releaser;
use crate::wake::ReleaseListener;

/// A fair request's place in its key's queue until the request ends: its waiter id (which
/// every owner token of the request starts with), its [`Seat`], and whether its last try found
/// waiters ahead of it. Dropped without a grant (timed out, failed, cancelled), it takes the
/// waiter out of the queue in the background — leaving the queue with the owner token
/// of the waiter's last try, which also gives back a grant that try may have made, and wakes
/// the new head — so the queue does not wait for the waiter's deadline.
pub(crate) struct FairWait<'a> {
    releaser: &'a Arc<Releaser>,
    key: LockKey,
    /// [`fair::WAITER_ID_LEN`] hex digits.
    pub(crate) waiter: String,
    pub(crate) seat: Seat,
    /// The last try found other waiters ahead.
    behind: bool,
    /// The owner token of the waiter's last try (empty: nothing to leave).
    owner: String,
    /// When the waiter's place, or the last try's grant, would be gone anyway, at the latest.
    until: std::time::Instant,
}

impl<'a> FairWait<'a> {
    pub(crate) fn new(releaser: &'a Arc<Releaser>, key: &LockKey, heartbeat: Duration) -> Self {
        let mut waiter = format!("{:032x}", fastrand::u128(..));
        waiter.truncate(fair::WAITER_ID_LEN);
        Self {
            releaser,
            key: key.clone(),
            waiter,
            seat: Seat {
                heartbeat,
                requested_at: unix_micros(),
                place: 0,
            },
            behind: false,
            owner: String::new(),
            until: std::time::Instant::now(),
        }
    }

    /// A fresh owner token for a try: the waiter id, then random hex digits up to the length
    /// of a UUID's, then the holder record, as [`new_owner`](super::pending::new_owner)'s.
    pub(crate) fn new_owner(&self, holder: &HolderTag) -> String {
        let mut uuid = format!("{:032x}", fastrand::u128(..));
        uuid.replace_range(..self.waiter.len().min(uuid.len()), &self.waiter);
        holder.owner(&uuid)
    }

    /// A try with `owner` is sent; a grant it makes expires at `expires` at the latest. Should
    /// the request end with this try (cancelled mid-request, an ambiguous error), leaving the
    /// queue with its owner token also gives back that grant.
    pub(crate) fn trying(&mut self, owner: &str, expires: std::time::Instant) {
        owner.clone_into(&mut self.owner);
        self.until = expires.max(std::time::Instant::now() + self.seat.heartbeat * 2);
    }

    /// The try was refused: the waiter's `place` (0: not said), and whether others are ahead.
    pub(crate) fn refused(&mut self, place: u64, behind: bool) {
        self.behind = behind;
        if place != 0 {
            // Asked for again should the waiter have to join again.
            self.seat.place = place;
        }
    }

    /// How long to wait before the next try, at most half a heartbeat, which keeps the place.
    /// Behind other waiters, the release that makes this one the head wakes it, and the
    /// heartbeat is the fallback; until this client listens for releases (and on the
    /// in-process store, which wakes nobody), backoff polls as for any lock.
    pub(crate) fn next_delay(
        &self,
        backoff: &mut Backoff,
        waker: Option<&ReleaseListener>,
        channel: &str,
    ) -> Duration {
        let half_beat = self.seat.heartbeat / 2;
        if self.behind && waker.is_some_and(|waker| waker.listening(channel)) {
            return half_beat;
        }
        backoff.next_delay().min(half_beat)
    }

    /// The request was granted: the grant took the waiter out of the queue.
    pub(crate) fn granted(mut self) {
        self.owner.clear();
    }
}

impl Drop for FairWait<'_> {
    fn drop(&mut self) {
        if !self.owner.is_empty() {
            self.releaser.clean_up(
                Holding::Seat,
                self.key.clone(),
                std::mem::take(&mut self.owner),
                self.until,
            );
        }
    }
}

/// The time since the Unix epoch in microseconds on this machine's clock (a fair waiter's
/// place on Redlock). A clock before the epoch gives a place behind every real one (2^52 µs
/// is the year 2112; places stay below 2^53, which a Redis score holds exactly).
fn unix_micros() -> u64 {
    const BEHIND_EVERY_CLOCK: u64 = 1 << 52;
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(BEHIND_EVERY_CLOCK, |d| {
            u64::try_from(d.as_micros()).unwrap_or(BEHIND_EVERY_CLOCK)
        })
}
