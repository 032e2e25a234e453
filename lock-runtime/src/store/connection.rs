//! One Redis server as the Redis store (`redis.rs`) reaches it: a [`Node`] keeps one
//! multiplexed connection, made on the client's I/O runtime (or the caller's multi-thread
//! runtime) and remade after it breaks, and implements the store's
//! [`Transport`](super::transport::Transport) for it (`requests.rs`). The server is a fixed
//! one, or the primary Sentinel names (`endpoint.rs`): a new connection then asks the sentinels
//! and checks that what it reached is a primary (`ROLE`) before using it, so the store follows
//! a failover. Redlock (`redlock.rs`) runs one per
//! master, with the same role check. With the failover guard (`ReplicaGuard`) `WAIT` follows a
//! grant or renewal on the same connection, that of a sibling node lent for the write
//! (`guarded.rs`), so the wait holds up nothing else.
//!
//! This file keeps the connection in use, made once for every caller that asks meanwhile.
//! Beside it: how a new connection is made and set up, by a task of its own that a caller which
//! stops waiting leaves to finish for the next ([`reach`]); the connections given up on, which
//! the server closes (`CLIENT KILL`) before the next request runs ([`replaced`]); whether the
//! user may run a transaction ([`transactions`]); how a request is sent, retried and cut off
//! ([`requests`]); and what a failure means ([`failure`], read by `cluster.rs` too).
//! `eviction.rs` is fired after the first connect to each server. Scripts are called by SHA
//! (`EVALSHA`); after a `NOSCRIPT` reply the call is sent once more with the script's source
//! (`script.rs`).

mod failure;
mod reach;
mod replaced;
mod requests;
mod transactions;

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError};
use tokio::runtime::Handle;

use super::endpoint::Endpoint;
use crate::error::BackendError;
pub(crate) use failure::{connect_error, request_error, Failure};
use reach::{Connected, Reach, SetUpFailure};
use replaced::ServerSideClient;
use transactions::Transactions;

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
    under_way: Option<(NodeConnect, Option<DriverRuntime>)>,
}

/// A connect task ([`Reach::connect`]).
type NodeConnect = tokio::task::JoinHandle<Result<Connected, SetUpFailure>>;

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
    fn connect(&self) -> (NodeConnect, Option<DriverRuntime>) {
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
