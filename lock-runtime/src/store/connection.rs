//! One Redis server as the Redis store (`redis.rs`) reaches it: a [`Node`] keeps one
//! multiplexed connection, made on the client's I/O runtime (or the caller's multi-thread
//! runtime) and remade after it breaks, and implements the store's [`Transport`] for it. The
//! server is a fixed one, or the primary Sentinel names (`endpoint.rs`): a new connection then
//! asks the sentinels and checks that what it reached is a primary (`ROLE`) before using it,
//! so the store follows a failover. Redlock (`redlock.rs`) runs one per master, with the same
//! role check. With the failover guard ([`ReplicaGuard`]) `WAIT` follows a grant or renewal on
//! the same connection, that of a sibling node lent for the write (`guarded.rs`), so the wait
//! holds up nothing else. Neighbours: `cluster.rs` is the other transport and reads failures
//! with [`Failure`] too; `eviction.rs` is fired after the first connect to each server.
//!
//! Scripts are called by SHA (`EVALSHA`); after a `NOSCRIPT` reply (after `SCRIPT FLUSH` or a
//! restart) the call is sent once more with the script's source (`script.rs`).
//!
//! A connection that failed is replaced, and the next request to the server — on the
//! replacement or on a sibling's connection — first has the server close the old one
//! (`CLIENT KILL`): a request still under way on the old
//! connection (held up in the network, say) can then no longer run after the requests that
//! follow, such as the compare-and-delete that gives back a grant whose reply never came.
//!
//! A new connection is made and set up (the checks below) by a task of its own ([`Reach`]):
//! a caller that stops waiting for it — a lock request whose wait ran out — leaves it to
//! finish, and the next caller takes it up instead of starting over.
//!
//! A new connection also asks, before it is shared, whether the server's ACL lets its user run
//! a transaction ([`Transactions`]): a write lock's first try is a `MULTI`/`EXEC` where it may
//! be, and the script otherwise. A refused `MULTI` would let the `SET` behind it run outside
//! the transaction, and breaks the `redis` crate's reading of the replies.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, FromRedisValue, RedisError, ServerErrorKind};
use tokio::runtime::Handle;

use super::endpoint::Endpoint;
use super::transport::{replicated, ScanStep, Transport};
use crate::config::ReplicaGuard;
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::kind;
use crate::protocol::{Announce, Call};

mod reach;
use reach::{Connected, Reach, ServerSideClient, SetUpFailure, Transactions};

/// A connection in use, tagged so that only the failing generation is thrown away.
struct Current {
    generation: u64,
    connection: MultiplexedConnection,
    /// How the server knows it (`None` when it would not say).
    server_side: Option<ServerSideClient>,
    /// Whether the runtime its driver runs on still runs (`None`: the client's own).
    driver: Option<DriverRuntime>,
    /// Whether a transaction may be sent on it.
    transactions: bool,
}

/// A caller's runtime that holds a connection's driver, watched by a task of its own there:
/// the task (and the `Arc` it holds) is dropped when that runtime shuts down, or ends when the
/// connection is forgotten (the sender is dropped).
struct DriverRuntime {
    alive: Weak<()>,
    _forgotten: tokio::sync::oneshot::Sender<()>,
}

impl DriverRuntime {
    fn watch(runtime: &Handle) -> Self {
        let token = Arc::new(());
        let alive = Arc::downgrade(&token);
        let (forgotten, until_forgotten) = tokio::sync::oneshot::channel::<()>();
        runtime.spawn(async move {
            let _token = token;
            let _ = until_forgotten.await;
        });
        Self {
            alive,
            _forgotten: forgotten,
        }
    }
}

/// A connection handed to a request: its generation, the connection, whether it is new
/// (`false`: it was in use before and may have broken since), and the liveness of the runtime
/// its driver runs on (`None`: the client's own, which lives as long as the client).
struct InUse {
    generation: u64,
    connection: MultiplexedConnection,
    fresh: bool,
    driver: Option<Weak<()>>,
    /// Whether a transaction may be sent on it ([`Transactions`]).
    transactions: bool,
}

impl InUse {
    /// The runtime that ran the connection's driver has shut down: the connection broke with
    /// it, not with the server.
    fn driver_gone(&self) -> bool {
        self.driver
            .as_ref()
            .is_some_and(|alive| alive.upgrade().is_none())
    }
}

/// Reconnect bookkeeping, behind the `connecting` lock.
#[derive(Default)]
struct Connecting {
    last_generation: u64,
    /// The last failed connect: callers that queued behind it share its error instead of each
    /// waiting out another connect timeout.
    last_failure: Option<(Instant, RedisError)>,
    /// A connect under way, and the runtime that holds its driver: a caller that stops
    /// waiting for it (a lock request whose wait ran out) leaves it here, and the next caller
    /// takes it up instead of starting over, so a wait shorter than a connect does not keep
    /// the server from ever being reached.
    under_way: Option<(Connect, Option<DriverRuntime>)>,
}

/// A connect task ([`Reach::connect`]).
type Connect = tokio::task::JoinHandle<Result<Connected, SetUpFailure>>;

/// One Redis server and the connection to it.
pub(crate) struct Node {
    /// How a new connection is made and set up, shared with the task that makes it.
    reach: Arc<Reach>,
    io: Handle,
    current: Mutex<Option<Current>>,
    /// Serialises reconnects so a broken connection is replaced once, not by every caller.
    connecting: tokio::sync::Mutex<Connecting>,
}

impl Node {
    /// A node that connects to `endpoint` (a Sentinel endpoint's primary is always checked
    /// to be one; `require_primary` checks a fixed server too) and, when `asks_transactions`,
    /// asks a new connection whether transactions may be sent.
    pub(crate) fn new(
        endpoint: Arc<Endpoint>,
        connect_timeout: Duration,
        response_timeout: Duration,
        require_primary: bool,
        asks_transactions: bool,
        io: Handle,
    ) -> Self {
        Self {
            reach: Arc::new(Reach {
                server: endpoint.describe(),
                require_primary: require_primary || endpoint.is_sentinel(),
                refusal: Mutex::new(None),
                asks_transactions,
                endpoint,
                connection_config: AsyncConnectionConfig::new()
                    .set_response_timeout(Some(response_timeout))
                    .set_connection_timeout(Some(connect_timeout)),
                response_timeout,
                replaced: Arc::default(),
                transactions: AtomicU8::new(Transactions::Unknown as u8),
                warned_transactions: AtomicBool::new(false),
            }),
            io,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(Connecting::default()),
        }
    }

    /// Another node for the same server, with a connection of its own (the failover guard's
    /// writes: `guarded.rs`). The two share what they replaced, so a request on either closes
    /// a connection the other gave up on before it runs.
    fn sibling_node(&self) -> Self {
        let reach = &self.reach;
        Self {
            reach: Arc::new(Reach {
                endpoint: reach.endpoint.clone(),
                server: reach.server.clone(),
                require_primary: reach.require_primary,
                refusal: Mutex::new(None),
                asks_transactions: reach.asks_transactions,
                connection_config: reach.connection_config.clone(),
                response_timeout: reach.response_timeout,
                replaced: reach.replaced.clone(),
                transactions: AtomicU8::new(Transactions::Unknown as u8),
                warned_transactions: AtomicBool::new(
                    reach.warned_transactions.load(Ordering::Relaxed),
                ),
            }),
            io: self.io.clone(),
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(Connecting::default()),
        }
    }

    fn cached(&self, fresh: bool) -> Option<InUse> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.as_ref().map(|c| InUse {
            generation: c.generation,
            connection: c.connection.clone(),
            fresh,
            driver: c.driver.as_ref().map(|driver| driver.alive.clone()),
            transactions: c.transactions,
        })
    }

    /// The connection in use, connecting when there is none.
    ///
    /// Where the connection's driver runs: on the caller's runtime when that is a multi-thread
    /// runtime — requests and replies then need no hop to another thread, which costs a wake-up
    /// of the I/O thread per request and of the caller per reply (most of the client's CPU per
    /// lock cycle otherwise) — and on the client's own I/O runtime when called from a
    /// current-thread runtime (whose tasks do not run between its `block_on`s: a driver there
    /// would stall the watchdog) or from the I/O runtime itself. When the runtime that holds the
    /// driver shuts down, the requests on the connection fail, and are sent again on a new one
    /// made where they run (also when the connection was new: [`InUse::driver_gone`]).
    async fn in_use(&self) -> Result<InUse, BackendError> {
        if let Some(in_use) = self.cached(false) {
            return Ok(in_use);
        }
        let asked_at = Instant::now();
        let mut state = self.connecting.lock().await;
        if let Some(in_use) = self.cached(true) {
            return Ok(in_use);
        }
        if let Some((failed_at, err)) = &state.last_failure {
            if *failed_at >= asked_at {
                return Err(connect_error(err.clone()));
            }
        }
        // A connect left by a caller that stopped waiting is taken up; one that has failed
        // already is not (its failure is older than this caller's question): it starts over.
        let left = match state.under_way.take() {
            Some((connect, driver)) if connect.is_finished() => match connect.now_or_never() {
                Some(Ok(Ok(connected))) => Some((Ok(Ok(connected)), driver)),
                _ => None,
            },
            under_way => {
                state.under_way = under_way;
                None
            }
        };
        let (connected, driver) = match left {
            Some(left) => left,
            None => loop {
                let taken_up = state.under_way.is_some();
                let (connect, _) = match &mut state.under_way {
                    Some(under_way) => under_way,
                    under_way => under_way.insert(self.connect()),
                };
                // Awaited in place: a caller dropped meanwhile leaves it to the next one.
                let connected = connect.await;
                let driver = state.under_way.take().and_then(|(_, driver)| driver);
                match connected {
                    // Taken up from a caller whose runtime has shut down since: start over here.
                    Err(err) if taken_up && err.is_cancelled() => continue,
                    connected => break (connected, driver),
                }
            },
        };
        let Connected {
            connection,
            address,
            server_side,
            transactions,
        } = match connected {
            Ok(Ok(connected)) => connected,
            Ok(Err(SetUpFailure::Connection(err))) => {
                state.last_failure = Some((Instant::now(), err.clone()));
                return Err(connect_error(err));
            }
            Ok(Err(SetUpFailure::NotPrimary(err))) => {
                state.last_failure = None;
                return Err(err);
            }
            Err(err) => return Err(crate::io::connect_task_failed(err)),
        };
        if super::eviction::first_time(&address) {
            // Beside the first request, not before it: the check only ever logs.
            self.io
                .spawn(super::eviction::check_node(connection.clone(), address));
        }
        state.last_failure = None;
        state.last_generation += 1;
        let generation = state.last_generation;
        tracing::debug!(target: crate::telemetry::LOG_TARGET, server = %self.reach.server, generation, "connected to Redis");
        let in_use = InUse {
            generation,
            connection: connection.clone(),
            fresh: true,
            driver: driver.as_ref().map(|driver| driver.alive.clone()),
            transactions,
        };
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(Current {
            generation,
            connection,
            server_side,
            driver,
            transactions,
        });
        Ok(in_use)
    }

    /// Starts a connect task ([`Reach::connect`]): on the caller's runtime when that is a
    /// multi-thread runtime (the connection's driver task is spawned where it connects: see
    /// [`Node::in_use`]), on the client's I/O runtime otherwise.
    fn connect(&self) -> (Connect, Option<DriverRuntime>) {
        let caller = crate::io::multi_thread_caller();
        let driver = caller.as_ref().map(DriverRuntime::watch);
        let runtime = caller.unwrap_or_else(|| self.io.clone());
        (runtime.spawn(self.reach.clone().connect()), driver)
    }

    /// Whether a connection is in use (it may still turn out broken).
    pub(crate) fn is_connected(&self) -> bool {
        self.cached(false).is_some()
    }

    /// Connects now if there is no connection (Redlock connects before it starts the clock of
    /// a try, so a connect does not eat into the lease).
    pub(crate) async fn warm_up(&self) -> Result<(), BackendError> {
        self.in_use().await.map(|_| ())
    }

    /// Why the last connection refused the server as a primary, if it did.
    pub(crate) fn refusal(&self) -> Option<String> {
        self.reach
            .refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Forgets a connection that failed, so the next request makes a new one (which closes
    /// this one on the server first).
    fn discard(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|c| c.generation == generation) {
            tracing::debug!(target: crate::telemetry::LOG_TARGET, server = %self.reach.server, generation, "discarding broken Redis connection");
            if let Some(old) = current.take().and_then(|c| c.server_side) {
                self.reach.replaced.push(old);
            }
        }
    }
}

impl Transport for Node {
    const ANNOUNCE: Announce = Announce::Publish;
    const ROUTES_BY_SLOT: bool = false;
    const RETRIES_UNSEEN: bool = false;
    const WAITS_AFTER_ANY_REQUEST: bool = true;
    const CUTS_AT_CUT: bool = true;

    type Shard = ();

    fn sibling(&self) -> Self {
        self.sibling_node()
    }

    async fn ping(&self) -> Result<(), LockError> {
        let named = |kind: BackendErrorKind, err: &dyn std::fmt::Display| {
            BackendError::new("ping", kind, format!("{}: {err}", self.reach.server))
        };
        // The connect failure's cause alone, and whether it timed out: the ping's error gives
        // the advice once, the frozen server's when the connect timed out.
        let InUse { mut connection, .. } = self.in_use().await.map_err(|err| {
            LockError::from(
                named(err.kind(), &err.cause()).connect_timed_out(err.is_connect_timeout()),
            )
        })?;
        match redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
        {
            Ok(_) => Ok(()),
            // A refusal by the ACL keeps what was refused, so the error says how to grant it.
            Err(err) => Err(named(Failure::of(&err).kind, &err).refused_by(&err).into()),
        }
    }

    /// Whether a first try may be a transaction, as the connection in use found out; a store
    /// that has not connected yet connects first, to ask.
    async fn transactions(&self) -> Result<bool, LockError> {
        match Transactions::from_u8(self.reach.transactions.load(Ordering::Relaxed)) {
            Transactions::Allowed => Ok(true),
            Transactions::Refused => Ok(false),
            Transactions::Unknown => Ok(self.in_use().await?.transactions),
        }
    }

    /// As [`transactions`](Self::transactions), its connect given up at `cut`.
    async fn transactions_by(&self, cut: Option<Instant>) -> Result<bool, LockError> {
        match Transactions::from_u8(self.reach.transactions.load(Ordering::Relaxed)) {
            Transactions::Allowed => Ok(true),
            Transactions::Refused => Ok(false),
            Transactions::Unknown => Ok(self.in_use_by("acquire", cut).await?.transactions),
        }
    }

    /// Sends `call` on the connection in use. A request on a connection that was in use
    /// before and turns out broken (closed by the server while idle, say) is sent once more on
    /// a new connection: the lock scripts are safe to repeat for the same owner. The error of a
    /// request that may have run says so, also when its repetition then failed to connect.
    /// With a failover guard and a reply that `needs_wait` (a grant, not a refusal), `WAIT`
    /// follows on the same connection: a `WAIT` on any other connection would say nothing
    /// about this write.
    fn call<R: FromRedisValue + Send>(
        &self,
        operation: &'static str,
        call: Call<'_>,
        guard: Option<ReplicaGuard>,
        needs_wait: impl Fn(&R) -> bool + Send,
    ) -> impl std::future::Future<Output = Result<(R, bool), LockError>> + Send {
        self.request(operation, call, guard, None, needs_wait)
    }

    /// As [`call`](Self::call), given up at `cut`: its connect (when there is no connection
    /// yet) by a timer of its own, its request by the connection's own response timeout set
    /// to end there when that comes first. A request cut off so is not sent again, and its
    /// connection is kept (the server may just be slower than the wait is long).
    fn call_by<R: FromRedisValue + Send>(
        &self,
        operation: &'static str,
        call: Call<'_>,
        cut: Option<Instant>,
        needs_wait: impl Fn(&R) -> bool + Send,
    ) -> impl std::future::Future<Output = Result<(R, bool), LockError>> + Send {
        self.request(operation, call, None, cut, needs_wait)
    }

    async fn shards(&self) -> Result<Vec<()>, LockError> {
        Ok(vec![()])
    }

    async fn scan_step(&self, _: &(), step: &redis::Cmd) -> Result<ScanStep, LockError> {
        let mut pipeline = redis::pipe();
        pipeline.add_command(step.clone());
        let ((step,), _): ((ScanStep,), bool) = self
            .call("list", Call::Pipeline(&pipeline), None, |_| false)
            .await?;
        Ok(step)
    }
}

/// Requests, cut off or not.
impl Node {
    /// The connection in use ([`in_use`](Self::in_use)), a connect given up at `cut`.
    async fn in_use_by(
        &self,
        operation: &'static str,
        cut: Option<Instant>,
    ) -> Result<InUse, BackendError> {
        let Some(cut) = cut else {
            return self.in_use().await;
        };
        if let Some(in_use) = self.cached(false) {
            return Ok(in_use);
        }
        // Boxed: the request's future stays as small as an uncut one.
        match Box::pin(tokio::time::timeout_at(cut.into(), self.in_use())).await {
            Ok(in_use) => in_use,
            Err(_) => Err(BackendError::new(
                operation,
                BackendErrorKind::Timeout,
                format!(
                    "{}: not connected when the request was cut off",
                    self.reach.server
                ),
            )),
        }
    }

    /// [`Transport::call`], given up at `cut` ([`Transport::call_by`]).
    async fn request<R: FromRedisValue + Send>(
        &self,
        operation: &'static str,
        call: Call<'_>,
        guard: Option<ReplicaGuard>,
        cut: Option<Instant>,
        needs_wait: impl Fn(&R) -> bool + Send,
    ) -> Result<(R, bool), LockError> {
        let mut retried = false;
        let mut maybe_applied = false;
        loop {
            let mut in_use = self
                .in_use_by(operation, cut)
                .await
                .map_err(|err| err.maybe_applied(maybe_applied))?;
            // The connection's own timer ends the request at the cut when that comes first
            // (set on this clone of the connection only).
            let cut_short = cut
                .map(|cut| cut.saturating_duration_since(Instant::now()))
                .filter(|left| *left < self.reach.response_timeout);
            if let Some(left) = cut_short {
                in_use.connection.set_response_timeout(left);
            }
            let generation = in_use.generation;
            if call.is_transaction() && !in_use.transactions {
                // Picked before this connection was made, whose user may not run one (its ACL
                // changed): not sent, since a refused `MULTI` would let the rest run alone.
                // (`acquire` then sends the script.)
                return Err(transaction_refused(operation)
                    .maybe_applied(maybe_applied)
                    .into());
            }
            // A connection given up on (by a sibling, say) is closed on the server first; the
            // flag is read here, so a request with nothing to close awaits nothing more.
            let closed = if self.reach.replaced.pending() {
                self.reach.kill_replaced(&mut in_use.connection).await
            } else {
                Ok(())
            };
            let sent = match closed {
                Ok(()) => call.query_multiplexed(&mut in_use.connection).await,
                Err(err) => Err(err),
            };
            let err = match sent {
                Ok(value) => {
                    let Some(guard) = guard.filter(|_| needs_wait(&value)) else {
                        return Ok((value, true));
                    };
                    match redis::cmd("WAIT")
                        .arg(guard.replicas)
                        .arg(kind::millis(guard.wait_timeout()))
                        .query_async::<u32>(&mut in_use.connection)
                        .await
                    {
                        Ok(acknowledged) => {
                            let enough =
                                replicated(guard, acknowledged, operation, &self.reach.server);
                            return Ok((value, enough));
                        }
                        // The script ran: whatever failed after it, its effect may stand.
                        Err(err) => {
                            let failure = Failure::of(&err);
                            if failure.reconnect {
                                self.discard(generation);
                            }
                            return Err(BackendError::new(operation, failure.kind, err)
                                .maybe_applied(true)
                                .into());
                        }
                    }
                }
                Err(err) => err,
            };
            let failure = Failure::of(&err);
            maybe_applied |= failure.maybe_applied;
            if cut_short.is_some() && err.is_timeout() {
                // Cut off: the connection may well be fine.
                return Err(BackendError::new(operation, failure.kind, err)
                    .maybe_applied(true)
                    .into());
            }
            if failure.reconnect {
                self.discard(generation);
                // A timeout is not retried: it has spent the response budget already, and a
                // slow server is not helped by a second copy of the request. A new connection
                // that broke is not retried either (the server is gone), unless it broke with
                // the caller's runtime that ran its driver.
                let retry = !in_use.fresh || in_use.driver_gone();
                if retry && !retried && failure.kind != BackendErrorKind::Timeout {
                    tracing::debug!(target: crate::telemetry::LOG_TARGET, server = %self.reach.server, "retrying {operation} on a new connection: {err}");
                    retried = true;
                    continue;
                }
            }
            return Err(BackendError::new(operation, failure.kind, err)
                .maybe_applied(maybe_applied)
                .into());
        }
    }
}

/// A transaction not sent, because the connection's user may not run one.
fn transaction_refused(operation: &'static str) -> BackendError {
    BackendError::new(
        operation,
        BackendErrorKind::Server,
        RedisError::from((
            ErrorKind::Server(ServerErrorKind::NoPerm),
            "NOPERM",
            "this user has no permissions to run the 'multi' command (or 'exec'; the request \
             was not sent)"
                .to_owned(),
        )),
    )
}

pub(crate) fn connect_error(err: RedisError) -> BackendError {
    let timed_out = err.is_timeout();
    let kind = if crate::tls::is_handshake_failure(&err) {
        BackendErrorKind::Tls
    } else {
        Failure::of(&err).kind
    };
    BackendError::new("connect", kind, err).connect_timed_out(timed_out)
}

/// The server refused a command (permissions, unknown command): not a broken connection.
fn is_refusal(err: &RedisError) -> bool {
    matches!(err.kind(), ErrorKind::Server(_)) && Failure::of(err).kind == BackendErrorKind::Server
}

/// A failed request as the caller sees it: what it means ([`Failure`]), and whether it may
/// have run.
pub(crate) fn request_error(operation: &'static str, err: RedisError) -> LockError {
    let failure = Failure::of(&err);
    BackendError::new(operation, failure.kind, err)
        .maybe_applied(failure.maybe_applied)
        .into()
}

/// What a failed request means for the request and its connection.
pub(crate) struct Failure {
    pub(crate) kind: BackendErrorKind,
    /// The connection cannot serve locks: use a new one.
    pub(crate) reconnect: bool,
    /// The request may have run although it failed.
    pub(crate) maybe_applied: bool,
}

impl Failure {
    pub(crate) fn of(err: &RedisError) -> Self {
        // A transaction the server refused at a command (`EXECABORT`: a replica's `READONLY`,
        // say) fails as that command did; nothing of it ran.
        if err.kind() == ErrorKind::Server(ServerErrorKind::ExecAbort) {
            let first = err.clone().into_server_errors().and_then(|errors| {
                errors
                    .first()
                    .map(|(_, error)| RedisError::from(error.clone()))
            });
            if let Some(first) = first {
                return Self {
                    maybe_applied: false,
                    ..Self::of(&first)
                };
            }
        }
        let (kind, reconnect, maybe_applied) = if err.is_timeout() {
            (BackendErrorKind::Timeout, true, true)
        } else if err.code() == Some("NOAUTH") {
            // The server wants a password and the URL gives none.
            (BackendErrorKind::Authentication, false, false)
        } else {
            match err.kind() {
                // The server (a replica now, or not ready) refused before running anything.
                ErrorKind::Server(
                    ServerErrorKind::ReadOnly
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::BusyLoading,
                ) => (BackendErrorKind::Unavailable, true, false),
                // A Cluster slot in migration (`TRYAGAIN`: keys of a call on both sides) or a
                // Cluster without a quorum of primaries: nothing ran, and the connection is fine.
                ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => {
                    (BackendErrorKind::Unavailable, false, false)
                }
                // Wrong credentials: sent during the handshake, before any request.
                ErrorKind::AuthenticationFailed => (BackendErrorKind::Authentication, false, false),
                // Not the Redis protocol: another kind of server on the port. The request may
                // have reached a Redis that then sent garbage, so it may have run.
                ErrorKind::Parse => (BackendErrorKind::Protocol, true, true),
                // An error reply: a script that fails undoes its grant first.
                ErrorKind::Server(_)
                | ErrorKind::UnexpectedReturnType
                | ErrorKind::InvalidClientConfig
                | ErrorKind::Extension
                | ErrorKind::RESP3NotSupported => (BackendErrorKind::Server, false, false),
                _ => (BackendErrorKind::Connection, true, true),
            }
        };
        Self {
            kind,
            reconnect,
            maybe_applied,
        }
    }
}
