//! One deployment or one fault at a time: Redis Cluster, Sentinel and Redlock against real
//! processes (their failovers, migrations and quorums), Redis faults (restarts, flushed
//! scripts, ACL users that lack a command), the documented ACL user on each deployment, broken,
//! stalled and redirected connections through the fault-injecting proxy, failures retried
//! within a request's wait, servers that never answer, the eviction check, what an operator
//! sees through `tracing`, the PostgreSQL store's semantics and faults (`postgres_faults`, and
//! through PgBouncer and across a failover `postgres_pooler`, with the `postgres` feature), and
//! the test support's own deployments (Redis, PostgreSQL for the
//! Postgres store). The etcd store's faults have a binary of their own (`tests/etcd/`): its
//! three-member clusters, run beside this binary's timing tests on two cores, made them late.
//!
//! Process-wide state: the tracing capture (`support::capture`, installed once, read by
//! `acl`, `cluster`, `cluster_renewal_faults`, `sentinel`, `eviction_warning` and `observability`, each looking up its own key or
//! server), the global client (`observability` alone), and a panic hook that counts panics in
//! the library and the redis crate (`support::panics`, read by `redis_faults` and
//! `cluster_renewal_faults`). Tests that fail over or freeze a Cluster start their own;
//! the shared one ([`support::cluster::shared_cluster`]) is left as `cluster`'s tests found it.

#[path = "../support/mod.rs"]
mod support;

mod acl;
mod cluster;
mod cluster_renewal_faults;
mod deployments_support;
mod eviction_check_timing;
mod eviction_warning;
mod guarded_connections;
mod observability;
#[cfg(feature = "postgres")]
mod postgres_faults;
#[cfg(feature = "postgres")]
mod postgres_pooler;
mod postgres_server;
mod pubsub_faults;
mod reconnect_faults;
mod redis_faults;
mod redlock;
mod redlock_defaults;
mod retries;
mod retry_schedule;
mod sentinel;
mod silent_server;
mod slow_connect;
mod stalled_connection;
mod wait_deadline;
