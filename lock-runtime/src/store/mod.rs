//! The stores behind the locks: where a kind's operations run and how waiters are woken.
//! [`Store`] is the one contract every store keeps, and the compiler checks: a grant's life
//! for every [kind](crate::kind) (try, give back, renew many at once, and the multi-key
//! pair), the operations on one key's lock that are not a try, the keys matching a pattern,
//! whether the store answers, and what the acquire loop must know of it (its wake-ups, its
//! clock, whether it cuts a try off itself). [`AnyStore`] is the one a
//! [`Config`](crate::Config) chose, dispatching each method once (`dispatch!`). A store owns
//! its connections, the key layout ([`LockKey`]), its wake-ups and how it batches renewals;
//! what a grant means is the kind's.
//!
//! The decision: an operation on a key's lock that is not a try (the operator's view and
//! forced release, an election's leader record) is a value, not a method of every store. It
//! is a [`KeyOperation`] (`key_operation.rs`), written beside its scripts: its script call and
//! how its reply reads, its in-process twin, and how Redlock makes one answer of its masters'.
//! Each store runs any of them the same way ([`Store::run`]: the script on Redis, the twin
//! under the in-process store's mutex, every master on Redlock), as it runs a kind's try. So
//! the next feature like elections adds its operation beside its scripts and changes no
//! store, and a new store (PostgreSQL, etcd) implements this one trait; one method stays
//! overridable, [`Store::force_unlock`], for Redlock, which raises its fencing counters around
//! the forced release (`redlock/fencing.rs`).
//!
//! The stores: [`redis`] (the Redis store, over a [`transport`]: one server through
//! [`connection`] — also the primary found through Sentinel, and each master of Redlock — or a
//! Redis Cluster through [`cluster`]), [`redlock`] (a quorum of independent masters, each a
//! [`redis`] store on one server), [`memory`] (in-process) and, with the `postgres` feature,
//! `postgres` (PostgreSQL, running the kinds' twins under its own statements), with the `etcd`
//! feature `etcd` (the twins between a read and a compare-and-swap transaction, each grant a
//! key on an etcd lease).

pub(crate) mod cluster;
pub(crate) mod connection;
pub(crate) mod endpoint;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
#[cfg(any(feature = "postgres", feature = "etcd"))]
mod every_key;
pub(crate) mod eviction;
pub(crate) mod glob;
mod guarded;
#[cfg(any(feature = "postgres", feature = "etcd"))]
pub(crate) mod key_state;
pub(crate) mod memory;
mod open;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod primaries;
mod probe;
pub(crate) mod pubsub;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod transport;
#[cfg(feature = "postgres")]
mod turns;

use std::future::Future;

use crate::clock::Clock;
use crate::error::LockError;
use crate::key_operation::KeyOperation;
use crate::kind::multi::{MultiReply, MultiTry};
use crate::kind::{Holding, Renewal, Try};
use crate::operator_scripts::{ForceUnlock, RawHolder};
use crate::protocol::{AcquireReply, LockKey, Renewed};
use crate::wake;

/// What every store does. The grant's operations come first (for grants of any kind; `owner`
/// is the grant's random owner token), then the operations on a key's lock that are not a
/// try, then what the acquire loop must know of the store.
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

    /// Runs `operation` on its key's lock: its script on Redis, its twin in process, on every
    /// master of Redlock with one answer made of theirs by the operation's own rule.
    fn run<O: KeyOperation>(
        &self,
        operation: &O,
    ) -> impl Future<Output = Result<O::Output, LockError>> + Send;

    /// Frees `key`'s lock whatever holds it and wakes its waiters: the evicted holders, and
    /// a fencing token above every token handed out for the key so far. By default, the
    /// [`ForceUnlock`] operation; Redlock raises a majority's fencing counters around it.
    fn force_unlock(
        &self,
        key: &LockKey,
    ) -> impl Future<Output = Result<(Vec<RawHolder>, u64), LockError>> + Send {
        async move { self.run(&ForceUnlock(key)).await }
    }

    /// Adds the keys matching the `SCAN … MATCH` `pattern` to `found` (every primary of a
    /// Cluster, the union over Redlock's masters), stopping once it is [full](Found::full).
    fn scan_into(
        &self,
        pattern: &str,
        found: &mut Found,
    ) -> impl Future<Output = Result<(), LockError>> + Send;

    /// The keys matching any of the `SCAN … MATCH` `patterns`, deduplicated, at most `limit`.
    fn scan(
        &self,
        patterns: &[String],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<String>, LockError>> + Send {
        async move {
            let mut found = Found::new(limit);
            for pattern in patterns {
                self.scan_into(pattern, &mut found).await?;
                if found.full() {
                    break;
                }
            }
            Ok(found.into_keys())
        }
    }

    /// Whether the store answers now: the node (or Sentinel's primary), every Cluster primary,
    /// a majority of Redlock masters; the in-process store always does.
    fn ping(&self) -> impl Future<Output = Result<(), LockError>> + Send;

    /// Wake-ups on release, where the store has them (the Redis stores).
    fn waker(&self) -> Option<&wake::ReleaseListener>;

    /// The clock this store's leases keep (`clock.rs`): tokio's for the in-process store,
    /// which users' tests pause, the real one for Redis, which expires keys in real time.
    fn clock(&self) -> Clock;

    /// Whether a one-key try ends at its cut ([`Try::cut`]) in the store itself (or needs no
    /// cut: the in-process store answers at once), so that the acquire loop adds no timer of
    /// its own around it; a try cut off there fails with a
    /// [`BackendErrorKind::Timeout`](crate::error::BackendErrorKind::Timeout) at the cut.
    fn cuts_tries(&self) -> bool;
}

/// The keys a scan found so far, deduplicated, and how many are wanted.
pub(crate) struct Found {
    keys: Vec<String>,
    limit: usize,
}

impl Found {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            keys: Vec::new(),
            limit,
        }
    }

    /// Adds `keys`.
    pub(crate) fn extend(&mut self, keys: impl IntoIterator<Item = String>) {
        self.keys.extend(keys);
    }

    /// Whether `limit` keys (once each) are found: the scan may stop.
    pub(crate) fn full(&mut self) -> bool {
        if self.keys.len() < self.limit {
            return false;
        }
        self.keys.sort_unstable();
        self.keys.dedup();
        self.keys.len() >= self.limit
    }

    /// How many more keys are wanted, at most.
    pub(crate) fn wanted(&self) -> usize {
        self.limit.saturating_sub(self.keys.len())
    }

    /// The keys found, sorted, once each, at most `limit`.
    pub(crate) fn into_keys(mut self) -> Vec<String> {
        self.keys.sort_unstable();
        self.keys.dedup();
        self.keys.truncate(self.limit);
        self.keys
    }
}

/// The store a client was configured with.
pub(crate) enum AnyStore {
    /// One server, or the primary found through Sentinel.
    Redis(Box<redis::NodeStore>),
    Cluster(Box<cluster::ClusterStore>),
    Redlock(Box<redlock::RedlockStore>),
    Memory(memory::MemoryStore),
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(Box<postgres::PostgresStore>),
    /// etcd.
    #[cfg(feature = "etcd")]
    Etcd(Box<etcd::EtcdStore>),
}

/// Runs `$body` with `$store` bound to the store `$any` holds, whichever it is.
macro_rules! dispatch {
    ($any:expr, $store:ident => $body:expr) => {
        match $any {
            AnyStore::Redis($store) => $body,
            AnyStore::Cluster($store) => $body,
            AnyStore::Redlock($store) => $body,
            AnyStore::Memory($store) => $body,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($store) => $body,
            #[cfg(feature = "etcd")]
            AnyStore::Etcd($store) => $body,
        }
    };
}

impl AnyStore {
    /// What the store is, as an error names it to a user.
    #[cfg(feature = "postgres")]
    pub(crate) fn described(&self) -> &'static str {
        match self {
            AnyStore::Redis(_) => "Redis",
            AnyStore::Cluster(_) => "Redis Cluster",
            AnyStore::Redlock(_) => "Redlock",
            AnyStore::Memory(_) => "the in-process store",
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(_) => "PostgreSQL",
            #[cfg(feature = "etcd")]
            AnyStore::Etcd(_) => "etcd",
        }
    }

    /// The PostgreSQL store; `None` for every other store.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(&self) -> Option<&postgres::PostgresStore> {
        match self {
            AnyStore::Postgres(store) => Some(store),
            _ => None,
        }
    }
}

impl Store for AnyStore {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        dispatch!(self, store => store.acquire(attempt).await)
    }

    async fn release(
        &self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
    ) -> Result<bool, LockError> {
        dispatch!(self, store => store.release(holding, key, owner).await)
    }

    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        dispatch!(self, store => store.extend_many(leases).await)
    }

    async fn extend_many_as_answered(
        &self,
        leases: &[Renewal<'_>],
        report: &mut (dyn FnMut(usize, Renewed) + Send),
    ) -> Result<(), LockError> {
        dispatch!(self, store => store.extend_many_as_answered(leases, report).await)
    }

    async fn acquire_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        dispatch!(self, store => store.acquire_all(attempt).await)
    }

    async fn release_all(&self, keys: &[&LockKey], owner: &str) -> Result<bool, LockError> {
        dispatch!(self, store => store.release_all(keys, owner).await)
    }

    async fn run<O: KeyOperation>(&self, operation: &O) -> Result<O::Output, LockError> {
        dispatch!(self, store => store.run(operation).await)
    }

    async fn force_unlock(&self, key: &LockKey) -> Result<(Vec<RawHolder>, u64), LockError> {
        dispatch!(self, store => store.force_unlock(key).await)
    }

    async fn scan_into(&self, pattern: &str, found: &mut Found) -> Result<(), LockError> {
        dispatch!(self, store => store.scan_into(pattern, found).await)
    }

    async fn ping(&self) -> Result<(), LockError> {
        dispatch!(self, store => store.ping().await)
    }

    fn waker(&self) -> Option<&wake::ReleaseListener> {
        dispatch!(self, store => store.waker())
    }

    fn clock(&self) -> Clock {
        dispatch!(self, store => store.clock())
    }

    fn cuts_tries(&self) -> bool {
        dispatch!(self, store => store.cuts_tries())
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
