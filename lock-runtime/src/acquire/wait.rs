//! How a request keeps to its wait (the acquire loop's neighbour, `acquire/mod.rs`): each
//! try's budget, cut off at what is left of the wait ([`Plan::budget`], [`within`], or by the
//! store's own timers where it can: [`Plan::cut_by_wait`]); the pause between tries, until a
//! wake-up, the backoff step or the last try ([`Plan::pause`], a hundredth of the response
//! timeout before the deadline: [`last_try_allowance`]); the retries after a failure that may
//! pass ([`Plan::retry_after`]); and the request's timeout.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{FairWait, Plan, Refusal};
use crate::engine::Engine;
use crate::error::LockError;
use crate::store::Store;
use crate::telemetry::Acquire;

impl Plan {
    /// How long a try may take, on the real clock (`None`: the in-process store, which
    /// answers at once): what is left of the wait, so that no request outlives its wait — also
    /// against a server that takes connections and answers nothing (a frozen process, a proxy
    /// whose store is gone), whose connects and requests would otherwise each run their own
    /// timeouts. A request that does not wait has the response timeout for its one try; a
    /// request's first try at least a tenth of it ([`first_try_floor`]), so that a wait too
    /// short for a round trip (and a connect) still gets one real try — except a campaign's
    /// round, whose wait is what is left of the campaign's.
    pub(super) fn budget(&self, inner: &Engine, first_try: bool) -> Option<Duration> {
        if inner.clock == crate::clock::Clock::Tokio {
            return None;
        }
        let response_timeout = inner.config.response_timeout;
        if !self.waits {
            return Some(response_timeout);
        }
        let wait_left = self.deadline - Instant::now().min(self.deadline);
        Some(if first_try && !self.strict_wait {
            wait_left.max(first_try_floor(response_timeout))
        } else {
            wait_left
        })
    }

    /// The request's [`LockError::Timeout`] at `now`.
    pub(super) fn timed_out(&self, now: Instant) -> LockError {
        LockError::Timeout {
            key: self.keys.label().to_owned(),
            waited: now - self.started,
        }
    }

    /// A try's timeout at or past its `cut` (given `budget`), as the store's own timer ends a
    /// try there ([`AnyStore::cuts_tries`](crate::store::AnyStore::cuts_tries)): the try cut off by the end of the wait, as
    /// [`within`] reports it; other errors as they are.
    pub(super) fn cut_by_wait(
        &self,
        err: LockError,
        inner: &Engine,
        budget: Option<Duration>,
        cut: Option<std::time::Instant>,
    ) -> LockError {
        match (&err, budget, cut) {
            (LockError::Backend(timeout), Some(budget), Some(cut))
                if timeout.kind() == crate::error::BackendErrorKind::Timeout
                    && !timeout.is_cut_by_wait()
                    && std::time::Instant::now() >= cut =>
            {
                crate::error::BackendError::cut_by_wait(
                    &inner.config.store.describe(),
                    budget,
                    self.waits,
                )
                .advised_as(timeout)
                .into()
            }
            _ => err,
        }
    }

    /// After a failed try: pauses before the next when the failure may pass, a retry is left
    /// and the pause ends within the wait ([`Config::retry`](crate::Config::retry)); otherwise
    /// the request ends with the failure.
    pub(super) async fn retry_after(
        &mut self,
        inner: &Engine,
        observed: &Acquire,
        err: LockError,
    ) -> Result<(), LockError> {
        if self.retries_left == 0 || !err.is_transient() || inner.shut_down.load(Ordering::Relaxed)
        {
            return Err(err);
        }
        // Between half and all of the step, so that clients failing together spread out.
        let step = self.retry_pause;
        let pause = step / 2 + step.mul_f64(fastrand::f64()) / 2;
        // Checked: a huge retry interval (allowed) must end the request, not overflow the clock.
        let resumes = Instant::now().checked_add(pause);
        if resumes.is_none_or(|resumes| resumes >= self.deadline) {
            return Err(err);
        }
        self.retries_left -= 1;
        self.retry_pause = step.saturating_mul(2);
        observed.retrying(&err, pause);
        tokio::time::sleep(pause).await;
        // A pause that overslept the deadline (a loaded machine) sends no try past it.
        if Instant::now() >= self.deadline {
            return Err(err);
        }
        Ok(())
    }

    /// Pauses after a refusal: until the release of the key found held wakes the request,
    /// the backoff step passes (at most the holder's remaining lease), or the time of the
    /// last try comes (the deadline less [`last_try_allowance`]); after the last try, the
    /// request has timed out, at its deadline.
    pub(super) async fn pause(
        &mut self,
        inner: &Engine,
        observed: &Acquire,
        refusal: &Refusal,
        fair: Option<&FairWait<'_>>,
    ) -> Result<(), LockError> {
        if Instant::now() >= self.last_try {
            // The last try was refused: the request has waited its wait when it ends.
            tokio::time::sleep_until(self.deadline).await;
            return Err(self.timed_out(Instant::now()));
        }
        let now = Instant::now();
        let waker = inner.store.waker();
        let mut delay = match fair {
            Some(fair) => {
                fair.next_delay(&mut self.backoff, waker, &self.keys.as_slice()[0].channel())
            }
            None => self.backoff.next_delay(),
        }
        .min(self.last_try - now);
        if let Some(remaining) = refusal.remaining {
            delay = delay.min(remaining);
        }
        match waker {
            // Woken by the holder's release, or after the backoff step at the latest.
            Some(waker) => {
                let at = refusal.at.min(self.keys.as_slice().len() - 1);
                let registration = match &mut self.registration {
                    Some((held, registration)) if *held == at => registration,
                    registration => {
                        let waiter = fair.map(|fair| fair.waiter.as_str());
                        let channel = &self.keys.as_slice()[at].channel();
                        &mut registration
                            .insert((at, waker.interest(channel, self.kind, waiter)))
                            .1
                    }
                };
                observed.waited(waker.wait(registration, delay).await);
            }
            None => tokio::time::sleep(delay).await,
        }
        // A pause that overslept the deadline (a loaded machine) ends the request: a try sent
        // then would have nothing of the wait left to be answered in.
        let now = Instant::now();
        if now >= self.deadline {
            return Err(self.timed_out(now));
        }
        Ok(())
    }
}

/// How long before its deadline a request that waits sends its last try: a hundredth of the
/// response timeout (10 ms by default), for its answer to come within the wait — at most
/// [`LAST_TRY_ALLOWANCE_MAX`], so that a long response timeout does not end a short wait
/// early.
pub(super) fn last_try_allowance(response_timeout: Duration) -> Duration {
    (response_timeout / 100).min(LAST_TRY_ALLOWANCE_MAX)
}

/// The most [`last_try_allowance`] takes off a wait: what it is at the default response
/// timeout.
const LAST_TRY_ALLOWANCE_MAX: Duration = Duration::from_millis(10);

/// The least a request that waits gives its first try: a tenth of the response timeout
/// (100 ms by default), at most [`FIRST_TRY_FLOOR_MAX`] — a short wait still gets one round
/// trip, and a long response timeout never stretches a wait (at an hour's, a tenth of it
/// made a 2 s wait last six minutes against a silent server).
fn first_try_floor(response_timeout: Duration) -> Duration {
    (response_timeout / 10).min(FIRST_TRY_FLOOR_MAX)
}

/// The most a first try's floor ([`first_try_floor`]) adds to a short wait: what it is at the
/// default response timeout.
const FIRST_TRY_FLOOR_MAX: Duration = Duration::from_millis(100);

/// `request`, cut off after `budget` ([`Plan::budget`]) with a timeout that may have taken
/// effect: the acquire loop then gives the possible grant back in the background, as after
/// a response timeout. The timer starts when the request is first polled, inside the I/O
/// runtime's context where the stores' own timers run (`clock.rs`).
pub(super) async fn within<T>(
    budget: Option<Duration>,
    waits: bool,
    inner: &Engine,
    request: impl std::future::Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    let Some(budget) = budget else {
        return request.await;
    };
    match tokio::time::timeout(budget, request).await {
        Ok(reply) => reply,
        Err(_) => Err(crate::error::BackendError::cut_by_wait(
            &inner.config.store.describe(),
            budget,
            waits,
        )
        .into()),
    }
}
