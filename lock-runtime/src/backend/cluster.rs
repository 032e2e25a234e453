//! Redis Cluster store: runs the kinds' Lua scripts through the `redis` crate's cluster
//! connection, which routes each call by its first key to the primary of the key's slot and
//! follows `MOVED` and `ASK` redirections, failovers and slot migrations. All keys of one lock
//! share a hash tag ([`LockKey`]), so every script touches a single slot; renewals are batched
//! per slot (a script may only touch keys of one slot). Releases announce themselves by sharded
//! pub/sub (`SPUBLISH`), which the waker (`wake.rs`) follows with one subscription per channel.
//! The connection is made on the client's I/O runtime, so it outlives the caller's runtime.

use std::collections::HashMap;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::RedisError;
use tokio::runtime::Handle;

use super::redis::{Failure, NodeOptions};
use super::wake::{Transport, Waker};
use super::{AcquireReply, Announce, Kind, LockBackend, LockKey, Renewal, Try};
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::kind;

pub(crate) struct ClusterBackend {
    client: ClusterClient,
    /// The seed nodes, for logs (never the credentials).
    nodes: String,
    io: Handle,
    /// Made once; it reconnects to nodes by itself. A failed connect is tried again by the
    /// next request.
    connection: tokio::sync::OnceCell<ClusterConnection>,
    waker: Waker,
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
            .map(crate::error::server_address)
            .collect::<Vec<_>>()
            .join(", ");
        Ok(Self {
            waker: Waker::new(
                Transport::Cluster(infos),
                io.clone(),
                options.connect_timeout,
                options.response_timeout,
            ),
            client,
            nodes: described,
            io,
            connection: tokio::sync::OnceCell::new(),
        })
    }

    pub(crate) fn waker(&self) -> &Waker {
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
                        tracing::debug!(nodes = %self.nodes, "connected to Redis Cluster");
                        Ok(connection)
                    }
                    Ok(Err(err)) => Err(BackendError::new("connect", Failure::of(&err).kind, err)),
                    Err(_) => Err(BackendError::new(
                        "connect",
                        BackendErrorKind::Connection,
                        "the client's I/O runtime has shut down",
                    )),
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
            .map_err(|err: RedisError| {
                let failure = Failure::of(&err);
                BackendError::new(operation, failure.kind, err)
                    .maybe_applied(failure.maybe_applied)
                    .into()
            })
    }
}

impl LockBackend for ClusterBackend {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        let reply = self
            .invoke("acquire", attempt.kind.acquire_call(attempt))
            .await?;
        kind::read_acquire_reply(attempt.key, reply)
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

    /// One script call per slot, all slots at once.
    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let mut by_slot: HashMap<Slot, Vec<usize>> = HashMap::new();
        for (i, renewal) in leases.iter().enumerate() {
            by_slot
                .entry(Slot::for_key(&renewal.key.lock))
                .or_default()
                .push(i);
        }
        let batches = by_slot.into_values().map(|indices| async move {
            let batch: Vec<Renewal<'_>> = indices.iter().map(|&i| leases[i]).collect();
            let extended: Vec<i64> = self.invoke("renew", kind::extend_many_call(&batch)).await?;
            if extended.len() != batch.len() {
                return Err(LockError::from(BackendError::new(
                    "renew",
                    BackendErrorKind::Server,
                    format!(
                        "asked to renew {} leases, got {} answers",
                        batch.len(),
                        extended.len()
                    ),
                )));
            }
            Ok((indices, extended))
        });
        let mut answers = vec![false; leases.len()];
        for outcome in futures_util::future::join_all(batches).await {
            let (indices, extended) = outcome?;
            for (i, e) in indices.into_iter().zip(extended) {
                answers[i] = e == 1;
            }
        }
        Ok(answers)
    }
}
