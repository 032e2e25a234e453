//! Declarative distributed locks for async Rust on Redis, with fencing tokens.
//!
//! Configure once at startup, then take locks; every grant carries a [`FencingToken`], a
//! watchdog renews the lease while you work, and the [`LockGuard`] releases the lock.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), distlock::LockError> {
//!     distlock::init(distlock::Config::from_env()?)?;
//!
//!     let guard = distlock::lock("order:42")
//!         .lease(Duration::from_secs(15))
//!         .wait(Duration::from_secs(5))
//!         .acquire()
//!         .await?;
//!     println!("holding {} with token {}", guard.key(), guard.fencing_token());
//!     guard.release().await?;
//!     Ok(())
//! }
//! ```
//!
//! For unit tests of your own code, [`Config::in_memory`] keeps the locks in the process with
//! the same semantics; it is never chosen in place of Redis unless you ask for it.
#![deny(missing_docs)]

pub use lock_macros::distributed_lock;
pub use lock_runtime::{
    current, init, lock, BackendError, BackendErrorKind, Client, Config, FencingToken, LockError,
    LockGuard, LockInfo, LockRequest, DEFAULT_BACKOFF_MAX, DEFAULT_BACKOFF_MIN,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEY_PREFIX, DEFAULT_LEASE, DEFAULT_REDIS_URL,
    DEFAULT_RESPONSE_TIMEOUT, DEFAULT_WAIT, MAX_KEY_LEN,
};

#[doc(hidden)]
pub use lock_runtime::__private;

/// The README's examples, compiled as doctests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
