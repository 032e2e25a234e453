//! Runtime of [distlock](https://docs.rs/distlock): configuration, the global and explicit
//! clients, the acquire loop, the watchdog and the guards, over two independent axes — lock
//! kinds (`kind/`: write, read, semaphore, fair and multi-key, each its Lua scripts and
//! in-process twin) and stores (`store/`: single Redis node, Sentinel, Cluster, Redlock,
//! in-process), so a kind is written once and runs on every store. [`fenced`] is the other end of fencing tokens: writes to Redis that a stale holder
//! cannot make, the same pattern for SQL, and (feature `postgres`) a PostgreSQL transaction that
//! holds the lock itself.
//!
//! Users depend on the `distlock` facade, which re-exports everything public here; the
//! attribute macro expands to calls into this crate through the facade.
#![deny(missing_docs)]

mod acquire;
mod attribute;
mod client;
mod clock;
mod config;
mod election;
mod election_scripts;
mod engine;
mod error;
pub mod fenced;
mod global;
mod guard;
mod inspect;
mod io;
mod key_operation;
mod kind;
mod lease;
mod operator_scripts;
mod protocol;
mod release;
mod request;
mod script;
mod store;
mod telemetry;
mod tls;
mod url;
mod wake;
mod watchdog;

pub use attribute::{current, fencing_token, LockInfo};
pub use client::Client;
pub use config::{
    Config, DEFAULT_BACKOFF_MAX, DEFAULT_BACKOFF_MIN, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FAIR_HEARTBEAT, DEFAULT_KEY_PREFIX, DEFAULT_LEASE, DEFAULT_NODE_TIMEOUT,
    DEFAULT_POSTGRES_SCHEMA, DEFAULT_REDIS_URL, DEFAULT_RESPONSE_TIMEOUT, DEFAULT_RETRY_ATTEMPTS,
    DEFAULT_RETRY_INTERVAL, DEFAULT_WAIT, ENV_APP_NAME, ENV_CLUSTER_URLS, ENV_ETCD_ENDPOINTS,
    ENV_POSTGRES_URL, ENV_REDIS_URL, ENV_REDLOCK_URLS, ENV_SENTINEL_MASTER, ENV_SENTINEL_URLS,
    FAIR_HEARTBEAT_BOUNDS, MAX_LEASE, MAX_NODE_TIMEOUT, MAX_TOKEN_LEAD, MIN_LEASE,
};
pub use election::{election, Election, LeaderChanges, LeaderStates, Leadership};
pub use error::{BackendError, BackendErrorKind, LockError};
pub use global::{
    init, inspect, is_locked, lock, lock_all, ping, read_lock, semaphore, shutdown, try_init,
    write_lock,
};
pub use guard::LockGuard;
pub use inspect::{ForcedUnlock, Holder, LeaderInfo, LockState};
pub use protocol::{FencingToken, LockMode, MAX_KEY_LEN};
pub use request::LockRequest;
pub use telemetry::{LOG_TARGET, METRICS};

#[cfg(feature = "postgres")]
pub use store::postgres::postgres_schema_sql;

/// What the attribute macro expands to. Not a public API: no stability promise.
#[doc(hidden)]
pub mod __private {
    pub use crate::attribute::{
        client_of, global_client, lock_error_into, run_locked, skipped_value, LockErrorInto,
        LockResult, LockSpec, LockTarget, OnLost, Skipped,
    };
    pub use crate::protocol::LockMode;
    pub use core::time::Duration;
    pub use std::format;
    pub use std::vec::Vec;
}
