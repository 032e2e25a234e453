//! How a [`Node`](super::Node)'s new connection is reached and set up before it is shared
//! (`connection.rs` keeps the connection in use): [`Reach`] connects (through the sentinels,
//! for a Sentinel endpoint), checks the role, has the server close the connections given up on
//! (`replaced.rs`) and asks whether the user may run transactions (`transactions.rs`), as a
//! task of its own that finishes the connection for the next caller when the one that started
//! it stops waiting.

use std::sync::atomic::{AtomicBool, AtomicU8};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError};

use super::failure::connect_error;
use super::replaced::{Replaced, ServerSideClient};
use crate::error::{BackendError, BackendErrorKind};
use crate::store::endpoint::Endpoint;

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
    /// Whether a new connection asks if transactions may be sent
    /// ([`Transactions`](super::transactions::Transactions)): only a store whose tokens come
    /// from the clock sends them.
    pub(super) asks_transactions: bool,
    pub(super) connection_config: AsyncConnectionConfig,
    /// The connection's response timeout, which a request cut off sooner sets lower
    /// ([`Node::call_by`](super::Node::call_by)).
    pub(super) response_timeout: Duration,
    /// Connections given up on that the server may still run requests from, shared with the
    /// node's siblings ([`Node::sibling`](super::Node::sibling)): the next request to the
    /// server, on whichever of them, has the server close them first.
    pub(super) replaced: Arc<Replaced>,
    /// What the last connection found out about transactions
    /// ([`Transactions`](super::transactions::Transactions) as a `u8`), read by a first try
    /// before it picks its request.
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
