//! The Redis Cluster transport of the Redis store (`redis.rs`): calls go through the `redis`
//! crate's cluster connection, which routes each call by its first key to the primary of the
//! key's slot and follows `MOVED` and `ASK` redirections, failovers and slot migrations; a
//! batch (the watchdog's renewals) goes as one pipeline per primary (`primaries.rs`), each
//! primary's answers handed on as they come; releases are heard by `SSUBSCRIBE`
//! (`pubsub.rs`); with the failover guard a script goes as `[EVALSHA …, WAIT n timeout]`.
//! Why each of these is so: `docs/how-it-works.md`, "Redis Cluster: routing, batches and the
//! failover guard". Neighbours: `connection.rs` is the one-server transport, whose reading of
//! failures ([`Failure`]) this one shares.

use std::sync::Arc;

use futures_util::stream::{self, FuturesUnordered, Stream, StreamExt};
use futures_util::FutureExt;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::FromRedisValue;
use tokio::runtime::Handle;

use super::connection::{request_error, Failure};
use super::primaries::{Primaries, Sent, Share};
use super::redis::{NodeOptions, RedisStore};
use super::transport::{replicated, Answered, ScanStep, Transport};
use crate::config::ReplicaGuard;
use crate::error::{BackendError, LockError};
use crate::kind::{self, Tokens};
use crate::protocol::{Announce, Call};
use crate::script::ScriptCall;
use crate::store::pubsub::{Announcer, PubSub};

/// A Redis Cluster, reached through one cluster connection.
pub(crate) struct Cluster {
    client: ClusterClient,
    /// The seed nodes, for logs (never the credentials).
    nodes: String,
    io: Handle,
    /// Made once; it reconnects to nodes by itself. A failed connect is tried again by the
    /// next request.
    connection: Arc<tokio::sync::OnceCell<ClusterConnection>>,
    /// The connect under way: a caller that stops waiting for it (a lock request whose wait
    /// ran out) leaves it to the next, which takes it up instead of starting over.
    under_way: tokio::sync::Mutex<Option<ClusterConnect>>,
    /// The primaries by slot, with connections of this transport's own, for batches.
    primaries: Arc<Primaries>,
}

/// A connect task of the cluster connection.
type ClusterConnect = tokio::task::JoinHandle<redis::RedisResult<ClusterConnection>>;

/// The store on a Redis Cluster.
pub(crate) type ClusterStore = RedisStore<Cluster>;

impl ClusterStore {
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
        let seed = infos.first().cloned().ok_or_else(|| {
            LockError::Config("a Redis Cluster needs at least one node URL".to_owned())
        })?;
        let waker = PubSub::listener(
            vec![Announcer::Cluster(infos)],
            io.clone(),
            options.connect_timeout,
            options.response_timeout,
        );
        let cluster = Cluster {
            client,
            nodes: described,
            primaries: Primaries::new(
                seed,
                options.connect_timeout,
                options.response_timeout,
                io.clone(),
            ),
            io,
            connection: Arc::default(),
            under_way: tokio::sync::Mutex::new(None),
        };
        Ok(Self::over(
            cluster,
            options.guard,
            Tokens::Clock,
            Some(waker),
        ))
    }
}

impl Cluster {
    /// The cluster connection, made on the I/O runtime on first use. It reconnects to nodes
    /// and refreshes the slot map by itself.
    async fn connection(&self) -> Result<ClusterConnection, BackendError> {
        let connection = self
            .connection
            .get_or_try_init(|| async {
                let mut under_way = self.under_way.lock().await;
                // A connect left finished is taken up only if it connected: a failure is
                // older than this caller's question, which starts over.
                let left = match under_way.take() {
                    Some(connect) if connect.is_finished() => connect
                        .now_or_never()
                        .filter(|connected| matches!(connected, Ok(Ok(_)))),
                    other => {
                        *under_way = other;
                        None
                    }
                };
                let connected = match left {
                    Some(connected) => connected,
                    None => {
                        let connect = under_way.get_or_insert_with(|| {
                            let client = self.client.clone();
                            self.io
                                .spawn(async move { client.get_async_connection().await })
                        });
                        // Awaited in place: a caller dropped meanwhile leaves it to the next.
                        let connected = connect.await;
                        *under_way = None;
                        connected
                    }
                };
                set_up(connected, &self.nodes, &self.io, &self.primaries)
            })
            .await?;
        Ok(connection.clone())
    }

    /// Makes the cluster connection in the background if it is not made yet, for a batch that
    /// goes per primary without it (the map is read once it is made, if it is out of date).
    /// Making it connects to every node and waits out the connect timeout on a frozen one:
    /// no batch waits for that while it has a map to go by.
    fn connect_in_background(&self) {
        if self.connection.initialized() {
            return;
        }
        let (cell, client, nodes, io, primaries) = (
            self.connection.clone(),
            self.client.clone(),
            self.nodes.clone(),
            self.io.clone(),
            self.primaries.clone(),
        );
        self.io.spawn(async move {
            // A failed connect is tried again by the next request that needs it.
            let _ = cell
                .get_or_try_init(|| connect(client, nodes, io, primaries))
                .await;
        });
    }
}

/// Makes a cluster connection on the I/O runtime `io`; then checks the nodes' eviction policy
/// in the background and reads the slot map for batches.
async fn connect(
    client: ClusterClient,
    nodes: String,
    io: Handle,
    primaries: Arc<Primaries>,
) -> Result<ClusterConnection, BackendError> {
    let connected = io
        .spawn(async move { client.get_async_connection().await })
        .await;
    set_up(connected, &nodes, &io, &primaries)
}

/// What a finished connect task gives: the connection, whose nodes' eviction policy is then
/// checked in the background and whose slot map is read for batches, or the connect's error.
fn set_up(
    connected: Result<redis::RedisResult<ClusterConnection>, tokio::task::JoinError>,
    nodes: &str,
    io: &Handle,
    primaries: &Arc<Primaries>,
) -> Result<ClusterConnection, BackendError> {
    match connected {
        Ok(Ok(connection)) => {
            tracing::debug!(target: crate::telemetry::LOG_TARGET, nodes = %nodes, "connected to Redis Cluster");
            // Beside the first request, not before it: the check only ever logs.
            io.spawn(super::eviction::check_cluster(connection.clone()));
            // The map for batches, read before the first one is due.
            primaries.refresh(&connection);
            Ok(connection)
        }
        Ok(Err(err)) => Err(super::connection::connect_error(err)),
        Err(err) => Err(crate::io::connect_task_failed(err)),
    }
}

impl Cluster {
    /// Answers every call of one [`Share`] of the batch `calls`: by its primary's pipeline,
    /// and those it did not answer for (or all, for a share without a primary) sent alone.
    async fn answer_share<R: FromRedisValue + Send>(
        &self,
        operation: &'static str,
        calls: &[ScriptCall],
        guard: Option<ReplicaGuard>,
        share: Share,
    ) -> Vec<Answered<R>> {
        let answers: Vec<Sent<R>> = self.primaries.send(&share, operation, calls, guard).await;
        let alone: Vec<usize> = share
            .indices
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_none())
            .map(|(&i, _)| i)
            .collect();
        if !alone.is_empty() {
            tracing::trace!(target: crate::telemetry::LOG_TARGET, nodes = %self.nodes, alone = alone.len(), "{operation}: {} calls sent alone", alone.len());
        }
        let replies = futures_util::future::join_all(
            alone
                .iter()
                .map(|&i| self.call(operation, Call::Script(&calls[i]), guard, |_: &R| true)),
        )
        .await;
        let mut replies = replies.into_iter();
        share
            .indices
            .into_iter()
            .zip(answers)
            .map(|(i, answer)| {
                let answer = match answer {
                    Some(answer) => answer,
                    None => replies.next().unwrap_or_else(|| {
                        Err(BackendError::new(
                            operation,
                            crate::error::BackendErrorKind::Server,
                            "a call of the batch was not sent",
                        )
                        .into())
                    }),
                };
                (i, answer)
            })
            .collect()
    }
}

impl Transport for Cluster {
    const ANNOUNCE: Announce = Announce::ShardedPublish;
    const ROUTES_BY_SLOT: bool = true;
    // The cluster connection retries by itself (after a lost reply, a MOVED, a failover)
    // and reports only its last error.
    const RETRIES_UNSEEN: bool = true;
    // A lone `WAIT` goes to every primary.
    const WAITS_AFTER_ANY_REQUEST: bool = false;

    /// A primary, by host and port.
    type Shard = (String, u16);

    /// A cluster connection of its own, made on first use, and connections of its own to the
    /// primaries, by this transport's slot map ([`Primaries::sibling`]): its batches go out at
    /// once, without waiting for its cluster connection.
    fn sibling(&self) -> Self {
        Self {
            client: self.client.clone(),
            nodes: self.nodes.clone(),
            io: self.io.clone(),
            connection: Arc::default(),
            under_way: tokio::sync::Mutex::new(None),
            primaries: self.primaries.sibling(),
        }
    }

    /// Never: `TIME` has no key to route by.
    async fn transactions(&self) -> Result<bool, LockError> {
        Ok(false)
    }

    /// Sends `call`; with the failover guard, a script and `WAIT` in one pipeline, whatever
    /// the reply (`needs_wait` is not asked). A request that is not a script is sent without
    /// `WAIT` (the store sends none under the guard): it counts as unacknowledged then.
    async fn call<R: FromRedisValue + Send>(
        &self,
        operation: &'static str,
        call: Call<'_>,
        guard: Option<ReplicaGuard>,
        _needs_wait: impl Fn(&R) -> bool + Send,
    ) -> Result<(R, bool), LockError> {
        let mut connection = self.connection().await?;
        let (Some(guard), Call::Script(invocation)) = (guard, call) else {
            let reply = call
                .query(&mut connection)
                .await
                .map_err(|err| request_error(operation, err))?;
            return Ok((reply, guard.is_none()));
        };
        let guarded = |script: redis::Cmd| {
            let mut pipeline = redis::pipe();
            pipeline
                .add_command(script)
                .cmd("WAIT")
                .arg(guard.replicas)
                .arg(kind::millis(guard.wait_timeout()));
            pipeline
        };
        let (value, acknowledged) = match guarded(invocation.by_hash())
            .query_async::<(R, u32)>(&mut connection)
            .await
        {
            Ok(reply) => reply,
            // After a `SCRIPT FLUSH`, a restart or a failover to a replica that never ran it:
            // sent with its source, to the same node (`script.rs`).
            Err(err) if crate::script::is_noscript(&err) => guarded(invocation.with_source())
                .query_async::<(R, u32)>(&mut connection)
                .await
                .map_err(|err| request_error(operation, err))?,
            Err(err) => return Err(request_error(operation, err)),
        };
        let enough = replicated(guard, acknowledged, operation, &self.nodes);
        Ok((value, enough))
    }

    /// One pipeline per primary, all at once ([`Primaries::send`]), even for a batch of one (a
    /// `TRYAGAIN` then comes back as it is, rather than being retried until the response
    /// timeout); a call its primary did not answer for is sent alone, as
    /// [`call`](Self::call) sends it. Each primary's answers come as that primary gives them
    /// (its calls sent alone answered too), whatever the others do: a frozen primary, or one
    /// whose `WAIT` waits for a lagging replica, holds up only its own calls.
    fn call_each<'a, R: FromRedisValue + Send + 'a>(
        &'a self,
        operation: &'static str,
        calls: &'a [ScriptCall],
        guard: Option<ReplicaGuard>,
    ) -> impl Stream<Item = Answered<R>> + Send + 'a {
        stream::once(async move {
            // The cluster connection is waited for only when there is no map to go by: a new
            // sibling (the failover guard's) has its parent's map, and connects to the
            // primaries alone, not to a frozen replica, before its first batch.
            let shares = if calls.is_empty() {
                Vec::new()
            } else if let Some(connection) = self.connection.get() {
                self.primaries.refresh(connection);
                self.primaries.shares(calls)
            } else if self.primaries.has_map() {
                self.connect_in_background();
                self.primaries.shares(calls)
            } else if let Ok(connection) = self.connection().await {
                self.primaries.refresh(&connection);
                self.primaries.shares(calls)
            } else {
                vec![Share::alone((0..calls.len()).collect())]
            };
            shares
                .into_iter()
                .map(|share| self.answer_share(operation, calls, guard, share))
                .collect::<FuturesUnordered<_>>()
        })
        .flatten()
        .flat_map(stream::iter)
    }

    /// The primaries `CLUSTER SLOTS` names.
    async fn shards(&self) -> Result<Vec<(String, u16)>, LockError> {
        let mut connection = self.connection().await?;
        let slots = connection
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .map_err(|err| request_error("list", err))?;
        Ok(primaries(&slots))
    }

    async fn ping(&self) -> Result<(), LockError> {
        let mut connection = self.connection().await?;
        let primaries = self.shards().await?;
        for (host, port) in primaries {
            let routed = connection
                .route_command(
                    redis::cmd("PING"),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port,
                    }),
                )
                .await;
            // A command routed by address comes back with the server's error reply as a value
            // (a `PING` the ACL refuses, say), not as an error.
            let routed = routed.and_then(redis::Value::extract_error);
            if let Err(err) = routed {
                let kind = Failure::of(&err).kind;
                return Err(BackendError::new(
                    "ping",
                    kind,
                    format!("Cluster primary {host}:{port}: {err}"),
                )
                .refused_by(&err)
                .into());
            }
        }
        Ok(())
    }

    async fn scan_step(
        &self,
        (host, port): &(String, u16),
        step: &redis::Cmd,
    ) -> Result<ScanStep, LockError> {
        let mut connection = self.connection().await?;
        let reply = connection
            .route_command(
                step.clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                }),
            )
            .await
            .map_err(|err| request_error("list", err))?;
        redis::from_redis_value(reply).map_err(|err| request_error("list", err.into()))
    }
}

/// The primaries named by a `CLUSTER SLOTS` reply, each once.
fn primaries(slots: &redis::Value) -> Vec<(String, u16)> {
    let mut primaries: Vec<(String, u16)> = Vec::new();
    for (_, _, primary) in super::primaries::slot_ranges(slots) {
        if !primaries.contains(&primary) {
            primaries.push(primary);
        }
    }
    primaries
}
