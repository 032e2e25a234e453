//! The stores behind the locks (a store is a store): where a kind's operations run and how
//! waiters are woken. [`Store`] is the contract every store keeps for every
//! [kind](crate::kind) — try a grant, give it back, renew many grants at once; [`AnyStore`]
//! dispatches to the one a [`Config`](crate::Config) chose. A store owns its connections, the
//! key layout ([`LockKey`]), its wake-ups and how it batches renewals; what a grant means is
//! the kind's. The acquire loop, the watchdog and the release path only talk to this module.
//!
//! The stores: [`redis`] (the Redis store, over a [`transport`]: one server through
//! [`connection`] — also the primary found through Sentinel, and each master of Redlock — or a
//! Redis Cluster through [`cluster`]), [`redlock`] (a quorum of independent masters, each a
//! [`redis`] store on one server) and [`memory`] (in-process).

pub(crate) mod cluster;
pub(crate) mod connection;
pub(crate) mod endpoint;
pub(crate) mod eviction;
mod guarded;
pub(crate) mod memory;
mod open;
pub(crate) mod primaries;
mod probe;
pub(crate) mod pubsub;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod transport;

use std::future::Future;

use crate::clock::Clock;
use crate::error::LockError;
use crate::kind::multi::{MultiReply, MultiTry};
use crate::kind::{Holding, Renewal, Try};
use crate::operator_scripts::{RawHolder, RawView};
use crate::protocol::{AcquireReply, LockKey, RawRecord, Renewed};
use crate::wake;

/// One store's three atomic operations, for grants of any kind. `owner` is the grant's random
/// owner token.
pub(crate) trait Store: Send + Sync {
    /// One try: takes the grant the try asks for if the kind allows it now, with its token.
    fn acquire(
        &self,
        attempt: &Try<'_>,
    ) -> impl Future<Output = Result<AcquireReply, LockError>> + Send;

    /// Gives back what `owner` holds at `key` (a grant of a kind, or a fair seat) if it still
    /// holds it; `false` when the grant was no longer ours.
    fn release(
        &self,
        holding: Holding,
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

    /// Renews as [`extend_many`](Self::extend_many) does, handing each grant's outcome to
    /// `report` (its index in `leases`, what became of it) as soon as the store learns it,
    /// once for each grant: a server that answers late delays only the outcomes of the grants
    /// it holds, not those another server answered. An error says nothing was learnt of any
    /// (each was reported unknown). By default, every outcome once all are known.
    fn extend_many_as_answered(
        &self,
        leases: &[Renewal<'_>],
        report: &mut (dyn FnMut(usize, Renewed) + Send),
    ) -> impl Future<Output = Result<(), LockError>> + Send {
        async move {
            let renewed = self.extend_many(leases).await;
            let known = renewed.as_deref().unwrap_or_default();
            for i in 0..leases.len() {
                report(i, known.get(i).copied().unwrap_or(Renewed::Unknown));
            }
            renewed.map(drop)
        }
    }

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

/// The store a client was configured with.
pub(crate) enum AnyStore {
    /// One server, or the primary found through Sentinel.
    Redis(Box<redis::NodeStore>),
    Cluster(Box<cluster::ClusterStore>),
    Redlock(Box<redlock::RedlockStore>),
    Memory(memory::MemoryStore),
}

impl AnyStore {
    /// Whether a one-key try ends at its cut ([`Try::cut`]) in the store itself (or needs no
    /// cut: the in-process store answers at once), so that the acquire loop adds no timer of
    /// its own around it; a try cut off there fails with a
    /// [`BackendErrorKind::Timeout`](crate::error::BackendErrorKind::Timeout) at the cut.
    pub(crate) fn cuts_tries(&self) -> bool {
        match self {
            AnyStore::Redis(b) => b.cuts_tries(),
            AnyStore::Memory(_) => true,
            AnyStore::Cluster(_) | AnyStore::Redlock(_) => false,
        }
    }
}

impl Store for AnyStore {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        match self {
            AnyStore::Redis(b) => b.acquire(attempt).await,
            AnyStore::Cluster(b) => b.acquire(attempt).await,
            AnyStore::Redlock(b) => b.acquire(attempt).await,
            AnyStore::Memory(b) => b.acquire(attempt).await,
        }
    }

    async fn release(
        &self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
    ) -> Result<bool, LockError> {
        match self {
            AnyStore::Redis(b) => b.release(holding, key, owner).await,
            AnyStore::Cluster(b) => b.release(holding, key, owner).await,
            AnyStore::Redlock(b) => b.release(holding, key, owner).await,
            AnyStore::Memory(b) => b.release(holding, key, owner).await,
        }
    }

    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        match self {
            AnyStore::Redis(b) => b.extend_many(leases).await,
            AnyStore::Cluster(b) => b.extend_many(leases).await,
            AnyStore::Redlock(b) => b.extend_many(leases).await,
            AnyStore::Memory(b) => b.extend_many(leases).await,
        }
    }

    async fn extend_many_as_answered(
        &self,
        leases: &[Renewal<'_>],
        report: &mut (dyn FnMut(usize, Renewed) + Send),
    ) -> Result<(), LockError> {
        match self {
            AnyStore::Redis(b) => b.extend_many_as_answered(leases, report).await,
            AnyStore::Cluster(b) => b.extend_many_as_answered(leases, report).await,
            AnyStore::Redlock(b) => b.extend_many_as_answered(leases, report).await,
            AnyStore::Memory(b) => b.extend_many_as_answered(leases, report).await,
        }
    }

    async fn acquire_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        match self {
            AnyStore::Redis(b) => b.acquire_all(attempt).await,
            AnyStore::Cluster(b) => b.acquire_all(attempt).await,
            AnyStore::Redlock(b) => b.acquire_all(attempt).await,
            AnyStore::Memory(b) => b.acquire_all(attempt).await,
        }
    }

    async fn release_all(&self, keys: &[&LockKey], owner: &str) -> Result<bool, LockError> {
        match self {
            AnyStore::Redis(b) => b.release_all(keys, owner).await,
            AnyStore::Cluster(b) => b.release_all(keys, owner).await,
            AnyStore::Redlock(b) => b.release_all(keys, owner).await,
            AnyStore::Memory(b) => b.release_all(keys, owner).await,
        }
    }
}

impl AnyStore {
    /// The clock this store's leases keep (`clock.rs`): tokio's for the in-process store,
    /// which users' tests pause, the real one for Redis, which expires keys in real time.
    pub(crate) fn clock(&self) -> Clock {
        match self {
            AnyStore::Memory(_) => Clock::Tokio,
            AnyStore::Redis(_) | AnyStore::Cluster(_) | AnyStore::Redlock(_) => Clock::Real,
        }
    }
}

impl AnyStore {
    /// Wake-ups on release, where the store has them (the Redis stores).
    pub(crate) fn waker(&self) -> Option<&wake::ReleaseListener> {
        match self {
            AnyStore::Redis(b) => b.waker(),
            AnyStore::Cluster(b) => b.waker(),
            AnyStore::Redlock(b) => Some(b.waker()),
            AnyStore::Memory(_) => None,
        }
    }
}

/// The operator's operations, on whichever store the client was configured with.
impl AnyStore {
    /// Whether the store answers now: the node (or Sentinel's primary), every Cluster primary,
    /// a majority of Redlock masters; the in-process store always does.
    pub(crate) async fn ping(&self) -> Result<(), LockError> {
        match self {
            AnyStore::Redis(b) => b.ping().await,
            AnyStore::Cluster(b) => b.ping().await,
            AnyStore::Redlock(b) => b.ping().await,
            AnyStore::Memory(_) => Ok(()),
        }
    }

    /// What the store says of `key`'s lock, read-only.
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<RawView, LockError> {
        match self {
            AnyStore::Redis(b) => b.inspect(key).await,
            AnyStore::Cluster(b) => b.inspect(key).await,
            AnyStore::Redlock(b) => b.inspect(key).await,
            AnyStore::Memory(b) => Ok(b.inspect(key)),
        }
    }

    /// Frees `key`'s lock whatever holds it and wakes its waiters: the evicted holders, and
    /// a fencing token above every token handed out for the key so far.
    pub(crate) async fn force_unlock(
        &self,
        key: &LockKey,
    ) -> Result<(Vec<RawHolder>, u64), LockError> {
        match self {
            AnyStore::Redis(b) => b.force_unlock(key).await,
            AnyStore::Cluster(b) => b.force_unlock(key).await,
            AnyStore::Redlock(b) => b.force_unlock(key).await,
            AnyStore::Memory(b) => Ok(b.force_unlock(key)),
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
                AnyStore::Redis(b) => b.scan(pattern, limit, &mut found).await?,
                AnyStore::Cluster(b) => b.scan(pattern, limit, &mut found).await?,
                AnyStore::Redlock(b) => b.scan(pattern, limit, &mut found).await?,
                AnyStore::Memory(b) => found.extend(b.scan(
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

/// An election's leader record (`election_scripts.rs`), on whichever store.
impl AnyStore {
    /// Writes `record` beside `key`'s lock and announces it, if the record's owner holds the
    /// lock: `false` when it does not (any more). On Redlock, on a majority.
    pub(crate) async fn proclaim(
        &self,
        key: &LockKey,
        record: &RawRecord,
    ) -> Result<bool, LockError> {
        match self {
            AnyStore::Redis(b) => b.proclaim(key, record).await,
            AnyStore::Cluster(b) => b.proclaim(key, record).await,
            AnyStore::Redlock(b) => b.proclaim(key, record).await,
            AnyStore::Memory(b) => Ok(b.proclaim(key, record)),
        }
    }

    /// Deletes `key`'s record if `owner` wrote it.
    pub(crate) async fn withdraw(&self, key: &LockKey, owner: &str) -> Result<bool, LockError> {
        match self {
            AnyStore::Redis(b) => b.withdraw(key, owner).await,
            AnyStore::Cluster(b) => b.withdraw(key, owner).await,
            AnyStore::Redlock(b) => b.withdraw(key, owner).await,
            AnyStore::Memory(b) => Ok(b.withdraw(key, owner)),
        }
    }
}

/// Marks a failed request as one that may have taken effect, so the acquire loop cleans up —
/// unless it failed to connect: a request that got no connection was never sent (a refused
/// connect reported `maybe_applied: true` before, on a Cluster).
pub(crate) fn ambiguous(err: LockError) -> LockError {
    match err {
        LockError::Backend(e) if !e.is_connect_failure() => {
            LockError::Backend(e.maybe_applied(true))
        }
        other => other,
    }
}

/// Whether a failed request may nevertheless have taken effect on the server (it was sent and
/// timed out, or the connection broke after sending — also when a retry then failed to
/// connect), so that a grant may exist that nobody knows about.
pub(crate) fn is_ambiguous(err: &LockError) -> bool {
    matches!(err, LockError::Backend(e) if e.may_have_applied())
}
