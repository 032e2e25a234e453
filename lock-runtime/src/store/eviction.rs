//! The eviction check: a Redis whose `maxmemory-policy` may evict keys with a TTL
//! (`volatile-*`, `allkeys-*`) can drop a held lock's key under memory pressure and hand the
//! lock to a second owner. On the first connection to each server (per process) the policy is
//! read with `CONFIG GET` and a bad one is warned about once. Neighbours: the two transports
//! of the Redis store — one server (`connection.rs`, which Sentinel and each Redlock master
//! use) and `cluster.rs` — fire it after they connect, without waiting for it: it is never on a request's path.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

use redis::aio::ConnectionLike;
use redis::Value;

/// Servers (`host:port`) whose policy this process has checked or is checking.
static CHECKED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Whether `server` is still to be checked; marks it as checked.
pub(crate) fn first_time(server: &str) -> bool {
    CHECKED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(server.to_owned())
}

/// The command: `maxmemory*` matches `maxmemory` and `maxmemory-policy` on every Redis version
/// (several names in one `CONFIG GET` need 7.0).
fn config_get() -> redis::Cmd {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory*");
    cmd
}

/// A check under way: if it is dropped unfinished (its client, and with it the I/O runtime,
/// went away first), the server is to be checked again by the next client that connects.
struct Pending {
    server: String,
    finished: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.finished {
            CHECKED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&self.server);
        }
    }
}

/// Reads one server's policy over `connection` and warns if it can evict lock keys. The
/// caller has marked `server` with [`first_time`].
pub(crate) async fn check_node(mut connection: impl ConnectionLike, server: String) {
    let mut pending = Pending {
        server,
        finished: false,
    };
    let reply = config_get()
        .query_async::<HashMap<String, String>>(&mut connection)
        .await;
    match reply {
        Ok(settings) => {
            pending.finished = true;
            judge(&pending.server, &settings);
        }
        Err(err) => {
            // A refusal is the server's answer; a broken connection is not, and the next
            // connection asks again.
            pending.finished = matches!(err.kind(), redis::ErrorKind::Server(_));
            refused(&pending.server, &err);
        }
    }
}

/// Reads the policy of every primary of a Cluster (one request, fanned out by the cluster
/// connection) and warns for each one that can evict lock keys.
pub(crate) async fn check_cluster(mut connection: redis::cluster_async::ClusterConnection) {
    let routing = redis::cluster_routing::RoutingInfo::MultiNode((
        redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
        None,
    ));
    match connection.route_command(config_get(), routing).await {
        Ok(Value::Map(replies)) => {
            for (node, reply) in replies {
                let Ok(server) = redis::from_redis_value::<String>(node) else {
                    continue;
                };
                if !first_time(&server) {
                    continue;
                }
                match redis::from_redis_value::<HashMap<String, String>>(reply) {
                    Ok(settings) => judge(&server, &settings),
                    Err(err) => refused(&server, &err),
                }
            }
        }
        Ok(_) => {}
        Err(err) => refused("the Redis Cluster", &err),
    }
}

fn judge(server: &str, settings: &HashMap<String, String>) {
    let Some(policy) = settings.get("maxmemory-policy") else {
        return;
    };
    let maxmemory = settings.get("maxmemory").map_or("?", String::as_str);
    if can_evict_lock_keys(policy) {
        tracing::warn!(
            target: crate::telemetry::LOG_TARGET,
            server,
            policy = %policy,
            maxmemory,
            "Redis at {server} has maxmemory-policy `{policy}`, which may evict lock keys \
             (they have a TTL) under memory pressure: a held lock would then be handed to a \
             second owner and mutual exclusion lost; set `maxmemory-policy noeviction` on the \
             servers that keep locks (writes then fail loudly when memory is full)"
        );
    } else {
        tracing::debug!(target: crate::telemetry::LOG_TARGET, server, policy = %policy, "maxmemory-policy keeps lock keys");
    }
}

fn refused(server: &str, err: &dyn std::fmt::Display) {
    // Managed Redis often disables or renames CONFIG: nothing to learn, nothing wrong.
    tracing::debug!(
        target: crate::telemetry::LOG_TARGET,
        server,
        error = %err,
        "could not read maxmemory-policy (CONFIG GET refused or renamed); eviction not checked"
    );
}

/// Whether `policy` lets Redis evict keys that have a TTL, as every lock key does.
fn can_evict_lock_keys(policy: &str) -> bool {
    policy.starts_with("volatile-") || policy.starts_with("allkeys-")
}

#[cfg(test)]
mod tests {
    use super::can_evict_lock_keys;

    #[test]
    fn only_noeviction_keeps_lock_keys() {
        for policy in [
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
        ] {
            assert!(can_evict_lock_keys(policy), "{policy}");
        }
        assert!(!can_evict_lock_keys("noeviction"));
    }
}
