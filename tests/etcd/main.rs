//! The etcd store against real etcd members (issue 39): its faults and the pitfalls of etcd's
//! lock recipes (`etcd_faults`, with the `etcd` feature) — a leader killed under contention, a
//! quorum lost, a member killed, leases run out, revoked or rounded, a least-privilege user —
//! and the test support's own etcd members and three-member clusters (`etcd_server`, no
//! feature needed: the support's etcd client is a plain dev-dependency). A binary of its own,
//! so that its clusters (three Go processes each) do not run beside the Redis deployments'
//! timing tests (`tests/deployments/`) on a two-core machine.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "etcd")]
mod etcd_faults;
mod etcd_server;
