//! Declarative distributed locks for async Rust on Redis, with fencing tokens.
//!
//! Configure once at startup, then put [`macro@distributed_lock`] on an async fn: the key is
//! built from the fn's arguments, the lock is taken (waiting with backoff), a watchdog renews
//! the lease while the body runs, and the lock is released before the fn returns. Every grant
//! carries a [`FencingToken`], which the body reads through [`current`].
//!
//! ```no_run
//! #[derive(Debug)]
//! enum AppError { Lock(distlock::LockError) }
//! impl From<distlock::LockError> for AppError {
//!     fn from(err: distlock::LockError) -> Self { AppError::Lock(err) }
//! }
//!
//! struct Shop;
//!
//! impl Shop {
//!     #[distlock::distributed_lock(key = "order:{order_id}", lease = "15s", wait = "5s")]
//!     async fn reduce_stock(&self, order_id: u64) -> Result<(), AppError> {
//!         let token = distlock::current().unwrap().fencing_token();
//!         // … write to the store, passing `token` …
//!         Ok(())
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), AppError> {
//!     distlock::init(distlock::Config::from_env()?)?;
//!     Shop.reduce_stock(42).await
//! }
//! ```
//!
//! The same without the attribute is [`lock`]`(key).lease(..).wait(..).acquire().await`, which
//! returns a [`LockGuard`]. For unit tests of your own code, [`Config::in_memory`] keeps the
//! locks in the process with the same semantics; it is never chosen in place of Redis unless
//! you ask for it.
//!
//! The resource side of fencing, for data in Redis (a write refused unless its token is
//! current) and the pattern for SQL databases, is in [`fenced`]; with the `postgres` feature,
//! `fenced::postgres` also runs writes in a transaction that holds the lock itself.
//!
//! Misuse is a compile error at the offending token, e.g. a placeholder that names no
//! parameter:
//!
//! ```compile_fail
//! #[distlock::distributed_lock(key = "order:{order}")]
//! async fn reduce(order_id: u64) -> Result<(), distlock::LockError> {
//!     Ok(())
//! }
//! ```
#![deny(missing_docs)]

/// Runs an async fn under a distributed lock whose key is built from its arguments.
///
/// | argument | meaning | default |
/// |---|---|---|
/// | `key` | template: `{name}`, `{name.field.0}`, `{self.field}` by `Display`; `{{` `}}` escape | required |
/// | `mode` | `"exclusive"` or `"write"` (the same lock), or `"read"` (shared among readers) | `"exclusive"` |
/// | `lease` | lease per grant: `"250ms"`, `"15s"`, `"2m"`, `"1h"`, `"1m30s"`, or a `Duration` expression | config (30 s) |
/// | `wait` | how long to wait while the lock is held; `"0s"` tries once; or a `Duration` expression | config (10 s) |
/// | `max_hold` | stop renewing after this long; with `on_lost = "abort"` return `LockError::HeldTooLong`; or a `Duration` expression | none |
/// | `keys` | the locks of several keys at once, all or nothing (see [`lock_all`]): `keys = ["acct:{from}", "acct:{to}"]`, each a template like `key`; instead of `key`; exclusive only | — |
/// | `permits` | a semaphore of N permits on `key` (see [`semaphore`]): a number, or a `u32` expression checked when called; not with `mode` | — |
/// | `watchdog` | renew the lease while the body runs | `true` |
/// | `on_lost` | `"abort"`: cancel the body, return `LockError::LeaseLost`; `"continue"`: let it finish | `"abort"` |
/// | `fencing` | `false`: no fencing token, a bare `SET NX PX` | config (`true`) |
/// | `fair` | `true`: the exclusive lock is granted in request order among the key's fair waiters (see [`LockRequest::fair`]); not with `mode = "read"`, `permits` or `keys` | `false` |
/// | `client` | an expression reaching the [`Client`] to lock through (`self.locks`, `&LOCKS`, `state.locks()`) | the global client of [`init`] |
/// | `crate` | path of this crate when renamed | `::distlock` |
///
/// Duration literals are checked at compile time; a duration expression (a const, a field, a
/// call) is checked when the fn is called: a lease out of bounds or a `max_hold` shorter than
/// the lease returns `LockError::Config` naming the argument, and the body does not run. The
/// `client` and duration expressions are evaluated once, before the body runs.
///
/// The fn must return `Result<T, E>` with `E: From<LockError>` (so `anyhow::Result` works).
/// A call that finds the same lock (the same key through the same client, or a clone of it)
/// already held by its own task (through this attribute) joins that grant instead of waiting:
/// the outer grant's lease and watchdog apply, the call's own `on_lost` too. The same key
/// through another client is another owner's lock, waited for. A spawned task is another
/// owner. Read inside read, write inside write and read inside write join; write inside read
/// fails at once with `LockError::UpgradeRefused`.
///
/// ```no_run
/// #[distlock::distributed_lock(key = "report:{day}", lease = "2m", wait = "0s")]
/// async fn build_report(day: u32) -> anyhow::Result<()> {
///     Ok(())
/// }
/// ```
///
/// A semaphore, and several keys at once:
///
/// ```no_run
/// #[distlock::distributed_lock(key = "partner-api", permits = 5)]
/// async fn call_partner(order: u64) -> anyhow::Result<()> {
///     Ok(()) // at most 5 at once, in every process
/// }
///
/// #[distlock::distributed_lock(keys = ["acct:{from}", "acct:{to}"])]
/// async fn transfer(from: u64, to: u64) -> anyhow::Result<()> {
///     Ok(()) // both accounts, taken together: opposite transfers cannot deadlock
/// }
/// ```
///
/// A nested call on a semaphore the task holds joins its permit; a nested single-key call on
/// a key of a `keys` grant joins that key's grant; a `keys` call inside a grant of one of its
/// keys, or a lock inside a permit of the same key, fails at once with `LockError::Config`.
///
/// Through a client of one's own, with a lease from a const (no [`init`] needed):
///
/// ```no_run
/// use std::time::Duration;
///
/// const LEASE: Duration = Duration::from_secs(15);
///
/// struct Billing {
///     locks: distlock::Client,
/// }
///
/// impl Billing {
///     #[distlock::distributed_lock(key = "invoice:{id}", client = self.locks, lease = LEASE)]
///     async fn settle(&self, id: u64) -> Result<(), distlock::LockError> {
///         Ok(())
///     }
/// }
/// ```
pub use lock_macros::distributed_lock;
pub use lock_runtime::{
    current, election, fencing_token, init, inspect, is_locked, lock, ping, read_lock, shutdown,
    try_init, write_lock, BackendError, BackendErrorKind, Client, Config, Election, FencingToken,
    ForcedUnlock, Holder, LeaderChanges, LeaderInfo, LeaderStates, Leadership, LockError,
    LockGuard, LockInfo, LockMode, LockRequest, LockState, DEFAULT_BACKOFF_MAX,
    DEFAULT_BACKOFF_MIN, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FAIR_HEARTBEAT, DEFAULT_KEY_PREFIX,
    DEFAULT_LEASE, DEFAULT_NODE_TIMEOUT, DEFAULT_POSTGRES_SCHEMA, DEFAULT_REDIS_URL,
    DEFAULT_RESPONSE_TIMEOUT, DEFAULT_RETRY_ATTEMPTS, DEFAULT_RETRY_INTERVAL, DEFAULT_WAIT,
    ENV_APP_NAME, ENV_CLUSTER_URLS, ENV_ETCD_ENDPOINTS, ENV_POSTGRES_URL, ENV_REDIS_URL,
    ENV_REDLOCK_URLS, ENV_SENTINEL_MASTER, ENV_SENTINEL_URLS, FAIR_HEARTBEAT_BOUNDS, LOG_TARGET,
    MAX_KEY_LEN, MAX_LEASE, MAX_NODE_TIMEOUT, MAX_TOKEN_LEAD, METRICS, MIN_LEASE,
};

#[cfg(feature = "postgres")]
pub use lock_runtime::postgres_schema_sql;

pub use lock_runtime::fenced;
pub use lock_runtime::lock_all;
pub use lock_runtime::semaphore;

#[doc(hidden)]
pub use lock_runtime::__private;

/// The README's examples, compiled as doctests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The examples of the reference pages in `docs/`, compiled as doctests like the README's.
#[cfg(doctest)]
pub mod docs_doctests {
    #[doc = include_str!("../docs/lock-kinds.md")]
    pub struct LockKinds;
    #[doc = include_str!("../docs/deployments.md")]
    pub struct Deployments;
    #[doc = include_str!("../docs/how-it-works.md")]
    pub struct HowItWorks;
    #[doc = include_str!("../docs/guarantees.md")]
    pub struct Guarantees;
    #[doc = include_str!("../docs/fenced-writes.md")]
    pub struct FencedWrites;
    #[doc = include_str!("../docs/keys-and-acls.md")]
    pub struct KeysAndAcls;
    #[doc = include_str!("../docs/operating.md")]
    pub struct Operating;
    #[doc = include_str!("../docs/observability.md")]
    pub struct Observability;
    #[doc = include_str!("../docs/tls.md")]
    pub struct Tls;
    #[doc = include_str!("../docs/development.md")]
    pub struct Development;
}
