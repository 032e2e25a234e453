//! The acquire loop, one for every request: one key of any kind, or several keys at once.
//! Its steps, in order: [`Plan::of`] checks the request and fixes its keys, lease and wait
//! deadline; each round sends one try ([`Plan::send`]) and its [`Outcome`] reads the reply
//! the same way for one key and many; a grant becomes one lease per key under one guard
//! ([`Plan::grant`]); a refusal pauses — until the holder's release wakes the request, the
//! backoff step passes, or the deadline comes ([`Plan::pause`]) — and the request tries again.
//! Each try is cut off at what is left of the wait ([`Plan::budget`]), so no request outlives
//! its wait, whatever the store's own timeouts: by the store itself where it can (one server
//! or a Sentinel primary without the failover guard: a one-key try's connect by a timer, its
//! request by the connection's response timeout, set to end at the cut when that is sooner),
//! so that the hot path adds no timer; by a timer around the try elsewhere.
//!
//! Neighbours: the request (`request.rs`) says what is asked; the store (`store/`) runs
//! each try; the kind (`kind/`) says what a grant means; a try in flight is a
//! [`PendingGrant`] (`pending.rs`), a fair request's seat a [`FairWait`] (`fair_wait.rs`),
//! what a try came to an [`Outcome`] (`outcome.rs`),
//! the pauses are `backoff.rs`'s; the watchdog renews what is granted.

mod backoff;
mod fair_wait;
mod outcome;
mod pending;
mod wait;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::clock::drift;
use crate::engine::Engine;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::kind::multi::MultiTry;
use crate::kind::{Holding, Kind, Try};
use crate::lease::Lease;
use crate::protocol::LockKey;
use crate::request::{Exclusive, LockRequest, Refusing, Target};
use crate::store::{is_ambiguous, Store};
use crate::telemetry::Acquire;
use crate::wake::WaitRegistration;

use backoff::writer_waiting_mark;
pub(crate) use backoff::Backoff;
use fair_wait::FairWait;
use outcome::{GrantTokens, Outcome, Refusal};
pub(crate) use pending::new_owner;
use pending::PendingGrant;
use wait::{last_try_allowance, within};

impl LockRequest {
    /// Takes the lock, waiting as configured.
    ///
    /// Errors: [`LockError::Timeout`] when the lock stayed held for the whole wait (or no grant
    /// counted: see [`Config::replicas`](crate::config::Config::replicas)), [`LockError::Backend`] when the store failed,
    /// [`LockError::QuorumUnavailable`] when fewer than a majority of Redlock masters answered,
    /// [`LockError::InvalidKey`] for an empty or oversized key, [`LockError::Config`] for a
    /// zero lease or a Redlock master that is a replica, and [`LockError::NotInitialized`]
    /// for the global client before [`init`](crate::init).
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        acquire(self).await
    }

    /// One try, without waiting: `Ok(Some(guard))` when granted, `Ok(None)` when someone else
    /// holds the lock — busy is no error — and `Err` only for a failure (the store, the
    /// request's settings). For work that must not run twice at once and is simply skipped
    /// when it already runs elsewhere (a scheduled job on every replica, say); the request's
    /// `wait` is ignored, and the try ends within the response timeout
    /// ([`Config::response_timeout`](crate::Config::response_timeout)), connect included. A busy lock is logged at DEBUG and counted in
    /// `distlock_acquire_busy_total`, not as a timeout.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), distlock::LockError> {
    /// match distlock::lock("report:daily").try_acquire().await? {
    ///     Some(guard) => {
    ///         // … the job …
    ///         guard.release().await?;
    ///     }
    ///     None => { /* it runs elsewhere: skip */ }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(mut self) -> Result<Option<LockGuard>, LockError> {
        self.settings.wait = Some(Duration::ZERO);
        self.busy_expected = true;
        match acquire(self).await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }
}

/// Takes what `request` asks for, waiting as it says (see [`LockRequest::acquire`]).
async fn acquire(request: LockRequest) -> Result<LockGuard, LockError> {
    let engine = request.engine.clone().ok_or(LockError::NotInitialized)?;
    if let Some(err) = request.refusal() {
        return Err(err);
    }
    let store = engine.store_name;
    let busy_expected = request.busy_expected;
    let mut observed = match &request.target {
        Target::All(names) => Acquire::start(&names.join(","), Kind::Write.into(), store),
        target => Acquire::start(&target.label(","), target.kind().into(), store),
    };
    let outcome = if observed.span.is_disabled() {
        // No subscriber takes the span: no wrapper around the acquire loop (hot path).
        run(request, &engine, &mut observed).await
    } else {
        let span = observed.span.clone();
        run(request, &engine, &mut observed).instrument(span).await
    };
    if let Err(err) = &outcome {
        match err {
            LockError::Timeout { .. } if busy_expected => observed.busy(),
            LockError::Timeout { .. } => observed.timed_out(),
            err => observed.failed(err),
        }
    }
    outcome
}

/// The loop: try, and while the lock is held, pause and try again until the deadline.
async fn run(
    request: LockRequest,
    inner: &Engine,
    observed: &mut Acquire,
) -> Result<LockGuard, LockError> {
    if inner.shut_down.load(Ordering::Relaxed) {
        return Err(LockError::ShutDown);
    }
    let mut plan = Plan::of(request, inner)?;
    observed.try_once = plan.deadline == plan.started;
    // A fair request's place in the key's queue, until the request ends.
    let mut fair = match (&plan.keys, plan.exclusive) {
        (Keys::One(key), Exclusive::Fair) => Some(FairWait::new(
            &inner.releaser,
            key,
            inner.config.fair_heartbeat,
        )),
        _ => None,
    };
    let mut refused_before = false;
    // Whether a try was answered "held": a later try that the wait's end cuts off then ends
    // the request as a timeout, not as a failure of the store.
    let mut held_seen = false;
    let mut first_try = true;
    loop {
        // A shutdown also ends a request that is waiting: it takes no grant after it.
        if inner.shut_down.load(Ordering::Relaxed) {
            return Err(LockError::ShutDown);
        }
        // Every try has an owner token of its own, so a try can never be mistaken for an
        // earlier one whose grant is being given back: a late grant's clean-up and the next
        // try may reach Redis in either order.
        let sent = inner.clock.now();
        let pending = PendingGrant {
            releaser: &inner.releaser,
            kind: plan.kind,
            keys: plan.keys.as_slice(),
            owner: match &fair {
                Some(fair) => fair.new_owner(&inner.holder),
                None => new_owner(&inner.holder),
            },
            expires: sent + plan.lease,
            settled: false,
        };
        observed.tried();
        if let Some(fair) = &mut fair {
            fair.trying(&pending.owner, pending.expires);
        }
        let budget = plan.budget(inner, first_try);
        first_try = false;
        let reply = plan
            .send(inner, &pending.owner, refused_before, fair.as_ref(), budget)
            .await;
        let refusal = match reply {
            Ok(Outcome::Granted(_))
                if inner.clock.now() >= sent + plan.lease - drift(plan.lease) =>
            {
                // The reply came too late to leave any of the lease: dropping the unsettled
                // try gives the grant back; try again like a held lock.
                drop(pending);
                Refusal::default()
            }
            Ok(Outcome::Granted(tokens)) => {
                let owner = pending.settle();
                if let Some(fair) = fair.take() {
                    fair.granted();
                }
                return plan.grant(inner, observed, owner, tokens, sent).await;
            }
            Ok(Outcome::Refused(refusal)) => {
                pending.settle();
                held_seen = true;
                observed.refused();
                // A fair try refused behind other waiters did not get to the write side's try,
                // so it set no writer-waiting mark for a later grant to take away (which would
                // cost that grant a command).
                refused_before |= !matches!(refusal.queued, Some((_, true)));
                if let (Some(fair), Some((place, behind))) = (&mut fair, refusal.queued) {
                    fair.refused(place, behind);
                }
                refusal
            }
            Err(err) => {
                if is_ambiguous(&err) {
                    // Gives the possible grant back in the background; the next try has an
                    // owner token of its own.
                    drop(pending);
                } else {
                    pending.settle();
                }
                if held_seen && matches!(&err, LockError::Backend(cut) if cut.is_cut_by_wait()) {
                    // The lock was held when the store last answered, and the wait is over.
                    return Err(plan.timed_out(Instant::now()));
                }
                plan.retry_after(inner, observed, err).await?;
                continue;
            }
        };
        plan.pause(inner, observed, &refusal, fair.as_ref()).await?;
    }
}

/// A request's keys, with the configured prefix.
enum Keys {
    One(LockKey),
    /// A multi-key request's, in the order every request takes them, and how errors name
    /// them together.
    Many {
        keys: Vec<LockKey>,
        label: String,
    },
}

impl Keys {
    fn as_slice(&self) -> &[LockKey] {
        match self {
            Keys::One(key) => std::slice::from_ref(key),
            Keys::Many { keys, .. } => keys,
        }
    }

    fn label(&self) -> &str {
        match self {
            Keys::One(key) => &key.name,
            Keys::Many { label, .. } => label,
        }
    }

    /// Each key, by value: one, or every key of a multi-key request (no allocation for one).
    fn into_iter(self) -> impl Iterator<Item = LockKey> {
        let (one, many) = match self {
            Keys::One(key) => (Some(key), Vec::new()),
            Keys::Many { keys, .. } => (None, keys),
        };
        one.into_iter().chain(many)
    }
}

/// A request checked and fixed: what every try of it sends, and until when it tries.
struct Plan {
    keys: Keys,
    /// The kind of each try; a fair request's tries carry a seat in the key's queue too.
    kind: Kind,
    /// Whether the exclusive lock is queued for or kept past its release (`Plain` for the
    /// other kinds).
    exclusive: Exclusive,
    lease: Duration,
    fencing: bool,
    watchdog: bool,
    max_hold: Option<Duration>,
    /// The wait runs on the caller's clock; leases on the store's (see `clock`).
    started: Instant,
    deadline: Instant,
    /// When the last try is sent: the deadline less [`last_try_allowance`], so that it has
    /// that long to be answered within the wait. A pause ends there at the latest; a try sent
    /// at or after it is the last.
    last_try: Instant,
    /// Whether the request waits at all (`false`: `wait(0)`, `try_acquire`: one try, bounded
    /// by the response timeout).
    waits: bool,
    /// Whether the wait is what is left of a longer one (a campaign's round): its first try
    /// gets no more than the wait either ([`Plan::budget`]).
    strict_wait: bool,
    backoff: Backoff,
    /// Retries left after failures that may pass ([`Config::retry`](crate::Config::retry)),
    /// and the pause before the next.
    retries_left: u32,
    retry_pause: Duration,
    /// The registration for the release of the key found held last, and that key's position;
    /// made on the first pause, kept while the same key is the one waited for.
    registration: Option<(usize, WaitRegistration)>,
}

impl Plan {
    /// Checks `request` against the client's settings and fixes its keys and deadline.
    fn of(request: LockRequest, inner: &Engine) -> Result<Self, LockError> {
        let config = &inner.config;
        let kind = request.target.kind();
        let (keys, exclusive) = match request.target {
            Target::Write { name, exclusive } => (
                Keys::One(LockKey::new(&config.key_prefix, name)?),
                exclusive,
            ),
            Target::Read { name } => (
                Keys::One(LockKey::new(&config.key_prefix, name)?),
                Exclusive::Plain,
            ),
            Target::Semaphore { name, permits } => {
                let key = LockKey::new(&config.key_prefix, name)?;
                if permits == 0 {
                    return Err(crate::kind::semaphore::no_permits(&key));
                }
                (Keys::One(key), Exclusive::Plain)
            }
            Target::All(names) => {
                let keys = crate::kind::multi::ordered_keys(&config.key_prefix, names)?;
                let label = keys
                    .iter()
                    .map(|key| key.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ");
                (Keys::Many { keys, label }, Exclusive::Plain)
            }
        };
        let settings = request.settings;
        let lease = settings.checked_lease(config, &Refusing::Request(keys.label()))?;
        let wait = settings.wait.unwrap_or(config.default_wait);
        let strict_wait = request.strict_wait;
        let started = Instant::now();
        let deadline = started
            .checked_add(wait)
            .unwrap_or_else(|| started + Duration::from_secs(100 * 365 * 24 * 3600));
        let last_try = if inner.clock == crate::clock::Clock::Tokio {
            deadline
        } else {
            deadline
                .checked_sub(last_try_allowance(config.response_timeout))
                .unwrap_or(started)
                .max(started)
        };
        Ok(Self {
            keys,
            kind,
            exclusive,
            lease,
            fencing: settings.fencing.unwrap_or(config.fencing),
            watchdog: settings.watchdog,
            max_hold: settings.max_hold,
            started,
            deadline,
            last_try,
            waits: !wait.is_zero(),
            strict_wait,
            backoff: Backoff::new(config.backoff_min, config.backoff_max),
            retries_left: config.retry_attempts,
            retry_pause: config.retry_interval,
            registration: None,
        })
    }

    /// Sends one try with `owner`, through the store's one-key or multi-key call, cut off
    /// after `budget` ([`Plan::budget`]) — by the store where it can
    /// ([`AnyStore::cuts_tries`](crate::store::AnyStore::cuts_tries)), else by [`within`].
    async fn send(
        &self,
        inner: &Engine,
        owner: &str,
        refused_before: bool,
        fair: Option<&FairWait<'_>>,
        budget: Option<Duration>,
    ) -> Result<Outcome, LockError> {
        let wait_left = self.deadline - Instant::now().min(self.deadline);
        // Nothing on the last try: a writer that will not try again holds no reader up.
        let tries_left = self.last_try - Instant::now().min(self.last_try);
        let writer_waiting = writer_waiting_mark(inner.config.backoff_max, tries_left);
        // On the real clock, which the stores' timeouts run on (`clock.rs`).
        let now = std::time::Instant::now();
        let deadline = now.checked_add(wait_left);
        let cut = budget.and_then(|budget| now.checked_add(budget));
        match &self.keys {
            Keys::One(key) => {
                let attempt = Try {
                    kind: self.kind,
                    key,
                    owner,
                    lease: self.lease,
                    writer_waiting,
                    refused_before,
                    fencing: self.fencing,
                    seat: fair.map(|fair| fair.seat),
                    proposed: None,
                    deadline,
                    cut,
                };
                if inner.store.cuts_tries() {
                    // The store ends the try at `cut` itself, on the timers it runs anyway.
                    let reply = inner.clock.send(&inner.io, inner.store.acquire(&attempt));
                    return reply
                        .await
                        .map(Outcome::from)
                        .map_err(|err| self.cut_by_wait(err, inner, budget, cut));
                }
                // Boxed: the try's future stays as small as where the store cuts it.
                let reply = Box::pin(within(
                    budget,
                    self.waits,
                    inner,
                    inner.store.acquire(&attempt),
                ));
                inner.clock.send(&inner.io, reply).await.map(Outcome::from)
            }
            Keys::Many { keys, .. } => {
                let attempt = MultiTry {
                    keys,
                    owner,
                    lease: self.lease,
                    writer_waiting,
                    refused_before,
                    fencing: self.fencing,
                    proposed: None,
                    deadline,
                    cut,
                };
                let reply = Box::pin(within(
                    budget,
                    self.waits,
                    inner,
                    inner.store.acquire_all(&attempt),
                ));
                inner
                    .clock
                    .send(&inner.io, reply)
                    .await
                    .map(Outcome::from)
                    .map_err(|err| self.cut_by_wait(err, inner, budget, cut))
            }
        }
    }

    /// The grant: one lease per key, all under `owner` and the send time, watched by the
    /// watchdog and held by one guard — so renewals, releases, `inspect` and `force_unlock`
    /// see each key of a multi-key grant as an ordinary write lock.
    async fn grant(
        self,
        inner: &Engine,
        observed: &Acquire,
        owner: String,
        tokens: GrantTokens,
        sent: std::time::Instant,
    ) -> Result<LockGuard, LockError> {
        // The grant's span names the request: its one key, or every key of a multi-key grant
        // (the other keys' leases get spans of their own).
        let mut hold = Some(observed.granted(self.keys.label(), tokens.of(0), self.lease));
        let count = self.keys.as_slice().len();
        let mut owner = Some(owner);
        let mut first = None;
        let mut more = Vec::with_capacity(count.saturating_sub(1));
        for (at, key) in self.keys.into_iter().enumerate() {
            let token = tokens.of(at);
            let hold = hold
                .take()
                .unwrap_or_else(|| observed.granted(&key.name, token, self.lease));
            let lease = Arc::new(
                Lease::new(
                    // A grant taken through a seat is given back by leaving the queue.
                    if self.exclusive == Exclusive::Fair {
                        Holding::Seat
                    } else {
                        Holding::Grant(self.kind)
                    },
                    key,
                    // Moved into the last lease, cloned for the others.
                    if at + 1 == count {
                        owner.take().unwrap_or_default()
                    } else {
                        owner.clone().unwrap_or_default()
                    },
                    token,
                    self.lease,
                    self.watchdog,
                    self.max_hold,
                    sent,
                    inner.clock,
                    hold,
                )
                .held_until(match self.exclusive {
                    Exclusive::HeldAtLeast(min_hold) => sent.checked_add(min_hold),
                    Exclusive::Plain | Exclusive::Fair => None,
                }),
            );
            inner.watchdog.watch(lease.clone());
            match first {
                None => first = Some(lease),
                Some(_) => more.push(lease),
            }
        }
        let Some(first) = first else {
            // `Plan::of` refuses a request of no key; no store grants one.
            return Err(LockError::Config(
                "`lock_all` was given no key: name at least one".to_owned(),
            ));
        };
        let guard = LockGuard::new(first, more, inner.releaser.clone());
        if inner.shut_down.load(Ordering::SeqCst) {
            // Granted while the client shut down: given back at once.
            let _ = guard.release().await;
            return Err(LockError::ShutDown);
        }
        Ok(guard)
    }
}
