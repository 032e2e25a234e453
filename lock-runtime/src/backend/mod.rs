//! The storage behind the locks. [`LockBackend`] is the contract every backend keeps (grant with
//! a fencing token, compare-and-delete, compare-and-extend); [`Backend`] dispatches to the one a
//! [`Config`](crate::Config) chose. The acquire loop and the watchdog only talk to this module.

pub(crate) mod memory;
pub(crate) mod redis;

use std::future::Future;
use std::time::Duration;

use crate::error::LockError;
use crate::FencingToken;

/// Longest lock key accepted, in bytes: Redis would take more, but a key this long is a bug.
pub const MAX_KEY_LEN: usize = 4096;

/// The Redis keys of one lock. The user's key is wrapped in a hash tag, so the lock key and
/// its companions (the fencing counter) land in the same Redis Cluster slot.
#[derive(Debug, Clone)]
pub(crate) struct LockKey {
    /// The key as the user gave it.
    pub(crate) name: String,
    /// `{prefix}{{name}}`: holds the owner token while the lock is held.
    pub(crate) lock: String,
    /// `{prefix}{{name}}:fence`: the fencing counter.
    pub(crate) fence: String,
}

impl LockKey {
    pub(crate) fn new(prefix: &str, name: String) -> Result<Self, LockError> {
        let reason = if name.is_empty() {
            Some("a lock key must not be empty".to_owned())
        } else if name.len() > MAX_KEY_LEN {
            Some(format!(
                "a lock key may be at most {MAX_KEY_LEN} bytes, this one has {}; hash long identifiers first",
                name.len()
            ))
        } else {
            None
        };
        if let Some(reason) = reason {
            // An oversized key is kept only in part (120 characters with the ellipsis): the
            // error may well be logged with `{:?}`.
            let key = match name.char_indices().nth(119) {
                Some((cut, _)) if name.len() > MAX_KEY_LEN => format!("{}…", &name[..cut]),
                _ => name,
            };
            return Err(LockError::InvalidKey { key, reason });
        }
        let lock = format!("{prefix}{{{name}}}");
        let fence = format!("{lock}:fence");
        Ok(Self { name, lock, fence })
    }
}

/// What a single try to take a lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// Granted, with this fencing token.
    Acquired(FencingToken),
    /// Held by another owner, whose lease ends in this much time (`None`: unknown, e.g. the
    /// key has no expiry).
    Held(Option<Duration>),
}

/// One backend's three atomic operations. `owner` is the grant's random owner token.
pub(crate) trait LockBackend: Send + Sync {
    /// Takes `key` for `lease` if it is free, handing out the next fencing token.
    fn acquire(
        &self,
        key: &LockKey,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<AcquireReply, LockError>> + Send;

    /// Deletes `key` if `owner` still holds it; `false` when it was no longer ours.
    fn release(
        &self,
        key: &LockKey,
        owner: &str,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Sets `key`'s remaining lease to `lease` if `owner` still holds it; `false` otherwise.
    fn extend(
        &self,
        key: &LockKey,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;
}

/// The backend a client was configured with.
pub(crate) enum Backend {
    Redis(Box<redis::RedisBackend>),
    Memory(memory::MemoryBackend),
}

impl LockBackend for Backend {
    async fn acquire(
        &self,
        key: &LockKey,
        owner: &str,
        lease: Duration,
    ) -> Result<AcquireReply, LockError> {
        match self {
            Backend::Redis(b) => b.acquire(key, owner, lease).await,
            Backend::Memory(b) => b.acquire(key, owner, lease).await,
        }
    }

    async fn release(&self, key: &LockKey, owner: &str) -> Result<bool, LockError> {
        match self {
            Backend::Redis(b) => b.release(key, owner).await,
            Backend::Memory(b) => b.release(key, owner).await,
        }
    }

    async fn extend(&self, key: &LockKey, owner: &str, lease: Duration) -> Result<bool, LockError> {
        match self {
            Backend::Redis(b) => b.extend(key, owner, lease).await,
            Backend::Memory(b) => b.extend(key, owner, lease).await,
        }
    }
}

/// Whether a failed request may nevertheless have taken effect on the server (timed out, or
/// the connection broke after sending), so that a grant may exist that nobody knows about.
/// A failed connect sent nothing; an error reply comes from a script that undid its grant.
pub(crate) fn is_ambiguous(err: &LockError) -> bool {
    use crate::error::BackendErrorKind;
    matches!(err, LockError::Backend(e) if e.kind() != BackendErrorKind::Server && e.operation() != "connect")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_and_fence_keys_share_a_hash_tag() {
        let key = LockKey::new("app:", "order:42".to_owned()).unwrap();
        assert_eq!(key.lock, "app:{order:42}");
        assert_eq!(key.fence, "app:{order:42}:fence");
    }

    #[test]
    fn empty_and_oversized_keys_are_invalid() {
        assert!(matches!(
            LockKey::new("p:", String::new()),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(matches!(
            LockKey::new("p:", "x".repeat(MAX_KEY_LEN + 1)),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(LockKey::new("p:", "ключ {with} spaces".to_owned()).is_ok());
    }
}
