//! The conformance binary: what every store promises, the same test bodies run on a single
//! `redis-server`, a primary found through Sentinel, the 3+3 Redis Cluster, Redlock over three
//! masters and the in-process store (`support::stores`) — every kind (`behaviour`), semaphores,
//! several keys, fair locks, run-once jobs, the operator's tools, the readiness check, bad input,
//! every API name the docs mention (`api_names`) — and what the stores keep beside
//! their locks: read/write layout and wake-ups, fencing keys and fenced writes, shutdown, a
//! paused clock. Beside them, `promise_ledger` checks that every test `docs/promises.md` names
//! exists, `layers` that the imports of `lock-runtime/src` keep ARCHITECTURE.md's layers, and
//! `observability_doc` that `docs/observability.md` lists every span, event and metric the code
//! emits, and no other.
//!
//! One Sentinel setup, one Cluster and one set of Redlock masters serve every test of the
//! binary, each test under a key prefix of its own. Process-wide state: the global client is
//! `inspect`'s (its annotated fn), the environment is read and set by `inspect` alone, and the
//! tracing capture is installed by `semaphore` (its records are looked up by key).

#[path = "../support/mod.rs"]
mod support;

mod api_names;
mod bad_input;
mod behaviour;
mod elections;
mod fair;
#[cfg(feature = "postgres")]
mod fenced_postgres;
mod fenced_writes;
mod fencing_keys;
mod health;
mod inspect;
mod jobs;
mod layers;
mod leadership_seen;
mod multi_key;
mod observability_doc;
mod paused_time;
mod promise_ledger;
mod read_write;
mod semaphore;
mod shutdown;
