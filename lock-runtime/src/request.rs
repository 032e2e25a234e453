//! [`LockRequest`]: what a request asks for — its [`Target`] (one key of a kind, or several
//! keys at once) and its settings — built with consuming setters. The builder is also where a
//! request that can never be granted is refused, once, before any try: a fair read, semaphore
//! or multi-key request, a lease out of bounds. [`Client`](crate::client::Client)'s request methods are in
//! `client/requests.rs`, the global client's in `global.rs`; the acquire loop (`acquire/`) takes a request
//! ([`LockRequest::acquire`]).

use std::sync::Arc;
use std::time::Duration;

use crate::config::{lease_out_of_bounds, Config};
use crate::engine::Engine;
use crate::error::LockError;
use crate::kind::Kind;

/// What a request takes.
#[derive(Debug)]
pub(crate) enum Target {
    /// One key (as given, without the configured prefix) and the kind of grant asked for.
    Key { name: String, kind: Kind },
    /// The write locks of every key, at once ([`lock_all`](crate::lock_all)); as given.
    Keys(Vec<String>),
}

impl Target {
    /// The keys as given, for errors: one name, or every name joined with `sep`.
    pub(crate) fn label(&self, sep: &str) -> String {
        match self {
            Target::Key { name, .. } => name.clone(),
            Target::Keys(names) => names.join(sep),
        }
    }
}

/// A request for one lock, built with consuming setters and sent by
/// [`acquire`](LockRequest::acquire).
///
/// ## Behavior
///
/// - One try is one round trip. While the lock is held, the request sleeps a random time
///   between zero and an exponentially growing ceiling (full jitter), never longer than the
///   holder's remaining lease and never past the last try, and tries again. The last try is
///   sent a hundredth of the response timeout (10 ms by default) before the wait's deadline,
///   so that its answer comes within the wait; its refusal ends the request with
///   [`LockError::Timeout`] at the deadline. A wait of zero tries
///   once.
/// - The request ends within its wait, also against a server that takes connections and
///   answers nothing (a frozen process, a proxy whose store is gone): each try, its connect
///   included, is cut off at what is left of the wait, whatever the response and connect
///   timeouts. A wait of zero gives its one try the response timeout; a request's first try
///   gets at least a tenth of it (100 ms by default), so a wait shorter than that may take
///   as long. A try cut off fails as a response timeout does ([`LockError::Backend`], kind
///   `Timeout`), or ends the request with [`LockError::Timeout`] when an earlier try found the
///   lock held.
/// - A store error ends the request at once with [`LockError::Backend`] (on Redlock,
///   [`LockError::QuorumUnavailable`] when too few masters answered), unless it may pass and
///   the wait leaves time to try again ([`Config::retry`](crate::Config::retry)). If the
///   failed try may still have taken the lock (a timeout, a broken connection, a try cut off
///   by the wait), or the acquire future is dropped while a try is under way, the possible
///   grant is deleted in the background with a compare-and-delete.
#[must_use = "a lock request does nothing until `.acquire().await`"]
#[derive(Debug)]
pub struct LockRequest {
    pub(crate) engine: Option<Arc<Engine>>,
    pub(crate) target: Target,
    pub(crate) lease: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) watchdog: bool,
    pub(crate) fencing: Option<bool>,
    /// Queued in request order among fair waiters ([`LockRequest::fair`]).
    pub(crate) fair: bool,
    /// A lock held elsewhere is an expected outcome, not a timeout ([`LockRequest::try_acquire`],
    /// `on_busy = "skip"`): the request's span, log and metrics say "busy".
    pub(crate) busy_expected: bool,
    /// Given back earlier, the lock is kept until the grant plus this ([`LockRequest::hold_at_least`]).
    pub(crate) hold_at_least: Option<Duration>,
    /// The wait is what is left of a longer one (a campaign's round): no try of the request
    /// runs past it, not even the first (which otherwise gets a tenth of the response timeout
    /// at least).
    pub(crate) strict_wait: bool,
}

impl LockRequest {
    /// A request for the grant of `kind` on the key `name`.
    pub(crate) fn new(engine: Option<Arc<Engine>>, name: String, kind: Kind) -> Self {
        Self::of(engine, Target::Key { name, kind })
    }

    /// A request for the write locks of every key of `keys` at once ([`lock_all`](crate::lock_all)).
    pub(crate) fn all<I, K>(engine: Option<Arc<Engine>>, keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        Self::of(
            engine,
            Target::Keys(keys.into_iter().map(Into::into).collect()),
        )
    }

    fn of(engine: Option<Arc<Engine>>, target: Target) -> Self {
        Self {
            engine,
            target,
            lease: None,
            wait: None,
            max_hold: None,
            watchdog: true,
            fencing: None,
            fair: false,
            busy_expected: false,
            hold_at_least: None,
            strict_wait: false,
        }
    }

    /// Lease (time to live) of the grant; the watchdog renews it while the guard lives.
    /// Defaults to the client's [`Config::default_lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long to wait while someone else holds the lock; zero tries once. The request ends
    /// within it, also when the store does not answer (see [Behavior](LockRequest#behavior)).
    /// Defaults to the client's [`Config::default_wait`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The longest the lock is held, renewals included: past it the watchdog stops renewing
    /// and the guard reports the lease lost ([`LockGuard::lost`] completes; an annotated fn
    /// with `on_lost = "abort"` returns [`LockError::HeldTooLong`]). A cap on hung work, like
    /// a maximum number of renewals. At least the lease; none by default.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Holds the lock at least this long from its grant: given back earlier (the guard released
    /// or dropped, the annotated fn returned), it stays held — not renewed — until the grant
    /// plus `min_hold`, then expires, so nobody else starts the same job within that window
    /// (ShedLock's `lockAtLeastFor`: a job that finishes quickly on one node is not run again by
    /// another whose clock is a little behind). The release shortens the lease to what is left
    /// of the window instead of deleting the key, checked against the owner like every
    /// release. Only for the exclusive (write) lock of one key, not fair; at most `max_hold`
    /// where both are given — otherwise the request fails with [`LockError::Config`].
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), distlock::LockError> {
    /// use std::time::Duration;
    /// if let Some(guard) = distlock::lock("job:every-minute")
    ///     .hold_at_least(Duration::from_secs(30))
    ///     .try_acquire()
    ///     .await?
    /// {
    ///     // … a job that may end in a second …
    ///     guard.release().await?; // held until 30 s after the grant all the same
    /// }
    /// # Ok(()) }
    /// ```
    pub fn hold_at_least(mut self, min_hold: Duration) -> Self {
        self.hold_at_least = Some(min_hold);
        self
    }

    /// Whether the watchdog renews the lease while the guard lives; with `false` the lease is a
    /// hard time limit and the guard reports it lost when it runs out. Defaults to `true`.
    pub fn watchdog(mut self, renew: bool) -> Self {
        self.watchdog = renew;
        self
    }

    /// Whether the grant carries a fencing token. Defaults to the client's
    /// [`Config::fencing`] (`true`).
    ///
    /// `false` is the efficiency mode, for a lock that only keeps work from being done twice:
    /// the first try of a write grant is a bare `SET NX PX` (no script), no fencing counter is
    /// written, and [`LockGuard::fencing_token`] is `None` — there is no token to hand to a
    /// store, so a holder paused past its lease can still write after the next holder.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), distlock::LockError> {
    /// let guard = distlock::lock("report:daily").fencing(false).acquire().await?;
    /// assert_eq!(guard.fencing_token(), None);
    /// # Ok(()) }
    /// ```
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = Some(fencing);
        self
    }

    /// Makes the request fair: it waits in the key's queue and is granted in request order
    /// among the key's fair waiters (FIFO), instead of to whoever tries first after a release.
    /// Only for the exclusive (write) lock; a read, semaphore or multi-key request made fair
    /// fails with [`LockError::Config`]. Defaults to not fair.
    ///
    /// ## Behavior
    ///
    /// - The first try joins the queue; its place is the server's clock when it got there
    ///   (on Redlock, this client's clock when the request started, the same on every master,
    ///   so that the masters agree on the order). Only the queue's head is granted the lock.
    /// - A release wakes the head alone; every waiter also tries again at least every half
    ///   [`Config::fair_heartbeat`], which keeps its place (the fallback when a wake-up is lost).
    /// - A waiter that stops trying — crashed, frozen, cut off — is dropped from the queue one
    ///   and a half heartbeats after its last try, on the server's clock, by the next try of
    ///   any waiter; so a dead waiter holds the queue up for at most two heartbeats. A waiter
    ///   whose request times out, fails or is cancelled (its future dropped) leaves the queue at
    ///   once, in the background. A waiter dropped while alive (its process stalled past its
    ///   heartbeat) comes back at the place it had: each refusal tells it its place.
    /// - Unfair requests for the same key ([`lock`], [`write_lock`]) do not queue: they take the
    ///   lock whenever they find it free, and exclude fair holders as any writer does.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), distlock::LockError> {
    /// let guard = distlock::lock("invoice:7").fair().acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    /// Refuses, before any try, a request that no store could grant: a fair request whose
    /// kind has no queue, and a multi-key request naming no key.
    pub(crate) fn refusal(&self) -> Option<LockError> {
        if let Target::Keys(names) = &self.target {
            if names.is_empty() {
                return Some(LockError::Config(
                    "`lock_all` was given no key: name at least one".to_owned(),
                ));
            }
        }
        if let Some(err) = self.hold_at_least_refusal() {
            return Some(err);
        }
        if !self.fair {
            return None;
        }
        let what = match &self.target {
            Target::Keys(_) => "multi-key lock (taken in a fixed key order, not queued)",
            Target::Key {
                kind: Kind::Read, ..
            } => "read lock (readers share the lock and need no queue)",
            Target::Key {
                kind: Kind::Semaphore(_),
                ..
            } => "semaphore",
            Target::Key {
                kind: Kind::Write, ..
            } => return None,
        };
        Some(LockError::Config(format!(
            "lock `{}` was requested fair as a {what}; only the exclusive lock (`lock`, \
             `write_lock`) queues its waiters: drop `.fair()`",
            self.target.label(", ")
        )))
    }

    /// `hold_at_least` on a request that cannot keep it: another kind than the one-key exclusive
    /// lock, a fair request, or a window longer than `max_hold`.
    fn hold_at_least_refusal(&self) -> Option<LockError> {
        let min_hold = self.hold_at_least?;
        let name = self.target.label(", ");
        let exclusive = matches!(
            self.target,
            Target::Key {
                kind: Kind::Write,
                ..
            }
        );
        if !exclusive || self.fair {
            return Some(LockError::Config(format!(
                "lock `{name}`: `hold_at_least` keeps the exclusive lock of one key past its \
                 release; a read, semaphore, multi-key or fair request cannot be kept: drop \
                 `hold_at_least`"
            )));
        }
        match self.max_hold {
            Some(max_hold) if min_hold > max_hold => Some(LockError::Config(format!(
                "lock `{name}`: `hold_at_least` ({min_hold:?}) is longer than `max_hold` \
                 ({max_hold:?}): the lock could not be held that long; shorten `hold_at_least` \
                 or lengthen `max_hold`"
            ))),
            _ => None,
        }
    }

    /// A request's `lease`, or the client's default, checked against its bounds and against
    /// `max_hold`; `name` names the lock in the error.
    pub(crate) fn checked_lease(
        lease: Option<Duration>,
        max_hold: Option<Duration>,
        config: &Config,
        name: &str,
    ) -> Result<Duration, LockError> {
        let lease = lease.unwrap_or(config.default_lease);
        if let Some(why) = lease_out_of_bounds(lease) {
            return Err(LockError::Config(format!(
                "the lease of lock `{name}` is {why}"
            )));
        }
        if let Some(max_hold) = max_hold.filter(|&max_hold| max_hold < lease) {
            return Err(LockError::Config(format!(
                "the max_hold of lock `{name}` ({max_hold:?}) is shorter than its lease ({lease:?}): \
                 it would be given up before its first renewal; make max_hold at least the lease"
            )));
        }
        Ok(lease)
    }
}
