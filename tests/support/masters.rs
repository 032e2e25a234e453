//! Independent Redis masters, for Redlock-style tests that spread one lock over several
//! servers which know nothing of each other. Each is a plain [`RedisServer`] from `mod.rs`.

use super::RedisServer;

/// Starts `n` independent masters on free loopback ports; each is stopped when dropped.
pub fn start_masters(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}
