//! The checks of a [`Config`] before a client starts ([`Config::validate`]), and the bounds
//! of a lease ([`lease_out_of_bounds`]), which requests, elections and the attribute check
//! theirs against. Neighbours: `config.rs` has the settings; `request.rs` refuses a request's.

use std::time::Duration;

use crate::error::LockError;

use super::{
    Config, StoreConfig, DEFAULT_NODE_TIMEOUT, FAIR_HEARTBEAT_BOUNDS, MAX_LEASE, MAX_NODE_TIMEOUT,
    MAX_TOKEN_LEAD, MIN_LEASE,
};

impl Config {
    /// Rejects settings no client can work with, naming the setting and what is accepted.
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        let positive = [
            ("default_lease", self.default_lease),
            ("response_timeout", self.response_timeout),
            ("connect_timeout", self.connect_timeout),
            ("backoff min", self.backoff_min),
            ("backoff max", self.backoff_max),
            ("node_timeout", self.node_timeout),
        ];
        for (name, value) in positive {
            if value.is_zero() {
                return Err(LockError::Config(format!(
                    "`{name}` must be greater than zero"
                )));
            }
        }
        #[cfg(feature = "postgres")]
        if let StoreConfig::Postgres(target) = &self.store {
            let schema = &target.options.schema;
            if !super::postgres::valid_schema(schema) {
                return Err(LockError::Config(format!(
                    "`postgres_schema` is {schema:?}; it must be a lower-case SQL identifier \
                     (letters a-z, digits and `_`, not starting with a digit, at most 63 \
                     characters)"
                )));
            }
            target.options.check_tls()?;
        }
        #[cfg(feature = "etcd")]
        if let StoreConfig::Etcd(target) = &self.store {
            target.check()?;
        }
        if self.node_timeout > MAX_NODE_TIMEOUT {
            return Err(LockError::Config(format!(
                "`node_timeout` is {:?}; it must be at most {MAX_NODE_TIMEOUT:?} \
                 (`MAX_NODE_TIMEOUT`): a Redlock client proposes fencing tokens at most \
                 {MAX_TOKEN_LEAD:?} ahead of its clock (`MAX_TOKEN_LEAD`), so a master slower \
                 than that would refuse every token. Lower it (the default is \
                 {DEFAULT_NODE_TIMEOUT:?}); a master that needs longer counts as down",
                self.node_timeout
            )));
        }
        if let Some(why) = lease_out_of_bounds(self.default_lease) {
            return Err(LockError::Config(format!("`default_lease` is {why}")));
        }
        if self.key_prefix.contains(['{', '}']) {
            return Err(LockError::Config(format!(
                "the key prefix `{}` holds a `{{` or `}}`; remove it: the lock's hash tag, which \
                 keeps a lock's keys in one Cluster slot, comes after the prefix",
                self.key_prefix
            )));
        }
        if let Some(guard) = self.replicas {
            if guard.timeout >= self.response_timeout {
                return Err(LockError::Config(format!(
                    "the failover guard's timeout ({:?}) must be shorter than the response \
                     timeout ({:?}), which bounds the `WAIT` that runs it",
                    guard.timeout, self.response_timeout
                )));
            }
            if guard.replicas == 0 || guard.timeout.is_zero() {
                return Err(LockError::Config(
                    "`replicas(n, timeout)` needs at least one replica and a timeout above zero"
                        .to_owned(),
                ));
            }
            if matches!(
                self.store,
                StoreConfig::Redlock(_) | StoreConfig::InMemory(_)
            ) {
                return Err(LockError::Config(
                    "`replicas(n, timeout)` (the failover guard) works with a single primary, \
                     Sentinel or Cluster; Redlock masters and the in-process store have no \
                     replicas"
                        .to_owned(),
                ));
            }
        }
        if !FAIR_HEARTBEAT_BOUNDS.contains(&self.fair_heartbeat) {
            return Err(LockError::Config(format!(
                "`fair_heartbeat` is {:?}; it must be between {:?} and {:?}",
                self.fair_heartbeat,
                FAIR_HEARTBEAT_BOUNDS.start(),
                FAIR_HEARTBEAT_BOUNDS.end()
            )));
        }
        if self.backoff_min > self.backoff_max {
            return Err(LockError::Config(format!(
                "backoff min ({:?}) must not exceed backoff max ({:?})",
                self.backoff_min, self.backoff_max
            )));
        }
        if self.retry_attempts > 0 && self.retry_interval.is_zero() {
            return Err(LockError::Config(format!(
                "`retry` interval must be greater than zero for {} attempts (retry(0, _) turns \
                 retrying off)",
                self.retry_attempts
            )));
        }
        Ok(())
    }
}

/// Why `lease` cannot be a lease, if it cannot: "{lease}; it must be between … and …".
pub(crate) fn lease_out_of_bounds(lease: Duration) -> Option<String> {
    (!(MIN_LEASE..=MAX_LEASE).contains(&lease))
        .then(|| format!("{lease:?}; it must be between {MIN_LEASE:?} and {MAX_LEASE:?}"))
}
