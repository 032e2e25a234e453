//! The stores behind the locks (a backend is a store): where a kind's operations run and how
//! waiters are woken. [`LockBackend`] is the contract every store keeps for every
//! [kind](crate::kind) — try a grant, give it back, renew many grants at once; [`Backend`]
//! dispatches to the one a [`Config`](crate::Config) chose. A store owns its connections, the
//! key layout ([`LockKey`]), its wake-ups and how it batches renewals; what a grant means is
//! the kind's. The acquire loop, the watchdog and the release path only talk to this module.
//!
//! The stores: [`redis`] (one server, also the primary found through Sentinel, and each
//! master of Redlock), [`cluster`] (Redis Cluster), [`redlock`] (a quorum of independent
//! masters, each a [`redis`] node) and [`memory`] (in-process).

pub(crate) mod cluster;
pub(crate) mod endpoint;
pub(crate) mod eviction;
pub(crate) mod memory;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod wake;

use std::future::Future;
use std::time::Duration;

use crate::config::ReplicaGuard;
use crate::error::{BackendError, BackendErrorKind, LockError};
pub(crate) use crate::kind::multi::{MultiReply, MultiTry};
use crate::kind::operator::{RawHolder, RawView};
pub(crate) use crate::kind::{Kind, Try};
use crate::FencingToken;

/// Longest lock key accepted, in bytes: Redis would take more, but a key this long is a bug.
pub const MAX_KEY_LEN: usize = 4096;

/// The Redis keys of one lock. The user's key is wrapped in a hash tag, so the lock key and
/// its companions (fencing counter, writer-waiting mark, release channel) land in the same
/// Redis Cluster slot whatever the key contains: a `{` or `}` inside the key only moves where
/// the tag ends, and the same for every companion (they only add a suffix); a key that starts
/// with `}` (which would make an empty tag, which Redis ignores) is tagged with a hash of the
/// key instead. The prefix may hold neither brace ([`Config::key_prefix`](crate::Config::key_prefix)).
#[derive(Debug, Clone)]
pub(crate) struct LockKey {
    /// The key as the user gave it.
    pub(crate) name: String,
    /// `{prefix}{{name}}`: while a writer holds the lock, a string with its owner token; while
    /// readers hold it, a sorted set of their owner tokens scored by when their leases end.
    pub(crate) lock: String,
    /// `{prefix}{{name}}:fence`: the fencing counter.
    pub(crate) fence: String,
    /// `{prefix}{{name}}:writer-waiting`: set by a writer that found the lock held; while it
    /// lives no new reader enters.
    pub(crate) writer_waiting: String,
    /// `{prefix}{{name}}:released`: the channel a release is announced on.
    pub(crate) channel: String,
    /// `{prefix}{{name}}:queue`: the fair waiters in order (a sorted set of waiter ids).
    pub(crate) queue: String,
    /// `{prefix}{{name}}:queue-deadlines`: when each fair waiter is dropped from the queue
    /// unless it tries again.
    pub(crate) queue_deadlines: String,
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
        let lock = if name.starts_with('}') {
            // `{}…` would be an empty hash tag, which Redis ignores: the whole key would be
            // hashed and the lock's companion keys could land in other slots. Such a name gets
            // a tag made of a hash of the name instead, and a closing `#`: every other lock key
            // ends with `}`, so no name of the other form can make the same key.
            format!("{prefix}{{#{:016x}}}{name}#", fnv1a(name.as_bytes()))
        } else {
            format!("{prefix}{{{name}}}")
        };
        Ok(Self {
            name,
            fence: format!("{lock}:fence"),
            writer_waiting: format!("{lock}:writer-waiting"),
            channel: format!("{lock}:released"),
            queue: format!("{lock}:queue"),
            queue_deadlines: format!("{lock}:queue-deadlines"),
            lock,
        })
    }
}

/// How a store's release scripts announce a release to waiters: plain pub/sub, or sharded
/// pub/sub on Cluster (where the channel lives on the lock's own shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announce {
    /// `PUBLISH`.
    Publish,
    /// `SPUBLISH`.
    ShardedPublish,
}

impl Announce {
    /// The command the scripts run.
    pub(crate) fn command(self) -> &'static str {
        match self {
            Announce::Publish => "PUBLISH",
            Announce::ShardedPublish => "SPUBLISH",
        }
    }
}

/// 64-bit FNV-1a: a hash that stays the same across builds and platforms, for hash tags.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One request of a lock operation as a store sends it: a script call, or (a first try that
/// needs no script, [`FirstTry`](crate::kind::FirstTry)) a pipeline built for it, whose reply is
/// an array with error replies kept as values (a refusal can be an answer, not a failure).
#[derive(Clone, Copy)]
pub(crate) enum Call<'a> {
    Script(&'a ::redis::ScriptInvocation<'a>),
    Pipeline(&'a ::redis::Pipeline),
}

impl Call<'_> {
    /// Whether the request is a transaction (`MULTI` … `EXEC`).
    pub(crate) fn is_transaction(&self) -> bool {
        matches!(self, Call::Pipeline(pipeline) if pipeline.is_transaction())
    }

    /// Sends the request (a script by its SHA, loading it on `NOSCRIPT`).
    pub(crate) async fn query<T: ::redis::FromRedisValue>(
        self,
        connection: &mut impl ::redis::aio::ConnectionLike,
    ) -> ::redis::RedisResult<T> {
        match self {
            Call::Script(invocation) => invocation.invoke_async(connection).await,
            Call::Pipeline(pipeline) => pipeline.query_async(connection).await,
        }
    }
}

/// What a single try to take a lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// Granted, with this fencing token (`None`: a grant without one, see
    /// [`LockRequest::fencing`](crate::LockRequest::fencing)).
    Acquired(Option<FencingToken>),
    /// Held by another owner, whose lease ends in this much time (`None`: unknown, e.g. the
    /// key has no expiry).
    Held(Option<Duration>),
    /// A fair try refused ([`Kind::Fair`]): `behind` other waiters (its next try is its
    /// heartbeat, unless the release that makes it the head wakes it first), or the queue's
    /// head while the lock is held (for at most `remaining`, as [`Held`](Self::Held) says).
    /// `place` is the waiter's place in the queue (0: not known), which its later tries ask
    /// for should they have to join again.
    Queued {
        place: u64,
        behind: bool,
        remaining: Option<Duration>,
    },
}

/// One store's three atomic operations, for grants of any kind. `owner` is the grant's random
/// owner token.
pub(crate) trait LockBackend: Send + Sync {
    /// One try: takes the grant the try asks for if the kind allows it now, with its token.
    fn acquire(
        &self,
        attempt: &Try<'_>,
    ) -> impl Future<Output = Result<AcquireReply, LockError>> + Send;

    /// Gives back `owner`'s grant of `kind` on `key` if it still holds it; `false` when it
    /// was no longer ours.
    fn release(
        &self,
        kind: Kind,
        key: &LockKey,
        owner: &str,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Resets the lease of each grant that its owner still holds, in as few requests as the
    /// store allows; element `i` of the answer says what became of grant `i`. An error says
    /// nothing was learnt of any.
    fn extend_many(
        &self,
        leases: &[Renewal<'_>],
    ) -> impl Future<Output = Result<Vec<Renewed>, LockError>> + Send;

    /// One try of a multi-key lock ([`crate::kind::multi`]): the write lock of every key of
    /// the try, or of none (a partial grant is undone before the answer).
    fn acquire_all(
        &self,
        attempt: &MultiTry<'_>,
    ) -> impl Future<Output = Result<MultiReply, LockError>> + Send;

    /// Gives back `owner`'s write lock of each of `keys` that it still holds; `true` when
    /// every one was still ours.
    fn release_all(
        &self,
        keys: &[&LockKey],
        owner: &str,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;
}

/// What a store learnt of one renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// The lease was reset: the grant is still ours.
    Yes,
    /// The grant is no longer ours (expired, taken over, deleted): the lease is lost.
    No,
    /// Not known (its shard or too many masters did not answer): try again while the lease
    /// may still be in force.
    Unknown,
}

impl From<bool> for Renewed {
    fn from(still_ours: bool) -> Self {
        if still_ours {
            Renewed::Yes
        } else {
            Renewed::No
        }
    }
}

/// One lease to renew: its kind, key, owner token and lease.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) kind: Kind,
    pub(crate) key: &'a LockKey,
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
}

/// The backend a client was configured with.
pub(crate) enum Backend {
    /// One server, or the primary found through Sentinel.
    Redis(Box<redis::RedisBackend>),
    Cluster(Box<cluster::ClusterBackend>),
    Redlock(Box<redlock::RedlockBackend>),
    Memory(memory::MemoryBackend),
}

impl LockBackend for Backend {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        match self {
            Backend::Redis(b) => b.acquire(attempt).await,
            Backend::Cluster(b) => b.acquire(attempt).await,
            Backend::Redlock(b) => b.acquire(attempt).await,
            Backend::Memory(b) => b.acquire(attempt).await,
        }
    }

    async fn release(&self, kind: Kind, key: &LockKey, owner: &str) -> Result<bool, LockError> {
        match self {
            Backend::Redis(b) => b.release(kind, key, owner).await,
            Backend::Cluster(b) => b.release(kind, key, owner).await,
            Backend::Redlock(b) => b.release(kind, key, owner).await,
            Backend::Memory(b) => b.release(kind, key, owner).await,
        }
    }

    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        match self {
            Backend::Redis(b) => b.extend_many(leases).await,
            Backend::Cluster(b) => b.extend_many(leases).await,
            Backend::Redlock(b) => b.extend_many(leases).await,
            Backend::Memory(b) => b.extend_many(leases).await,
        }
    }

    async fn acquire_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        match self {
            Backend::Redis(b) => b.acquire_all(attempt).await,
            Backend::Cluster(b) => b.acquire_all(attempt).await,
            Backend::Redlock(b) => b.acquire_all(attempt).await,
            Backend::Memory(b) => b.acquire_all(attempt).await,
        }
    }

    async fn release_all(&self, keys: &[&LockKey], owner: &str) -> Result<bool, LockError> {
        match self {
            Backend::Redis(b) => b.release_all(keys, owner).await,
            Backend::Cluster(b) => b.release_all(keys, owner).await,
            Backend::Redlock(b) => b.release_all(keys, owner).await,
            Backend::Memory(b) => b.release_all(keys, owner).await,
        }
    }
}

impl Backend {
    /// Wake-ups on release, where the backend has them (the Redis stores).
    pub(crate) fn waker(&self) -> Option<&wake::Waker> {
        match self {
            Backend::Redis(b) => b.waker(),
            Backend::Cluster(b) => Some(b.waker()),
            Backend::Redlock(b) => Some(b.waker()),
            Backend::Memory(_) => None,
        }
    }
}

/// The operator's operations, on whichever store the client was configured with.
impl Backend {
    /// What the store says of `key`'s lock, read-only.
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<RawView, LockError> {
        match self {
            Backend::Redis(b) => b.inspect(key).await,
            Backend::Cluster(b) => b.inspect(key).await,
            Backend::Redlock(b) => b.inspect(key).await,
            Backend::Memory(b) => Ok(b.inspect(key)),
        }
    }

    /// Frees `key`'s lock whatever holds it and wakes its waiters: the evicted holders, and
    /// a fencing token above every token handed out for the key so far.
    pub(crate) async fn force_unlock(
        &self,
        key: &LockKey,
    ) -> Result<(Vec<RawHolder>, u64), LockError> {
        match self {
            Backend::Redis(b) => b.force_unlock(key).await,
            Backend::Cluster(b) => b.force_unlock(key).await,
            Backend::Redlock(b) => b.force_unlock(key).await,
            Backend::Memory(b) => Ok(b.force_unlock(key)),
        }
    }

    /// The keys matching any of the `SCAN … MATCH` `patterns`, deduplicated, at most `limit`
    /// (every primary of a Cluster, the union over Redlock's masters).
    pub(crate) async fn scan(
        &self,
        patterns: &[String],
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        let mut found = Vec::new();
        for pattern in patterns {
            match self {
                Backend::Redis(b) => b.scan(pattern, limit, &mut found).await?,
                Backend::Cluster(b) => b.scan(pattern, limit, &mut found).await?,
                Backend::Redlock(b) => b.scan(pattern, limit, &mut found).await?,
                Backend::Memory(b) => found.extend(b.scan(
                    |key| crate::inspect::glob_matches(pattern.as_bytes(), key.as_bytes()),
                    limit,
                )),
            }
            found.sort_unstable();
            found.dedup();
            if found.len() >= limit {
                break;
            }
        }
        found.truncate(limit);
        Ok(found)
    }
}

/// The failover guard's verdict on one `WAIT`: whether `acknowledged` replicas are enough
/// for the write to count; a shortfall is logged.
pub(crate) fn replicated(
    guard: ReplicaGuard,
    acknowledged: u32,
    operation: &str,
    server: &str,
) -> bool {
    if acknowledged < guard.replicas {
        tracing::warn!(target: crate::LOG_TARGET, server,
            "{operation}: {acknowledged} of {} replicas acknowledged within {:?}; it does not \
             count (failover guard)",
            guard.replicas,
            guard.timeout
        );
    }
    acknowledged >= guard.replicas
}

/// A try's reply under the failover guard: a grant that too few replicas acknowledged is
/// given back (a failover now could hand the lock out again) and reported as held, so the
/// acquire loop tries again within its wait.
pub(crate) async fn count_only_replicated<B: LockBackend>(
    store: &B,
    attempt: &Try<'_>,
    reply: AcquireReply,
    replicated: bool,
) -> Result<AcquireReply, LockError> {
    if replicated || !matches!(reply, AcquireReply::Acquired(_)) {
        return Ok(reply);
    }
    // The grant exists: if giving it back fails, the acquire loop must clean it up.
    store
        .release(attempt.kind.of_grant(), attempt.key, attempt.owner)
        .await
        .map_err(ambiguous)?;
    Ok(AcquireReply::Held(None))
}

/// A renewal's answers under the failover guard: none counts unless enough replicas
/// acknowledged it.
pub(crate) fn count_only_replicated_renewals(
    renewed: Vec<Renewed>,
    replicated: bool,
) -> Result<Vec<Renewed>, LockError> {
    if replicated {
        return Ok(renewed);
    }
    Err(BackendError::new(
        "renew",
        BackendErrorKind::Unreplicated,
        "too few replicas acknowledged the renewal within the failover guard's timeout, so it \
         does not count",
    )
    .into())
}

/// Marks a failed request as one that may have taken effect, so the acquire loop cleans up.
pub(crate) fn ambiguous(err: LockError) -> LockError {
    match err {
        LockError::Backend(e) => LockError::Backend(e.maybe_applied(true)),
        other => other,
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
        assert_eq!(key.writer_waiting, "app:{order:42}:writer-waiting");
        assert_eq!(key.channel, "app:{order:42}:released");
        assert_eq!(key.queue, "app:{order:42}:queue");
        assert_eq!(key.queue_deadlines, "app:{order:42}:queue-deadlines");
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

    #[test]
    fn every_key_of_a_lock_shares_its_slot_whatever_the_name_holds() {
        use ::redis::cluster_routing::Slot;
        for name in [
            "plain", "a{b", "a}b", "}", "}x", "}{x}", "{}", "{a}", "{{", "}}{", "x{}y",
        ] {
            let key = LockKey::new("distlock:", name.to_owned()).unwrap();
            let slot = Slot::for_key(&key.lock);
            for companion in [
                &key.fence,
                &key.writer_waiting,
                &key.channel,
                &key.queue,
                &key.queue_deadlines,
            ] {
                assert_eq!(Slot::for_key(companion), slot, "{name:?}: {companion}");
            }
        }
        let tagged = LockKey::new("p:", "}x".to_owned()).unwrap();
        assert!(
            tagged.lock.starts_with("p:{#") && tagged.lock.ends_with("}}x#"),
            "{}",
            tagged.lock
        );
        // A crafted name of the plain form cannot make the same key.
        let hash = &tagged.lock["p:{".len().."p:{#0123456789abcdef".len()];
        let crafted = LockKey::new("p:", format!("{hash}}}x")).unwrap();
        assert_ne!(crafted.lock, tagged.lock);
    }
}
