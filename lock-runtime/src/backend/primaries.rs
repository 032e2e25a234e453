//! A Redis Cluster's primaries by hash slot, each with a connection of its own, for the
//! requests the Cluster transport (`cluster.rs`) sends one per primary
//! ([`Transport::call_each`](super::transport::Transport::call_each)): a batch of script calls,
//! each naming keys of one slot, goes to each primary as one pipeline. The `redis` crate's
//! cluster connection cannot carry such a pipeline: when any reply in a pipeline asks for
//! action (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`…) it sends the whole pipeline again, to the
//! node that one reply named, where every other slot's call then misses. So the pipelines go
//! over connections of their own, one [`Node`] per primary (reconnecting as one server's
//! store does, `connection.rs`), and every reply is read on its own: a call whose slot answers
//! that it lives elsewhere or lacks the script is handed back to be sent alone through the
//! cluster connection, which follows redirections, failovers and migrations and sends a
//! missing script's source.
//!
//! The map comes from `CLUSTER SLOTS` (through the cluster connection), read when the
//! transport connects and again, in the background, once a reply showed it out of date (a
//! redirection, `CLUSTERDOWN`, `READONLY`, a primary that failed or that the map lacks): a
//! batch never waits for it, and a stale map costs only the calls it misroutes, which go
//! alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo, Slot};
use redis::{ConnectionAddr, ConnectionInfo, FromRedisValue, RedisError, Value};
use tokio::runtime::Handle;

use super::connection::{request_error, Node};
use super::endpoint::Endpoint;
use super::transport::{replicated, Transport};
use crate::config::ReplicaGuard;
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::kind;
use crate::protocol::Call;
use crate::script::ScriptCall;

/// What became of one call of a batch sent to its primary: its reply (or the error it
/// answered), or `None` when it is to be sent alone through the cluster connection.
pub(crate) type Sent<R> = Option<Result<(R, bool), LockError>>;

/// The primaries of one Cluster transport, by slot.
pub(crate) struct Primaries {
    /// How to connect to a node (credentials, TLS), taken from the first seed node.
    seed: ConnectionInfo,
    connect_timeout: Duration,
    response_timeout: Duration,
    io: Handle,
    map: Mutex<Option<Arc<SlotMap>>>,
    /// A reply showed the map out of date: it is read again.
    stale: AtomicBool,
    /// A read of the map is under way.
    reading: AtomicBool,
}

/// Which primary serves each slot, as `CLUSTER SLOTS` said.
struct SlotMap {
    /// Slot → index into `primaries`.
    by_slot: HashMap<Slot, u16>,
    primaries: Vec<Arc<Primary>>,
}

/// One primary and the connection to it.
struct Primary {
    /// `host:port`, for logs.
    address: String,
    host: String,
    port: u16,
    node: Node,
}

impl Primaries {
    pub(crate) fn new(
        seed: ConnectionInfo,
        connect_timeout: Duration,
        response_timeout: Duration,
        io: Handle,
    ) -> Arc<Self> {
        Arc::new(Self {
            seed,
            connect_timeout,
            response_timeout,
            io,
            map: Mutex::new(None),
            stale: AtomicBool::new(true),
            reading: AtomicBool::new(false),
        })
    }

    /// Another set for the same cluster, with connections of its own (the failover guard's
    /// transports: `guarded.rs`).
    pub(crate) fn sibling(&self) -> Arc<Self> {
        Self::new(
            self.seed.clone(),
            self.connect_timeout,
            self.response_timeout,
            self.io.clone(),
        )
    }

    fn map(&self) -> Option<Arc<SlotMap>> {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The map is out of date: the next batch starts reading it again.
    fn out_of_date(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }

    /// Reads the map again in the background over `connection`, if it is out of date and no
    /// read is under way.
    pub(crate) fn refresh(self: &Arc<Self>, connection: &ClusterConnection) {
        if !self.stale.load(Ordering::Relaxed) || self.reading.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stale.store(false, Ordering::Relaxed);
        let (primaries, mut connection) = (self.clone(), connection.clone());
        self.io.spawn(async move {
            let slots = connection
                .route_command(
                    redis::cmd("CLUSTER").arg("SLOTS").clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                )
                .await;
            match slots {
                Ok(slots) => primaries.install(&slots),
                Err(err) => {
                    tracing::debug!(target: crate::LOG_TARGET, "could not read the Cluster's slots: {err}");
                    primaries.out_of_date();
                }
            }
            primaries.reading.store(false, Ordering::Release);
        });
    }

    /// Takes the map a `CLUSTER SLOTS` reply gives, keeping the connections to the primaries
    /// it still names.
    fn install(&self, slots: &Value) {
        let ranges = slot_ranges(slots);
        let old = self.map();
        let mut primaries: Vec<Arc<Primary>> = Vec::new();
        let mut by_slot = HashMap::new();
        for (first, last, (host, port)) in ranges {
            let known =
                |list: &[Arc<Primary>]| list.iter().position(|p| p.host == host && p.port == port);
            let at = match known(&primaries) {
                Some(at) => at,
                None => {
                    let kept = old
                        .as_ref()
                        .and_then(|map| known(&map.primaries).map(|at| map.primaries[at].clone()));
                    let Some(primary) =
                        kept.or_else(|| self.connect(host.clone(), port).map(Arc::new))
                    else {
                        continue;
                    };
                    primaries.push(primary);
                    primaries.len() - 1
                }
            };
            let Ok(at) = u16::try_from(at) else {
                continue;
            };
            by_slot.extend((first..=last).filter_map(Slot::new).map(|slot| (slot, at)));
        }
        *self.map.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Arc::new(SlotMap { by_slot, primaries }));
    }

    /// A primary at `host:port`, connected on first use with the seed node's settings (`None`:
    /// those settings do not make a client for it, and its slots' calls go alone).
    fn connect(&self, host: String, port: u16) -> Option<Primary> {
        let addr = match self.seed.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.clone(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.clone(), port),
        };
        let client = redis::Client::open(self.seed.clone().set_addr(addr)).ok()?;
        let node = Node::new(
            Arc::new(Endpoint::Fixed(client)),
            self.connect_timeout,
            self.response_timeout,
            false,
            false,
            self.io.clone(),
        );
        Some(Primary {
            address: format!("{host}:{port}"),
            host,
            port,
            node,
        })
    }

    /// Sends `calls` one pipeline per primary the map knows, all at once: element `i` of the
    /// answer is what became of `calls[i]` (`None`: to be sent alone, as is every call when
    /// there is no map yet).
    pub(crate) async fn send<R: FromRedisValue + Send>(
        &self,
        operation: &'static str,
        calls: &[ScriptCall],
        guard: Option<ReplicaGuard>,
    ) -> Vec<Sent<R>> {
        let mut answers: Vec<Sent<R>> = calls.iter().map(|_| None).collect();
        let Some(map) = self.map() else {
            return answers;
        };
        let mut per_primary: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, call) in calls.iter().enumerate() {
            let primary = call
                .first_key()
                .and_then(|key| map.by_slot.get(&Slot::for_key(key)));
            match primary {
                Some(&at) => per_primary.entry(usize::from(at)).or_default().push(i),
                // A slot nobody serves (the cluster is failing over): sent alone.
                None => self.out_of_date(),
            }
        }
        let sent = per_primary.into_iter().map(|(at, indices)| {
            let primary = map.primaries[at].clone();
            async move {
                let replies = self
                    .send_to(&primary, operation, calls, &indices, guard)
                    .await;
                (indices, replies)
            }
        });
        for (indices, replies) in futures_util::future::join_all(sent).await {
            for (i, reply) in indices.into_iter().zip(replies) {
                answers[i] = reply;
            }
        }
        answers
    }

    /// Sends `calls[i]` for each of `indices` to `primary` in one pipeline (with a `guard`,
    /// `WAIT` at its end), and reads each reply on its own.
    async fn send_to<R: FromRedisValue + Send>(
        &self,
        primary: &Primary,
        operation: &'static str,
        calls: &[ScriptCall],
        indices: &[usize],
        guard: Option<ReplicaGuard>,
    ) -> Vec<Sent<R>> {
        let mut pipeline = redis::Pipeline::with_capacity(indices.len() + 1);
        for &i in indices {
            pipeline.add_command(calls[i].by_hash());
        }
        if let Some(guard) = guard {
            pipeline
                .cmd("WAIT")
                .arg(guard.replicas)
                .arg(kind::millis(guard.timeout));
        }
        pipeline.ignore_errors();
        tracing::trace!(target: crate::LOG_TARGET, server = %primary.address, calls = indices.len(), "{operation}: one request for {} calls", indices.len());
        let replies: Vec<Value> = match primary
            .node
            .call(operation, Call::Pipeline(&pipeline), None, |_| false)
            .await
        {
            Ok((replies, _)) => replies,
            Err(err) => {
                self.out_of_date();
                // A primary that did not answer in time is not asked again (a second request
                // would wait as long): its calls fail, and only its leases stay unknown. After
                // any other failure (refused, reset: a failover under way) each call goes
                // alone, through the cluster connection, which follows the failover.
                let timed_out =
                    matches!(&err, LockError::Backend(e) if e.kind() == BackendErrorKind::Timeout);
                return indices
                    .iter()
                    .map(|_| timed_out.then(|| Err(timed_out_at(operation, primary))))
                    .collect();
            }
        };
        if replies.len() != pipeline.len() {
            return indices.iter().map(|_| None).collect();
        }
        let mut replies = replies.into_iter();
        let scripts: Vec<Value> = replies.by_ref().take(indices.len()).collect();
        let enough = match (guard, replies.next()) {
            (None, _) => true,
            (Some(guard), Some(acknowledged)) => u32::from_redis_value(acknowledged)
                .is_ok_and(|n| replicated(guard, n, operation, &primary.address)),
            (Some(_), None) => false,
        };
        scripts
            .into_iter()
            .map(|reply| match reply {
                Value::ServerError(err) => match err.code() {
                    // The slot is elsewhere now (or half-way there), or the cluster or this
                    // node is failing over: the cluster connection finds where it is.
                    "MOVED" | "ASK" | "CLUSTERDOWN" | "READONLY" | "MASTERDOWN" => {
                        self.out_of_date();
                        None
                    }
                    // Keys of the call on both sides of a migration, a node loading its data,
                    // the script missing there: the cluster connection waits, retries or
                    // sends the source.
                    "TRYAGAIN" | "LOADING" | "NOSCRIPT" => None,
                    _ => Some(Err(request_error(operation, RedisError::from(err)))),
                },
                reply => Some(
                    R::from_redis_value(reply)
                        .map(|value| (value, enough))
                        .map_err(|err| request_error(operation, err.into())),
                ),
            })
            .collect()
    }
}

/// The error of a call whose primary did not answer in time.
fn timed_out_at(operation: &'static str, primary: &Primary) -> LockError {
    BackendError::new(
        operation,
        BackendErrorKind::Timeout,
        format!("Cluster primary {} did not answer in time", primary.address),
    )
    .maybe_applied(true)
    .into()
}

/// The slot ranges of a `CLUSTER SLOTS` reply (`[[start, end, [host, port, …], replicas…],
/// …]`), each with its primary.
pub(crate) fn slot_ranges(slots: &Value) -> Vec<(u16, u16, (String, u16))> {
    let mut ranges = Vec::new();
    let Value::Array(entries) = slots else {
        return ranges;
    };
    for entry in entries {
        let Value::Array(entry) = entry else {
            continue;
        };
        let (Some(Ok(first)), Some(Ok(last))) = (
            entry.first().map(redis::from_redis_value_ref::<u16>),
            entry.get(1).map(redis::from_redis_value_ref::<u16>),
        ) else {
            continue;
        };
        let Some(Value::Array(node)) = entry.get(2) else {
            continue;
        };
        let host = match node.first() {
            Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
            Some(Value::SimpleString(host)) => host.clone(),
            _ => continue,
        };
        let Some(Ok(port)) = node.get(1).map(redis::from_redis_value_ref::<u16>) else {
            continue;
        };
        ranges.push((first, last, (host, port)));
    }
    ranges
}
