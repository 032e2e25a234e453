//! One deployment or one fault at a time: Redis Cluster, Sentinel and Redlock against real
//! processes (their failovers, migrations and quorums), Redis faults (restarts, flushed
//! scripts, ACLs), broken, stalled and redirected connections through the fault-injecting
//! proxy, failures retried within a request's wait, servers that never answer, the eviction
//! check, what an operator sees through `tracing`, and the test support's own deployments.

#[path = "../support/mod.rs"]
mod support;

mod cluster;
mod cluster_renewal_faults;
mod deployments_support;
mod eviction_warning;
mod observability;
mod pubsub_faults;
mod reconnect_faults;
mod redis_faults;
mod redlock;
mod retries;
mod sentinel;
mod silent_server;
mod slow_connect;
mod stalled_connection;
