//! How a [`Node`] sends a request on its connection in use, as the Redis store's [`Transport`]:
//! sent once more on a new connection when one in use before turns out broken, cut off at the
//! try's cut by the connection's own timer, and followed by `WAIT` on the same connection with
//! the failover guard. Neighbours: `connection.rs` hands out the connection in use and
//! discards a broken one; `failure.rs` says what a failed request means.

use std::sync::atomic::Ordering;
use std::time::Instant;

use redis::{ErrorKind, FromRedisValue, RedisError, ServerErrorKind};

use super::failure::Failure;
use super::transactions::Transactions;
use super::{InUse, Node};
use crate::config::ReplicaGuard;
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::kind;
use crate::protocol::{Announce, Call};
use crate::store::transport::{replicated, ScanStep, Transport};

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
