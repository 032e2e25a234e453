//! [`Client`]'s builder methods: each starts a [`LockRequest`] (`request.rs`) through this
//! client's engine. The global client's are the free functions of `global.rs`; an election,
//! which is built on a client, is started by `Client::election` in `election/mod.rs`, so that
//! this module does not import the elections that import it.

use super::Client;
use crate::request::LockRequest;

/// Requests started through a client; the global client's are the free functions
/// (`global.rs`).
impl Client {
    /// Starts a request for the lock `key` through this client (exclusive: the write side of
    /// the key's read/write lock).
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::write(Some(self.engine.clone()), key.into())
    }

    /// Starts a request for the write side of the read/write lock `key`: the same lock as
    /// [`Client::lock`]. See [`write_lock`](crate::write_lock).
    pub fn write_lock(&self, key: impl Into<String>) -> LockRequest {
        self.lock(key)
    }

    /// Starts a request for the locks of every key of `keys` at once: all or nothing, one
    /// guard, a fencing token per key. See [`lock_all`](crate::lock_all).
    pub fn lock_all<I, K>(&self, keys: I) -> LockRequest
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        LockRequest::all(Some(self.engine.clone()), keys)
    }

    /// Starts a request for the read side of the read/write lock `key`. See [`read_lock`](crate::read_lock).
    pub fn read_lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::read(Some(self.engine.clone()), key.into())
    }

    /// Starts a request for one of `permits` permits of the semaphore `key`. See
    /// [`semaphore`](crate::semaphore).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// use std::time::Duration;
    /// let client = distlock::Client::new(distlock::Config::in_memory())?;
    /// let a = client.semaphore("api", 2).acquire().await?;
    /// let b = client.semaphore("api", 2).acquire().await?;
    /// assert_eq!(a.permits(), Some(2));
    /// // Both permits are taken: a third request waits, here not at all.
    /// let third = client.semaphore("api", 2).wait(Duration::ZERO).acquire().await;
    /// assert!(matches!(third, Err(distlock::LockError::Timeout { .. })));
    /// b.release().await?;
    /// let c = client.semaphore("api", 2).acquire().await?;
    /// # drop((a, c)); Ok(()) }
    /// ```
    pub fn semaphore(&self, key: impl Into<String>, permits: u32) -> LockRequest {
        LockRequest::semaphore(Some(self.engine.clone()), key.into(), permits)
    }
}
