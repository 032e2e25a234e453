//! The attribute's runtime — what `#[distributed_lock]` expands to: [`run_locked`] takes the
//! lock of a [`LockTarget`] (one key, a permit of a key, or several keys at once) through the
//! global client or the one named by `client = …` (or joins a grant the task already holds on
//! the same lock), runs the body inside a task-local scope that [`current`] reads, cancels the
//! body when a lease is lost (unless told to continue), and releases the lock before
//! returning. Its neighbours: the macro (`lock-macros`) builds the target and the spec; the
//! request (`request.rs`) and the acquire loop (`acquire/`) take the grant, the guard
//! (`guard.rs`) gives it back; the lease (`lease.rs`) says when one is over. In `attribute/`:
//! what the macro hands over and its checks (`spec.rs`) and what a task holds (`held.rs`).
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

mod held;
mod spec;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use tracing::Instrument;

use crate::client::Client;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lease::Lease;
use crate::protocol::LockMode;
use crate::request::LockRequest;

pub use held::{current, fencing_token, LockInfo};
use held::{held_by_this_task, held_of, run_scoped, Held};
pub use spec::{LockSpec, LockTarget, OnLost};

// The return types an annotated fn may have, as the expansion checks them, stay in this file:
// the compiler's messages for a return type that fails them name it (the macro's UI tests,
// `lock-macros/tests/ui/fail/*.stderr`).

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
        (Err(NotTaken::Failed(LockError::Timeout { .. })), Some(skipped)) => {
            // At INFO, unlike `try_acquire`'s busy (DEBUG): a skipped run of a job is what an
            // operator reads the log for ("did the job run here?").
            tracing::info!(target: crate::telemetry::LOG_TARGET, key = %label, "job skipped: the lock is held elsewhere (on_busy = \"skip\")");
            return skipped();
        }
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
                Some(outer) if outer.info.mode() == LockMode::Read && mode == LockMode::Write => {
                    return Err(NotTaken::Failed(LockError::UpgradeRefused {
                        key: key.clone(),
                    }));
                }
                // A permit is not a lock, nor a lock a permit: neither can join the other, and
                // waiting for the other would wait on this task itself.
                Some(outer)
                    if (outer.info.mode() == LockMode::Semaphore)
                        != (mode == LockMode::Semaphore) =>
                {
                    return Err(NotTaken::Failed(LockError::Config(format!(
                        "`#[distributed_lock]` on `{key}`: this task already holds `{key}` as a \
                         {}, and a nested call takes it as a {}; a key is a semaphore or a \
                         lock, not both: use distinct keys",
                        kind_name(outer.info.mode()),
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

/// How a nested call's error names what a task holds.
fn kind_name(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Semaphore => "semaphore permit",
        LockMode::Write | LockMode::Read => "lock",
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
