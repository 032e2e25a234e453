//! A Redis Cluster's primaries by hash slot, each with a connection of its own, for the
//! requests the Cluster transport (`cluster.rs`) sends one per primary
//! ([`Transport::call_each`](super::transport::Transport::call_each)): a batch of script calls,
//! each naming keys of one slot, goes to each primary as one pipeline. The `redis` crate's
//! cluster connection cannot carry such a pipeline: when any reply in a pipeline asks for
//! action (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`…) it sends the whole pipeline again, to the
//! node that one reply named, where every other slot's call then misses. So the pipelines go
//! over connections of their own, one [`Node`](super::connection::Node) per primary
//! (reconnecting as one server's store does, `connection.rs`), and every reply is read on its
//! own: a call whose slot answers that it lives elsewhere or lacks the script is handed back to
//! be sent alone through the cluster connection, which follows redirections, failovers and migrations and sends a
//! missing script's source; a call answered that the cluster or the node cannot serve it yet
//! (`CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, `TRYAGAIN`) fails for this batch, as the cluster
//! connection would only ask again until its response timeout. A primary that does not answer
//! (a timeout, a broken or refused connection) fails its own calls for this batch: they are
//! not sent again alone, as a sick node would then get one request per call.
//!
//! This file splits a batch into its primaries' pipelines and reads their replies. Beside it:
//! which primary serves each slot, and its connection ([`slot_map`]); when batching turns
//! itself off, and back on ([`batching`]).

mod batching;
mod slot_map;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::cluster_routing::Slot;
use redis::{ConnectionInfo, FromRedisValue, RedisError, Value};
use tokio::runtime::Handle;

use super::connection::request_error;
use super::transport::{replicated, Transport};
use crate::config::ReplicaGuard;
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::kind;
use crate::protocol::Call;
use crate::script::ScriptCall;
use batching::{BatchRound, BatchRoundState, Batching};
pub(crate) use slot_map::slot_ranges;
use slot_map::{Primary, SlotMap};

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
    /// Whether batches go as pipelines, or every call alone for a while.
    batching: Mutex<Batching>,
}

/// The calls of one batch that go to one primary as one pipeline, or (no primary) the calls
/// of the batch to be sent alone through the cluster connection.
pub(crate) struct Share {
    /// The primary, and the batch's round, which every share with a primary reports to.
    primary: Option<(Arc<Primary>, Arc<BatchRound>)>,
    /// The share's calls, as indices into the batch.
    pub(crate) indices: Vec<usize>,
}

impl Share {
    /// The calls at `indices`, to be sent alone.
    pub(crate) fn alone(indices: Vec<usize>) -> Self {
        Self {
            primary: None,
            indices,
        }
    }
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
            batching: Mutex::new(Batching::On),
        })
    }

    /// Another set for the same cluster, with connections of its own (the failover guard's
    /// transports: `guarded.rs`). It starts with this set's map, over new connections made on
    /// first use, one per primary: so its first batch goes out at once, without waiting for a
    /// cluster connection of its own to be made — which connects to every node, and waits out
    /// the connect timeout on one that is frozen (a replica whose lag the guard is there for).
    pub(crate) fn sibling(&self) -> Arc<Self> {
        let sibling = Self::new(
            self.seed.clone(),
            self.connect_timeout,
            self.response_timeout,
            self.io.clone(),
        );
        if let Some(map) = self.map() {
            let primaries: Result<Vec<Arc<Primary>>, String> = map
                .primaries
                .iter()
                .map(|primary| {
                    sibling
                        .connect(primary.host.clone(), primary.port)
                        .map(Arc::new)
                })
                .collect();
            if let Ok(primaries) = primaries {
                *sibling.map.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(Arc::new(SlotMap {
                        by_slot: map.by_slot.clone(),
                        primaries,
                        unusable: map.unusable.clone(),
                    }));
                sibling
                    .stale
                    .store(self.stale.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
        sibling
    }

    /// Splits `calls` into the [`Share`]s of one batch: one per primary the map knows, its
    /// calls to go as one pipeline, and one of the calls to be sent alone (every call when
    /// there is no map yet or batching is paused).
    pub(crate) fn shares(&self, calls: &[ScriptCall]) -> Vec<Share> {
        let everything = || vec![Share::alone((0..calls.len()).collect())];
        if self.paused() {
            return everything();
        }
        let Some(map) = self.map() else {
            return everything();
        };
        let mut per_primary: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut alone = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            let primary = call
                .first_key()
                .and_then(|key| map.by_slot.get(&Slot::for_key(key)));
            match primary {
                Some(&at) => per_primary.entry(usize::from(at)).or_default().push(i),
                // A slot of a primary no client could be made for: sent alone (batching is
                // off already, and the map is read again when it is tried again).
                None if map.unusable.is_some() => alone.push(i),
                // A slot nobody serves (the cluster is failing over): sent alone.
                None => {
                    self.out_of_date();
                    alone.push(i);
                }
            }
        }
        let usable = map.unusable.is_none();
        if per_primary.is_empty() && usable {
            self.switch_on(&[]);
        }
        let round = Arc::new(BatchRound {
            state: Mutex::new(BatchRoundState {
                pending: per_primary.len(),
                all_usable: usable,
                reached: Vec::new(),
            }),
        });
        let mut shares: Vec<Share> = per_primary
            .into_iter()
            .map(|(at, indices)| Share {
                primary: Some((map.primaries[at].clone(), round.clone())),
                indices,
            })
            .collect();
        if !alone.is_empty() {
            shares.push(Share::alone(alone));
        }
        shares
    }

    /// Sends the calls of `share` (of the batch `calls`) to its primary in one pipeline:
    /// element `j` of the answer is what became of `calls[share.indices[j]]` (`None`: to be
    /// sent alone, as is every call of a share without a primary). Each share is answered on
    /// its own, as its primary answers; once the batch's last primary has, batching is on
    /// again if every primary's connection worked.
    pub(crate) async fn send<R: FromRedisValue + Send>(
        &self,
        share: &Share,
        operation: &'static str,
        calls: &[ScriptCall],
        guard: Option<ReplicaGuard>,
    ) -> Vec<Sent<R>> {
        let Some((primary, round)) = &share.primary else {
            return share.indices.iter().map(|_| None).collect();
        };
        let (replies, usable) = self
            .send_to(primary, operation, calls, &share.indices, guard)
            .await;
        if let Some(reached) = round.answered(usable, &primary.address) {
            let reached: Vec<&str> = reached.iter().map(String::as_str).collect();
            self.switch_on(&reached);
        }
        replies
    }

    /// Sends `calls[i]` for each of `indices` to `primary` in one pipeline (with a `guard`,
    /// `WAIT` at its end), and reads each reply on its own. The flag is `false` when the
    /// connection to the primary cannot be made to work (batching is then off).
    ///
    /// The request runs as a task of its own, and its calls wait for it at most a response
    /// timeout (and the guard's `WAIT`): a primary that must first be connected to, and does
    /// not accept or answer (frozen, or unreachable), would otherwise keep its calls
    /// unanswered for a connect timeout and more each round, past the leases. Its calls then
    /// fail this round; the task goes on, so a slow connect still ends, and the next batch
    /// finds the connection made. (The other primaries' answers never wait for it: each
    /// share is answered on its own, [`send`](Self::send).)
    async fn send_to<R: FromRedisValue + Send>(
        &self,
        primary: &Arc<Primary>,
        operation: &'static str,
        calls: &[ScriptCall],
        indices: &[usize],
        guard: Option<ReplicaGuard>,
    ) -> (Vec<Sent<R>>, bool) {
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
        tracing::trace!(target: crate::telemetry::LOG_TARGET, server = %primary.address, seed = %self.seed.addr(), calls = indices.len(), "{operation}: one request for {} calls", indices.len());
        let expected = pipeline.len();
        let request = {
            let primary = primary.clone();
            self.io.spawn(async move {
                primary
                    .node
                    .call(operation, Call::Pipeline(&pipeline), None, |_| false)
                    .await
            })
        };
        let within = self.response_timeout + guard.map_or(Duration::ZERO, |guard| guard.timeout);
        let replied = match tokio::time::timeout(within, request).await {
            Ok(Ok(replied)) => replied,
            Ok(Err(err)) => Err(crate::io::connect_task_failed(err).into()),
            Err(_) => Err(BackendError::new(
                operation,
                BackendErrorKind::Timeout,
                format!("no answer within {within:?}"),
            )
            .maybe_applied(true)
            .into()),
        };
        let replies: Vec<Value> = match replied {
            Ok((replies, _)) => replies,
            Err(err) => {
                self.out_of_date();
                if let Some(cause) = unworkable(&err) {
                    // The cluster connection, made with the same settings, got through: the
                    // calls go alone through it.
                    self.switch_off(
                        format!("Cluster primary {}: {cause}", primary.address),
                        Some(primary.address.clone()),
                    );
                    return (indices.iter().map(|_| None).collect(), false);
                }
                // A primary that did not answer (in time, or at all: killed, or failing over)
                // is not asked again, alone or through the cluster connection, which would
                // wait as long or retry against the same node: its calls fail, and only its
                // leases stay unknown this round. The map, read again, names its successor.
                let failed = failed_at(operation, primary, &err);
                return (
                    indices
                        .iter()
                        .map(|_| Some(Err(failed.clone().into())))
                        .collect(),
                    true,
                );
            }
        };
        if replies.len() != expected {
            return (indices.iter().map(|_| None).collect(), true);
        }
        let mut replies = replies.into_iter();
        let scripts: Vec<Value> = replies.by_ref().take(indices.len()).collect();
        let enough = match (guard, replies.next()) {
            (None, _) => true,
            (Some(guard), Some(acknowledged)) => u32::from_redis_value(acknowledged)
                .is_ok_and(|n| replicated(guard, n, operation, &primary.address)),
            (Some(_), None) => false,
        };
        // An error reply goes alone through the cluster connection only where that gets an
        // answer now: another node serves the slot, or the script needs its source. Where the
        // cluster connection would just ask again until its response timeout (the redis
        // crate's `WaitAndRetry`: `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, `TRYAGAIN`), the call
        // fails for this round (its leases unknown, tried again while they may be in force):
        // a cluster down answers so to every call on every node, every round.
        let replies = scripts
            .into_iter()
            .map(|reply| match reply {
                Value::ServerError(err) => match err.code() {
                    // The slot is elsewhere now (or half-way there), or this node is a
                    // replica since a failover: the cluster connection finds where it is.
                    "MOVED" | "ASK" | "READONLY" => {
                        self.out_of_date();
                        None
                    }
                    // The script is missing there: the cluster connection sends its source.
                    "NOSCRIPT" => None,
                    // The cluster is down, or this node's primary (it is a replica now):
                    // the map is read again, for the failover that may come.
                    "CLUSTERDOWN" | "MASTERDOWN" => {
                        self.out_of_date();
                        Some(Err(request_error(operation, RedisError::from(err))))
                    }
                    // A node loading its data; keys of the call on both sides of a migration
                    // (`TRYAGAIN`, which the store then splits per lock); any other error.
                    _ => Some(Err(request_error(operation, RedisError::from(err)))),
                },
                reply => Some(
                    R::from_redis_value(reply)
                        .map(|value| (value, enough))
                        .map_err(|err| request_error(operation, err.into())),
                ),
            })
            .collect();
        (replies, true)
    }
}

/// Why a per-primary connection cannot work with the seed node's settings, when that is why
/// a pipeline failed: the primary refused the credentials, TLS could not be set up, or what
/// answered is not Redis (`None`: the primary is sick or gone, not the settings).
fn unworkable(err: &LockError) -> Option<String> {
    match err {
        LockError::Backend(err)
            if matches!(
                err.kind(),
                BackendErrorKind::Authentication
                    | BackendErrorKind::Tls
                    | BackendErrorKind::Protocol
            ) =>
        {
            Some(err.cause().to_string())
        }
        _ => None,
    }
}

/// The error of each call of a pipeline that `primary` did not answer (`err`), naming it.
fn failed_at(operation: &'static str, primary: &Primary, err: &LockError) -> FailedAt {
    let (kind, maybe_applied, cause) = match err {
        LockError::Backend(err) => (err.kind(), err.may_have_applied(), err.cause().to_string()),
        _ => (BackendErrorKind::Connection, true, err.to_string()),
    };
    let how = match kind {
        BackendErrorKind::Timeout => "did not answer in time".to_owned(),
        _ => format!("did not answer: {cause}"),
    };
    FailedAt {
        operation,
        kind,
        maybe_applied,
        message: format!("Cluster primary {} {how}", primary.address),
    }
}

/// One failure shared by every call of a pipeline, made into an error per call.
#[derive(Clone)]
struct FailedAt {
    operation: &'static str,
    kind: BackendErrorKind,
    maybe_applied: bool,
    message: String,
}

impl From<FailedAt> for LockError {
    fn from(failed: FailedAt) -> Self {
        BackendError::new(failed.operation, failed.kind, failed.message)
            .maybe_applied(failed.maybe_applied)
            .into()
    }
}
