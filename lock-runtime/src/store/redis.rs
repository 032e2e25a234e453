//! The Redis store: the one implementation of the store contract ([`Store`]) for Redis,
//! over a [`Transport`] that carries its requests — one server ([`Node`], `connection.rs`: a
//! fixed server, Sentinel's primary, each Redlock master) or a Redis Cluster (`cluster.rs`).
//! It sends what the kinds and the key operations build; it splits batches per hash slot
//! where the transport routes by slot; and with the failover guard ([`ReplicaGuard`]) a
//! grant, renewal or guarded write counts only once `WAIT` reports enough replicas have it,
//! such a write running on a transport lent to it alone (`guarded.rs`), as its `WAIT` blocks
//! the connection. This file holds the store and how it sends a call; its operations are in
//! `redis/`: `tries.rs` (one key's try, several keys'), `renewals.rs`, `releases.rs` and
//! `operator.rs` (the key operations, the scan). Redlock (`redlock.rs`) runs one of these per
//! master.

mod operator;
mod releases;
mod renewals;
mod tries;

mod first_try;

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{BoxStream, FuturesUnordered, StreamExt};
use redis::cluster_routing::Slot;
use redis::FromRedisValue;
use tokio::runtime::Handle;

use super::connection::Node;
use super::endpoint::Endpoint;
use super::guarded::Guarded;
use super::transport::{Answered, Transport};
use super::{Found, Store};
use crate::clock::Clock;
use crate::config::ReplicaGuard;
use crate::error::LockError;
use crate::key_operation::KeyOperation;
use crate::kind::multi::{MultiReply, MultiTry};
use crate::kind::Tokens;
use crate::kind::{Holding, Renewal, Try};
use crate::protocol::{AcquireReply, Call, LockKey, Renewed};
use crate::store::pubsub::{Announcer, PubSub};
use crate::wake::ReleaseListener;

/// How a Redis store connects and what it checks.
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

/// The Redis store over the transport `T`.
pub(crate) struct RedisStore<T> {
    transport: T,
    /// The failover guard.
    guard: Option<ReplicaGuard>,
    /// The transports the guarded writes borrow, so that their `WAIT` holds up nothing else.
    guarded: Guarded<T>,
    /// Where fencing tokens come from: the clock, or (Redlock's masters) the counter.
    tokens: Tokens,
    /// Wake-ups on release (none on a Redlock master: Redlock listens on any one master).
    waker: Option<ReleaseListener>,
    /// Whether a try ends at its cut ([`Try::cut`]) here, in the transport's own timers
    /// ([`Transport::CUTS_AT_CUT`]), so that the acquire loop need not cut it off from outside:
    /// without a failover guard (whose give-back of a grant too few replicas have would run
    /// past it), and not on a Redlock master (whose round decides what a late master means).
    cuts_tries: bool,
}

/// The store on one server.
pub(crate) type NodeStore = RedisStore<Node>;

impl NodeStore {
    pub(crate) fn new(endpoint: Endpoint, options: NodeOptions, io: Handle) -> Self {
        let endpoint = Arc::new(endpoint);
        let waker = options.wake_ups.then(|| {
            PubSub::listener(
                vec![Announcer::Node(endpoint.clone())],
                io.clone(),
                options.connect_timeout,
                options.response_timeout,
            )
        });
        let node = Node::new(
            endpoint,
            options.connect_timeout,
            options.response_timeout,
            options.require_primary,
            options.tokens == Tokens::Clock,
            io,
        );
        Self::over(node, options.guard, options.tokens, waker)
    }

    /// The server's connection (Redlock connects its masters before a try, and asks whether
    /// each is a primary).
    pub(crate) fn node(&self) -> &Node {
        &self.transport
    }
}

impl<T: Transport> RedisStore<T> {
    pub(crate) fn over(
        transport: T,
        guard: Option<ReplicaGuard>,
        tokens: Tokens,
        waker: Option<ReleaseListener>,
    ) -> Self {
        Self {
            transport,
            guard,
            guarded: Guarded::new(),
            tokens,
            waker,
            cuts_tries: T::CUTS_AT_CUT && guard.is_none(),
        }
    }

    /// The store as a Redlock master: its tries run past their cut, which Redlock's round
    /// takes care of.
    pub(crate) fn not_cutting_tries(mut self) -> Self {
        self.cuts_tries = false;
        self
    }

    /// Runs a script, without the failover guard.
    pub(crate) async fn invoke<R: FromRedisValue + Send>(
        &self,
        operation: &'static str,
        invocation: crate::script::ScriptCall,
    ) -> Result<R, LockError> {
        Ok(self
            .transport
            .call(operation, Call::Script(&invocation), None, |_| false)
            .await?
            .0)
    }

    /// Sends a write under the failover guard, if there is one: then on a transport of its
    /// own, lent for the write ([`Guarded`]), since its `WAIT` blocks the connection it is
    /// sent on. The flag says whether enough replicas acknowledged it.
    async fn call_guarded<R: FromRedisValue + Send>(
        &self,
        operation: &'static str,
        call: Call<'_>,
        needs_wait: impl Fn(&R) -> bool + Send,
    ) -> Result<(R, bool), LockError> {
        self.call_guarded_by(operation, call, None, needs_wait)
            .await
    }

    /// [`call_guarded`](Self::call_guarded) for a try that must end by `deadline` (a lock
    /// request's wait): its `WAIT` gives up in time for its reply to come back before it
    /// ([`ReplicaGuard::by`]).
    async fn call_guarded_by<R: FromRedisValue + Send>(
        &self,
        operation: &'static str,
        call: Call<'_>,
        deadline: Option<std::time::Instant>,
        needs_wait: impl Fn(&R) -> bool + Send,
    ) -> Result<(R, bool), LockError> {
        let Some(guard) = self.guard.map(|guard| guard.by(deadline)) else {
            return self
                .transport
                .call_by(
                    operation,
                    call,
                    deadline.filter(|_| self.cuts_tries),
                    needs_wait,
                )
                .await;
        };
        let lent = self.guarded.lend(&self.transport).await;
        let replied = lent.call(operation, call, Some(guard), needs_wait).await;
        lent.give_back();
        replied
    }

    /// Sends independent script calls ([`Transport::call_each`]) under the failover guard, if
    /// there is one, and yields each call's answer as it comes. A Cluster sends them as one
    /// pipeline per primary, each ending with one `WAIT`, on the transport `lent` for all of
    /// them; elsewhere each call is a request of its own on a transport lent for it
    /// ([`call_guarded`](Self::call_guarded)), so that no call's `WAIT` queues behind another's
    /// on a shared connection.
    fn call_each_guarded<'a, R: FromRedisValue + Send + 'a>(
        &'a self,
        operation: &'static str,
        calls: &'a [crate::script::ScriptCall],
        lent: Option<&'a T>,
    ) -> BoxStream<'a, Answered<R>> {
        match (self.guard, lent) {
            (None, _) => self.transport.call_each(operation, calls, None).boxed(),
            (Some(guard), Some(lent)) => lent.call_each(operation, calls, Some(guard)).boxed(),
            (Some(_), None) => calls
                .iter()
                .enumerate()
                .map(|(i, call)| async move {
                    let answer = self
                        .call_guarded(operation, Call::Script(call), |_: &R| true)
                        .await;
                    (i, answer)
                })
                .collect::<FuturesUnordered<_>>()
                .boxed(),
        }
    }

    /// The end of the run of `keys` from `start` that one call may name: all of them, unless
    /// the transport routes by slot (then those in the slot of `keys[start]`).
    fn one_call_until(keys: &[LockKey], start: usize) -> usize {
        if !T::ROUTES_BY_SLOT {
            return keys.len();
        }
        let slot = Slot::for_key(&keys[start].lock);
        keys[start..]
            .iter()
            .position(|key| Slot::for_key(&key.lock) != slot)
            .map_or(keys.len(), |n| start + n)
    }
}

/// Each operation as the module that holds it does it.
impl<T: Transport> Store for RedisStore<T> {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        self.try_one(attempt).await
    }

    async fn release(
        &self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
    ) -> Result<bool, LockError> {
        self.give_back(holding, key, owner, true).await
    }

    /// One call for every [`MOST_PER_CALL`](renewals::MOST_PER_CALL) leases, on a Cluster per slot, all at once.
    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        let mut answers = vec![Renewed::Unknown; leases.len()];
        self.renew_all(leases, &mut |i, renewed| answers[i] = renewed)
            .await?;
        Ok(answers)
    }

    /// As [`extend_many`](Self::extend_many), each call's leases reported as it is answered.
    async fn extend_many_as_answered(
        &self,
        leases: &[Renewal<'_>],
        report: &mut (dyn FnMut(usize, Renewed) + Send),
    ) -> Result<(), LockError> {
        self.renew_all(leases, report).await
    }

    async fn acquire_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        self.try_all(attempt).await
    }

    async fn release_all(&self, keys: &[&LockKey], owner: &str) -> Result<bool, LockError> {
        self.give_back_all(keys, owner, true).await
    }

    async fn run<O: KeyOperation>(&self, operation: &O) -> Result<O::Output, LockError> {
        self.run_script(operation).await
    }

    async fn scan_into(&self, pattern: &str, found: &mut Found) -> Result<(), LockError> {
        self.scan_shards(pattern, found).await
    }

    /// Whether the transport's servers answer a `PING` ([`Transport::ping`]).
    async fn ping(&self) -> Result<(), LockError> {
        self.transport.ping().await
    }

    fn waker(&self) -> Option<&ReleaseListener> {
        self.waker.as_ref()
    }

    /// Redis expires keys in real time.
    fn clock(&self) -> Clock {
        Clock::Real
    }

    /// Where the transport cuts a try at its cut itself ([`Transport::CUTS_AT_CUT`]),
    /// without a failover guard, and not on a Redlock master.
    fn cuts_tries(&self) -> bool {
        self.cuts_tries
    }
}
