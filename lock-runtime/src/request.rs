//! [`LockRequest`]: what a request asks for — its [`Target`] (the exclusive lock of one key,
//! fair or kept past its release; a read lock; a semaphore permit; or several keys at once)
//! and its [`Settings`] — built with consuming setters. The target is typed so that what no
//! store could grant cannot be written (a fair read, a kept semaphore); what a setter asked
//! that its target cannot hold is noted and refused here, once, before any try
//! ([`LockRequest::refusal`]), and so are the settings out of bounds ([`settings_refusal`],
//! also the attribute's and the elections' check). `Client`'s request methods are in
//! `client/requests.rs`, the global client's in `global.rs`; the acquire loop
//! (`acquire/`) takes a request ([`LockRequest::acquire`]).

use std::sync::Arc;
use std::time::Duration;

use crate::config::{lease_out_of_bounds, Config};
use crate::engine::Engine;
use crate::error::LockError;
use crate::kind::Kind;

/// What a request takes: only the exclusive lock of one key can queue or be kept past its
/// release, and not both at once.
#[derive(Debug)]
pub(crate) enum Target {
    /// The exclusive (write) lock of one key (as given, without the configured prefix).
    Write { name: String, exclusive: Exclusive },
    /// The read lock of one key.
    Read { name: String },
    /// One of `permits` permits of the semaphore `name`.
    Semaphore { name: String, permits: u32 },
    /// The write locks of every key, at once (`lock_all`); as given.
    All(Vec<String>),
}

/// How an exclusive lock is waited for and given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exclusive {
    /// Taken by whoever tries first after a release; released at once.
    Plain,
    /// Queued in request order among the key's fair waiters ([`LockRequest::fair`]).
    Fair,
    /// Given back earlier, kept until the grant plus this ([`LockRequest::hold_at_least`]).
    HeldAtLeast(Duration),
}

impl Target {
    /// The keys as given, for errors: one name, or every name joined with `sep`.
    pub(crate) fn label(&self, sep: &str) -> String {
        match self {
            Target::Write { name, .. } | Target::Read { name } | Target::Semaphore { name, .. } => {
                name.clone()
            }
            Target::All(names) => names.join(sep),
        }
    }

    /// The kind of grant each key is taken as.
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Target::Write { .. } | Target::All(_) => Kind::Write,
            Target::Read { .. } => Kind::Read,
            Target::Semaphore { permits, .. } => Kind::Semaphore(*permits),
        }
    }
}

/// What the setters asked that the request's [`Target`] cannot hold, refused by
/// [`LockRequest::refusal`] when the request is sent (a setter cannot fail).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Misfit {
    /// [`LockRequest::fair`] on a target that does not queue.
    pub(crate) fair: bool,
    /// [`LockRequest::hold_at_least`] on a target that cannot be kept.
    pub(crate) hold_at_least: bool,
}

/// The settings a request passes to its grant; an election (`election/`) holds those of its
/// campaign's requests.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// `None`: the client's [`Config::default_lease`].
    pub(crate) lease: Option<Duration>,
    /// `None`: the client's [`Config::default_wait`].
    pub(crate) wait: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) watchdog: bool,
    /// `None`: the client's [`Config::fencing`].
    pub(crate) fencing: Option<bool>,
}

impl Settings {
    /// The lease, or the client's default, refused out of bounds or longer than `max_hold`
    /// ([`settings_refusal`], naming what `refusing` says).
    pub(crate) fn checked_lease(
        &self,
        config: &Config,
        refusing: &Refusing<'_>,
    ) -> Result<Duration, LockError> {
        let lease = self.lease.unwrap_or(config.default_lease);
        match settings_refusal(lease, self.max_hold, refusing) {
            Some(err) => Err(err),
            None => Ok(lease),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            lease: None,
            wait: None,
            max_hold: None,
            watchdog: true,
            fencing: None,
        }
    }
}

/// Who a refusal of a lease or `max_hold` names: a request its lock, an election itself, the
/// attribute the arguments as written (which the compiler could not check).
pub(crate) enum Refusing<'a> {
    /// A request for the lock (or keys) `name`.
    Request(&'a str),
    /// The campaign of the election `name`.
    Election(&'a str),
    /// `#[distributed_lock]` on the lock `lock`, with `lease = <expr>` and `max_hold = <expr>`
    /// as written (`None` for a literal).
    Attribute {
        lock: &'a str,
        lease: Option<&'a str>,
        max_hold: Option<&'a str>,
    },
}

impl Refusing<'_> {
    /// The error saying `why`, after who refuses.
    fn error(&self, why: String) -> LockError {
        LockError::Config(match self {
            Refusing::Request(_) => why,
            Refusing::Election(name) => format!("election `{name}`: {why}"),
            Refusing::Attribute { lock, .. } => {
                format!("`#[distributed_lock]` on lock `{lock}`: {why}")
            }
        })
    }

    /// The lease, as the subject of a sentence.
    fn lease(&self) -> String {
        match self {
            Refusing::Request(name) => format!("the lease of lock `{name}`"),
            Refusing::Election(_) => "its lease".to_owned(),
            Refusing::Attribute { lease, .. } => written("lease", *lease),
        }
    }

    /// The lease, as the object of a sentence about `max_hold`.
    fn lease_after_max_hold(&self) -> String {
        match self {
            Refusing::Request(_) | Refusing::Election(_) => "its lease".to_owned(),
            Refusing::Attribute { lease, .. } => written("lease", *lease),
        }
    }

    fn max_hold(&self) -> String {
        match self {
            Refusing::Request(name) => format!("the max_hold of lock `{name}`"),
            Refusing::Election(_) => "its max_hold".to_owned(),
            Refusing::Attribute { max_hold, .. } => written("max_hold", *max_hold),
        }
    }

    /// What would be given up.
    fn holder(&self) -> &'static str {
        match self {
            Refusing::Request(_) | Refusing::Election(_) => "it",
            Refusing::Attribute { .. } => "the lock",
        }
    }
}

/// An attribute's argument as written: `` `lease = <expr>` ``, or `` `lease` `` for a literal.
fn written(argument: &str, expr: Option<&str>) -> String {
    match expr {
        Some(expr) => format!("`{argument} = {expr}`"),
        None => format!("`{argument}`"),
    }
}

/// Refuses a lease out of bounds, and a `max_hold` shorter than the lease (it would be given
/// up before its first renewal); `refusing` names them. The one check of both, for requests,
/// elections and the attribute.
pub(crate) fn settings_refusal(
    lease: Duration,
    max_hold: Option<Duration>,
    refusing: &Refusing<'_>,
) -> Option<LockError> {
    if let Some(why) = lease_out_of_bounds(lease) {
        return Some(refusing.error(format!("{} is {why}", refusing.lease())));
    }
    let max_hold = max_hold.filter(|&max_hold| max_hold < lease)?;
    Some(refusing.error(format!(
        "{} ({max_hold:?}) is shorter than {} ({lease:?}): {} would be given up before its \
         first renewal; make max_hold at least the lease",
        refusing.max_hold(),
        refusing.lease_after_max_hold(),
        refusing.holder()
    )))
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
    /// What the setters asked that `target` cannot hold.
    pub(crate) misfit: Misfit,
    pub(crate) settings: Settings,
    /// A lock held elsewhere is an expected outcome, not a timeout ([`LockRequest::try_acquire`],
    /// `on_busy = "skip"`): the request's span, log and metrics say "busy".
    pub(crate) busy_expected: bool,
    /// The wait is what is left of a longer one (a campaign's round): no try of the request
    /// runs past it, not even the first (which otherwise gets a tenth of the response timeout
    /// at least).
    pub(crate) strict_wait: bool,
}

impl LockRequest {
    /// A request for the exclusive lock of the key `name`.
    pub(crate) fn write(engine: Option<Arc<Engine>>, name: String) -> Self {
        Self::of(
            engine,
            Target::Write {
                name,
                exclusive: Exclusive::Plain,
            },
        )
    }

    /// A request for the read lock of the key `name`.
    pub(crate) fn read(engine: Option<Arc<Engine>>, name: String) -> Self {
        Self::of(engine, Target::Read { name })
    }

    /// A request for one of `permits` permits of the semaphore `name`.
    pub(crate) fn semaphore(engine: Option<Arc<Engine>>, name: String, permits: u32) -> Self {
        Self::of(engine, Target::Semaphore { name, permits })
    }

    /// A request for the write locks of every key of `keys` at once (`lock_all`).
    pub(crate) fn all<I, K>(engine: Option<Arc<Engine>>, keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        Self::of(
            engine,
            Target::All(keys.into_iter().map(Into::into).collect()),
        )
    }

    fn of(engine: Option<Arc<Engine>>, target: Target) -> Self {
        Self {
            engine,
            target,
            misfit: Misfit::default(),
            settings: Settings::default(),
            busy_expected: false,
            strict_wait: false,
        }
    }

    /// This request with `settings` in place of its own (an election's, for its campaign).
    pub(crate) fn with_settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// Lease (time to live) of the grant; the watchdog renews it while the guard lives.
    /// Defaults to the client's [`Config::default_lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = Some(lease);
        self
    }

    /// How long to wait while someone else holds the lock; zero tries once. The request ends
    /// within it, also when the store does not answer (see [Behavior](LockRequest#behavior)).
    /// Defaults to the client's [`Config::default_wait`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.settings.wait = Some(wait);
        self
    }

    /// The longest the lock is held, renewals included: past it the watchdog stops renewing
    /// and the guard reports the lease lost ([`LockGuard::lost`](crate::guard::LockGuard::lost) completes; an annotated fn
    /// with `on_lost = "abort"` returns [`LockError::HeldTooLong`]). A cap on hung work, like
    /// a maximum number of renewals. At least the lease; none by default.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.settings.max_hold = Some(max_hold);
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
        match &mut self.target {
            Target::Write { exclusive, .. } if *exclusive != Exclusive::Fair => {
                *exclusive = Exclusive::HeldAtLeast(min_hold);
            }
            _ => self.misfit.hold_at_least = true,
        }
        self
    }

    /// Whether the watchdog renews the lease while the guard lives; with `false` the lease is a
    /// hard time limit and the guard reports it lost when it runs out. Defaults to `true`.
    pub fn watchdog(mut self, renew: bool) -> Self {
        self.settings.watchdog = renew;
        self
    }

    /// Whether the grant carries a fencing token. Defaults to the client's
    /// [`Config::fencing`] (`true`).
    ///
    /// `false` is the efficiency mode, for a lock that only keeps work from being done twice:
    /// the first try of a write grant is a bare `SET NX PX` (no script), no fencing counter is
    /// written, and [`LockGuard::fencing_token`](crate::guard::LockGuard::fencing_token) is `None` — there is no token to hand to a
    /// store, so a holder paused past its lease can still write after the next holder.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), distlock::LockError> {
    /// let guard = distlock::lock("report:daily").fencing(false).acquire().await?;
    /// assert_eq!(guard.fencing_token(), None);
    /// # Ok(()) }
    /// ```
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.settings.fencing = Some(fencing);
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
    /// - Unfair requests for the same key ([`lock`](crate::lock), [`write_lock`](crate::write_lock)) do not queue: they take the
    ///   lock whenever they find it free, and exclude fair holders as any writer does.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), distlock::LockError> {
    /// let guard = distlock::lock("invoice:7").fair().acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fair(mut self) -> Self {
        match &mut self.target {
            Target::Write { exclusive, .. } => {
                // A fair lock cannot be kept: the window asked before is refused.
                if let Exclusive::HeldAtLeast(_) = exclusive {
                    self.misfit.hold_at_least = true;
                }
                *exclusive = Exclusive::Fair;
            }
            _ => self.misfit.fair = true,
        }
        self
    }

    /// Refuses, before any try, a request that no store could grant: a multi-key request
    /// naming no key, and what the setters asked that the target cannot hold — a fair request
    /// whose kind has no queue, `hold_at_least` on a request that cannot be kept, or longer
    /// than `max_hold`. The one place these are refused.
    pub(crate) fn refusal(&self) -> Option<LockError> {
        if let Target::All(names) = &self.target {
            if names.is_empty() {
                return Some(LockError::Config(
                    "`lock_all` was given no key: name at least one".to_owned(),
                ));
            }
        }
        let name = || self.target.label(", ");
        if self.misfit.hold_at_least {
            return Some(LockError::Config(format!(
                "lock `{}`: `hold_at_least` keeps the exclusive lock of one key past its \
                 release; a read, semaphore, multi-key or fair request cannot be kept: drop \
                 `hold_at_least`",
                name()
            )));
        }
        if let (
            Target::Write {
                exclusive: Exclusive::HeldAtLeast(min_hold),
                ..
            },
            Some(max_hold),
        ) = (&self.target, self.settings.max_hold)
        {
            if *min_hold > max_hold {
                return Some(LockError::Config(format!(
                    "lock `{}`: `hold_at_least` ({min_hold:?}) is longer than `max_hold` \
                     ({max_hold:?}): the lock could not be held that long; shorten \
                     `hold_at_least` or lengthen `max_hold`",
                    name()
                )));
            }
        }
        if !self.misfit.fair {
            return None;
        }
        let what = match &self.target {
            Target::All(_) => "multi-key lock (taken in a fixed key order, not queued)",
            Target::Read { .. } => "read lock (readers share the lock and need no queue)",
            Target::Semaphore { .. } => "semaphore",
            Target::Write { .. } => return None,
        };
        Some(LockError::Config(format!(
            "lock `{}` was requested fair as a {what}; only the exclusive lock (`lock`, \
             `write_lock`) queues its waiters: drop `.fair()`",
            name()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(request: LockRequest) -> String {
        match request.refusal() {
            Some(LockError::Config(message)) => message,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn a_fair_lock_cannot_be_kept_whichever_setter_comes_first() {
        let window = Duration::from_secs(1);
        let write = || LockRequest::write(None, "k".into());
        for request in [
            write().fair().hold_at_least(window),
            write().hold_at_least(window).fair(),
        ] {
            assert!(refusal(request)
                .contains("a read, semaphore, multi-key or fair request cannot be kept"));
        }
        assert!(write().fair().refusal().is_none());
        assert!(write().hold_at_least(window).refusal().is_none());
    }

    #[test]
    fn only_the_exclusive_lock_takes_fair_and_hold_at_least() {
        let read = LockRequest::read(None, "k".into()).fair();
        assert!(refusal(read).contains("fair as a read lock"));
        let permit =
            LockRequest::semaphore(None, "k".into(), 2).hold_at_least(Duration::from_secs(1));
        assert!(refusal(permit).contains("drop `hold_at_least`"));
        // `hold_at_least` is refused before `fair`, as a request asking both is told.
        let both = LockRequest::read(None, "k".into())
            .fair()
            .hold_at_least(Duration::from_secs(1));
        assert!(refusal(both).contains("drop `hold_at_least`"));
        let none = LockRequest::all(None, Vec::<String>::new());
        assert!(refusal(none).contains("no key"));
    }

    #[test]
    fn a_max_hold_shorter_than_the_lease_is_named_as_the_caller_wrote_it() {
        let (lease, max_hold) = (Duration::from_secs(1), Some(Duration::from_millis(500)));
        let message = |refusing: Refusing<'_>| match settings_refusal(lease, max_hold, &refusing) {
            Some(LockError::Config(message)) => message,
            other => panic!("expected a config error, got {other:?}"),
        };
        assert_eq!(
            message(Refusing::Request("k")),
            "the max_hold of lock `k` (500ms) is shorter than its lease (1s): it would be given \
             up before its first renewal; make max_hold at least the lease"
        );
        assert_eq!(
            message(Refusing::Attribute {
                lock: "k",
                lease: None,
                max_hold: Some("half()"),
            }),
            "`#[distributed_lock]` on lock `k`: `max_hold = half()` (500ms) is shorter than \
             `lease` (1s): the lock would be given up before its first renewal; make max_hold \
             at least the lease"
        );
        assert!(settings_refusal(lease, Some(lease), &Refusing::Request("k")).is_none());
    }
}
