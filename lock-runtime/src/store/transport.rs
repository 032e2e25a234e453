//! How the Redis store's requests reach Redis: the seam between the one implementation of the
//! store contract (`redis.rs`, which sends what the kinds build and reads their replies) and
//! the two ways of reaching a deployment — one server over one multiplexed connection
//! (`connection.rs`: a fixed server, Sentinel's primary, each Redlock master) and a Redis
//! Cluster over the `redis` crate's cluster connection (`cluster.rs`). Both take the same
//! [`Call`]s, since the crate gives both connections one `ConnectionLike` trait; what differs
//! is what a [`Transport`] says: whether a transaction may be sent, how the failover guard's
//! `WAIT` rides along, whether calls are split per hash slot and how a batch of them is sent
//! ([`Transport::call_each`]), how releases are announced, and what a failed request may hide.

use std::future::Future;

use futures_util::stream::{FuturesUnordered, Stream};
use redis::FromRedisValue;

use crate::config::ReplicaGuard;
use crate::error::LockError;
use crate::protocol::{Announce, Call};
use crate::script::ScriptCall;

/// One `SCAN` step's reply: the next cursor (0: done) and the keys found by this step.
pub(crate) type ScanStep = (u64, Vec<Vec<u8>>);

/// One call's answer in a batch ([`Transport::call_each`]): the call's index in the batch, and
/// what [`Transport::call`] would have answered for it.
pub(crate) type Answered<R> = (usize, Result<(R, bool), LockError>);

/// How the Redis store reaches its servers.
pub(crate) trait Transport: Send + Sync {
    /// How the release scripts wake waiters: `PUBLISH` on one server, `SPUBLISH` on a Cluster
    /// (the channel lives on the lock's own shard).
    const ANNOUNCE: Announce;

    /// A call may name keys of one hash slot only (a Cluster routes it by its first key), so
    /// the store splits a batch of keys per slot.
    const ROUTES_BY_SLOT: bool;

    /// The transport sends a failed request again by itself (after a lost reply, a `MOVED`,
    /// a failover) and reports only its last error, which may hide a request that ran: every
    /// failed try may have taken a grant.
    const RETRIES_UNSEEN: bool;

    /// `WAIT` can follow any request (on the connection that sent it). Otherwise it rides only
    /// behind a script, in one pipeline, and a try that is not a script (`FirstTry`) is not
    /// sent under the failover guard.
    const WAITS_AFTER_ANY_REQUEST: bool;

    /// A server that `SCAN` walks: the node itself, or each primary of a Cluster.
    type Shard: Send + Sync;

    /// Another transport to the same servers with connections of its own, for the failover
    /// guard's writes (`guarded.rs`): its `WAIT` then holds up nothing else.
    fn sibling(&self) -> Self
    where
        Self: Sized;

    /// Whether [`call_by`](Self::call_by) and [`transactions_by`](Self::transactions_by) end
    /// at their `cut` themselves; otherwise the acquire loop cuts a try off from outside.
    const CUTS_AT_CUT: bool = false;

    /// Whether a try may be a transaction (`MULTI` … `EXEC`) now; it may connect to find out.
    fn transactions(&self) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// As [`transactions`](Self::transactions), given up at `cut` with a
    /// [`BackendErrorKind::Timeout`](crate::error::BackendErrorKind::Timeout) where the
    /// transport [cuts](Self::CUTS_AT_CUT) (by default, it does not).
    fn transactions_by(
        &self,
        cut: Option<std::time::Instant>,
    ) -> impl Future<Output = Result<bool, LockError>> + Send {
        let _ = cut;
        self.transactions()
    }

    /// Sends `call`; with a failover `guard` (and, where the transport waits only when asked,
    /// a reply that `needs_wait`: a grant, not a refusal), also `WAIT` on the node that ran it.
    /// The flag says whether enough replicas acknowledged (always `true` without a guard).
    fn call<R: FromRedisValue + Send>(
        &self,
        operation: &'static str,
        call: Call<'_>,
        guard: Option<ReplicaGuard>,
        needs_wait: impl Fn(&R) -> bool + Send,
    ) -> impl Future<Output = Result<(R, bool), LockError>> + Send;

    /// As [`call`](Self::call) without a guard, given up at `cut` (its connect, its request
    /// and any repetition of it) with a
    /// [`BackendErrorKind::Timeout`](crate::error::BackendErrorKind::Timeout) that may have
    /// taken effect, where the transport [cuts](Self::CUTS_AT_CUT) (by default, it does not).
    fn call_by<R: FromRedisValue + Send>(
        &self,
        operation: &'static str,
        call: Call<'_>,
        cut: Option<std::time::Instant>,
        needs_wait: impl Fn(&R) -> bool + Send,
    ) -> impl Future<Output = Result<(R, bool), LockError>> + Send {
        let _ = cut;
        self.call(operation, call, None, needs_wait)
    }

    /// Sends independent script `calls`, each naming keys of one hash slot, in as few requests
    /// as the transport can, and yields each call's answer as it comes: `(i, answer)`, where
    /// `answer` is what [`call`](Self::call) would have answered for `calls[i]` (always with a
    /// `WAIT` under a `guard`), once for each call. A server that answers late delays only its
    /// own calls' answers. By default each call is its own request, all at once; a Cluster
    /// sends one pipeline per primary, and each primary's answers come as that primary gives
    /// them.
    fn call_each<'a, R: FromRedisValue + Send + 'a>(
        &'a self,
        operation: &'static str,
        calls: &'a [ScriptCall],
        guard: Option<ReplicaGuard>,
    ) -> impl Stream<Item = Answered<R>> + Send + 'a {
        calls
            .iter()
            .enumerate()
            .map(move |(i, call)| async move {
                let answer = self
                    .call(operation, Call::Script(call), guard, |_: &R| true)
                    .await;
                (i, answer)
            })
            .collect::<FuturesUnordered<_>>()
    }

    /// Whether the servers that take the locks' writes answer a `PING` now (the node; every
    /// primary of a Cluster), connecting where needed; the error names the server that did
    /// not and why.
    fn ping(&self) -> impl Future<Output = Result<(), LockError>> + Send;

    /// The servers that `SCAN` must walk to see every key.
    fn shards(&self) -> impl Future<Output = Result<Vec<Self::Shard>, LockError>> + Send;

    /// One `SCAN` step on `shard`.
    fn scan_step(
        &self,
        shard: &Self::Shard,
        step: &redis::Cmd,
    ) -> impl Future<Output = Result<ScanStep, LockError>> + Send;
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
        tracing::warn!(target: crate::telemetry::LOG_TARGET, server,
            "{operation}: {acknowledged} of {} replicas acknowledged within {:?}; it does not \
             count (failover guard)",
            guard.replicas,
            guard.timeout
        );
    }
    acknowledged >= guard.replicas
}
