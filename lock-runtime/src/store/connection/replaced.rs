//! The connections to one server given up on ([`Replaced`], each known by its
//! [`ServerSideClient`]), which the server closes (`CLIENT KILL`) before it runs anything else
//! of ours: a request still under way on one (held up in the network, say) can then no longer
//! run after the requests that follow, such as the compare-and-delete that gives back a grant
//! whose reply never came. Neighbours: `connection.rs` lists a connection here when it
//! discards it; `reach.rs` closes them on a new connection, and a request on one in use
//! (`requests.rs`) before it is sent.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use redis::aio::MultiplexedConnection;
use redis::RedisError;

use super::failure::is_refusal;
use super::reach::Reach;

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

impl Reach {
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
}
