//! What the benches that compare libraries share — `locks.rs` (Redis), `postgres.rs` and
//! `etcd.rs` — included by each with `#[path = "support/mod.rs"]` (a bench is a crate of its
//! own, and `benches/support/` is no bench: Cargo finds benches only in `benches/*.rs`).
//! `pinning` puts the servers and the bench on CPUs of their own, `header` names the machine
//! and the build a run is read against, `rounds` turns the rounds' figures into medians,
//! per-round ratios, tables and JSON lines, `process_cpu` measures CPU time (also included
//! alone by `cycle.rs` and `client_costs.rs`). The servers themselves come from the tests'
//! support (`tests/support/`), which each bench includes too.
#![allow(dead_code)] // each bench uses its own part

pub mod header;
pub mod pinning;
pub mod process_cpu;
pub mod rounds;
