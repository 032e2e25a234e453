//! Whether a connection's user may run a transaction ([`Transactions`]), asked of each new
//! connection before it is shared (a write lock's first try is a `MULTI`/`EXEC` where it may
//! be, and the script otherwise). Neighbours: `reach.rs` asks on each new connection; a first
//! try reads the answer through the node (`requests.rs`).

use std::sync::atomic::Ordering;

use redis::aio::MultiplexedConnection;
use redis::{ErrorKind, RedisError};

use super::reach::Reach;

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
}
