//! The Redis store: the one implementation of the store contract ([`Store`]) and the
//! operator's calls for Redis, over a [`Transport`] that carries its requests — one server
//! ([`Node`], `connection.rs`: a fixed server, Sentinel's primary, each Redlock master) or a
//! Redis Cluster (`cluster.rs`). It sends what the kinds build (`kind/`): a write lock's first
//! try without a script ([`FirstTry`]) where the transport allows it, the kind's script
//! otherwise; it splits batches per hash slot where the transport routes by slot, undoing the
//! slots already taken when a later one is held, and hands a renewal's per-slot calls to the
//! transport all at once ([`Transport::call_each`]: one request per Cluster primary), handing
//! each lease's outcome back as its call is answered (`extend_many_as_answered`); and with the failover guard
//! ([`ReplicaGuard`]) a grant or renewal counts only once `WAIT` reports enough replicas have
//! it (a grant that too few acknowledged is given back and reported as held, so the acquire
//! loop tries again within its wait; such a renewal is an error); such a write runs on a
//! transport lent to it alone (`guarded.rs`), as its `WAIT` blocks the connection. Redlock (`redlock.rs`) runs
//! one of these per master.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{BoxStream, FuturesUnordered, StreamExt};
use redis::cluster_routing::Slot;
use redis::{ErrorKind, FromRedisValue, RedisError, ServerErrorKind};
use tokio::runtime::Handle;

use super::connection::Node;
use super::endpoint::Endpoint;
use super::guarded::Guarded;
use super::transport::{Answered, Transport};
use super::{Found, Store};
use crate::clock::Clock;
use crate::config::ReplicaGuard;
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::key_operation::KeyOperation;
use crate::kind::multi::{MultiReply, MultiTry};
use crate::kind::{self, multi, FirstTry, ScriptReply, Tokens};
use crate::kind::{Holding, Renewal, Try};
use crate::protocol::Announce;
use crate::protocol::{AcquireReply, Call, LockKey, Renewed};
use crate::store::wake::{Announcer, ReleaseListener};

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
            ReleaseListener::new(
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

    /// Sends a try's request under the failover guard. A transport that hides its own retries
    /// may have run a try that failed: its failure says so, and the acquire loop cleans up.
    async fn send_try<R: FromRedisValue + Send>(
        &self,
        call: Call<'_>,
        deadline: Option<std::time::Instant>,
        needs_wait: impl Fn(&R) -> bool + Send,
    ) -> Result<(R, bool), LockError> {
        self.call_guarded_by("acquire", call, deadline, needs_wait)
            .await
            .map_err(Self::unseen_retries)
    }

    /// A try's failure as the acquire loop must take it: one that may have run, where the
    /// transport retries unseen.
    fn unseen_retries(err: LockError) -> LockError {
        if T::RETRIES_UNSEEN {
            super::ambiguous(err)
        } else {
            err
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

/// The two forms of a try (`acquire` picks one).
impl<T: Transport> RedisStore<T> {
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
        let (reply, replicated) = match self.send_try(first.call(), attempt.cut, granted).await {
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
        let call = attempt.call(self.tokens, T::ANNOUNCE);
        self.send_try(Call::Script(&call), attempt.cut, |reply: &ScriptReply| {
            reply.granted == 1
        })
        .await
    }
}

/// The first refusal among a pipeline's replies (sent with `ignore_errors`, so that a refused
/// command is a reply, not the pipeline's error), or a command's own: it did not run.
fn refusal_in(reply: &redis::Value) -> Option<RedisError> {
    let refusal = |item: &redis::Value| match item {
        redis::Value::ServerError(err) if err.code() == "NOPERM" => {
            Some(RedisError::from(err.clone()))
        }
        _ => None,
    };
    match reply {
        redis::Value::Array(items) => items.iter().find_map(refusal),
        // A command's reply, sent alone.
        reply => refusal(reply),
    }
}

/// The failover guard's rule: a write counts only once enough replicas have it.
impl<T: Transport> RedisStore<T> {
    /// A try's reply under the failover guard: a grant that too few replicas acknowledged is
    /// given back (a failover now could hand the lock out again) and reported as held, so the
    /// acquire loop tries again within its wait.
    async fn count_only_replicated(
        &self,
        attempt: &Try<'_>,
        reply: AcquireReply,
        replicated: bool,
    ) -> Result<AcquireReply, LockError> {
        if replicated || !matches!(reply, AcquireReply::Acquired(_)) {
            return Ok(reply);
        }
        // The grant exists: if giving it back fails, the acquire loop must clean it up.
        self.release(attempt.grant(), attempt.key, attempt.owner)
            .await
            .map_err(super::ambiguous)?;
        Ok(AcquireReply::Held(None))
    }
}

/// A renewal's answers under the failover guard: none counts unless enough replicas
/// acknowledged it.
fn count_only_replicated_renewals(
    renewed: Vec<Renewed>,
    replicated: bool,
) -> Result<Vec<Renewed>, LockError> {
    if replicated {
        return Ok(renewed);
    }
    Err(BackendError::new(
        "renew",
        BackendErrorKind::Unreplicated,
        "too few replicas acknowledged the renewal within the failover guard's timeout, so it \
         does not count",
    )
    .into())
}

/// The parts of a batch: one call each.
impl<T: Transport> RedisStore<T> {
    /// Renews leases that one call may name (on a Cluster: of one slot).
    async fn renew(&self, batch: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        let (extended, replicated) = self
            .call_guarded(
                "renew",
                Call::Script(&kind::extend_many_call(batch)),
                |_| true,
            )
            .await?;
        let renewed = kind::read_extend_many_reply(batch.len(), extended)?;
        count_only_replicated_renewals(renewed, replicated)
    }

    /// The calls a renewal of `leases` takes, as indices into it: the leases one call may
    /// name (all of them, or a slot's where the transport routes by slot), at most
    /// [`MOST_PER_CALL`] each.
    fn renewal_calls(leases: &[Renewal<'_>]) -> Vec<Vec<usize>> {
        let groups: Vec<Vec<usize>> = if T::ROUTES_BY_SLOT {
            let mut by_slot: HashMap<Slot, Vec<usize>> = HashMap::new();
            for (i, renewal) in leases.iter().enumerate() {
                by_slot
                    .entry(Slot::for_key(&renewal.key.lock))
                    .or_default()
                    .push(i);
            }
            by_slot.into_values().collect()
        } else {
            vec![(0..leases.len()).collect()]
        };
        groups
            .iter()
            .flat_map(|group| group.chunks(MOST_PER_CALL).map(<[usize]>::to_vec))
            .collect()
    }

    /// The renewal of `leases` in [`renewal_calls`](Self::renewal_calls), all sent at once by
    /// [`Transport::call_each`] (on a Cluster one request per primary), each lease's outcome
    /// handed to `report` as soon as its call is answered: a server that answers late (a
    /// frozen Cluster primary, or one whose `WAIT` waits for a lagging replica) delays only
    /// the leases it holds. A call that fails (its shard is failing over, say) leaves its
    /// leases unknown, not the leases of the others; a call refused only for naming its keys
    /// together (a half-moved slot) goes again as one call per lease ([`goes_one_by_one`]).
    /// Every lease is reported once; the error says why, when nothing was learnt of any.
    async fn renew_all(
        &self,
        leases: &[Renewal<'_>],
        report: &mut (dyn FnMut(usize, Renewed) + Send),
    ) -> Result<(), LockError> {
        let slots = Self::renewal_calls(leases);
        let batches: Vec<Vec<Renewal<'_>>> = slots
            .iter()
            .map(|indices| indices.iter().map(|&i| leases[i]).collect())
            .collect();
        let calls: Vec<_> = batches
            .iter()
            .map(|batch| kind::extend_many_call(batch))
            .collect();
        // Under the guard, a Cluster's pipelines share one transport lent for the batch.
        let lent = match self.guard {
            Some(_) if T::ROUTES_BY_SLOT => Some(self.guarded.lend(&self.transport).await),
            _ => None,
        };
        let mut outcomes = self
            .call_each_guarded::<Vec<i64>>("renew", &calls, lent.as_deref())
            .map(|(at, reply)| {
                let batch = &batches[at];
                async move {
                    let renewed = reply.and_then(|(extended, replicated)| {
                        count_only_replicated_renewals(
                            kind::read_extend_many_reply(batch.len(), extended)?,
                            replicated,
                        )
                    });
                    let renewed = match renewed {
                        Err(err)
                            if T::ROUTES_BY_SLOT && batch.len() > 1 && goes_one_by_one(&err) =>
                        {
                            self.renew_one_by_one(batch, err).await
                        }
                        // Anything else (a timeout, a broken or refused connection, too few
                        // replicas): the leases are unknown this round and the watchdog tries
                        // again, rather than sending the sick server one request per lease.
                        renewed => renewed,
                    };
                    (at, renewed)
                }
            })
            .buffer_unordered(calls.len().max(1));
        let mut learnt = false;
        let mut failure = None;
        while let Some((at, outcome)) = outcomes.next().await {
            match outcome {
                Ok(renewed) => {
                    for (&i, renewed) in slots[at].iter().zip(renewed) {
                        learnt |= renewed != Renewed::Unknown;
                        report(i, renewed);
                    }
                }
                Err(err) => {
                    for &i in &slots[at] {
                        report(i, Renewed::Unknown);
                    }
                    failure.get_or_insert(err);
                }
            }
        }
        drop(outcomes);
        if let Some(lent) = lent {
            lent.give_back();
        }
        // Nothing learnt at all: say why.
        match failure {
            Some(err) if !learnt => Err(err),
            _ => Ok(()),
        }
    }

    /// Renews each of `batch` with a call of its own, after the call for all of them was
    /// refused with `err` for the keys it named together ([`goes_one_by_one`]; `err` is the
    /// answer when none of these goes through either).
    async fn renew_one_by_one(
        &self,
        batch: &[Renewal<'_>],
        err: LockError,
    ) -> Result<Vec<Renewed>, LockError> {
        let first = batch
            .first()
            .map_or("", |renewal| renewal.key.name.as_str());
        tracing::trace!(target: crate::telemetry::LOG_TARGET, leases = batch.len(), first, "renew: {} leases one by one after: {err}", batch.len());
        let singles = batch
            .iter()
            .map(|renewal| self.renew(std::slice::from_ref(renewal)));
        let renewed: Vec<Renewed> = futures_util::future::join_all(singles)
            .await
            .into_iter()
            .map(|single| match single.as_deref() {
                Ok([renewed]) => *renewed,
                _ => Renewed::Unknown,
            })
            .collect();
        if renewed.iter().all(|&r| r == Renewed::Unknown) {
            return Err(err);
        }
        Ok(renewed)
    }

    /// Gives back `owner`'s write lock of each of `keys` (which one call may name), announced
    /// as `announce` says; `true` when every one was still ours.
    async fn release_keys(
        &self,
        keys: &[&LockKey],
        owner: &str,
        announce: Option<Announce>,
    ) -> Result<bool, LockError> {
        let released: usize = self
            .invoke(
                "release",
                multi::release_call(keys.iter().copied(), owner, announce),
            )
            .await?;
        Ok(released == keys.len())
    }

    /// One call per slot, all slots at once.
    async fn release_per_slot(
        &self,
        keys: &[&LockKey],
        owner: &str,
        announce: Option<Announce>,
    ) -> Result<bool, LockError> {
        let mut by_slot: HashMap<Slot, Vec<&LockKey>> = HashMap::new();
        for &key in keys {
            by_slot
                .entry(Slot::for_key(&key.lock))
                .or_default()
                .push(key);
        }
        let calls = by_slot
            .into_values()
            .map(|slot_keys| async move { self.release_keys(&slot_keys, owner, announce).await });
        let mut all = true;
        for outcome in futures_util::future::join_all(calls).await {
            all &= outcome?;
        }
        Ok(all)
    }

    /// Releases `owner`'s grant (or seat) at `key`, the release announced when `announced`;
    /// `true` when it was still ours. Unannounced, it is a Redlock try's give-back on a master
    /// where the try fell short of a quorum (`redlock.rs`, `Undo`): the lock was free there only
    /// for that try, so no waiter was kept out of a lock it could take now (except in a split
    /// between waiters, which their backoff spreads). Announced, that give-back woke the waiters
    /// of the client giving it back, its own request among them: while a minority of masters
    /// held the lock for a lease, that request tried again after each give-back, a try every
    /// millisecond.
    pub(crate) async fn give_back(
        &self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
        announced: bool,
    ) -> Result<bool, LockError> {
        let announce = announced.then_some(T::ANNOUNCE);
        let released: i64 = self
            .invoke("release", holding.release_call(key, owner, announce))
            .await?;
        Ok(released == 1)
    }

    /// [`give_back`](Self::give_back) for `owner`'s write lock of each of `keys`; `true` when
    /// every one was still ours.
    pub(crate) async fn give_back_all(
        &self,
        keys: &[&LockKey],
        owner: &str,
        announced: bool,
    ) -> Result<bool, LockError> {
        let announce = announced.then_some(T::ANNOUNCE);
        if T::ROUTES_BY_SLOT {
            self.release_per_slot(keys, owner, announce).await
        } else {
            self.release_keys(keys, owner, announce).await
        }
    }
}

/// Whether a renewal call for several leases that failed with `err` is sent again as one call
/// per lease ([`RedisStore::renew_one_by_one`]): only when the server refused the call for
/// the keys it names together, which each lease's keys alone would not be refused for —
///
/// - `TRYAGAIN` ([`ServerErrorKind::TryAgain`]): the slot is half-moved by a migration and the
///   call names keys on both of its nodes (or some missing on the node asked); each lock's own
///   keys are all on one of them;
/// - `CROSSSLOT` ([`ServerErrorKind::CrossSlot`]): the call names keys of more than one slot.
///
/// Never after a timeout, an I/O error, a broken or refused connection, `CLUSTERDOWN`,
/// `READONLY`, `LOADING`, too few replicas (the failover guard) or any other server error:
/// those say the server is sick or busy, not that the call was too big, and one request per
/// lease would only load it more (the leases stay unknown this round; the watchdog tries
/// again while they may be in force). `MOVED`, `ASK`, `READONLY` and `NOSCRIPT` are followed by the
/// transport itself.
fn goes_one_by_one(err: &LockError) -> bool {
    let LockError::Backend(err) = err else {
        return false;
    };
    err.cause().downcast_ref::<RedisError>().is_some_and(|err| {
        matches!(
            err.kind(),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::CrossSlot)
        )
    })
}

/// Most leases one renewal call names: one script call holds the server for as long as it
/// runs (a few microseconds a lease).
pub(crate) const MOST_PER_CALL: usize = 256;

/// Keys asked for per `SCAN` step: a hint to the server, which bounds the work of one step.
pub(crate) const SCAN_COUNT: u64 = 1000;

impl<T: Transport> Store for RedisStore<T> {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        let transactions = self
            .transport
            .transactions_by(attempt.cut.filter(|_| self.cuts_tries))
            .await?;
        // Under the failover guard, a transport whose `WAIT` rides only behind a script sends
        // the script, whatever the try.
        let first = FirstTry::of(attempt, self.tokens, transactions)
            .filter(|_| T::WAITS_AFTER_ANY_REQUEST || self.guard.is_none());
        let tried = match &first {
            Some(first) => self.first_try(attempt, first).await?,
            None => None,
        };
        let (reply, replicated) = match tried {
            Some(tried) => tried,
            None => self.script_try(attempt).await?,
        };
        let reply = kind::read_acquire_reply(attempt, reply)?;
        self.count_only_replicated(attempt, reply, replicated).await
    }

    async fn release(
        &self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
    ) -> Result<bool, LockError> {
        self.give_back(holding, key, owner, true).await
    }

    /// One call for every [`MOST_PER_CALL`] leases, on a Cluster per slot, all at once.
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

    /// The keys one call may name in one script (every key on a server; a slot's on a
    /// Cluster), the calls one after another in the order of the try's keys (which keeps a
    /// slot's keys together: `crate::multi`). When a later call's keys are held, the keys
    /// already taken are given back before the answer, so a waiting request holds nothing; so
    /// are they when too few replicas acknowledged a call. A failed call that may have run is
    /// reported as such: the acquire loop then gives back every key in the background.
    async fn acquire_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        let keys = attempt.keys;
        let mut tokens = Vec::new();
        let mut start = 0;
        while start < keys.len() {
            let end = Self::one_call_until(keys, start);
            let part = attempt.part(&keys[start..end]);
            let call = multi::acquire_call(&part, self.tokens);
            let (reply, replicated): (Vec<i64>, bool) = match self
                .send_try(Call::Script(&call), attempt.cut, |reply: &Vec<i64>| {
                    reply.first() == Some(&1)
                })
                .await
            {
                Ok(reply) => reply,
                // The earlier calls' grants are given back here; an ambiguous try's clean-up
                // (the acquire loop's) gives back every key.
                Err(err) => {
                    if start > 0 && !super::is_ambiguous(&err) {
                        let taken: Vec<&LockKey> = keys[..start].iter().collect();
                        if let Err(undo) = self.release_all(&taken, attempt.owner).await {
                            // The request's own error is the answer; the grants given back
                            // here expire with their lease at the latest.
                            tracing::warn!(target: crate::telemetry::LOG_TARGET, "could not give back the keys of a refused multi-key try: {undo}");
                        }
                    }
                    return Err(err);
                }
            };
            let (undo, held) = match multi::read_acquire_reply(&part, &reply)
                .map_err(Self::unseen_retries)?
            {
                MultiReply::Acquired(part_tokens) if replicated => {
                    if tokens.is_empty() {
                        tokens = part_tokens;
                    } else {
                        tokens.extend(part_tokens);
                    }
                    start = end;
                    continue;
                }
                // Too few replicas acknowledged: this call's grant is given back too.
                MultiReply::Acquired(_) => (end, MultiReply::Held(None, start)),
                MultiReply::Held(remaining, at) => (start, MultiReply::Held(remaining, start + at)),
                MultiReply::TooLow(too_low) => (start, MultiReply::TooLow(too_low)),
            };
            if undo > 0 {
                let taken: Vec<&LockKey> = keys[..undo].iter().collect();
                self.release_all(&taken, attempt.owner)
                    .await
                    .map_err(super::ambiguous)?;
            }
            return Ok(held);
        }
        Ok(MultiReply::Acquired(tokens))
    }

    async fn release_all(&self, keys: &[&LockKey], owner: &str) -> Result<bool, LockError> {
        self.give_back_all(keys, owner, true).await
    }

    /// A lock's keys share one slot, so an operation on it is one script, on its shard in a
    /// Cluster; under the failover guard when the operation is a guarded write.
    async fn run<O: KeyOperation>(&self, operation: &O) -> Result<O::Output, LockError> {
        let call = operation.call(T::ANNOUNCE, self.tokens);
        let (reply, replicated) = if O::GUARDED {
            self.call_guarded(O::NAME, Call::Script(&call), O::wrote)
                .await?
        } else {
            (self.invoke(O::NAME, call).await?, true)
        };
        operation.read(reply, replicated)
    }

    /// `SCAN` on the server, or on every primary of a Cluster; never `KEYS`. Keys that are
    /// not UTF-8 are no lock keys and are skipped.
    async fn scan_into(&self, pattern: &str, found: &mut Found) -> Result<(), LockError> {
        for shard in self.transport.shards().await? {
            let mut cursor = 0u64;
            loop {
                let mut step = redis::cmd("SCAN");
                step.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let (next, keys) = self.transport.scan_step(&shard, &step).await?;
                found.extend(keys.into_iter().filter_map(|k| String::from_utf8(k).ok()));
                if found.full() {
                    return Ok(());
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(())
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
