//! The storage behind the locks. [`LockBackend`] is the contract every backend keeps (grant with
//! a fencing token, compare-and-delete, compare-and-extend of many leases at once); [`Backend`] dispatches to the one a
//! [`Config`](crate::Config) chose. The acquire loop and the watchdog only talk to this module.

pub(crate) mod memory;
pub(crate) mod redis;
pub(crate) mod wake;

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
    /// `{prefix}{{name}}:released`: the channel a release is announced on.
    pub(crate) channel: String,
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
        let channel = format!("{lock}:released");
        Ok(Self {
            name,
            lock,
            fence,
            channel,
        })
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

    /// Resets the lease of each `(key, owner, lease)` whose key `owner` still holds, in one
    /// request; element `i` of the answer says whether lock `i` was still ours.
    fn extend_many(
        &self,
        leases: &[Renewal<'_>],
    ) -> impl Future<Output = Result<Vec<bool>, LockError>> + Send;
}

/// One lease to renew: its key, owner token and lease.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
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

    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        match self {
            Backend::Redis(b) => b.extend_many(leases).await,
            Backend::Memory(b) => b.extend_many(leases).await,
        }
    }
}

impl Backend {
    /// Wake-ups on release, where the backend has them (Redis).
    pub(crate) fn waker(&self) -> Option<&wake::Waker> {
        match self {
            Backend::Redis(b) => Some(b.waker()),
            Backend::Memory(_) => None,
        }
    }
}

/// Whether a failed request may nevertheless have taken effect on the server (it was sent and
/// timed out, or the connection broke after sending — also when a retry then failed to
/// connect), so that a grant may exist that nobody knows about.
pub(crate) fn is_ambiguous(err: &LockError) -> bool {
    matches!(err, LockError::Backend(e) if e.may_have_applied())
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
