//! The attribute's runtime — what `#[distributed_lock]` expands to: [`run_locked`] takes the
//! lock of a [`LockTarget`] (one key, a permit of a key, or several keys at once) through the
//! global client or the one named by `client = …` (or joins a grant the task already holds on
//! the same lock), runs the body inside a task-local scope that [`current`] reads, cancels the
//! body when a lease is lost (unless told to continue), and releases the lock before
//! returning. Its neighbours: the macro (`lock-macros`) builds the target and the spec; the
//! request (`request.rs`) and the acquire loop (`acquire/`) take the grant, the guard
//! (`guard.rs`) gives it back; the lease (`lease.rs`) says when one is over.
//!
//! A call that finds the same lock held by its own task joins that grant when the grant covers
//! it: read in read, write in write, read in write (a downgrade: the write grant covers it).
//! Write in read (an upgrade) is refused at once with [`LockError::UpgradeRefused`]. The same
//! lock is the same key through the same [`Client`] (or a clone of it; the global client is
//! one client): the same key through another client is another owner's lock, which the call
//! waits for like any other — a task nesting one key through two clients waits for itself
//! until its `wait` runs out.
//!
//! Re-entrancy nests: a call that joins a grant waits for its turn among the other calls that
//! joined the same grant (two joined calls driven side by side in one task, as by
//! `tokio::join!`, do not overlap), and calls nested inside it join it in turn. A joined call
//! ends with `LeaseLost` when the grant it joined ends — lost, or released by the outer call
//! while a joined future escaped it — so no joined body runs without the lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, OwnedMutexGuard};

use tracing::Instrument;

use crate::client::Client;
use crate::engine::Engine;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lease::Lease;
use crate::protocol::{FencingToken, LockMode};
use crate::request::{settings_refusal, LockRequest, Refusing};

tokio::task_local! {
    /// Locks held by the current task through the attribute, outermost first; a re-entrant
    /// call pushes the grant it joined again, so `current()` names its own key.
    static HELD: Vec<Held>;
}

/// A grant on the task's stack: what `current()` shows, the lease to watch, and the turn
/// that calls joining it at this level take one at a time.
#[derive(Clone)]
struct Held {
    info: LockInfo,
    /// The client the grant was taken through: a call joins it only through the same one.
    engine: Arc<Engine>,
    lease: Arc<Lease>,
    turn: Arc<Mutex<()>>,
}

impl Held {
    fn new(info: LockInfo, engine: Arc<Engine>, lease: Arc<Lease>) -> Self {
        Self {
            info,
            engine,
            lease,
            turn: Arc::new(Mutex::new(())),
        }
    }
}

/// The lock the current task holds through `#[distributed_lock]`: its key and fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    key: String,
    mode: LockMode,
    fencing_token: Option<FencingToken>,
}

impl LockInfo {
    /// The key as requested (without the configured prefix).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token of the grant; pass it to the resource the lock protects. For a read
    /// grant, one that sorts between the write tokens around it. `None` with `fencing = false`.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.fencing_token
    }

    /// Which side of the key's read/write lock is held: [`LockMode::Write`] for an exclusive or
    /// write grant (also when a `mode = "read"` call joined it), [`LockMode::Read`] for a read.
    pub fn mode(&self) -> LockMode {
        self.mode
    }
}

/// Inside the body of a `#[distributed_lock]` fn: the innermost lock the task holds. `None`
/// outside any annotated fn, and in tasks spawned from one (a spawned task is another owner).
///
/// ```no_run
/// # #[derive(Debug)] struct AppError;
/// # impl From<distlock::LockError> for AppError { fn from(_: distlock::LockError) -> Self { AppError } }
/// #[distlock::distributed_lock(key = "invoice:{id}")]
/// async fn settle(id: u64) -> Result<(), AppError> {
///     let lock = distlock::current().expect("inside an annotated fn");
///     println!("writing with fencing token {:?}", lock.fencing_token());
///     Ok(())
/// }
/// ```
pub fn current() -> Option<LockInfo> {
    HELD.try_with(|held| held.last().map(|h| h.info.clone()))
        .ok()
        .flatten()
}

/// The fencing token of the innermost lock the current task holds through
/// `#[distributed_lock]`, for the store it protects:
/// `fenced::set(&mut conn, key, value, distlock::fencing_token()?)` in one line.
///
/// Errors ([`LockError::NoFencingToken`], saying which): called outside an annotated fn (or
/// in a task it spawned: the lock belongs to the task that took it), or the lock was taken
/// without a token (`fencing = false`, [`Config::fencing`](crate::Config::fencing)).
///
/// ```no_run
/// # #[derive(Debug)] struct AppError;
/// # impl From<distlock::LockError> for AppError { fn from(_: distlock::LockError) -> Self { AppError } }
/// # impl From<redis::RedisError> for AppError { fn from(_: redis::RedisError) -> Self { AppError } }
/// #[distlock::distributed_lock(key = "stock:{sku}")]
/// async fn sell(conn: &mut redis::aio::MultiplexedConnection, sku: &str, left: i64) -> Result<(), AppError> {
///     let token = distlock::fencing_token()?;
///     distlock::fenced::set(conn, &format!("stock:{sku}"), left, token).await?;
///     Ok(())
/// }
/// ```
pub fn fencing_token() -> Result<FencingToken, LockError> {
    let Some(lock) = current() else {
        return Err(LockError::NoFencingToken(
            "no lock is held here: call it inside a fn annotated with #[distributed_lock] (not \
             in a task it spawned), or take the token from the guard (`LockGuard::fencing_token`)",
        ));
    };
    lock.fencing_token().ok_or(LockError::NoFencingToken(
        "the lock was taken without a fencing token (`fencing = false`, or \
         `Config::fencing(false)`): turn fencing on for a lock whose writes must be fenced",
    ))
}

/// The grant of `key` through `client` the current task already holds through the attribute,
/// if any.
fn held_by_this_task(engine: &Arc<Engine>, key: &str) -> Option<Held> {
    HELD.try_with(|held| {
        held.iter()
            .rev()
            .find(|h| h.info.key == key && Arc::ptr_eq(&h.engine, engine))
            .cloned()
    })
    .ok()
    .flatten()
}

/// What to do with the body when the lease is lost.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// Cancel the body at its next await and return `LockError::LeaseLost`.
    Abort,
    /// Let the body finish; the loss is logged.
    Continue,
}

/// What an annotated fn locks: the macro's checked target (`Target` in
/// `lock-macros/src/validate.rs`, the same three cases), with its keys built from the fn's
/// arguments.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub enum LockTarget {
    /// `key = "…"` (with `mode`): the write (exclusive) or read side of one key's lock.
    Key {
        key: String,
        mode: crate::protocol::LockMode,
    },
    /// `key = "…", permits = N`: one of `permits` permits of the semaphore `key`; `written` is
    /// `permits = <expr>` as written, for errors (`None` for a literal, checked at compile
    /// time).
    Permits {
        key: String,
        permits: u32,
        written: Option<&'static str>,
    },
    /// `keys = [..]`: the write locks of every key at once, in the order written.
    Keys(Vec<String>),
}

impl LockTarget {
    /// How errors and logs name the target: its key, or its keys joined by `, `.
    fn label(&self) -> String {
        match self {
            LockTarget::Key { key, .. } | LockTarget::Permits { key, .. } => key.clone(),
            LockTarget::Keys(keys) => keys.join(", "),
        }
    }

    /// The mode a grant of this target holds each key in.
    fn mode(&self) -> LockMode {
        match self {
            LockTarget::Key { mode, .. } => *mode,
            LockTarget::Permits { .. } => LockMode::Semaphore,
            LockTarget::Keys(_) => LockMode::Write,
        }
    }

    /// The request for this target through `client`, before the attribute's settings.
    fn request(&self, client: &Client) -> LockRequest {
        match self {
            LockTarget::Key {
                key,
                mode: LockMode::Read,
            } => client.read_lock(key.clone()),
            LockTarget::Key { key, .. } => client.write_lock(key.clone()),
            // `permits = 0` written as an expression was refused by `LockSpec::check`; a
            // literal 0 does not compile.
            LockTarget::Permits { key, permits, .. } => client.semaphore(key.clone(), *permits),
            LockTarget::Keys(keys) => client.lock_all(keys.iter().cloned()),
        }
    }
}

/// The attribute's settings, as the macro parsed them.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct LockSpec {
    pub lease: Option<Duration>,
    pub wait: Option<Duration>,
    pub max_hold: Option<Duration>,
    pub watchdog: bool,
    pub on_lost: OnLost,
    /// `Some(false)`: no fencing token (`fencing = false`); `None`: the client's default.
    pub fencing: Option<bool>,
    /// `lease = <expr>` as written, for errors; `None` for a literal (checked at compile time).
    pub lease_expr: Option<&'static str>,
    /// `max_hold = <expr>` as written, for errors; `None` for a literal.
    pub max_hold_expr: Option<&'static str>,
    /// `fair = true`: granted in request order among the key's fair waiters.
    pub fair: bool,
    /// `hold_at_least`: a release before the grant plus this keeps the lock to then.
    pub hold_at_least: Option<Duration>,
    /// Set by `on_busy = "skip"` (not by the expansion): a lock held elsewhere is reported as
    /// busy, not as a timeout.
    #[doc(hidden)]
    pub busy_expected: bool,
}

impl LockSpec {
    /// `request` with the attribute's settings: the watchdog, fencing, lease, wait and
    /// max_hold it was given (the client's defaults for those it was not).
    fn settings_of(&self, mut request: LockRequest) -> LockRequest {
        request = request.watchdog(self.watchdog);
        if let Some(fencing) = self.fencing {
            request = request.fencing(fencing);
        }
        if let Some(lease) = self.lease {
            request = request.lease(lease);
        }
        if let Some(wait) = self.wait {
            request = request.wait(wait);
        }
        if let Some(max_hold) = self.max_hold {
            request = request.max_hold(max_hold);
        }
        if self.fair {
            request = request.fair();
        }
        if let Some(min_hold) = self.hold_at_least {
            request = request.hold_at_least(min_hold);
        }
        request.busy_expected = self.busy_expected;
        request
    }

    /// What the compiler could not check: a lease, max_hold or permit count given as an
    /// expression. The error names the argument as written; a request would only name the lock.
    fn check(&self, target: &LockTarget, key: &str) -> Result<(), LockError> {
        let invalid = |what: String| {
            Err(LockError::Config(format!(
                "`#[distributed_lock]` on lock `{key}`: {what}"
            )))
        };
        if let LockTarget::Permits {
            permits: 0,
            written: Some(written),
            ..
        } = target
        {
            return invalid(format!(
                "`permits = {written}` is 0: a semaphore of zero permits could never be taken"
            ));
        }
        // A lease and max_hold written as literals were checked by the compiler; the request
        // checks a default lease itself.
        let Some(lease) = self.lease else {
            return Ok(());
        };
        if self.lease_expr.is_none() && self.max_hold_expr.is_none() {
            return Ok(());
        }
        let refusing = Refusing::Attribute {
            lock: key,
            lease: self.lease_expr,
            max_hold: self.max_hold_expr,
        };
        match settings_refusal(lease, self.max_hold, &refusing) {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}

/// The error types an annotated fn's `Result<T, E>` may carry: those with
/// `From<LockError>`. Checked on `E` itself, so the compiler reports this message, once, and
/// not every `From` impl of `E` ("required for `Result<T, E>`…" would name them all).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` cannot return a lock error as `{Self}`: `{Self}` does not implement `From<distlock::LockError>`",
    label = "the error type of this fn cannot carry a `distlock::LockError`",
    note = "implement `From<distlock::LockError>` for the error type (for a type of your own: `impl From<distlock::LockError> for MyError`), or return `anyhow::Result<T>`; a foreign type such as `String` cannot take the impl: wrap it in an error type of your own"
)]
pub trait LockErrorInto {
    /// Makes this error from a lock failure.
    fn from_lock_error(err: LockError) -> Self;
}

impl<E: From<LockError>> LockErrorInto for E {
    fn from_lock_error(err: LockError) -> Self {
        E::from(err)
    }
}

/// The return types an annotated fn may have: `Result<T, E>`; its `E` must also implement
/// [`LockErrorInto`].
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` needs the fn to return `Result<T, E>` where `E: From<distlock::LockError>`; `{Self}` cannot carry a lock error",
    label = "this return type cannot carry `distlock::LockError`",
    note = "return `Result<T, E>` and implement `From<distlock::LockError>` for `E` (or return `anyhow::Result<T>`)"
)]
pub trait LockResult {
    /// The error type.
    type Error;
    /// The result that is this error.
    fn from_error(err: Self::Error) -> Self;
}

impl<T, E> LockResult for Result<T, E> {
    type Error = E;
    fn from_error(err: E) -> Self {
        Err(err)
    }
}

/// The return types an annotated fn with `on_busy = "skip"` may have: those with a value that
/// says "skipped" — `Result<(), E>` (`Ok(())`) and `Result<Option<T>, E>` (`Ok(None)`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`on_busy = \"skip\"` needs the fn to return `Result<(), E>` or `Result<Option<T>, E>`: `{Self}` has no value that says the call was skipped",
    label = "a skipped call would have nothing to return as `{Self}`",
    note = "return `Result<(), E>` (a skipped call returns `Ok(())`) or `Result<Option<T>, E>` (it returns `Ok(None)`), or drop `on_busy = \"skip\"` to wait for the lock"
)]
pub trait Skipped {
    /// The value a skipped call returns.
    fn skipped() -> Self;
}

impl<E> Skipped for Result<(), E> {
    fn skipped() -> Self {
        Ok(())
    }
}

impl<T, E> Skipped for Result<Option<T>, E> {
    fn skipped() -> Self {
        Ok(None)
    }
}

/// What a call skipped by `on_busy = "skip"` returns, for the fn's return type `R`: the
/// expansion's check that `R` has such a value, emitted at the `on_busy` argument.
#[doc(hidden)]
pub fn skipped_value<R: Skipped>() -> fn() -> R {
    R::skipped
}

/// How a lock failure becomes the fn's return type `R`. The expansion's one check of `R`,
/// emitted at the return type; [`run_locked`] itself puts no bound on `R`, so a return type
/// that cannot carry a lock error is reported once.
#[doc(hidden)]
pub fn lock_error_into<R>() -> fn(LockError) -> R
where
    R: LockResult,
    R::Error: LockErrorInto,
{
    |err| R::from_error(R::Error::from_lock_error(err))
}

/// `client = <expr>`: the client the expression reaches (a `&Client`, or anything that
/// dereferences to one), cloned so the body may move what it was borrowed from.
#[doc(hidden)]
pub fn client_of(client: &Client) -> Option<Client> {
    Some(client.clone())
}

/// No `client = …`: the global client, `None` before [`init`](crate::init).
#[doc(hidden)]
pub fn global_client() -> Option<Client> {
    crate::global::global()
}

/// How a call holds its lock while its body runs.
enum Grant {
    /// Its own, taken for this call and released after it.
    Own(LockGuard),
    /// A grant of the task it joined; the turn keeps the other calls joining it waiting.
    Joined { _turn: OwnedMutexGuard<()> },
}

/// Runs `body` under the lock of `target` through `client` (the global client if `None`: not
/// initialized), as `spec` says; a failure to lock becomes `R` through `into`. With `skipped`
/// (`on_busy = "skip"`) a lock held elsewhere — after one try, or after `wait` when it was given
/// — is no failure: the body does not run and the call returns `skipped()`.
///
/// The body is boxed at once: a future that moves it through the acquire, the scope and the
/// select keeps a slot for it at every step, and nested annotated calls multiply that — debug
/// builds of a few nested calls in `tokio::join!` overflowed a test thread's stack.
#[doc(hidden)]
pub fn run_locked<R, F>(
    client: Option<Client>,
    target: LockTarget,
    spec: LockSpec,
    into: fn(LockError) -> R,
    skipped: Option<fn() -> R>,
    body: F,
) -> impl Future<Output = R>
where
    F: Future<Output = R>,
{
    locked(client, target, spec, into, skipped, Box::pin(body))
}

async fn locked<R, F>(
    client: Option<Client>,
    target: LockTarget,
    mut spec: LockSpec,
    into: fn(LockError) -> R,
    skipped: Option<fn() -> R>,
    body: Pin<Box<F>>,
) -> R
where
    F: Future<Output = R>,
{
    let label = target.label();
    if let Err(err) = spec.check(&target, &label) {
        return into(err);
    }
    let Some(client) = client else {
        return into(LockError::NotInitialized);
    };
    if skipped.is_some() {
        // A busy lock skips the call: one try unless a `wait` was given.
        spec.busy_expected = true;
        spec.wait.get_or_insert(Duration::ZERO);
    }
    let (held, grant) = match (take(&client, &target, spec).await, skipped) {
        (Ok(taken), _) => taken,
        (Err(NotTaken::Failed(LockError::Timeout { .. })), Some(skipped)) => return skipped(),
        (Err(err), _) => return into(err.for_key(&label)),
    };
    let leases: Vec<Arc<Lease>> = held.iter().map(|held| held.lease.clone()).collect();
    // The body runs in the grant's `hold` span: its own events name the lock they ran under.
    let span = leases[0].hold.span().clone();
    let outcome = run_scoped(held, spec.on_lost, body).instrument(span).await;
    if let Grant::Own(guard) = grant {
        if outcome.is_some() && !guard.is_held() {
            tracing::warn!(target: crate::telemetry::LOG_TARGET, key = %label, "the lease was lost while the body ran (on_lost = \"continue\")");
        }
        give_back(guard, &label).await;
    }
    match outcome {
        Some(result) => result,
        None => into(ended_error(&leases, label)),
    }
}

/// Takes the lock of `target` for a call: joins the grant of the same lock its task holds
/// where that grant covers the call, refuses where it cannot (an upgrade, a permit inside a
/// lock, a multi-key call over a key held), and acquires otherwise.
///
/// A multi-key call puts each key's grant on the task's stack, so a nested single-key call on
/// one of them joins it (and [`current`] names the last key). A multi-key call in a task that
/// already holds one of its keys cannot join (it would wait on itself): it fails at once with
/// [`LockError::Config`]; take every key in the outer call.
async fn take(
    client: &Client,
    target: &LockTarget,
    spec: LockSpec,
) -> Result<(Vec<Held>, Grant), NotTaken> {
    let mode = target.mode();
    match target {
        LockTarget::Keys(keys) => {
            if let Some(held) = keys
                .iter()
                .find(|key| held_by_this_task(&client.engine, key).is_some())
            {
                return Err(NotTaken::Failed(LockError::Config(format!(
                    "`#[distributed_lock]` on `{label}`: this task already holds `{held}`, and \
                     a multi-key call cannot join a grant the task holds (it would wait on \
                     itself): take every key in the outer call",
                    label = target.label()
                ))));
            }
        }
        LockTarget::Key { key, .. } | LockTarget::Permits { key, .. } => {
            match held_by_this_task(&client.engine, key) {
                // A read cannot become a write: refused at once, never a deadlock.
                Some(outer) if outer.info.mode == LockMode::Read && mode == LockMode::Write => {
                    return Err(NotTaken::Failed(LockError::UpgradeRefused {
                        key: key.clone(),
                    }));
                }
                // A permit is not a lock, nor a lock a permit: neither can join the other, and
                // waiting for the other would wait on this task itself.
                Some(outer)
                    if (outer.info.mode == LockMode::Semaphore)
                        != (mode == LockMode::Semaphore) =>
                {
                    return Err(NotTaken::Failed(LockError::Config(format!(
                        "`#[distributed_lock]` on `{key}`: this task already holds `{key}` as a \
                         {}, and a nested call takes it as a {}; a key is a semaphore or a \
                         lock, not both: use distinct keys",
                        kind_name(outer.info.mode),
                        kind_name(mode)
                    ))));
                }
                // Read in read, write in write, read in write (downgrade), and a permit in a
                // permit of the same semaphore (one permit for both) join the grant.
                Some(outer) => return join(outer).await,
                None => {}
            }
        }
    }
    let guard = spec
        .settings_of(target.request(client))
        .acquire()
        .await
        .map_err(NotTaken::Failed)?;
    Ok((held_of(&guard, &client.engine), Grant::Own(guard)))
}

/// Releases the call's own grant after its body; a failed release is logged, never returned
/// (the body's result stands).
async fn give_back(guard: LockGuard, label: &str) {
    match guard.release().await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(target: crate::telemetry::LOG_TARGET, key = %label, "the lock was no longer held by this owner when released: its lease expired or it was force-unlocked")
        }
        Err(err) => {
            tracing::warn!(target: crate::telemetry::LOG_TARGET, key = %label, "release failed; the lease will expire: {err}")
        }
    }
}

/// Why a body was cancelled: its grant was given back by the client's shutdown (nothing was
/// lost), held for its `max_hold`, or lost.
fn ended_error(leases: &[Arc<Lease>], label: String) -> LockError {
    match leases.iter().find_map(|lease| lease.max_hold_passed()) {
        _ if leases.iter().any(|lease| lease.was_shut_down()) => LockError::ShutDown,
        Some(max_hold) => LockError::HeldTooLong {
            key: label,
            max_hold,
        },
        None => LockError::LeaseLost { key: label },
    }
}

impl LockRequest {
    /// Takes the lock, runs `body` under it and gives it back: the attribute's behaviour as a
    /// method (node-redlock's `using`), for code without `#[distributed_lock]`. The body runs
    /// with the lock as the task's current one ([`current`], [`fencing_token`]), and is
    /// cancelled at its next await if the lease is lost (as `on_lost = "abort"`); the lock is
    /// released when the body ends, also when it fails. Returns the body's output, or the
    /// error that kept it from running or finishing: [`LockError::Timeout`] and the others of
    /// [`acquire`](Self::acquire), [`LockError::LeaseLost`], [`LockError::HeldTooLong`] past
    /// `max_hold`, [`LockError::ShutDown`]. A failed release is logged; the body's output stands.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), distlock::LockError> {
    /// let total = distlock::lock("ledger:7")
    ///     .run(async {
    ///         let token = distlock::fencing_token()?; // for the writes it makes
    ///         # let _ = token;
    ///         Ok::<_, distlock::LockError>(42)
    ///     })
    ///     .await??;
    /// # let _ = total; Ok(()) }
    /// ```
    pub async fn run<F: Future>(self, body: F) -> Result<F::Output, LockError> {
        let Some(engine) = self.engine.clone() else {
            return Err(LockError::NotInitialized);
        };
        let label = self.target.label(", ");
        let guard = self.acquire().await?;
        let leases: Vec<Arc<Lease>> = guard.leases().cloned().collect();
        let span = leases[0].hold.span().clone();
        let outcome = run_scoped(held_of(&guard, &engine), OnLost::Abort, body)
            .instrument(span)
            .await;
        give_back(guard, &label).await;
        outcome.ok_or_else(|| ended_error(&leases, label))
    }
}

/// What the task holds while the body of `guard`'s grant runs: each of its leases, with the
/// key, mode and token [`current`] gives.
fn held_of(guard: &LockGuard, engine: &Arc<Engine>) -> Vec<Held> {
    guard
        .leases()
        .map(|lease| {
            let info = LockInfo {
                key: lease.key.name.clone(),
                mode: lease.kind().into(),
                fencing_token: lease.token,
            };
            Held::new(info, engine.clone(), lease.clone())
        })
        .collect()
}

/// How a nested call's error names what a task holds.
fn kind_name(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Semaphore => "semaphore permit",
        LockMode::Write | LockMode::Read => "lock",
    }
}

/// Runs `body` with `held` (one grant, or every key's grant of a multi-key grant) pushed on
/// the task's stack; `None` if it was cancelled (with `OnLost::Abort`) because a lease was
/// lost or the grant it joined ended.
async fn run_scoped<F: Future>(held: Vec<Held>, on_lost: OnLost, body: F) -> Option<F::Output> {
    let leases: Vec<Arc<Lease>> = held.iter().map(|h| h.lease.clone()).collect();
    let mut stack = HELD.try_with(Clone::clone).unwrap_or_default();
    stack.extend(held);
    HELD.scope(stack, async {
        match on_lost {
            OnLost::Abort => {
                tokio::select! {
                    biased;
                    () = any_over(&leases) => None,
                    result = body => Some(result),
                }
            }
            OnLost::Continue => Some(body.await),
        }
    })
    .await
}

/// Completes when any of `leases` is over (one lease needs no boxing).
async fn any_over(leases: &[Arc<Lease>]) {
    match leases {
        [lease] => lease.over().await,
        leases => {
            futures_util::future::select_all(leases.iter().map(|lease| Box::pin(lease.over())))
                .await;
        }
    }
}

/// Why a call could not start its body.
enum NotTaken {
    /// The grant it would join ended first.
    GrantEnded,
    Failed(LockError),
}

impl NotTaken {
    fn for_key(self, key: &str) -> LockError {
        match self {
            NotTaken::GrantEnded => LockError::LeaseLost {
                key: key.to_owned(),
            },
            NotTaken::Failed(err) => err,
        }
    }
}

/// A re-entrant call in the same task: joins the grant `outer` (its lease and watchdog apply;
/// this call's own `lease`, `wait`, `max_hold` and `watchdog` do not) once the calls that
/// joined it before are done, unless the grant ends first.
async fn join(outer: Held) -> Result<(Vec<Held>, Grant), NotTaken> {
    let turn = tokio::select! {
        biased;
        () = outer.lease.over() => return Err(NotTaken::GrantEnded),
        turn = outer.turn.clone().lock_owned() => turn,
    };
    if !outer.lease.is_held() {
        return Err(NotTaken::GrantEnded);
    }
    Ok((
        vec![Held::new(outer.info, outer.engine, outer.lease)],
        Grant::Joined { _turn: turn },
    ))
}
