//! What a task holds through the attribute: the task-local stack of grants ([`Held`]) that a
//! nested call joins, that [`current`] and [`fencing_token`] read, and the scope a body runs
//! in, cancelled when a lease is over ([`run_scoped`]). Neighbours: `attribute.rs` takes and
//! joins grants; the lease (`lease.rs`) says when one is over.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Mutex;

use crate::engine::Engine;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lease::Lease;
use crate::protocol::{FencingToken, LockMode};

use super::OnLost;

tokio::task_local! {
    /// Locks held by the current task through the attribute, outermost first; a re-entrant
    /// call pushes the grant it joined again, so `current()` names its own key.
    static HELD: Vec<Held>;
}

/// A grant on the task's stack: what `current()` shows, the lease to watch, and the turn
/// that calls joining it at this level take one at a time.
#[derive(Clone)]
pub(super) struct Held {
    pub(super) info: LockInfo,
    /// The client the grant was taken through: a call joins it only through the same one.
    pub(super) engine: Arc<Engine>,
    pub(super) lease: Arc<Lease>,
    pub(super) turn: Arc<Mutex<()>>,
}

impl Held {
    pub(super) fn new(info: LockInfo, engine: Arc<Engine>, lease: Arc<Lease>) -> Self {
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
pub(super) fn held_by_this_task(engine: &Arc<Engine>, key: &str) -> Option<Held> {
    HELD.try_with(|held| {
        held.iter()
            .rev()
            .find(|h| h.info.key == key && Arc::ptr_eq(&h.engine, engine))
            .cloned()
    })
    .ok()
    .flatten()
}

/// What the task holds while the body of `guard`'s grant runs: each of its leases, with the
/// key, mode and token [`current`] gives.
pub(super) fn held_of(guard: &LockGuard, engine: &Arc<Engine>) -> Vec<Held> {
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

/// Runs `body` with `held` (one grant, or every key's grant of a multi-key grant) pushed on
/// the task's stack; `None` if it was cancelled (with `OnLost::Abort`) because a lease was
/// lost or the grant it joined ended.
pub(super) async fn run_scoped<F: Future>(
    held: Vec<Held>,
    on_lost: OnLost,
    body: F,
) -> Option<F::Output> {
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
