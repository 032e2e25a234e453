//! How a [`Node`](super::Node)'s new connection is reached and set up before it is shared
//! (`connection.rs` keeps the connection in use and sends requests on it): [`Reach`] connects
//! (through the sentinels, for a Sentinel endpoint), checks the role, has the server close the
//! connections given up on ([`Replaced`], by their [`ServerSideClient`]) and asks whether the
//! user may run transactions ([`Transactions`]), as a task of its own that finishes the
//! connection for the next caller when the one that started it stops waiting.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError};

use super::*;

/// One of our connections as the server knows it: enough to close it from another one. The
/// address guards the id, which a restarted server hands out again.
#[derive(Debug, Clone)]
pub(super) struct ServerSideClient {
    pub(super) id: u64,
    pub(super) addr: String,
}

impl ServerSideClient {
    /// Reads `id=… addr=…` from a `CLIENT INFO` reply.
    pub(super) fn parse(info: &str) -> Option<Self> {
        let field = |name: &str| {
            info.split_whitespace()
                .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        };
        Some(Self {
            id: field("id")?.parse().ok()?,
            addr: field("addr")?.to_owned(),
        })
    }
}

/// Connections to one server given up on, which the server must close before it runs
/// anything else of ours: a request held up on one could otherwise run after the requests
/// that follow, such as the clean-up of its own try.
#[derive(Default)]
pub(super) struct Replaced {
    pub(super) list: Mutex<Vec<ServerSideClient>>,
    /// Whether the list is not empty: read by every request, before it is sent.
    pub(super) pending: AtomicBool,
}

impl Replaced {
    pub(super) fn list(&self) -> std::sync::MutexGuard<'_, Vec<ServerSideClient>> {
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn push(&self, old: ServerSideClient) {
        let mut list = self.list();
        list.push(old);
        self.pending.store(true, Ordering::Release);
    }

    /// Forgets those of `closed` still listed.
    pub(super) fn closed(&self, closed: &[ServerSideClient]) {
        let mut list = self.list();
        list.retain(|old| {
            !closed
                .iter()
                .any(|gone| gone.id == old.id && gone.addr == old.addr)
        });
        self.pending.store(!list.is_empty(), Ordering::Release);
    }

    pub(super) fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }
}

/// How a node's new connection is made and set up before it is shared: connected (through
/// the sentinels, for a Sentinel endpoint), its role checked, the connections it replaces
/// closed on the server, and whether it may send transactions asked. Run by a task of its own
/// ([`Reach::connect`]), which finishes the connection for the next caller when the one that
/// started it stops waiting.
pub(super) struct Reach {
    pub(super) endpoint: Arc<Endpoint>,
    /// Address and db for logs (never the credentials).
    pub(super) server: String,
    pub(super) require_primary: bool,
    /// Why the server was refused as a primary, when the last connection found it a replica.
    pub(super) refusal: Mutex<Option<String>>,
    /// Whether a new connection asks if transactions may be sent ([`Transactions`]): only a
    /// store whose tokens come from the clock sends them.
    pub(super) asks_transactions: bool,
    pub(super) connection_config: AsyncConnectionConfig,
    /// The connection's response timeout, which a request cut off sooner sets lower
    /// ([`Node::call_by`]).
    pub(super) response_timeout: Duration,
    /// Connections given up on that the server may still run requests from, shared with the
    /// node's siblings ([`Node::sibling`]): the next request to the server, on whichever of
    /// them, has the server close them first.
    pub(super) replaced: Arc<Replaced>,
    /// What the last connection found out about transactions ([`Transactions`] as a `u8`),
    /// read by a first try before it picks its request.
    pub(super) transactions: AtomicU8,
    /// Whether the missing permission for transactions has been warned about.
    pub(super) warned_transactions: AtomicBool,
}

/// A new connection, set up ([`Reach::connect`]).
pub(super) struct Connected {
    pub(super) connection: MultiplexedConnection,
    /// The address it reached, for the eviction check.
    pub(super) address: String,
    pub(super) server_side: Option<ServerSideClient>,
    pub(super) transactions: bool,
}

/// Why a new connection could not be set up.
pub(super) enum SetUpFailure {
    /// It failed (or the connect did): callers that queued behind it share the error.
    Connection(RedisError),
    /// What it reached is not a primary ([`Reach::check_role`]): the next caller asks again.
    NotPrimary(BackendError),
}

/// Whether a connection's user may run a transaction (`MULTI` … `EXEC`).
///
/// Asked once per new connection, before it is shared, so that no transaction is sent that
/// the server refuses: a refused `MULTI` lets the commands queued behind it run at once,
/// outside any transaction (a `SET` then takes a lock nobody knows about), and the `redis`
/// crate's connection cannot read the replies that follow. The question never leaves the
/// connection inside a transaction: a bare `EXEC` first (allowed: "EXEC without MULTI";
/// refused: `NOPERM`), and only when that is allowed, `MULTI` then `EXEC`, each reply read on
/// its own. Any other answer (a proxy that knows no transactions, say) counts as refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Transactions {
    /// No connection has asked yet.
    Unknown = 0,
    /// `MULTI` and `EXEC` both run.
    Allowed = 1,
    /// One of them is refused (or the store sends no transactions and did not ask).
    Refused = 2,
}

impl Transactions {
    pub(super) fn from_u8(value: u8) -> Self {
        match value {
            1 => Self::Allowed,
            2 => Self::Refused,
            _ => Self::Unknown,
        }
    }

    /// Asks the server over `connection`: `Ok(None)` when transactions may be sent, else the
    /// command refused (or the answer that was not the expected one). An error means the
    /// connection failed.
    pub(super) async fn ask(
        connection: &mut MultiplexedConnection,
    ) -> Result<Option<String>, RedisError> {
        match redis::cmd("EXEC")
            .query_async::<redis::Value>(connection)
            .await
        {
            Err(err) if err.code() == Some("ERR") && err.to_string().contains("without MULTI") => {}
            Err(err) if matches!(err.kind(), ErrorKind::Server(_)) => {
                return Ok(Some(format!("EXEC ({err})")))
            }
            Err(err) => return Err(err),
            Ok(other) => return Ok(Some(format!("EXEC (answered {other:?})"))),
        }
        let mut transaction = redis::pipe();
        transaction.cmd("MULTI").cmd("EXEC").ignore_errors();
        let replies: Vec<redis::Value> = transaction.query_async(connection).await?;
        match replies.as_slice() {
            [redis::Value::Okay, redis::Value::Array(done)] if done.is_empty() => Ok(None),
            [redis::Value::ServerError(err), _] => Ok(Some(format!("MULTI ({err:?})"))),
            _ => Ok(Some(format!("MULTI/EXEC (answered {replies:?})"))),
        }
    }
}

impl Reach {
    /// Connects and sets the new connection up (see [`Reach`]).
    pub(super) async fn connect(self: Arc<Self>) -> Result<Connected, SetUpFailure> {
        let failed = SetUpFailure::Connection;
        let server = self.endpoint.resolve().await.map_err(failed)?;
        let mut connection = server
            .get_multiplexed_async_connection_with_config(&self.connection_config)
            .await
            .map_err(failed)?;
        let address = server.get_connection_info().addr().to_string();
        if self.require_primary {
            self.check_role(&mut connection)
                .await
                .map_err(SetUpFailure::NotPrimary)?;
        }
        let server_side = self.close_replaced(&mut connection).await.map_err(failed)?;
        let transactions = self
            .check_transactions(&mut connection)
            .await
            .map_err(failed)?;
        Ok(Connected {
            connection,
            address,
            server_side,
            transactions,
        })
    }

    /// On a new connection, before it is used: has the server close the connections it
    /// replaces, then asks how the server knows this one. An error means the new connection
    /// failed too (the replaced ones stay listed).
    pub(super) async fn close_replaced(
        &self,
        connection: &mut MultiplexedConnection,
    ) -> Result<Option<ServerSideClient>, RedisError> {
        self.kill_replaced(connection).await?;
        match redis::cmd("CLIENT")
            .arg("INFO")
            .query_async::<String>(connection)
            .await
        {
            Ok(info) => Ok(ServerSideClient::parse(&info)),
            Err(err) if is_refusal(&err) => {
                tracing::warn!(target: crate::telemetry::LOG_TARGET, server = %self.server,
                    "could not learn this connection's id on the server ({err}), so it cannot be \
                     closed there if it is replaced: a request held up on it may take a lock \
                     after its clean-up. Allow the user `CLIENT INFO` and `CLIENT KILL`"
                );
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    /// Has the server close the connections given up on (this node's or a sibling's) over
    /// `connection`. An error means `connection` failed (the replaced ones stay listed); a
    /// refusal (an ACL without `CLIENT`, a server before 6.2) is logged, and a request held up
    /// on a replaced connection may then still run later — its grant then lasts until its
    /// lease runs out.
    pub(super) async fn kill_replaced(
        &self,
        connection: &mut MultiplexedConnection,
    ) -> Result<(), RedisError> {
        if !self.replaced.pending() {
            return Ok(());
        }
        // Copied, not taken: if this is cancelled midway, the list is still there for the
        // next request. Those closed here are removed below.
        let replaced = self.replaced.list().clone();
        if replaced.is_empty() {
            return Ok(());
        }
        let mut kills = redis::pipe();
        for old in &replaced {
            kills
                .cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(old.id)
                .arg("ADDR")
                .arg(&old.addr)
                .arg("SKIPME")
                .arg("yes")
                .ignore();
        }
        match kills.exec_async(connection).await {
            Ok(()) => {}
            Err(err) if is_refusal(&err) => {
                tracing::warn!(target: crate::telemetry::LOG_TARGET, server = %self.server,
                    "could not close replaced connections on the server ({err}); a request held \
                     up on one may still take a lock after its clean-up, which then lasts until \
                     its lease runs out. Allow the user `CLIENT KILL` to close this gap"
                )
            }
            Err(err) => return Err(err),
        }
        self.replaced.closed(&replaced);
        Ok(())
    }

    /// On a new connection, before it is used: whether a first try may be a transaction
    /// there ([`Transactions`]), remembered for the next first tries. A node that does not ask
    /// (its store's tokens come from counters) sends none. A refusal is warned about once:
    /// locking goes on with the script.
    pub(super) async fn check_transactions(
        &self,
        connection: &mut MultiplexedConnection,
    ) -> Result<bool, RedisError> {
        if !self.asks_transactions {
            self.transactions
                .store(Transactions::Refused as u8, Ordering::Relaxed);
            return Ok(false);
        }
        let refused = Transactions::ask(connection).await?;
        let found = match &refused {
            None => Transactions::Allowed,
            Some(_) => Transactions::Refused,
        };
        self.transactions.store(found as u8, Ordering::Relaxed);
        if let Some(refused) = &refused {
            if !self.warned_transactions.swap(true, Ordering::Relaxed) {
                tracing::warn!(target: crate::telemetry::LOG_TARGET, server = %self.server,
                    "the server does not let this user run a transaction: {refused}. A write \
                     lock's first try is then a script call instead of `MULTI`/`EXEC` (a few \
                     microseconds of server time more per uncontended lock); grant `MULTI` and \
                     `EXEC` in the user's ACL (`ACL SETUSER <user> +multi +exec`) to avoid it"
                );
            }
        }
        Ok(refused.is_none())
    }

    /// Makes sure a new connection reached a primary: a sentinel's answer may be stale during
    /// a failover, and a Redlock master that is a replica would defeat the algorithm.
    pub(super) async fn check_role(
        &self,
        connection: &mut MultiplexedConnection,
    ) -> Result<(), BackendError> {
        let role = redis::cmd("ROLE")
            .query_async::<redis::Value>(connection)
            .await
            .map_err(connect_error)?;
        let role = match role {
            redis::Value::Array(items) => match items.into_iter().next() {
                Some(redis::Value::BulkString(bytes)) => {
                    String::from_utf8_lossy(&bytes).into_owned()
                }
                Some(redis::Value::SimpleString(text)) => text,
                _ => String::new(),
            },
            _ => String::new(),
        };
        let mut refusal = self.refusal.lock().unwrap_or_else(PoisonError::into_inner);
        if role == "master" {
            *refusal = None;
            return Ok(());
        }
        let advice = if self.endpoint.is_sentinel() {
            "the sentinels named a server that is not the primary (a failover is under way); \
             the next request asks them again"
        } else {
            "Redlock needs independent masters: replication defeats the algorithm (a replica \
             promoted after a crash can grant a lock its master granted); list only masters"
        };
        let message = format!("{} reports the role `{role}`: {advice}", self.server);
        *refusal = Some(message.clone());
        Err(BackendError::new(
            "connect",
            BackendErrorKind::Unavailable,
            message,
        ))
    }
}
