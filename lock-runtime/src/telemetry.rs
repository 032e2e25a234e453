//! What distlock tells the outside about its work: `tracing` spans and events (target
//! [`LOG_TARGET`]), and — with the cargo feature `metrics` — counters, gauges and histograms
//! through the [`metrics`](https://docs.rs/metrics) facade. Everything an operator can observe
//! is named here, in one place; the acquire loop (`acquire/`), the lease (`lease.rs`), the
//! watchdog and the stores call in at the moments they describe.
//!
//! - **`acquire` span** (DEBUG), one per [`LockRequest::acquire`](crate::LockRequest::acquire):
//!   `key`, `mode`, `store`, then `attempts`, `waited_ms`, `token` and `outcome`
//!   (`acquired`, `timeout`, `error`), with one event as it ends (`timeout`: INFO when the
//!   request waited, DEBUG for a try-once request).
//! - **`hold` span** (DEBUG), one per grant, from the grant to its end: `key`, `mode`, `store`,
//!   `token`, `lease_ms`, then `held_ms`, `renewals` and `ended` (`released`, `dropped`,
//!   `lost`, `shutdown`). The attribute runs the fn's body inside it, so the body's own events
//!   name the lock they ran under.
//! - **Metrics** (feature `metrics`), each labelled with `store` (`redis`, `sentinel`,
//!   `cluster`, `redlock`, `memory`) and most with `mode` (`write`, `read`, `semaphore`): see
//!   [`METRICS`].
//!
//! - **Elections** (`telemetry/leadership.rs`): this process's leadership (a gauge, a counter
//!   of changes by cause, INFO events) and what observers see.
//!
//! Every span, event and metric is listed in `docs/observability.md`; the conformance test
//! `observability_doc` fails when the code and the page disagree.
//!
//! Without a subscriber or a recorder all of this costs a few relaxed loads per request.

mod leadership;

pub(crate) use leadership::{observed_leader, observed_vacancy, Term, TermEnd};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tracing::field::Empty;
use tracing::Span;

use crate::protocol::{FencingToken, LockMode};

/// The `tracing` target of every span and event distlock emits (`RUST_LOG=distlock=debug`).
pub const LOG_TARGET: &str = "distlock";

/// The metrics distlock records with the `metrics` feature: name, kind, labels and meaning.
///
/// | name | kind | labels | meaning |
/// |---|---|---|---|
/// | `distlock_acquire_seconds` | histogram | store, mode, outcome | time from request to grant, timeout or error |
/// | `distlock_wait_seconds` | histogram | store, mode, outcome | for requests that found the lock held: time from the first refusal to the outcome |
/// | `distlock_acquire_timeouts_total` | counter | store, mode | requests that ran out of wait |
/// | `distlock_acquire_errors_total` | counter | store, mode | requests that failed with an error |
/// | `distlock_locks_held` | gauge | store, mode | grants held by this process now |
/// | `distlock_hold_seconds` | histogram | store, mode, ended | how long grants were held, by how they ended |
/// | `distlock_leases_lost_total` | counter | store, mode | leases lost while held (expired unrenewed, or no longer ours) |
/// | `distlock_renewals_total` | counter | store | leases renewed by the watchdog |
/// | `distlock_wakeups_total` | counter | store | waits ended early by a release announcement |
/// | `distlock_acquire_retries_total` | counter | store, mode | tries sent again after a failure that may pass ([`Config::retry`](crate::Config::retry)) |
/// | `distlock_acquire_busy_total` | counter | store, mode | requests that found the lock held and skipped ([`LockRequest::try_acquire`](crate::LockRequest::try_acquire), `on_busy = "skip"`) |
/// | `distlock_leader` | gauge | election | 1 while this process leads the election, 0 otherwise |
/// | `distlock_leadership_changes_total` | counter | election, cause | changes of this process's leadership: `gained`, `lost`, `resigned` |
pub const METRICS: &[&str] = &[
    ACQUIRE_SECONDS,
    WAIT_SECONDS,
    ACQUIRE_TIMEOUTS,
    ACQUIRE_ERRORS,
    LOCKS_HELD,
    HOLD_SECONDS,
    LEASES_LOST,
    RENEWALS,
    WAKEUPS,
    ACQUIRE_RETRIES,
    ACQUIRE_BUSY,
    leadership::LEADER,
    leadership::LEADERSHIP_CHANGES,
];

const ACQUIRE_SECONDS: &str = "distlock_acquire_seconds";
const WAIT_SECONDS: &str = "distlock_wait_seconds";
const ACQUIRE_TIMEOUTS: &str = "distlock_acquire_timeouts_total";
const ACQUIRE_BUSY: &str = "distlock_acquire_busy_total";
const ACQUIRE_ERRORS: &str = "distlock_acquire_errors_total";
const LOCKS_HELD: &str = "distlock_locks_held";
const HOLD_SECONDS: &str = "distlock_hold_seconds";
const LEASES_LOST: &str = "distlock_leases_lost_total";
const RENEWALS: &str = "distlock_renewals_total";
const WAKEUPS: &str = "distlock_wakeups_total";
const ACQUIRE_RETRIES: &str = "distlock_acquire_retries_total";

/// Describes every metric to the installed recorder (units and help texts). Called when a
/// client is made; a recorder installed later sees the metrics without their descriptions.
pub(crate) fn describe() {
    #[cfg(feature = "metrics")]
    {
        use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
        describe_histogram!(
            ACQUIRE_SECONDS,
            Unit::Seconds,
            "Time from a lock request to its grant, timeout or error."
        );
        describe_histogram!(
            WAIT_SECONDS,
            Unit::Seconds,
            "For requests that found the lock held: time from the first refusal to the outcome."
        );
        describe_counter!(ACQUIRE_TIMEOUTS, "Lock requests that ran out of wait.");
        describe_counter!(
            ACQUIRE_BUSY,
            "Lock requests that found the lock held and skipped (try_acquire, on_busy = \"skip\")."
        );
        describe_counter!(ACQUIRE_ERRORS, "Lock requests that failed with an error.");
        describe_gauge!(LOCKS_HELD, "Grants held by this process now.");
        describe_histogram!(
            HOLD_SECONDS,
            Unit::Seconds,
            "How long grants were held, by how they ended."
        );
        describe_counter!(LEASES_LOST, "Leases lost while held.");
        describe_counter!(RENEWALS, "Leases renewed by the watchdog.");
        describe_counter!(WAKEUPS, "Waits ended early by a release announcement.");
        describe_counter!(
            ACQUIRE_RETRIES,
            "Tries sent again after a failure that may pass (a connection refused or reset, a \
             server not ready, too few Redlock masters)."
        );
        leadership::describe();
    }
}

/// Whether anything takes what `span` would carry: a subscriber that records it, or metrics.
fn observed(span: &Span) -> bool {
    cfg!(feature = "metrics") || !span.is_disabled()
}

fn mode_name(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Write => "write",
        LockMode::Read => "read",
        LockMode::Semaphore => "semaphore",
    }
}

/// One lock request as it is observed: its span, and what it has done so far.
pub(crate) struct Acquire {
    pub(crate) span: Span,
    /// The span the caller was in, parent of the grant's `hold` span.
    caller: Span,
    store: &'static str,
    mode: &'static str,
    /// When the request started; `None` when nothing observes it (no subscriber takes the
    /// span, no metrics), so the hot path reads no clock for it.
    started: Option<Instant>,
    attempts: u32,
    first_refused: Option<Instant>,
    /// The request tries once (a zero wait): running out of wait is its normal "busy".
    pub(crate) try_once: bool,
    /// Its outcome is recorded (a grant given back at once because the client shut down is
    /// not recorded again as an error).
    finished: std::sync::atomic::AtomicBool,
}

impl Acquire {
    pub(crate) fn start(key: &str, mode: LockMode, store: &'static str) -> Self {
        let mode = mode_name(mode);
        let span = tracing::debug_span!(
                target: LOG_TARGET,
                "acquire",
                key,
                mode,
                store,
                attempts = Empty,
                waited_ms = Empty,
                token = Empty,
                outcome = Empty,
        );
        // The caller's span is looked up only when spans are recorded at all (hot path).
        let caller = if span.is_disabled() {
            Span::none()
        } else {
            Span::current()
        };
        let started = observed(&span).then(Instant::now);
        Self {
            span,
            caller,
            store,
            mode,
            started,
            attempts: 0,
            first_refused: None,
            try_once: false,
            finished: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A try is sent.
    pub(crate) fn tried(&mut self) {
        self.attempts += 1;
    }

    /// A try found the lock held.
    pub(crate) fn refused(&mut self) {
        if self.started.is_some() {
            self.first_refused.get_or_insert_with(Instant::now);
        }
    }

    /// A try failed with `err`, which may pass: the request tries again after `pause`.
    pub(crate) fn retrying(&self, err: &crate::error::LockError, pause: Duration) {
        tracing::debug!(
            target: LOG_TARGET,
            pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
            "a try failed, retrying within the wait: {err}"
        );
        #[cfg(feature = "metrics")]
        metrics::counter!(ACQUIRE_RETRIES, "store" => self.store, "mode" => self.mode).increment(1);
    }

    /// A wait between tries ended; `woken`: by a release announcement.
    pub(crate) fn waited(&self, woken: bool) {
        if woken {
            #[cfg(feature = "metrics")]
            metrics::counter!(WAKEUPS, "store" => self.store).increment(1);
        }
    }

    fn finish(&self, outcome: &'static str) -> Duration {
        if self.finished.swap(true, Ordering::Relaxed) {
            return Duration::ZERO;
        }
        let Some(started) = self.started else {
            return Duration::ZERO;
        };
        let waited = started.elapsed();
        self.span.record("attempts", self.attempts);
        self.span.record("waited_ms", waited.as_millis() as u64);
        self.span.record("outcome", outcome);
        #[cfg(feature = "metrics")]
        {
            metrics::histogram!(ACQUIRE_SECONDS, "store" => self.store, "mode" => self.mode, "outcome" => outcome)
                .record(waited.as_secs_f64());
            if let Some(refused) = self.first_refused {
                metrics::histogram!(WAIT_SECONDS, "store" => self.store, "mode" => self.mode, "outcome" => outcome)
                    .record(refused.elapsed().as_secs_f64());
            }
        }
        waited
    }

    /// The request was granted: returns the grant's `hold` span.
    pub(crate) fn granted(&self, key: &str, token: Option<FencingToken>, lease: Duration) -> Hold {
        let token = token.map(FencingToken::get);
        if let Some(token) = token {
            self.span.record("token", token);
        }
        let waited = self.finish("acquired");
        tracing::debug!(
            target: LOG_TARGET,
            parent: &self.span,
            attempts = self.attempts,
            waited_ms = waited.as_millis() as u64,
            token,
            "lock acquired"
        );
        Hold::start(self, key, token, lease)
    }

    /// The wait ran out with the lock still held.
    pub(crate) fn timed_out(&self) {
        if self.finished.load(Ordering::Relaxed) {
            return;
        }
        let waited = self.finish("timeout");
        #[cfg(feature = "metrics")]
        metrics::counter!(ACQUIRE_TIMEOUTS, "store" => self.store, "mode" => self.mode)
            .increment(1);
        let waited_ms = waited.as_millis() as u64;
        if self.try_once {
            tracing::debug!(target: LOG_TARGET, parent: &self.span, attempts = self.attempts, waited_ms, "lock held elsewhere (tried once)");
        } else {
            tracing::info!(target: LOG_TARGET, parent: &self.span, attempts = self.attempts, waited_ms, "timed out waiting for the lock");
        }
    }

    /// The lock was held elsewhere and the request expected that might be so (`try_acquire`,
    /// `on_busy = "skip"`): no timeout, the call is skipped.
    pub(crate) fn busy(&self) {
        if self.finished.load(Ordering::Relaxed) {
            return;
        }
        let waited = self.finish("busy");
        #[cfg(feature = "metrics")]
        metrics::counter!(ACQUIRE_BUSY, "store" => self.store, "mode" => self.mode).increment(1);
        tracing::debug!(target: LOG_TARGET, parent: &self.span, attempts = self.attempts, waited_ms = waited.as_millis() as u64, "lock held elsewhere: skipped");
    }

    /// The request failed with `err`.
    pub(crate) fn failed(&self, err: &dyn std::fmt::Display) {
        if self.finished.load(Ordering::Relaxed) {
            return;
        }
        let waited = self.finish("error");
        #[cfg(feature = "metrics")]
        metrics::counter!(ACQUIRE_ERRORS, "store" => self.store, "mode" => self.mode).increment(1);
        tracing::debug!(target: LOG_TARGET, parent: &self.span, attempts = self.attempts, waited_ms = waited.as_millis() as u64, "lock request failed: {err}");
    }
}

/// How a hold ended, for its span, its event and `distlock_hold_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// [`LockGuard::release`](crate::LockGuard::release), or the attribute's release.
    Released,
    /// The guard was dropped unreleased (cancellation, panic, or simply dropped).
    Dropped,
    /// The lease was lost while held.
    Lost,
    /// [`Client::shutdown`](crate::Client::shutdown) gave it back.
    Shutdown,
    /// Released or dropped within its `hold_at_least` window: the lock is kept, unrenewed,
    /// for this much longer, then expires.
    Kept(Duration),
}

impl Ended {
    fn name(self) -> &'static str {
        match self {
            Ended::Released => "released",
            Ended::Dropped => "dropped",
            Ended::Lost => "lost",
            Ended::Shutdown => "shutdown",
            Ended::Kept(_) => "kept",
        }
    }
}

/// One grant as it is observed, from the grant to its end: its `hold` span, and its renewals.
pub(crate) struct Hold {
    span: Span,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    store: &'static str,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    mode: &'static str,
    /// When the grant was made; `None` when nothing observes it.
    since: Option<Instant>,
    renewals: AtomicU64,
    /// The election term this grant is, if it is a leader's ([`lead`](Self::lead)).
    term: OnceLock<Term>,
}

impl Hold {
    fn start(acquire: &Acquire, key: &str, token: Option<u64>, lease: Duration) -> Self {
        let span = tracing::debug_span!(
            target: LOG_TARGET,
            parent: &acquire.caller,
            "hold",
            key,
            mode = acquire.mode,
            store = acquire.store,
            token,
            lease_ms = lease.as_millis() as u64,
            held_ms = Empty,
            renewals = Empty,
            ended = Empty,
        );
        #[cfg(feature = "metrics")]
        metrics::gauge!(LOCKS_HELD, "store" => acquire.store, "mode" => acquire.mode).increment(1);
        Self {
            span,
            store: acquire.store,
            mode: acquire.mode,
            since: acquire.started.map(|_| Instant::now()),
            renewals: AtomicU64::new(0),
            term: OnceLock::new(),
        }
    }

    /// A hold made outside the acquire loop (the watchdog's own tests).
    #[cfg(test)]
    pub(crate) fn detached() -> Self {
        Self {
            span: Span::none(),
            store: "memory",
            mode: "write",
            since: None,
            renewals: AtomicU64::new(0),
            term: OnceLock::new(),
        }
    }

    /// The span the grant is held in (the attribute runs the body inside it).
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// The watchdog renewed the lease.
    pub(crate) fn renewed(&self) {
        self.renewals.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(RENEWALS, "store" => self.store).increment(1);
    }

    /// This grant is the leader's lock of an election from now on: its end ends the `term`.
    /// `still_held`: whether the lease was still held once the term was attached (a lease
    /// that ended just before is ended here, as lost).
    pub(crate) fn lead(&self, term: Term, still_held: impl FnOnce() -> bool) {
        let term = self.term.get_or_init(|| term);
        if !still_held() {
            term.ended(TermEnd::Lost);
        }
    }

    /// The grant stopped being held, `how`. Called once per grant, by the lease as it leaves
    /// its held state.
    pub(crate) fn ended(&self, how: Ended) {
        if let Some(term) = self.term.get() {
            term.ended(match how {
                Ended::Lost => TermEnd::Lost,
                Ended::Released | Ended::Dropped | Ended::Shutdown | Ended::Kept(_) => {
                    TermEnd::Resigned
                }
            });
        }
        let Some(since) = self.since else {
            return;
        };
        let held = since.elapsed();
        let renewals = self.renewals.load(Ordering::Relaxed);
        self.span.record("held_ms", held.as_millis() as u64);
        self.span.record("renewals", renewals);
        self.span.record("ended", how.name());
        #[cfg(feature = "metrics")]
        {
            metrics::gauge!(LOCKS_HELD, "store" => self.store, "mode" => self.mode).decrement(1);
            metrics::histogram!(HOLD_SECONDS, "store" => self.store, "mode" => self.mode, "ended" => how.name())
                .record(held.as_secs_f64());
            if how == Ended::Lost {
                metrics::counter!(LEASES_LOST, "store" => self.store, "mode" => self.mode)
                    .increment(1);
            }
        }
        let held_ms = held.as_millis() as u64;
        let parent = &self.span;
        match how {
            // A loss has its own WARN event, with the reason (`Lease::mark_lost`).
            Ended::Lost => {}
            Ended::Released => {
                tracing::debug!(target: LOG_TARGET, parent: parent, held_ms, renewals, "lock released");
            }
            Ended::Dropped => {
                tracing::debug!(target: LOG_TARGET, parent: parent, held_ms, renewals, "lock dropped");
            }
            Ended::Shutdown => {
                tracing::debug!(target: LOG_TARGET, parent: parent, held_ms, renewals, "lock given back at shutdown");
            }
            Ended::Kept(left) => {
                let kept_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
                tracing::debug!(target: LOG_TARGET, parent: parent, held_ms, renewals, kept_ms,
                    "lock kept until its hold_at_least window ends, in {left:?}");
            }
        }
    }
}
