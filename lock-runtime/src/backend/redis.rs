//! Single-node Redis backend: the three Lua scripts over one multiplexed connection, made on the
//! client's I/O runtime and remade after it breaks.
//!
//! Scripts are called by SHA (`EVALSHA`); a `NOSCRIPT` reply (after `SCRIPT FLUSH` or a restart)
//! loads the script and repeats the call, which the `redis` crate's `Script` does for us.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, Script};
use tokio::runtime::Handle;

use super::wake::Waker;
use super::{AcquireReply, LockBackend, LockKey, Renewal};
use crate::error::{server_address, BackendError, BackendErrorKind, LockError};
use crate::FencingToken;

/// Time to live of a fencing counter after its last grant (at least twice the lease). Safe to
/// let it lapse: tokens never fall below the server clock in microseconds, which has passed any
/// value the old counter reached.
const FENCE_COUNTER_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// A connection in use, tagged so that only the failing generation is thrown away.
struct Current {
    generation: u64,
    connection: MultiplexedConnection,
}

/// Reconnect bookkeeping, behind the `connecting` lock.
#[derive(Default)]
struct Connecting {
    last_generation: u64,
    /// The last failed connect: callers that queued behind it share its error instead of each
    /// waiting out another connect timeout.
    last_failure: Option<(Instant, RedisError)>,
}

pub(crate) struct RedisBackend {
    client: redis::Client,
    /// Address and db for logs (never the credentials).
    server: String,
    connection_config: AsyncConnectionConfig,
    io: Handle,
    current: Mutex<Option<Current>>,
    /// Serialises reconnects so a broken connection is replaced once, not by every caller.
    connecting: tokio::sync::Mutex<Connecting>,
    acquire_script: Script,
    release_script: Script,
    extend_many_script: Script,
    waker: Waker,
}

impl RedisBackend {
    pub(crate) fn new(
        client: redis::Client,
        response_timeout: Duration,
        connect_timeout: Duration,
        io: Handle,
    ) -> Self {
        Self {
            server: server_address(&client),
            waker: Waker::new(
                client.clone(),
                io.clone(),
                connect_timeout,
                response_timeout,
            ),
            client,
            connection_config: AsyncConnectionConfig::new()
                .set_response_timeout(Some(response_timeout))
                .set_connection_timeout(Some(connect_timeout)),
            io,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(Connecting::default()),
            acquire_script: Script::new(include_str!("../../scripts/acquire.lua")),
            release_script: Script::new(include_str!("../../scripts/release.lua")),
            extend_many_script: Script::new(include_str!("../../scripts/extend_many.lua")),
        }
    }

    pub(crate) fn waker(&self) -> &Waker {
        &self.waker
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current
            .as_ref()
            .map(|c| (c.generation, c.connection.clone()))
    }

    /// The connection in use, connecting (on the I/O runtime) when there is none. The flag
    /// says whether the connection is new (`false`: it was in use before and may have broken
    /// since).
    async fn connection(&self) -> Result<(u64, MultiplexedConnection, bool), LockError> {
        if let Some((generation, connection)) = self.cached() {
            return Ok((generation, connection, false));
        }
        let asked_at = Instant::now();
        let mut state = self.connecting.lock().await;
        if let Some((generation, connection)) = self.cached() {
            return Ok((generation, connection, true));
        }
        if let Some((failed_at, err)) = &state.last_failure {
            if *failed_at >= asked_at {
                return Err(self.error("connect", err.clone()));
            }
        }
        let client = self.client.clone();
        let config = self.connection_config.clone();
        // The connection's driver task is spawned on the runtime that connects: make that the
        // client's own, so the connection outlives the caller's runtime.
        let connected = self
            .io
            .spawn(async move {
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
            })
            .await;
        let connection = match connected {
            Ok(Ok(connection)) => connection,
            Ok(Err(err)) => {
                state.last_failure = Some((Instant::now(), err.clone()));
                return Err(self.error("connect", err));
            }
            Err(_) => {
                return Err(BackendError::new(
                    "connect",
                    BackendErrorKind::Connection,
                    "the client's I/O runtime has shut down",
                )
                .into())
            }
        };
        state.last_failure = None;
        state.last_generation += 1;
        let generation = state.last_generation;
        tracing::debug!(server = %self.server, generation, "connected to Redis");
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(Current {
            generation,
            connection: connection.clone(),
        });
        Ok((generation, connection, true))
    }

    /// Forgets a connection that failed, so the next request makes a new one.
    fn discard(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|c| c.generation == generation) {
            tracing::debug!(server = %self.server, generation, "discarding broken Redis connection");
            *current = None;
        }
    }

    fn error(&self, operation: &'static str, err: RedisError) -> LockError {
        let kind = classify(&err);
        BackendError::new(operation, kind, err).into()
    }

    /// Runs a script. A request on a connection that was in use before and turns out broken
    /// (closed by the server while idle, say) is sent once more on a new connection: all three
    /// scripts are safe to repeat for the same owner.
    async fn invoke<T: redis::FromRedisValue>(
        &self,
        operation: &'static str,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        let mut retried = false;
        loop {
            let (generation, mut connection, fresh) = self.connection().await?;
            let err = match invocation.invoke_async(&mut connection).await {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            let kind = classify(&err);
            if kind != BackendErrorKind::Server {
                self.discard(generation);
            }
            if kind == BackendErrorKind::Connection && !fresh && !retried {
                tracing::debug!(server = %self.server, "retrying {operation} on a new connection: {err}");
                retried = true;
                continue;
            }
            return Err(self.error(operation, err));
        }
    }
}

fn classify(err: &RedisError) -> BackendErrorKind {
    if err.is_timeout() {
        BackendErrorKind::Timeout
    } else {
        match err.kind() {
            ErrorKind::Server(_)
            | ErrorKind::AuthenticationFailed
            | ErrorKind::UnexpectedReturnType
            | ErrorKind::InvalidClientConfig
            | ErrorKind::Parse
            | ErrorKind::Extension
            | ErrorKind::RESP3NotSupported => BackendErrorKind::Server,
            _ => BackendErrorKind::Connection,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl LockBackend for RedisBackend {
    async fn acquire(
        &self,
        key: &LockKey,
        owner: &str,
        lease: Duration,
    ) -> Result<AcquireReply, LockError> {
        let mut invocation = self.acquire_script.prepare_invoke();
        invocation
            .key(&key.lock)
            .key(&key.fence)
            .arg(owner)
            .arg(millis(lease))
            .arg(millis(FENCE_COUNTER_TTL.max(lease.saturating_mul(2))));
        let (granted, value): (i64, i64) = self.invoke("acquire", invocation).await?;
        if granted == 1 {
            let token = u64::try_from(value).map_err(|_| {
                BackendError::new(
                    "acquire",
                    BackendErrorKind::Server,
                    format!(
                        "the fencing counter of `{}` holds a negative value",
                        key.name
                    ),
                )
            })?;
            Ok(AcquireReply::Acquired(FencingToken(token)))
        } else {
            // PTTL is -1 for a key without expiry and -2 for one that vanished meanwhile.
            let remaining = match value {
                -2 => Some(Duration::ZERO),
                ms if ms >= 0 => Some(Duration::from_millis(ms.unsigned_abs())),
                _ => None,
            };
            Ok(AcquireReply::Held(remaining))
        }
    }

    async fn release(&self, key: &LockKey, owner: &str) -> Result<bool, LockError> {
        let mut invocation = self.release_script.prepare_invoke();
        invocation.key(&key.lock).key(&key.channel).arg(owner);
        let deleted: i64 = self.invoke("release", invocation).await?;
        Ok(deleted == 1)
    }

    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let mut invocation = self.extend_many_script.prepare_invoke();
        for renewal in leases {
            invocation
                .key(&renewal.key.lock)
                .arg(renewal.owner)
                .arg(millis(renewal.lease));
        }
        let extended: Vec<i64> = self.invoke("renew", invocation).await?;
        if extended.len() != leases.len() {
            return Err(BackendError::new(
                "renew",
                BackendErrorKind::Server,
                format!(
                    "asked to renew {} leases, got {} answers",
                    leases.len(),
                    extended.len()
                ),
            )
            .into());
        }
        Ok(extended.into_iter().map(|e| e == 1).collect())
    }
}
