//! Runtime of [distlock](https://docs.rs/distlock): configuration, the global and explicit
//! clients, the acquire loop, the watchdog and the guards, over two independent axes — lock
//! kinds (`kind/`: write, read, semaphore, fair and multi-key, each its Lua scripts and
//! in-process twin) and stores (`backend/`: single Redis node, Sentinel, Cluster, Redlock,
//! in-process), so a kind is written once and runs on every store. [`fenced`] is the other end of fencing tokens: writes to Redis that a stale holder
//! cannot make, and the same pattern for SQL.
//!
//! Users depend on the `distlock` facade, which re-exports everything public here; the
//! attribute macro expands to calls into this crate through the facade.
#![deny(missing_docs)]

mod acquire;
mod attribute;
mod backend;
mod client;
mod clock;
mod config;
mod election;
mod election_scripts;
mod error;
pub mod fenced;
mod global;
mod guard;
mod inspect;
mod io;
mod kind;
mod lease;
mod operator_scripts;
mod protocol;
mod release;
mod request;
mod script;
mod telemetry;
mod tls;
mod url;
mod watchdog;

use std::fmt;

/// The `tracing` target of every span and event distlock emits (`RUST_LOG=distlock=debug`).
pub const LOG_TARGET: &str = "distlock";

pub use attribute::{current, fencing_token, LockInfo};
pub use client::Client;
pub use config::{
    Config, DEFAULT_BACKOFF_MAX, DEFAULT_BACKOFF_MIN, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FAIR_HEARTBEAT, DEFAULT_KEY_PREFIX, DEFAULT_LEASE, DEFAULT_NODE_TIMEOUT,
    DEFAULT_REDIS_URL, DEFAULT_RESPONSE_TIMEOUT, DEFAULT_RETRY_ATTEMPTS, DEFAULT_RETRY_INTERVAL,
    DEFAULT_WAIT, ENV_APP_NAME, ENV_CLUSTER_URLS, ENV_REDIS_URL, ENV_REDLOCK_URLS,
    ENV_SENTINEL_MASTER, ENV_SENTINEL_URLS, FAIR_HEARTBEAT_BOUNDS, MAX_LEASE, MAX_NODE_TIMEOUT,
    MAX_TOKEN_LEAD, MIN_LEASE,
};
pub use election::{election, Election, LeaderChanges, Leadership};
pub use error::{BackendError, BackendErrorKind, LockError};
pub use global::{
    init, inspect, is_locked, lock, lock_all, ping, read_lock, semaphore, shutdown, try_init,
    write_lock,
};
pub use guard::LockGuard;
pub use inspect::{ForcedUnlock, Holder, LeaderInfo, LockState};
pub use protocol::MAX_KEY_LEN;
pub use request::LockRequest;
pub use telemetry::METRICS;

/// What the attribute macro expands to. Not a public API: no stability promise.
#[doc(hidden)]
pub mod __private {
    pub use crate::attribute::{
        client_of, global_client, lock_error_into, run_locked, skipped_value, LockErrorInto,
        LockResult, LockSpec, LockTarget, OnLost, Skipped,
    };
    pub use crate::LockMode;
    pub use core::time::Duration;
    pub use std::format;
    pub use std::vec::Vec;
}

/// What a grant holds: a side of a key's read/write lock, or a semaphore permit.
///
/// A key has one lock with two sides: any number of readers at once, or one writer alone.
/// [`lock`] and [`write_lock`] take the write side (the exclusive lock), [`read_lock`] the
/// read side; the attribute chooses with `mode = "exclusive" | "write" | "read"`. A key can
/// instead be a semaphore ([`semaphore`]): at most N holders at once, each with a permit of
/// its own. A key is one or the other at a time: while permits are held, writers and readers
/// of the key wait, and while a writer or readers hold it, permits wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// Exclusive: no other writer and no reader holds the key meanwhile. Every write grant has
    /// a fencing token of its own, greater than every earlier write token of the key.
    Write,
    /// Shared among readers, excluding writers. A read grant takes no token of its own: its
    /// token sorts between the write tokens of the key around it.
    Read,
    /// One of a semaphore's N permits ([`semaphore`]): at most N holders at once. Like a read
    /// grant, a permit takes no token of its own (see [`LockGuard::fencing_token`]).
    Semaphore,
}

/// A fencing token: a number handed out with every grant of a key, strictly greater than every
/// token handed out for that key before (also across a restart of a Redis without persistence,
/// as long as the server's clock does not step back; README, "Guarantees"). Grants taken with
/// [`LockRequest::fencing`]`(false)` have none.
///
/// A store that remembers the highest token it has accepted and refuses lower ones cannot be
/// corrupted by a holder that was paused past its lease (Kleppmann's argument for fencing).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// let client = distlock::Client::new(distlock::Config::in_memory())?;
/// let first = client.lock("k").acquire().await?;
/// let t1 = first.fencing_token().expect("fencing is on by default");
/// first.release().await?;
/// let second = client.lock("k").acquire().await?;
/// assert!(second.fencing_token() > Some(t1));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub(crate) u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// A token received as a number — by a resource service in another process, say, that
    /// fences its writes with [`fenced`] — back as a `FencingToken`. Only the lock hands out
    /// tokens; this is for carrying one across a process boundary.
    ///
    /// ```
    /// let token = distlock::FencingToken::from_raw(1_795_468_000_123_456);
    /// assert_eq!(token.get(), 1_795_468_000_123_456);
    /// ```
    pub fn from_raw(token: u64) -> Self {
        Self(token)
    }
}

impl FencingToken {
    /// The token as a SQL integer (`BIGINT`, SQLite's `INTEGER`: signed 64-bit), for the
    /// fence column of a [fenced SQL write](fenced#sql-databases).
    ///
    /// Tokens are the server clock in microseconds at the grant (a Redlock counter starts
    /// there too), which reaches `i64::MAX` in about 292,000 years, so this does not fail in
    /// practice; it is checked anyway, never a silent wrap: a wrapped token would be negative
    /// and every later write would look stale.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = distlock::Client::new(distlock::Config::in_memory())?;
    /// let guard = client.lock("k").acquire().await?;
    /// let token = guard.fencing_token().expect("fencing is on by default");
    /// let fence: i64 = token.as_i64()?;
    /// assert_eq!(fence as u64, token.get());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A token above `i64::MAX`.
    pub fn as_i64(self) -> Result<i64, std::num::TryFromIntError> {
        i64::try_from(self.0)
    }
}

impl TryFrom<FencingToken> for i64 {
    type Error = std::num::TryFromIntError;

    /// [`FencingToken::as_i64`].
    fn try_from(token: FencingToken) -> Result<i64, Self::Error> {
        token.as_i64()
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod token_tests {
    use super::FencingToken;

    #[test]
    fn a_token_above_i64_max_is_an_error_not_a_wrap() {
        assert_eq!(FencingToken(i64::MAX as u64).as_i64(), Ok(i64::MAX));
        assert!(FencingToken(i64::MAX as u64 + 1).as_i64().is_err());
        assert!(i64::try_from(FencingToken(u64::MAX)).is_err());
    }
}
