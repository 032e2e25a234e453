//! `#[distributed_lock]` end to end: the attribute's table, fn shapes, re-entrancy and
//! abort-on-loss (`attribute`), its read/write modes (`attribute_read_write`) and its permits
//! and key lists (`attribute_kinds`, on clients of their own), and what run-once jobs use
//! (`jobs`: `try_acquire`, `on_busy = "skip"`, `fencing_token()`).
//!
//! The global client is per process, so the binary sets it up once ([`init_once`]) for every
//! test that locks through it: one `redis-server`, each test on keys of its own.

#[path = "../support/mod.rs"]
mod support;

mod attribute;
mod attribute_kinds;
mod attribute_read_write;
mod jobs;

use std::sync::OnceLock;
use std::time::Duration;

use support::RedisServer;

/// The server behind the global client, which the first caller starts and hands to
/// `distlock::init` (short backoff, so waiting tests stay quick).
fn init_once() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let server = RedisServer::start();
        let config = distlock::Config::from_url(&server.url())
            .expect("url")
            .backoff(Duration::from_millis(1), Duration::from_millis(20));
        distlock::init(config).expect("init");
        server
    })
}
