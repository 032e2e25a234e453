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
//! missing script's source; a call answered that the cluster or the node cannot serve it yet
//! (`CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, `TRYAGAIN`) fails for this batch, as the cluster
//! connection would only ask again until its response timeout.
//!
//! The map comes from `CLUSTER SLOTS` (through the cluster connection), read when the
//! transport connects and again, in the background, once a reply showed it out of date (a
//! redirection, `CLUSTERDOWN`, `READONLY`, a primary that failed or that the map lacks): a
//! batch never waits for it, and a stale map costs only the calls it misroutes, which go
//! alone. A primary that does not answer (a timeout, a broken or refused connection) fails
//! its own calls for this batch: they are not sent again alone, as a sick node would then get
//! one request per call.
//!
//! Batching turns itself off ([`Batching`]) when the per-primary connections cannot work
//! where the cluster connection does: a primary refuses the seed node's credentials or TLS
//! settings, or `CLUSTER SLOTS` names a host no client can be made for. That is logged once,
//! as a warning; while it is off every call goes alone and the map is not read, and after a
//! pause (doubling up to [`MOST_PAUSE`]) one batch tries again, so batching comes back by
//! itself once the cause is gone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

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
    /// Whether batches go as pipelines, or every call alone for a while.
    batching: Mutex<Batching>,
}

/// Whether batches are sent one pipeline per primary: on, or off since a per-primary
/// connection could not be made to work (bad credentials or TLS settings for the primaries,
/// an unusable host in `CLUSTER SLOTS`), until `retry_at`, when one batch tries again.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Batching {
    On,
    Off {
        /// Why, for the logs.
        cause: String,
        /// The primary whose connection failed (`None`: an unusable host in the map): only a
        /// batch that reaches it and works there turns batching on again, so that batches
        /// which happen to miss it do not, each, warn anew and start the pauses over.
        culprit: Option<String>,
        /// How long this pause lasts; the next one, after a failed try, lasts twice as long
        /// (at most [`MOST_PAUSE`]).
        pause: Duration,
        retry_at: Instant,
    },
}

/// The first pause of batching after it turned off.
const FIRST_PAUSE: Duration = Duration::from_secs(1);

/// The longest pause of batching between two tries.
const MOST_PAUSE: Duration = Duration::from_secs(30);

/// Which primary serves each slot, as `CLUSTER SLOTS` said.
struct SlotMap {
    /// Slot → index into `primaries`.
    by_slot: HashMap<Slot, u16>,
    primaries: Vec<Arc<Primary>>,
    /// A primary no client could be made for (its slots are not in `by_slot`), and why.
    unusable: Option<String>,
}

/// One primary and the connection to it.
struct Primary {
    /// `host:port`, for logs.
    address: String,
    host: String,
    port: u16,
    node: Node,
}

/// The calls of one batch that go to one primary as one pipeline, or (no primary) the calls
/// of the batch to be sent alone through the cluster connection.
pub(crate) struct Share {
    /// The primary, and the batch's round, which every share with a primary reports to.
    primary: Option<(Arc<Primary>, Arc<Round>)>,
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

/// What one batch learns of batching, as its primaries answer one by one.
struct Round {
    state: Mutex<RoundState>,
}

struct RoundState {
    /// Primaries yet to answer.
    pending: usize,
    /// No primary's connection failed to work, and the map names no unusable host.
    all_usable: bool,
    /// The primaries that answered, by address.
    reached: Vec<String>,
}

impl Round {
    /// The primary at `address` answered, its connection `usable` or not. When it was the
    /// last, and every one was usable: the primaries reached (batching may be on again).
    fn answered(&self, usable: bool, address: &str) -> Option<Vec<String>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.all_usable &= usable;
        state.reached.push(address.to_owned());
        state.pending = state.pending.saturating_sub(1);
        (state.pending == 0 && state.all_usable).then(|| std::mem::take(&mut state.reached))
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

    /// Whether there is a map to send batches by (perhaps out of date: a stale map costs only
    /// the calls it misroutes, which go alone).
    pub(crate) fn has_map(&self) -> bool {
        self.map().is_some()
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

    fn batching(&self) -> std::sync::MutexGuard<'_, Batching> {
        self.batching.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether batching is off and its pause not over: every call goes alone, and the map is
    /// not read.
    fn paused(&self) -> bool {
        matches!(&*self.batching(), Batching::Off { retry_at, .. } if Instant::now() < *retry_at)
    }

    /// Turns batching off for a pause, because of `cause` (at the primary `culprit`): with a
    /// warning when it was on; when this was a try after a pause, for twice as long as that
    /// pause. The map is read again at the next try.
    fn switch_off(&self, cause: String, culprit: Option<String>) {
        let now = Instant::now();
        let mut batching = self.batching();
        let pause = match &*batching {
            Batching::On => {
                tracing::warn!(target: crate::telemetry::LOG_TARGET, seed = %self.seed.addr(), cause = %cause,
                    "Redis Cluster renewals are no longer sent one pipeline per primary: {cause}. \
                     Each slot's renewal goes alone through the cluster connection (one request \
                     per slot instead of one per primary) until a per-primary connection works; \
                     tried again after {FIRST_PAUSE:?}, then less and less often (at most every \
                     {MOST_PAUSE:?}). Check that the credentials and TLS settings of the first \
                     node URL are valid on every primary, and that the addresses CLUSTER SLOTS \
                     announces (cluster-announce-ip, cluster-announce-hostname, \
                     cluster-preferred-endpoint-type) are reachable from this client.");
                FIRST_PAUSE
            }
            // Another primary of the same batch failed too: one pause for both.
            Batching::Off { retry_at, .. } if now < *retry_at => return,
            Batching::Off { pause, .. } => {
                let pause = (*pause * 2).min(MOST_PAUSE);
                tracing::debug!(target: crate::telemetry::LOG_TARGET, seed = %self.seed.addr(), "Redis Cluster renewals still not sent per primary ({cause}); tried again after {pause:?}");
                pause
            }
        };
        *batching = Batching::Off {
            cause,
            culprit,
            pause,
            retry_at: now + pause,
        };
        self.out_of_date();
    }

    /// A batch went through with nothing that turns batching off, at the primaries `reached`
    /// (their addresses): it is on again if it was off because of one of them, or of an
    /// unusable host in a map that has none now. A batch that did not reach the primary that
    /// failed leaves it off; once its pause is over batches go per primary anyway, and the
    /// next one to reach that primary either turns batching on or starts a longer pause.
    fn switch_on(&self, reached: &[&str]) {
        let mut batching = self.batching();
        if let Batching::Off { cause, culprit, .. } = &*batching {
            if culprit
                .as_deref()
                .is_some_and(|culprit| !reached.contains(&culprit))
            {
                return;
            }
            tracing::info!(target: crate::telemetry::LOG_TARGET, seed = %self.seed.addr(), "Redis Cluster renewals are sent one pipeline per primary again (they were not: {cause})");
            *batching = Batching::On;
        }
    }

    /// Reads the map again in the background over `connection`, if it is out of date, no
    /// read is under way and batching is not paused.
    pub(crate) fn refresh(self: &Arc<Self>, connection: &ClusterConnection) {
        if self.paused()
            || !self.stale.load(Ordering::Relaxed)
            || self.reading.swap(true, Ordering::AcqRel)
        {
            return;
        }
        tracing::trace!(target: crate::telemetry::LOG_TARGET, seed = %self.seed.addr(), "reading the Redis Cluster's slot map");
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
                    tracing::debug!(target: crate::telemetry::LOG_TARGET, "could not read the Cluster's slots: {err}");
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
        let mut unusable = None;
        for (first, last, (host, port)) in ranges {
            let known =
                |list: &[Arc<Primary>]| list.iter().position(|p| p.host == host && p.port == port);
            let at = match known(&primaries) {
                Some(at) => at,
                None => {
                    let kept = old
                        .as_ref()
                        .and_then(|map| known(&map.primaries).map(|at| map.primaries[at].clone()));
                    let made = match kept {
                        Some(primary) => Ok(primary),
                        None => self.connect(host.clone(), port).map(Arc::new),
                    };
                    let primary = match made {
                        Ok(primary) => primary,
                        Err(why) => {
                            unusable.get_or_insert(why);
                            continue;
                        }
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
        if let Some(why) = &unusable {
            self.switch_off(why.clone(), None);
        }
        *self.map.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(SlotMap {
            by_slot,
            primaries,
            unusable,
        }));
    }

    /// A primary at `host:port`, connected on first use with the seed node's settings (an
    /// error: no client can be made for it — an unknown (`?`) or empty host, or settings that
    /// do not make a client — and its slots' calls go alone).
    fn connect(&self, host: String, port: u16) -> Result<Primary, String> {
        if host.is_empty() || host == "?" {
            return Err(format!(
                "CLUSTER SLOTS names no usable host for the primary on port {port} ({host:?})"
            ));
        }
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
        let client = redis::Client::open(self.seed.clone().set_addr(addr)).map_err(|err| {
            format!("no client can be made for the Cluster primary {host}:{port}: {err}")
        })?;
        let node = Node::new(
            Arc::new(Endpoint::Fixed(client)),
            self.connect_timeout,
            self.response_timeout,
            false,
            false,
            self.io.clone(),
        );
        Ok(Primary {
            address: format!("{host}:{port}"),
            host,
            port,
            node,
        })
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
        let round = Arc::new(Round {
            state: Mutex::new(RoundState {
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
