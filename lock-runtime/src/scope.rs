//! What `#[distributed_lock]` expands to: [`run_locked`] takes the lock through the global
//! client (or joins a grant the task already holds on the same key), runs the body inside a
//! task-local scope that [`current`] reads, cancels the body when the lease is lost (unless
//! told to continue), and releases the lock before returning.
//!
//! A call that finds its key held by its own task joins that grant when the grant covers it:
//! read in read, write in write, read in write (a downgrade: the write grant covers it). Write
//! in read (an upgrade) is refused at once with [`LockError::UpgradeRefused`].
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

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lease::Lease;
use crate::{FencingToken, LockMode};

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
    lease: Arc<Lease>,
    turn: Arc<Mutex<()>>,
}

impl Held {
    fn new(info: LockInfo, lease: Arc<Lease>) -> Self {
        Self {
            info,
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

/// The grant of `key` the current task already holds through the attribute, if any.
fn held_by_this_task(key: &str) -> Option<Held> {
    HELD.try_with(|held| held.iter().rev().find(|h| h.info.key == key).cloned())
        .ok()
        .flatten()
}

/// Runs `body` with `held` pushed on the task's stack; `None` if it was cancelled because the
/// lease was lost or the grant ended (with `OnLost::Abort`).
async fn run_scoped<F: Future>(held: Held, on_lost: OnLost, body: F) -> Option<F::Output> {
    let lease = held.lease.clone();
    let mut stack = HELD.try_with(Clone::clone).unwrap_or_default();
    stack.push(held);
    HELD.scope(stack, async {
        match on_lost {
            OnLost::Abort => {
                tokio::select! {
                    biased;
                    () = lease.over() => None,
                    result = body => Some(result),
                }
            }
            OnLost::Continue => Some(body.await),
        }
    })
    .await
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

/// The attribute's settings, as the macro parsed them.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct LockSpec {
    pub mode: crate::LockMode,
    pub lease: Option<Duration>,
    pub wait: Option<Duration>,
    pub max_hold: Option<Duration>,
    pub watchdog: bool,
    pub on_lost: OnLost,
    /// `Some(false)`: no fencing token (`fencing = false`); `None`: the client's default.
    pub fencing: Option<bool>,
}

/// The return types an annotated fn may have: `Result<T, E>` with `E: From<LockError>`.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` needs the fn to return `Result<T, E>` where `E: From<distlock::LockError>`; `{Self}` cannot carry a lock error",
    label = "this return type cannot carry `distlock::LockError`",
    note = "return `Result<T, E>` and implement `From<distlock::LockError>` for `E` (or return `anyhow::Result<T>`)"
)]
pub trait LockResult {
    /// Turns a lock failure into this return type.
    fn from_lock_error(err: LockError) -> Self;
}

impl<T, E: From<LockError>> LockResult for Result<T, E> {
    fn from_lock_error(err: LockError) -> Self {
        Err(E::from(err))
    }
}

/// Compile-time check, emitted at the return type's span.
#[doc(hidden)]
pub fn assert_lock_result<R: LockResult>() {}

/// Compile-time check on a value of the return type (which may contain `impl Trait`).
#[doc(hidden)]
pub fn assert_lock_result_of<R: LockResult>(_: &R) {}

/// How a call holds its lock while its body runs.
enum Grant {
    /// Its own, taken for this call and released after it.
    Own(LockGuard),
    /// A grant of the task it joined; the turn keeps the other calls joining it waiting.
    Joined { _turn: OwnedMutexGuard<()> },
}

/// Runs `body` under the lock `key` of the global client, as `spec` says.
///
/// The body is boxed at once: a future that moves it through the acquire, the scope and the
/// select keeps a slot for it at every step, and nested annotated calls multiply that — debug
/// builds of a few nested calls in `tokio::join!` overflowed a test thread's stack.
#[doc(hidden)]
pub fn run_locked<R, F>(key: String, spec: LockSpec, body: F) -> impl Future<Output = R>
where
    R: LockResult,
    F: Future<Output = R>,
{
    locked(key, spec, Box::pin(body))
}

async fn locked<R, F>(key: String, spec: LockSpec, body: Pin<Box<F>>) -> R
where
    R: LockResult,
    F: Future<Output = R>,
{
    let taken = match held_by_this_task(&key) {
        // A read cannot become a write: refused at once, never a deadlock.
        Some(outer) if outer.info.mode == LockMode::Read && spec.mode == LockMode::Write => {
            Err(NotTaken::Failed(LockError::UpgradeRefused {
                key: key.clone(),
            }))
        }
        // Read in read, write in write, and read in write (downgrade) join the grant.
        Some(outer) => join(outer).await,
        None => acquire(&key, spec).await,
    };
    let (held, grant) = match taken {
        Ok(taken) => taken,
        Err(err) => return R::from_lock_error(err.for_key(&key)),
    };
    let lease = held.lease.clone();
    // The body runs in the grant's `hold` span: its own events name the lock they ran under.
    let outcome = run_scoped(held, spec.on_lost, body)
        .instrument(lease.hold.span().clone())
        .await;
    if let Grant::Own(guard) = grant {
        if outcome.is_some() && !guard.is_held() {
            tracing::warn!(target: crate::LOG_TARGET, %key, "the lease was lost while the body ran (on_lost = \"continue\")");
        }
        match guard.release().await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(target: crate::LOG_TARGET, %key, "the lock had already expired when released")
            }
            Err(err) => {
                tracing::warn!(target: crate::LOG_TARGET, %key, "release failed; the lease will expire: {err}")
            }
        }
    }
    match outcome {
        Some(result) => result,
        None => R::from_lock_error(match lease.max_hold_passed() {
            Some(max_hold) => LockError::HeldTooLong { key, max_hold },
            None => LockError::LeaseLost { key },
        }),
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

/// Takes the lock `key` through the global client.
async fn acquire(key: &str, spec: LockSpec) -> Result<(Held, Grant), NotTaken> {
    let request = match spec.mode {
        LockMode::Write => crate::write_lock(key.to_owned()),
        LockMode::Read => crate::read_lock(key.to_owned()),
    };
    let mut request = request.watchdog(spec.watchdog);
    if let Some(fencing) = spec.fencing {
        request = request.fencing(fencing);
    }
    if let Some(lease) = spec.lease {
        request = request.lease(lease);
    }
    if let Some(wait) = spec.wait {
        request = request.wait(wait);
    }
    if let Some(max_hold) = spec.max_hold {
        request = request.max_hold(max_hold);
    }
    let guard = request.acquire().await.map_err(NotTaken::Failed)?;
    let info = LockInfo {
        key: key.to_owned(),
        mode: spec.mode,
        fencing_token: guard.fencing_token(),
    };
    Ok((Held::new(info, guard.lease().clone()), Grant::Own(guard)))
}

/// A re-entrant call in the same task: joins the grant `outer` (its lease and watchdog apply;
/// this call's own `lease`, `wait`, `max_hold` and `watchdog` do not) once the calls that
/// joined it before are done, unless the grant ends first.
async fn join(outer: Held) -> Result<(Held, Grant), NotTaken> {
    let turn = tokio::select! {
        biased;
        () = outer.lease.over() => return Err(NotTaken::GrantEnded),
        turn = outer.turn.clone().lock_owned() => turn,
    };
    if !outer.lease.is_held() {
        return Err(NotTaken::GrantEnded);
    }
    Ok((
        Held::new(outer.info, outer.lease),
        Grant::Joined { _turn: turn },
    ))
}
