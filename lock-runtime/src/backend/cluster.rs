//! Redis Cluster store: runs the kinds' Lua scripts through the `redis` crate's cluster
//! connection, which routes each call by its first key to the primary of the key's slot and
//! follows `MOVED` and `ASK` redirections, failovers and slot migrations. All keys of one lock
//! share a hash tag ([`LockKey`]), so every script touches a single slot; renewals are batched
//! per slot (a script may only touch keys of one slot). Releases announce themselves by sharded
//! pub/sub (`SPUBLISH`), which the waker (`wake.rs`) follows with one subscription per channel.
//! The connection is made on the client's I/O runtime, so it outlives the caller's runtime.
//!
//! With the failover guard ([`ReplicaGuard`]) a grant or renewal is sent as the pipeline
//! `[EVALSHA …, WAIT n timeout]`: the cluster connection sends a pipeline to the node of its
//! first key, so `WAIT` counts the replicas of the very primary that ran the script (a `WAIT`
//! of its own would go to every primary and say nothing about this write). Pipelines do not
//! load scripts: on `NOSCRIPT` the script is loaded and the pipeline sent once more. A grant
//! too few replicas acknowledged is given back and reported as held, so the acquire loop tries
//! again within its wait; such a renewal is an error (it does not count).

use std::collections::HashMap;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo, Slot};
use redis::{ErrorKind, RedisError, ServerErrorKind};
use tokio::runtime::Handle;

use super::connection::Failure;
use super::redis::NodeOptions;
use super::wake::{ReleaseListener, Transport};
use super::{
    AcquireReply, Announce, Kind, LockBackend, LockKey, MultiReply, MultiTry, Renewal, Renewed, Try,
};
use crate::config::ReplicaGuard;
use crate::error::{BackendError, LockError};
use crate::kind::operator::{self, RawHolder, RawView};
use crate::kind::{self, multi, FirstTry, ScriptReply, Tokens};

pub(crate) struct ClusterBackend {
    client: ClusterClient,
    /// The seed nodes, for logs (never the credentials).
    nodes: String,
    io: Handle,
    /// Made once; it reconnects to nodes by itself. A failed connect is tried again by the
    /// next request.
    connection: tokio::sync::OnceCell<ClusterConnection>,
    /// The failover guard.
    guard: Option<ReplicaGuard>,
    waker: ReleaseListener,
}

impl ClusterBackend {
    pub(crate) fn new(
        nodes: &[redis::Client],
        options: NodeOptions,
        io: Handle,
    ) -> Result<Self, LockError> {
        let infos: Vec<_> = nodes
            .iter()
            .map(|node| node.get_connection_info().clone())
            .collect();
        let client = ClusterClient::builder(infos.clone())
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.response_timeout)
            .build()
            .map_err(|err| {
                LockError::Config(format!("the Redis Cluster node URLs are not usable: {err}"))
            })?;
        let described = nodes
            .iter()
            .map(crate::url::server_address)
            .collect::<Vec<_>>()
            .join(", ");
        Ok(Self {
            waker: ReleaseListener::new(
                Transport::Cluster(infos),
                io.clone(),
                options.connect_timeout,
                options.response_timeout,
            ),
            client,
            guard: options.guard,
            nodes: described,
            io,
            connection: tokio::sync::OnceCell::new(),
        })
    }

    pub(crate) fn waker(&self) -> &ReleaseListener {
        &self.waker
    }

    /// The cluster connection, made on the I/O runtime on first use. It reconnects to nodes
    /// and refreshes the slot map by itself.
    async fn connection(&self) -> Result<ClusterConnection, BackendError> {
        let connection = self
            .connection
            .get_or_try_init(|| async {
                let client = self.client.clone();
                let connected = self
                    .io
                    .spawn(async move { client.get_async_connection().await })
                    .await;
                match connected {
                    Ok(Ok(connection)) => {
                        tracing::debug!(target: crate::LOG_TARGET, nodes = %self.nodes, "connected to Redis Cluster");
                        // Beside the first request, not before it: the check only ever logs.
                        self.io
                            .spawn(super::eviction::check_cluster(connection.clone()));
                        Ok(connection)
                    }
                    Ok(Err(err)) => Err(super::connection::connect_error(err)),
                    Err(err) => Err(crate::io::connect_task_failed(err)),
                }
            })
            .await?;
        Ok(connection.clone())
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        operation: &'static str,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        let mut connection = self.connection().await?;
        invocation
            .invoke_async(&mut connection)
            .await
            .map_err(|err| backend_error(operation, err))
    }

    /// [`invoke`](Self::invoke), then, with the failover guard, `WAIT` on the same node (one
    /// pipeline): the flag says whether enough replicas acknowledged (always `true` without
    /// a guard).
    async fn invoke_replicated<T: redis::FromRedisValue>(
        &self,
        operation: &'static str,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<(T, bool), LockError> {
        let Some(guard) = self.guard else {
            return Ok((self.invoke(operation, invocation).await?, true));
        };
        let mut connection = self.connection().await?;
        let mut pipeline = redis::pipe();
        pipeline
            .invoke_script(&invocation)
            .cmd("WAIT")
            .arg(guard.replicas)
            .arg(kind::millis(guard.timeout));
        let mut loaded = false;
        let (value, acknowledged) = loop {
            match pipeline.query_async::<(T, u32)>(&mut connection).await {
                Ok(reply) => break reply,
                Err(err)
                    if !loaded && err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    // After a `SCRIPT FLUSH`, a restart or a failover to a replica that never
                    // loaded it.
                    invocation
                        .load_async(&mut connection)
                        .await
                        .map_err(|err| backend_error(operation, err))?;
                    loaded = true;
                }
                Err(err) => return Err(backend_error(operation, err)),
            }
        };
        let enough = super::replicated(guard, acknowledged, operation, &self.nodes);
        Ok((value, enough))
    }
}

impl ClusterBackend {
    /// Renews leases whose keys share one slot, in one script call.
    async fn renew_slot(&self, batch: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        let (extended, replicated) = self
            .invoke_replicated("renew", kind::extend_many_call(batch))
            .await?;
        let renewed = kind::read_extend_many_reply(batch.len(), extended)?;
        super::count_only_replicated_renewals(renewed, replicated)
    }
}

/// A failed request as the caller sees it.
fn backend_error(operation: &'static str, err: RedisError) -> LockError {
    let failure = Failure::of(&err);
    BackendError::new(operation, failure.kind, err)
        .maybe_applied(failure.maybe_applied)
        .into()
}

/// The operator's operations (`Client::inspect`, `force_unlock`, `list`) on the cluster. A
/// lock's keys share one slot, so inspecting or freeing it is one script on its shard.
impl ClusterBackend {
    /// What the lock's shard says of `key`'s lock (read-only).
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<RawView, LockError> {
        let call = operator::inspect_call(key, Announce::ShardedPublish, Tokens::Clock);
        operator::read_inspect_reply(key, self.invoke("inspect", call).await?)
    }

    /// Frees `key`'s lock whatever holds it: the evicted holders and a fresh fencing token.
    pub(crate) async fn force_unlock(
        &self,
        key: &LockKey,
    ) -> Result<(Vec<RawHolder>, u64), LockError> {
        let call = operator::force_unlock_call(key, Announce::ShardedPublish, Tokens::Clock);
        Ok(operator::read_force_unlock_reply(
            self.invoke("force unlock", call).await?,
        ))
    }

    /// Adds the keys matching `pattern` on every primary to `found` (`SCAN` on each, never
    /// `KEYS`), stopping once it holds `limit` keys or more.
    pub(crate) async fn scan(
        &self,
        pattern: &str,
        limit: usize,
        found: &mut Vec<String>,
    ) -> Result<(), LockError> {
        let mut connection = self.connection().await?;
        let slots = connection
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .map_err(|err| backend_error("list", err))?;
        for (host, port) in primaries(&slots) {
            let mut cursor = 0u64;
            loop {
                let reply = connection
                    .route_command(
                        redis::cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(pattern)
                            .arg("COUNT")
                            .arg(super::redis::SCAN_COUNT)
                            .clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        }),
                    )
                    .await
                    .map_err(|err| backend_error("list", err))?;
                let (next, keys): (u64, Vec<Vec<u8>>) = redis::from_redis_value(reply)
                    .map_err(|err| backend_error("list", err.into()))?;
                found.extend(keys.into_iter().filter_map(|k| String::from_utf8(k).ok()));
                if found.len() >= limit {
                    return Ok(());
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(())
    }
}

/// The primaries named by a `CLUSTER SLOTS` reply (`[[start, end, [host, port, …], replicas…],
/// …]`), each once.
fn primaries(slots: &redis::Value) -> Vec<(String, u16)> {
    let mut primaries: Vec<(String, u16)> = Vec::new();
    let redis::Value::Array(ranges) = slots else {
        return primaries;
    };
    for range in ranges {
        let redis::Value::Array(range) = range else {
            continue;
        };
        let Some(redis::Value::Array(node)) = range.get(2) else {
            continue;
        };
        let host = match node.first() {
            Some(redis::Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
            Some(redis::Value::SimpleString(host)) => host.clone(),
            _ => continue,
        };
        let Some(Ok(port)) = node.get(1).map(redis::from_redis_value_ref::<u16>) else {
            continue;
        };
        if !primaries.contains(&(host.clone(), port)) {
            primaries.push((host, port));
        }
    }
    primaries
}

impl LockBackend for ClusterBackend {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        // The cluster connection retries by itself (after a lost reply, a MOVED, a failover)
        // and reports only its last error, which may hide a try that ran: every failed try
        // is cleaned up.
        // No transaction on a cluster (`TIME` has no key to route by), and with the guard the
        // try shares a pipeline with `WAIT`: then the script, whatever the try.
        let first = FirstTry::of(attempt, Tokens::Clock, false).filter(|_| self.guard.is_none());
        let (reply, replicated) = match first {
            Some(first) => {
                let mut connection = self
                    .connection()
                    .await
                    .map_err(|err| super::ambiguous(err.into()))?;
                let reply = first
                    .call()
                    .query(&mut connection)
                    .await
                    .map_err(|err| super::ambiguous(backend_error("acquire", err)))?;
                if let Some(refused) = super::redis::refusal_in(&reply) {
                    return Err(backend_error("acquire", refused));
                }
                let (granted, value) = first.read(attempt.owner, &reply)?;
                (ScriptReply::from((granted, value)), true)
            }
            None => self
                .invoke_replicated(
                    "acquire",
                    attempt
                        .kind
                        .acquire_call(attempt, Tokens::Clock, Announce::ShardedPublish),
                )
                .await
                .map_err(super::ambiguous)?,
        };
        let reply = kind::read_acquire_reply(attempt, reply)?;
        super::count_only_replicated(self, attempt, reply, replicated).await
    }

    async fn release(&self, kind: Kind, key: &LockKey, owner: &str) -> Result<bool, LockError> {
        let released: i64 = self
            .invoke(
                "release",
                kind.release_call(key, owner, Announce::ShardedPublish),
            )
            .await?;
        Ok(released == 1)
    }

    /// One script call per slot, all slots at once. A slot whose call fails (its shard is
    /// failing over, say) leaves its leases unknown, not the leases of the other slots.
    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        let mut by_slot: HashMap<Slot, Vec<usize>> = HashMap::new();
        for (i, renewal) in leases.iter().enumerate() {
            by_slot
                .entry(Slot::for_key(&renewal.key.lock))
                .or_default()
                .push(i);
        }
        let batches = by_slot.into_values().map(|indices| async move {
            let batch: Vec<Renewal<'_>> = indices.iter().map(|&i| leases[i]).collect();
            match self.renew_slot(&batch).await {
                Ok(renewed) => Ok((indices, renewed)),
                // A slot half-moved by a migration refuses a call naming keys on both of its
                // nodes (`TRYAGAIN`, until the response timeout); each lock's own key is on
                // one of them, so one call per lock goes through.
                Err(err) if batch.len() > 1 => {
                    let singles = batch
                        .iter()
                        .map(|renewal| self.renew_slot(std::slice::from_ref(renewal)));
                    let renewed: Vec<Renewed> = futures_util::future::join_all(singles)
                        .await
                        .into_iter()
                        .map(|single| match single.as_deref() {
                            Ok([renewed]) => *renewed,
                            _ => Renewed::Unknown,
                        })
                        .collect();
                    if renewed.iter().all(|&r| r == Renewed::Unknown) {
                        return Err(err);
                    }
                    Ok((indices, renewed))
                }
                Err(err) => Err(err),
            }
        });
        let mut answers = vec![Renewed::Unknown; leases.len()];
        let mut failures = Vec::new();
        for outcome in futures_util::future::join_all(batches).await {
            match outcome {
                Ok((indices, renewed)) => {
                    for (i, renewed) in indices.into_iter().zip(renewed) {
                        answers[i] = renewed;
                    }
                }
                Err(err) => failures.push(err),
            }
        }
        // Nothing learnt at all: say why.
        if answers.iter().all(|&a| a == Renewed::Unknown) {
            if let Some(err) = failures.into_iter().next() {
                return Err(err);
            }
        }
        Ok(answers)
    }

    /// The keys of one slot in one script; the slots one after another, in the order of the
    /// try's keys (which keeps a slot's keys together: `crate::multi`). When a later slot's
    /// keys are held, the slots already taken are given back before the answer, so a waiting
    /// request holds nothing. A failed call is reported as one that may have run: the acquire
    /// loop then gives back every key in the background.
    async fn acquire_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        let keys = attempt.keys;
        let mut tokens = Vec::with_capacity(keys.len());
        let mut start = 0;
        while start < keys.len() {
            let slot = Slot::for_key(&keys[start].lock);
            let end = keys[start..]
                .iter()
                .position(|key| Slot::for_key(&key.lock) != slot)
                .map_or(keys.len(), |n| start + n);
            let part = attempt.part(&keys[start..end]);
            let (reply, replicated): (Vec<i64>, bool) = match self
                .invoke_replicated("acquire", multi::acquire_call(&part, Tokens::Clock))
                .await
            {
                Ok(reply) => reply,
                // The earlier slots' grants are given back here; an ambiguous try's clean-up
                // (the acquire loop's) gives back every key.
                Err(err) => {
                    let err = super::ambiguous(err);
                    if start > 0 && !super::is_ambiguous(&err) {
                        let taken: Vec<&LockKey> = keys[..start].iter().collect();
                        if let Err(undo) = self.release_all(&taken, attempt.owner).await {
                            // The request's own error is the answer; the grants given back
                            // here expire with their lease at the latest.
                            tracing::warn!(target: crate::LOG_TARGET, "could not give back the keys of a refused multi-key try: {undo}");
                        }
                    }
                    return Err(err);
                }
            };
            let undo_until = match multi::read_acquire_reply(&part, &reply)
                .map_err(super::ambiguous)?
            {
                MultiReply::Acquired(part_tokens) if replicated => {
                    tokens.extend(part_tokens);
                    start = end;
                    continue;
                }
                // Too few replicas acknowledged: this slot's grant is given back too.
                MultiReply::Acquired(_) => (end, MultiReply::Held(None, start)),
                MultiReply::Held(remaining, at) => (start, MultiReply::Held(remaining, start + at)),
            };
            let (undo, held) = undo_until;
            if undo > 0 {
                let taken: Vec<&LockKey> = keys[..undo].iter().collect();
                self.release_all(&taken, attempt.owner)
                    .await
                    .map_err(super::ambiguous)?;
            }
            return Ok(held);
        }
        Ok(MultiReply::Acquired(tokens))
    }

    /// One script call per slot, all slots at once.
    async fn release_all(&self, keys: &[&LockKey], owner: &str) -> Result<bool, LockError> {
        let mut by_slot: HashMap<Slot, Vec<&LockKey>> = HashMap::new();
        for &key in keys {
            by_slot
                .entry(Slot::for_key(&key.lock))
                .or_default()
                .push(key);
        }
        let calls = by_slot.into_values().map(|slot_keys| async move {
            let released: usize = self
                .invoke(
                    "release",
                    multi::release_call(slot_keys.iter().copied(), owner, Announce::ShardedPublish),
                )
                .await?;
            Ok::<_, LockError>(released == slot_keys.len())
        });
        let mut all = true;
        for outcome in futures_util::future::join_all(calls).await {
            all &= outcome?;
        }
        Ok(all)
    }
}
