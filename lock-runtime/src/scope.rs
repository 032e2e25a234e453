//! What `#[distributed_lock]` expands to: [`run_locked`] takes the lock through the global
//! client (or joins a grant the task already holds on the same key), runs the body inside a
//! task-local scope that [`current`] reads, cancels the body when the lease is lost (unless
//! told to continue), and releases the lock before returning.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::LockError;
use crate::watchdog::Lease;
use crate::FencingToken;

tokio::task_local! {
    /// Locks held by the current task through the attribute, outermost first; a re-entrant
    /// call pushes the grant it joined again, so `current()` names its own key.
    static HELD: Vec<Held>;
}

/// A grant on the task's stack: what `current()` shows, and the lease to watch.
#[derive(Clone)]
struct Held {
    info: LockInfo,
    lease: Arc<Lease>,
}

/// The lock the current task holds through `#[distributed_lock]`: its key and fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    key: String,
    fencing_token: FencingToken,
}

impl LockInfo {
    /// The key as requested (without the configured prefix).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token of the grant; pass it to the resource the lock protects.
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing_token
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
///     println!("writing with fencing token {}", lock.fencing_token());
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
/// lease was lost (with `OnLost::Abort`).
async fn run_scoped<F: Future>(held: Held, on_lost: OnLost, body: F) -> Option<F::Output> {
    let lease = held.lease.clone();
    let mut stack = HELD.try_with(Clone::clone).unwrap_or_default();
    stack.push(held);
    HELD.scope(stack, async {
        match on_lost {
            OnLost::Abort => {
                tokio::select! {
                    biased;
                    () = lease.lost() => None,
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
    pub lease: Option<Duration>,
    pub wait: Option<Duration>,
    pub watchdog: bool,
    pub on_lost: OnLost,
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

/// Runs `body` under the lock `key` of the global client, as `spec` says.
#[doc(hidden)]
pub async fn run_locked<R, F>(key: String, spec: LockSpec, body: F) -> R
where
    R: LockResult,
    F: Future<Output = R>,
{
    if let Some(outer) = held_by_this_task(&key) {
        // Re-entrant call in the same task: join the outer grant (its lease and watchdog
        // apply; this call's own `lease`, `wait` and `watchdog` do not).
        if outer.lease.is_lost() {
            return R::from_lock_error(LockError::LeaseLost { key });
        }
        return match run_scoped(outer, spec.on_lost, body).await {
            Some(result) => result,
            None => R::from_lock_error(LockError::LeaseLost { key }),
        };
    }
    let mut request = crate::lock(key.clone()).watchdog(spec.watchdog);
    if let Some(lease) = spec.lease {
        request = request.lease(lease);
    }
    if let Some(wait) = spec.wait {
        request = request.wait(wait);
    }
    let guard = match request.acquire().await {
        Ok(guard) => guard,
        Err(err) => return R::from_lock_error(err),
    };
    let held = Held {
        info: LockInfo {
            key: key.clone(),
            fencing_token: guard.fencing_token(),
        },
        lease: guard.lease().clone(),
    };
    let outcome = run_scoped(held, spec.on_lost, body).await;
    if outcome.is_some() && !guard.is_held() {
        tracing::warn!(%key, "the lease was lost while the body ran (on_lost = \"continue\")");
    }
    match guard.release().await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(%key, "the lock had already expired when released"),
        Err(err) => tracing::warn!(%key, "release failed; the lease will expire: {err}"),
    }
    match outcome {
        Some(result) => result,
        None => R::from_lock_error(LockError::LeaseLost { key }),
    }
}
