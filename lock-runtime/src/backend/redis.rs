//! Redis node store: runs the kinds' Lua scripts (`kind/`) on one server, through its
//! connection (`connection.rs`: made on the client's I/O runtime and remade after it breaks,
//! a fixed server or the primary Sentinel names). Redlock (`redlock.rs`) runs one of these per
//! master. With the failover guard ([`ReplicaGuard`]) a grant or renewal counts only once
//! `WAIT` on the same connection reports enough replicas have it.

use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;
use tokio::runtime::Handle;

use super::connection::Node;
use super::endpoint::Endpoint;
use super::wake::{ReleaseListener, Transport};
use super::{
    AcquireReply, Announce, Call, Kind, LockBackend, LockKey, MultiReply, MultiTry, Renewal,
    Renewed, Try,
};
use crate::config::ReplicaGuard;
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::kind::operator::{self, RawHolder, RawView};
use crate::kind::{self, multi, FirstTry, ScriptReply, Tokens};

/// How a node store connects and what it checks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeOptions {
    pub(crate) response_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// Refuse a server that is not a primary (`ROLE`): Redlock masters. (A Sentinel endpoint
    /// is always checked.)
    pub(crate) require_primary: bool,
    /// The failover guard.
    pub(crate) guard: Option<ReplicaGuard>,
    /// Whether waiters subscribe to this server for wake-ups (not Redlock's masters: their
    /// store subscribes to any one of them).
    pub(crate) wake_ups: bool,
    /// Where fencing tokens come from: the clock, or (Redlock's masters) the counter.
    pub(crate) tokens: Tokens,
}

pub(crate) struct RedisBackend {
    node: Node,
    guard: Option<ReplicaGuard>,
    tokens: Tokens,
    waker: Option<ReleaseListener>,
}

impl RedisBackend {
    pub(crate) fn new(endpoint: Endpoint, options: NodeOptions, io: Handle) -> Self {
        let endpoint = Arc::new(endpoint);
        Self {
            waker: options.wake_ups.then(|| {
                ReleaseListener::new(
                    Transport::Node(endpoint.clone()),
                    io.clone(),
                    options.connect_timeout,
                    options.response_timeout,
                )
            }),
            guard: options.guard,
            tokens: options.tokens,
            node: Node::new(
                endpoint,
                options.connect_timeout,
                options.response_timeout,
                options.require_primary,
                options.tokens == Tokens::Clock,
                io,
            ),
        }
    }

    pub(crate) fn waker(&self) -> Option<&ReleaseListener> {
        self.waker.as_ref()
    }

    /// The server's connection (Redlock connects its masters before a try, and asks whether
    /// each is a primary).
    pub(crate) fn node(&self) -> &Node {
        &self.node
    }

    /// Runs a script, without the failover guard.
    pub(crate) async fn invoke<T: redis::FromRedisValue>(
        &self,
        operation: &'static str,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        Ok(self
            .node
            .call(operation, Call::Script(&invocation), None, |_| false)
            .await?
            .0)
    }
}

/// The first refusal among a pipeline's replies (sent with `ignore_errors`, so that a refused
/// command is a reply, not the pipeline's error): it means the command did not run.
pub(crate) fn refusal_in(reply: &redis::Value) -> Option<RedisError> {
    let redis::Value::Array(items) = reply else {
        return None;
    };
    items.iter().find_map(|item| match item {
        redis::Value::ServerError(err) if err.code() == "NOPERM" => {
            Some(RedisError::from(err.clone()))
        }
        _ => None,
    })
}

/// Keys asked for per `SCAN` step: a hint to the server, which bounds the work of one step.
pub(crate) const SCAN_COUNT: u64 = 1000;

/// One `SCAN` step's reply: the next cursor (0: done) and the keys found by this step.
type ScanStep = (u64, Vec<Vec<u8>>);

/// The two forms of a try (`acquire` picks one).
impl RedisBackend {
    /// A try as its [`FirstTry`] request; `None` when it was not sent because the connection
    /// made for it may not run a transaction (its user lost the right since the last one): the
    /// script takes over.
    async fn first_try(
        &self,
        attempt: &Try<'_>,
        first: &FirstTry,
    ) -> Result<Option<(ScriptReply, bool)>, LockError> {
        // A `WAIT` only after a grant; a reply that does not read is no grant.
        let granted = |reply: &redis::Value| {
            first
                .read(attempt.owner, reply)
                .is_ok_and(|(granted, _)| granted == 1)
        };
        let (reply, replicated) = match self
            .node
            .call("acquire", first.call(), self.guard, granted)
            .await
        {
            Ok(replied) => replied,
            Err(LockError::Backend(err)) if err.refused_command() == Some("multi") => {
                return Ok(None)
            }
            Err(err) => return Err(err),
        };
        if let Some(refused) = refusal_in(&reply) {
            return Err(BackendError::new("acquire", BackendErrorKind::Server, refused).into());
        }
        let (granted, value) = first.read(attempt.owner, &reply)?;
        Ok(Some((ScriptReply::from((granted, value)), replicated)))
    }

    /// A try as its kind's acquire script.
    async fn script_try(&self, attempt: &Try<'_>) -> Result<(ScriptReply, bool), LockError> {
        let call = attempt
            .kind
            .acquire_call(attempt, self.tokens, Announce::Publish);
        self.node
            .call(
                "acquire",
                Call::Script(&call),
                self.guard,
                |reply: &ScriptReply| reply.granted == 1,
            )
            .await
    }
}

/// The operator's operations (`Client::inspect`, `force_unlock`, `list`) on this server.
impl RedisBackend {
    /// What the server says of `key`'s lock (read-only).
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<RawView, LockError> {
        let call = operator::inspect_call(key, Announce::Publish, self.tokens);
        operator::read_inspect_reply(key, self.invoke("inspect", call).await?)
    }

    /// Frees `key`'s lock whatever holds it: the evicted holders and a fresh fencing token.
    pub(crate) async fn force_unlock(
        &self,
        key: &LockKey,
    ) -> Result<(Vec<RawHolder>, u64), LockError> {
        let call = operator::force_unlock_call(key, Announce::Publish, self.tokens);
        Ok(operator::read_force_unlock_reply(
            self.invoke("force unlock", call).await?,
        ))
    }

    /// Adds the keys matching `pattern` to `found` (`SCAN`, never `KEYS`), stopping once it
    /// holds `limit` keys or more. Keys that are not UTF-8 are no lock keys and are skipped.
    pub(crate) async fn scan(
        &self,
        pattern: &str,
        limit: usize,
        found: &mut Vec<String>,
    ) -> Result<(), LockError> {
        let mut cursor = 0u64;
        loop {
            let mut pipeline = redis::pipe();
            pipeline
                .cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let ((step,), _): ((ScanStep,), bool) = self
                .node
                .call("list", Call::Pipeline(&pipeline), None, |_| false)
                .await?;
            let (next, keys) = step;
            found.extend(keys.into_iter().filter_map(|k| String::from_utf8(k).ok()));
            if next == 0 || found.len() >= limit {
                return Ok(());
            }
            cursor = next;
        }
    }
}

impl LockBackend for RedisBackend {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        let first = FirstTry::of(attempt, self.tokens, self.node.transactions().await?);
        let tried = match &first {
            Some(first) => self.first_try(attempt, first).await?,
            None => None,
        };
        let (reply, replicated) = match tried {
            Some(tried) => tried,
            None => self.script_try(attempt).await?,
        };
        let reply = kind::read_acquire_reply(attempt, reply)?;
        super::count_only_replicated(self, attempt, reply, replicated).await
    }

    async fn release(&self, kind: Kind, key: &LockKey, owner: &str) -> Result<bool, LockError> {
        let released: i64 = self
            .invoke("release", kind.release_call(key, owner, Announce::Publish))
            .await?;
        Ok(released == 1)
    }

    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        let (extended, replicated) = self
            .node
            .call(
                "renew",
                Call::Script(&kind::extend_many_call(leases)),
                self.guard,
                |_| true,
            )
            .await?;
        let renewed = kind::read_extend_many_reply(leases.len(), extended)?;
        super::count_only_replicated_renewals(renewed, replicated)
    }
    async fn acquire_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        let call = multi::acquire_call(attempt, self.tokens);
        let (reply, replicated) = self
            .node
            .call(
                "acquire",
                Call::Script(&call),
                self.guard,
                |reply: &Vec<i64>| reply.first() == Some(&1),
            )
            .await?;
        let reply = multi::read_acquire_reply(attempt, &reply)?;
        if replicated || !matches!(reply, MultiReply::Acquired(_)) {
            return Ok(reply);
        }
        // Too few replicas acknowledged: given back, and reported as held (as
        // `count_only_replicated` does for one key).
        let keys: Vec<&LockKey> = attempt.keys.iter().collect();
        self.release_all(&keys, attempt.owner)
            .await
            .map_err(super::ambiguous)?;
        Ok(MultiReply::Held(None, 0))
    }

    async fn release_all(&self, keys: &[&LockKey], owner: &str) -> Result<bool, LockError> {
        let released: usize = self
            .invoke(
                "release",
                multi::release_call(keys.iter().copied(), owner, Announce::Publish),
            )
            .await?;
        Ok(released == keys.len())
    }
}
