//! A [`Lease`]: the shared state of one grant — owner, fencing token, local deadline, and
//! whether it is still held, was lost, or has ended (released or dropped). The guard and the
//! attribute's scopes hold it; the [watchdog](crate::watchdog) renews it and declares it lost.
//!
//! A lease keeps the clock of its store ([`Clock`]): the real one on Redis, which expires keys
//! in real time, so a test that pauses tokio's clock (`start_paused = true`) does not move a
//! Redis lease's deadline; tokio's on the in-process store, which expires its entries by that
//! clock too, so advancing a paused clock past the lease ends it, while the watchdog — ticking
//! on the same clock (`watchdog.rs`) — keeps a renewed one. Whoever watches the deadline marks
//! the lease lost when it passes: the watchdog, and any task that polls [`Lease::lost`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::clock::drift;
use crate::clock::Clock;
use crate::kind::{Holding, Kind};
use crate::protocol::FencingToken;
use crate::protocol::LockKey;
use crate::telemetry::{Ended, Hold};

static NEXT_LEASE_ID: AtomicU64 = AtomicU64::new(1);

/// The local deadline that a grant or renewal sent at `sent` gives: the lease less drift, and
/// never past the request's `max_hold`.
fn deadline_after(
    sent: Instant,
    duration: Duration,
    max_hold: Option<(Duration, Instant)>,
) -> Instant {
    let deadline = sent + duration - drift(duration);
    max_hold.map_or(deadline, |(_, until)| deadline.min(until))
}

/// Where a grant stands. It only ever moves away from `Held`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseState {
    /// Ours, as far as this process can tell (the deadline may still have passed unnoticed:
    /// [`Lease::is_held`] checks it too).
    Held,
    /// Redis said it is no longer ours, or its deadline passed before a renewal succeeded.
    Lost,
    /// Released or dropped by its guard: nothing more is sent for it but its release.
    Ended,
}

/// The times of a lease, on its [`Clock`].
pub(crate) struct Times {
    /// When the lease ends for sure unless renewed: send time of the last successful
    /// acquire or renewal, plus the lease, minus drift.
    pub(crate) deadline: Instant,
    /// When the next renewal is due.
    pub(crate) next_renewal: Instant,
}

/// One grant's shared state.
pub(crate) struct Lease {
    pub(crate) id: u64,
    /// What its release gives back: the grant (of its [`kind`](Self::kind)), or the seat it
    /// was taken through.
    pub(crate) holding: Holding,
    pub(crate) key: LockKey,
    pub(crate) owner: String,
    pub(crate) token: Option<FencingToken>,
    pub(crate) duration: Duration,
    /// Whether the watchdog renews it (else it is a hard time limit).
    pub(crate) renew: bool,
    /// The clock its times are on: its store's.
    pub(crate) clock: Clock,
    /// The request's `max_hold` and when it runs out: no deadline goes past this.
    max_hold: Option<(Duration, Instant)>,
    /// `hold_at_least`: until when a release keeps the lock instead of deleting it (the
    /// request's send time plus the window, on the lease's clock).
    held_until: Option<Instant>,
    times: Mutex<Times>,
    /// Where it stands; changed only under this lock, with what tells of the change.
    state: Mutex<LeaseState>,
    /// Wakes the tasks waiting in [`lost`](Self::lost) or [`over`](Self::over) when the state
    /// changes (inline: no allocation per grant).
    changed: Notify,
    /// It ended because the client shut down ([`shut_down`](Self::shut_down)), not by a loss.
    shut_down: AtomicBool,
    /// Serialises a renewal with the release, so no renewal is sent after the release.
    pub(crate) gate: tokio::sync::Mutex<()>,
    /// The grant as observed: its `hold` span, renewals and end ([`crate::telemetry`]).
    pub(crate) hold: Hold,
}

impl Lease {
    /// A lease granted by a request sent at `sent` (on `clock`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        holding: Holding,
        key: LockKey,
        owner: String,
        token: Option<FencingToken>,
        duration: Duration,
        renew: bool,
        max_hold: Option<Duration>,
        sent: Instant,
        clock: Clock,
        hold: Hold,
    ) -> Self {
        let max_hold = max_hold.and_then(|max| Some((max, sent.checked_add(max)?)));
        Self {
            id: NEXT_LEASE_ID.fetch_add(1, Ordering::Relaxed),
            holding,
            key,
            owner,
            token,
            duration,
            renew,
            clock,
            max_hold,
            held_until: None,
            times: Mutex::new(Times {
                deadline: deadline_after(sent, duration, max_hold),
                next_renewal: sent + duration / 3,
            }),
            state: Mutex::new(LeaseState::Held),
            changed: Notify::new(),
            shut_down: AtomicBool::new(false),
            gate: tokio::sync::Mutex::new(()),
            hold,
        }
    }

    /// Keeps the lock until `until` when it is given back earlier
    /// ([`LockRequest::hold_at_least`](crate::LockRequest::hold_at_least)).
    pub(crate) fn held_until(mut self, until: Option<Instant>) -> Self {
        self.held_until = until;
        self
    }

    /// What a release of it gives back now: the grant, or — within its `hold_at_least` window
    /// — the grant kept for the rest of the window.
    pub(crate) fn holding_now(&self) -> Holding {
        match self.held_until {
            Some(until) => match until.checked_duration_since(self.now()) {
                Some(left) if !left.is_zero() => Holding::KeptFor(left),
                _ => self.holding,
            },
            None => self.holding,
        }
    }

    /// The grant's kind: a seat's is a write grant.
    pub(crate) fn kind(&self) -> Kind {
        self.holding.kind()
    }

    pub(crate) fn times(&self) -> MutexGuard<'_, Times> {
        self.times.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Now, on the lease's clock.
    pub(crate) fn now(&self) -> Instant {
        self.clock.now()
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.times().deadline
    }

    /// Records a renewal sent at `sent`: the deadline moves on (never back, and never past
    /// `max_hold`), and the next renewal is due a third of the lease later.
    pub(crate) fn renewed(&self, sent: Instant) {
        let mut times = self.times();
        let renewed = deadline_after(sent, self.duration, self.max_hold);
        times.deadline = times.deadline.max(renewed);
        times.next_renewal = sent + self.duration / 3;
        drop(times);
        self.hold.renewed();
    }

    /// The request's `max_hold`, if it has one and it has run out.
    pub(crate) fn max_hold_passed(&self) -> Option<Duration> {
        self.max_hold
            .filter(|&(_, until)| self.now() >= until)
            .map(|(max_hold, _)| max_hold)
    }

    /// Why the deadline passed, for the log.
    pub(crate) fn deadline_passed_why(&self) -> &'static str {
        if self.max_hold_passed().is_some() {
            "it was held for its max_hold; the watchdog stopped renewing it"
        } else {
            "its lease ran out before a renewal succeeded"
        }
    }

    pub(crate) fn state(&self) -> LeaseState {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Not lost, not ended, and its deadline not passed.
    pub(crate) fn is_held(&self) -> bool {
        self.state() == LeaseState::Held && self.now() < self.deadline()
    }

    /// Moves the lease from held to `to`, telling the outside (`tell`, then the hold's end)
    /// *before* waking its waiters: a holder told of a loss finds it logged and counted.
    /// Returns whether it was held.
    fn leave(&self, to: LeaseState, how: Ended, tell: impl FnOnce()) -> bool {
        {
            // Held while telling: whoever reads the state meanwhile waits, and finds the
            // change told when it sees it.
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if *state != LeaseState::Held {
                return false;
            }
            *state = to;
            tell();
            self.hold.ended(how);
        }
        self.changed.notify_waiters();
        true
    }

    /// Records that the guard let go of the lease (`how`: released or dropped). A lost lease
    /// stays lost: a holder told of the loss must still see it when it looks.
    pub(crate) fn end(&self, how: Ended) {
        self.leave(LeaseState::Ended, how, || {});
    }

    /// Reported lost by a loss (Redis said it is no longer ours, or its deadline passed
    /// before a renewal): not by a shutdown, whose leases are still given back.
    pub(crate) fn is_known_lost(&self) -> bool {
        self.state() == LeaseState::Lost && !self.was_shut_down()
    }

    /// Whether it ended because its client shut down (the holder then gets
    /// [`LockError::ShutDown`](crate::LockError::ShutDown), not a loss).
    pub(crate) fn was_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// Records that the lease is lost, unless it already ended or was lost.
    pub(crate) fn mark_lost(&self, why: &str) {
        self.leave(LeaseState::Lost, Ended::Lost, || {
            tracing::warn!(target: crate::telemetry::LOG_TARGET, parent: self.hold.span(), key = %self.key.name, token = self.token.map(FencingToken::get), "lease lost: {why}");
        });
    }

    /// Records that the client was shut down while the lease was held: the holder is told as for
    /// a loss (its `lost()` completes, an attribute body with `on_lost = "abort"` stops), and
    /// the lease is then given back. Returns whether it was held.
    pub(crate) fn shut_down(&self) -> bool {
        self.leave(LeaseState::Lost, Ended::Shutdown, || {
            self.shut_down.store(true, Ordering::Release);
            tracing::info!(target: crate::telemetry::LOG_TARGET, parent: self.hold.span(), key = %self.key.name, "giving the lock back: the client is shutting down");
        })
    }

    /// Completes when the lease is lost (never, if it never is). Checks the deadline itself on
    /// every poll, so a task woken after a long pause sees the loss at once; it is woken by
    /// the watchdog, which marks the lease lost when its deadline passes.
    pub(crate) async fn lost(&self) {
        self.left(false).await;
    }

    /// Completes when the lease is no longer held: lost, or ended by its guard. A call that
    /// joined the grant runs only while this has not completed.
    pub(crate) async fn over(&self) {
        self.left(true).await;
    }

    async fn left(&self, or_ended: bool) {
        loop {
            // Registered before the state is read: a change after the read wakes it.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.state() {
                LeaseState::Lost => return,
                LeaseState::Ended if or_ended => return,
                LeaseState::Ended => return std::future::pending().await,
                LeaseState::Held => {}
            }
            // Looked at on every poll, not only when the state changes: a task woken after a
            // long pause (SIGSTOP, a blocked thread) by its body's own timer must see the loss
            // before its body runs again, although the watchdog thread may not have run yet.
            let past_deadline = std::future::poll_fn(|_| {
                if self.now() >= self.deadline() {
                    Poll::Ready(())
                } else {
                    // No waker of its own: the watchdog changes the state at the deadline,
                    // which wakes this task through the other branch.
                    Poll::Pending
                }
            });
            tokio::select! {
                biased;
                () = past_deadline => {
                    self.mark_lost(self.deadline_passed_why());
                    return;
                }
                () = &mut changed => {}
            }
        }
    }
}
