//! Redlock store: a lock over N independent Redis masters (N odd, at least 3), each a Redis
//! store on one server (`redis.rs` over `connection.rs`, which refuses a master that reports
//! itself a replica). Every operation goes to all masters at once with a per-master timeout far
//! below the lease ([`Config::node_timeout`](crate::Config::node_timeout)); a grant stands only
//! when a majority (N/2+1) granted it within its validity (lease − elapsed − drift), and a try
//! that falls short is undone on every master: one tally ([`RedlockStore::tally`]) for one
//! key and for several. Renewals need a majority too. The kinds' scripts run unchanged on each
//! master.
//!
//! **Fencing tokens.** A write grant's token is proposed by the client, the same number T to
//! every master of a try (`scripts/write/acquire.lua`, counter tokens): a master grants T only
//! when its live counter for the key is below T and its clock in microseconds has not passed
//! T, and then sets its counter to T until its own clock has passed T by one more lease;
//! otherwise it writes nothing and refuses with the least token it would take (the hint). A
//! grant stands on a quorum Q whose counters all hold T. A later write grant T' stands on a
//! majority Q' that shares a master m with Q; m granted T' only above its live counter,
//! which is T or higher (counters only go up), or, once that counter had lapsed, at or above
//! its clock, which had passed T (the counter lived until then). So T' > T without a second
//! round, and without the masters' or clients' clocks agreeing. The argument needs masters
//! that keep their counters: a master restarted empty has none, and grants whatever is at or
//! above its clock, so it must stay down longer than the tokens it granted ran ahead of its
//! clock (Redlock's delayed restart; with clocks that agree, [`MAX_TOKEN_LEAD`] after its last
//! grant, and a lease for the grant itself; before, a restart needed the masters' clocks to
//! agree within a lease). The proposal is the client's clock plus a lead
//! ([`RedlockStore::propose`]): at first the node timeout, so a master whose clock agrees
//! and which answers in time takes it; raised for good by a refusal to what the refusing
//! master's clock showed plus the node timeout, or to what its counter showed (another
//! client's lead) — so a client whose clock lags pays a second round once, not on every grant,
//! and two clients' leads never climb over each other — but never past [`MAX_TOKEN_LEAD`] (a
//! second), whatever the settings: `Config` refuses a node timeout above it
//! ([`MAX_NODE_TIMEOUT`](crate::MAX_NODE_TIMEOUT)), and a clock further off costs a second
//! round on each grant, and a warning. So a counter lives at most [`MAX_TOKEN_LEAD`] longer
//! than a lease after the grant that set it (the lease past its token). The second round
//! keeps the try's owner token, so it is sent only once every undo of the first has been
//! answered (a late undo would give the new grant back); otherwise the try is refused and the
//! acquire loop tries again with a new owner. A try that masters refused as too low — so many that the rest fell short, or any at all while the rest granted (a grant's
//! token is then at least what every master that answered would take, which keeps the
//! masters' counters together) — is undone and tried again at once with the largest hint
//! (and at least a fresh proposal): the rare second round. It keeps to the request's wait
//! ([`Try::deadline`]): the wait for connects before the first round lasts at most until the
//! deadline, the undo and the second round at most until one node timeout past it, so a try
//! ends within one node timeout of it as on the other stores; a first
//! round that a quorum granted is sent again only while the wait lasts (else its grant
//! stands), and a try left without the time for its second round is refused, for the acquire
//! loop to try again at once or time out. A read grant carries
//! the largest latest-write token of its quorum (a master without a live counter answers its
//! clock), which for the same reason is at least every write token handed out before it (it
//! may be higher than any handed out: a write try that fell short and was undone left its T in
//! the counters it reached, which only ever go up). When those counters are on a minority
//! that a later write grant's quorum avoids, the read's token may exceed that later write
//! token too — by less than [`MAX_TOKEN_LEAD`], plus however far the clocks of clients and
//! masters disagree (and without bound past a counter set by hand): every proposal, and so
//! every counter, is at most its client's clock plus [`MAX_TOKEN_LEAD`] (a second round's
//! floor is a counter or a master's clock plus one), while a later proposal is above its
//! client's clock. `force_unlock` still raises a majority's
//! counters in a round of its own (`scripts/redlock/raise_fence.lua`, with a grant's expiry
//! rule). Wake-ups come from a subscription on every master that answers: each master that
//! held the grant announces its release (the release script), and a waiter woken by the first
//! master's announcement, refused because another had not released yet, is woken again by
//! that one's (`wake.rs`); a try that fell short gives back unannounced ([`Undo`]); the
//! backoff covers the rest.
//!
//! **Semaphores.** A permit needs more than a majority (the kind's `quorum`): each master counts
//! at most N holders, and permits taken by bare majorities could admit up to about 2N − 1
//! holders. A permit is granted (and renewed) by `q > N · masters / (N + 1)` masters, so N + 1
//! holders cannot each hold `q`; with 3 masters and N ≥ 2 that is every master.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::script::LuaScript;
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::runtime::Handle;
use tokio::sync::Notify;

use super::endpoint::Endpoint;
use super::redis::{NodeOptions, NodeStore};
use super::{Found, Store};
use crate::clock::{drift, Clock};
use crate::config::MAX_TOKEN_LEAD;
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::key_operation::{KeyOperation, NoAgreement};
use crate::kind::multi::{MultiReply, MultiTry};
use crate::kind::{self, write::fence_ttl, Refusals, TokenRule, Tokens};
use crate::kind::{Holding, Renewal, Try};
use crate::operator_scripts::{ForceUnlock, Inspect, RawHolder, FORCED_FENCE_TTL};
use crate::protocol::FencingToken;
use crate::protocol::TooLow;
use crate::protocol::{AcquireReply, LockKey, Renewed};
use crate::store::wake::{Announcer, ReleaseListener};

static RAISE_FENCE: LazyLock<LuaScript> =
    LazyLock::new(|| kind::script(include_str!("../../scripts/redlock/raise_fence.lua")));

pub(crate) struct RedlockStore {
    masters: Vec<Arc<NodeStore>>,
    /// Per master: whether a connect runs in the background, and its end.
    connecting: Vec<Arc<Connecting>>,
    /// Per master: a request to it ran past its timeout, and it is asked in the background
    /// until it answers ([`ask_until_it_answers`](Self::ask_until_it_answers)); meanwhile no
    /// request waits for it once the other masters have settled the outcome.
    slow: Vec<Arc<AtomicBool>>,
    /// Per master: its ACL's refusal of that `PING` was told ([`super::probe`]).
    ping_refusal_told: Vec<Arc<AtomicBool>>,
    node_timeout: Duration,
    connect_timeout: Duration,
    /// No try has warmed up yet: the first waits for every master (up to the connect
    /// timeout), so a replica among them is refused from the start.
    first_use: AtomicBool,
    /// Wake-ups from every master that answers: each announces a release.
    waker: ReleaseListener,
    /// How far ahead of this client's clock a write grant's token is proposed, in
    /// microseconds ([`propose`](Self::propose)): the node timeout, raised by refusals, never
    /// past [`MAX_TOKEN_LEAD`].
    lead: AtomicU64,
    io: Handle,
}

/// A master's connect in the background.
#[derive(Default)]
struct Connecting {
    running: AtomicBool,
    ended: Notify,
}

/// Ends a background connect when dropped: when it finished, and also when the runtime it ran
/// on shut down under it (else the master would never be connected again).
struct ConnectEnds(Arc<Connecting>);

impl Drop for ConnectEnds {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
        self.0.ended.notify_waiters();
    }
}

/// What one master said to one request, or that it said nothing in time, or that its answer
/// was not awaited because the others' had settled the outcome.
enum Answer<T> {
    Said(T),
    Failed(LockError),
    NotAwaited,
}

/// How many masters are still out.
fn not_awaited<T>(answers: &[Answer<T>]) -> usize {
    answers
        .iter()
        .filter(|answer| matches!(answer, Answer::NotAwaited))
        .count()
}

/// Where a try that did not stand is undone: on each master that granted it, failed in a way
/// that leaves it unknown, or was not awaited. The undo waits for the masters that answered
/// the try; one that was not awaited gets the undo behind the try and is not waited for.
///
/// A try that fell short of a quorum gives back without announcing a release
/// ([`RedisStore::give_back`](super::redis::RedisStore::give_back), `announced` false): the lock was free on
/// those masters only for it. One that a quorum granted and that does not stand anyway (too
/// late, or refused by a master for good) kept everyone else out: its give-back is announced,
/// as a release is.
struct Undo {
    /// Per master: (undo it, wait for the undo's answer).
    masters: Vec<(bool, bool)>,
    /// The give-back is announced to waiters.
    announced: bool,
}

impl Undo {
    fn of<Q: QuorumTry>(answers: &[Answer<Q::Reply>], announced: bool) -> Self {
        let masters = answers
            .iter()
            .map(|answer| match answer {
                Answer::Said(reply) => (Q::granted(reply).is_some(), true),
                Answer::Failed(err) => (super::is_ambiguous(err), true),
                Answer::NotAwaited => (true, false),
            })
            .collect();
        Self { masters, announced }
    }

    fn any(&self) -> bool {
        self.masters.iter().any(|&(undo, _)| undo)
    }

    fn needed(&self, master: usize) -> bool {
        self.masters.get(master).is_some_and(|&(undo, _)| undo)
    }

    /// Every master whose undo is waited for has answered it (or failed to).
    fn answered<T>(&self, answers: &[Answer<T>]) -> bool {
        answers
            .iter()
            .zip(&self.masters)
            .all(|(answer, &(undo, wait))| !(undo && wait && matches!(answer, Answer::NotAwaited)))
    }
}

/// How many masters said something `counts`.
fn count_said<T>(answers: &[Answer<T>], counts: impl Fn(&T) -> bool) -> usize {
    answers
        .iter()
        .filter(|answer| matches!(answer, Answer::Said(said) if counts(said)))
        .count()
}

/// A duration in whole microseconds.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// This client's clock in microseconds since the Unix epoch (0 before it).
fn clock_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, micros)
}

/// A master that did not answer within `timeout`: the request may still run there.
fn node_timed_out(timeout: Duration) -> LockError {
    BackendError::new(
        "reach a Redlock master",
        BackendErrorKind::Timeout,
        format!("no answer within the node timeout of {timeout:?}"),
    )
    .maybe_applied(true)
    .into()
}

impl RedlockStore {
    pub(crate) fn new(
        masters: &[redis::Client],
        options: NodeOptions,
        node_timeout: Duration,
        io: Handle,
    ) -> Self {
        let options = NodeOptions {
            require_primary: true,
            guard: None,
            wake_ups: false,
            tokens: Tokens::Counter,
            ..options
        };
        Self {
            masters: masters
                .iter()
                .map(|master| {
                    Arc::new(
                        NodeStore::new(Endpoint::Fixed(master.clone()), options, io.clone())
                            .not_cutting_tries(),
                    )
                })
                .collect(),
            connecting: masters.iter().map(|_| Arc::default()).collect(),
            slow: masters.iter().map(|_| Arc::default()).collect(),
            ping_refusal_told: masters.iter().map(|_| Arc::default()).collect(),
            node_timeout,
            connect_timeout: options.connect_timeout,
            first_use: AtomicBool::new(true),
            lead: AtomicU64::new(micros(first_lead(node_timeout))),
            waker: ReleaseListener::new(
                masters
                    .iter()
                    .map(|master| Announcer::Node(Arc::new(Endpoint::Fixed(master.clone()))))
                    .collect(),
                io.clone(),
                options.connect_timeout,
                options.response_timeout,
            ),
            io,
        }
    }

    fn quorum(&self) -> usize {
        self.masters.len() / 2 + 1
    }

    /// How long one master may take for one request of a grant with this lease.
    fn timeout_for(&self, lease: Duration) -> Duration {
        self.node_timeout
            .min(lease / 10)
            .max(Duration::from_millis(1))
    }

    /// Runs `request` on every master at once, each bounded by `timeout`: each master's
    /// answer, or its failure (a timeout when it did not answer in time).
    async fn on_all<'a, T, F, Fut>(
        &'a self,
        timeout: Duration,
        request: F,
    ) -> Vec<Result<T, LockError>>
    where
        F: Fn(&'a NodeStore) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + 'a,
    {
        let request = &request;
        join_all(self.masters.iter().map(|master| async move {
            tokio::time::timeout(timeout, request(master))
                .await
                .unwrap_or_else(|_| Err(node_timed_out(timeout)))
        }))
        .await
    }

    /// Runs `request` on every master at once and waits for every answer, at most `timeout`
    /// (the masters still out then [`Answer::Failed`] with a timeout, and are marked slow) —
    /// but not for the masters marked slow once the others have answered and `decided` says
    /// their answers settle the outcome (enough masters granted, or too many refused): such a
    /// master is [`Answer::NotAwaited`]. So a frozen master costs one request its timeout,
    /// and the requests after it nothing while the others answer.
    ///
    /// Returns the answers and the requests still out, which the caller drops or finishes in
    /// the background ([`finish_in_background`](Self::finish_in_background)). Dropping one
    /// is safe for a try and a renewal: a step it sent still runs on its master (every
    /// request is polled once before anything is decided, and goes out on its first poll once
    /// the master has a connection), before anything sent to that master afterwards — each
    /// master has one ordered connection — and a step not yet sent (a try sent again after
    /// `NOSCRIPT`) is never sent. A release or an undo must finish instead: its later step is
    /// what gives the grant back.
    async fn until_decided<'a, T, F, Fut>(
        &'a self,
        timeout: Duration,
        request: F,
        mut decided: impl FnMut(&[Answer<T>]) -> bool,
    ) -> (Vec<Answer<T>>, Vec<Option<Pin<Box<Fut>>>>)
    where
        F: Fn(usize, &'a Arc<NodeStore>) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + 'a,
    {
        let mut out: Vec<Option<Pin<Box<Fut>>>> = self
            .masters
            .iter()
            .enumerate()
            .map(|(i, master)| Some(Box::pin(request(i, master))))
            .collect();
        let mut answers: Vec<Answer<T>> = self.masters.iter().map(|_| Answer::NotAwaited).collect();
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        std::future::poll_fn(|cx| {
            // Every request still out is polled each round (the first round sends them all).
            for (slot, answer) in out.iter_mut().zip(answers.iter_mut()) {
                if let Some(request) = slot {
                    if let Poll::Ready(said) = request.as_mut().poll(cx) {
                        *answer = match said {
                            Ok(said) => Answer::Said(said),
                            Err(err) => Answer::Failed(err),
                        };
                        *slot = None;
                    }
                }
            }
            let only_slow_out = out
                .iter()
                .zip(&self.slow)
                .all(|(slot, slow)| slot.is_none() || slow.load(Ordering::Acquire));
            if out.iter().all(Option::is_none) || (only_slow_out && decided(&answers)) {
                return Poll::Ready(());
            }
            if deadline.as_mut().poll(cx).is_ready() {
                for (i, (slot, answer)) in out.iter().zip(answers.iter_mut()).enumerate() {
                    if slot.is_some() {
                        *answer = Answer::Failed(node_timed_out(timeout));
                        self.ask_until_it_answers(i);
                    }
                }
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
        (answers, out)
    }

    /// Marks master `i` slow and asks it, in the background, until it answers a `PING` (which
    /// queues behind whatever it has not run yet; an ACL's refusal of it is an answer too:
    /// [`super::probe`]), then clears the mark. One asker per master.
    fn ask_until_it_answers(&self, i: usize) {
        let (Some(master), Some(slow), Some(told)) = (
            self.masters.get(i),
            self.slow.get(i),
            self.ping_refusal_told.get(i),
        ) else {
            return;
        };
        if slow.swap(true, Ordering::AcqRel) {
            return;
        }
        let (master, slow, told) = (master.clone(), slow.clone(), told.clone());
        let pause = self.node_timeout.max(Duration::from_millis(100));
        self.io.spawn(async move {
            super::probe::until_it_answers(&master, pause, &told).await;
            slow.store(false, Ordering::Release);
        });
    }

    /// Lets the requests `until_decided` left out run to their end on the I/O runtime (each
    /// within the connection's response timeout), their answers unread.
    fn finish_in_background<Fut>(&self, out: Vec<Option<Pin<Box<Fut>>>>)
    where
        Fut: Future + Send + 'static,
    {
        for request in out.into_iter().flatten() {
            self.io.spawn(async move {
                let _ = request.await;
            });
        }
    }

    /// Connects the masters that have no connection (in the background:
    /// [`connect_in_background`](Self::connect_in_background)) before the try's requests are
    /// sent (so a connect does not eat into the node timeout; the acquire loop's
    /// own deadline, which started earlier, still counts it, so a first use with a very short
    /// lease may come back too late and be tried again). Waits only
    /// while fewer than a majority are connected (on first use: fewer than all, so that a
    /// replica among the masters is refused from the start), and then at most the connect
    /// timeout: a
    /// master that is down, or that drops packets, does not slow the tries of the others. A
    /// connect nobody waits for finishes in the background, for the next try.
    ///
    /// It also waits no longer than until the request's `deadline`, so that a try sent
    /// before it still ends within one node timeout past it ([`Bounds`]); past it, it does
    /// not wait (the first round's requests connect on their own, within the node timeout) —
    /// except on first use, a fresh client's one try (`wait(0)`), which could otherwise
    /// hardly be granted: that waits the connect timeout, before its first round.
    async fn warm_up(&self, deadline: Option<Instant>) {
        let missing: Vec<usize> = (0..self.masters.len())
            .filter(|&i| !self.masters[i].node().is_connected())
            .collect();
        if missing.is_empty() {
            return;
        }
        let connected = self.masters.len() - missing.len();
        let first_use = self.first_use.swap(false, Ordering::AcqRel);
        let enough = if first_use {
            self.masters.len()
        } else {
            self.quorum()
        };
        // Registered before the connects start, so none of their ends is missed.
        let mut ended: FuturesUnordered<_> = missing
            .iter()
            .map(|&i| {
                let mut ended = Box::pin(self.connecting[i].ended.notified());
                ended.as_mut().enable();
                ended
            })
            .collect();
        for &i in &missing {
            self.connect_in_background(i);
        }
        let wait = match deadline {
            Some(deadline) if !first_use || deadline > Instant::now() => self
                .connect_timeout
                .min(deadline.saturating_duration_since(Instant::now())),
            _ => self.connect_timeout,
        };
        if connected >= enough || wait.is_zero() {
            return;
        }
        let _ = tokio::time::timeout(wait, async {
            while ended.next().await.is_some() {
                let connected = self
                    .masters
                    .iter()
                    .filter(|m| m.node().is_connected())
                    .count();
                if connected >= enough {
                    break;
                }
            }
        })
        .await;
    }

    /// Connects master `i` in the background unless a connect of it is under way already;
    /// its end is announced on the master's [`Connecting::ended`]. The connect runs on the
    /// caller's runtime when that is a multi-thread runtime, so that the master's connection
    /// is driven there (no thread hop per request, see `connection.rs`), else on the I/O runtime.
    fn connect_in_background(&self, i: usize) {
        let connecting = &self.connecting[i];
        if connecting.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let (master, ends) = (self.masters[i].clone(), ConnectEnds(connecting.clone()));
        let runtime = crate::io::multi_thread_caller().unwrap_or_else(|| self.io.clone());
        runtime.spawn(async move {
            let _ends = ends;
            let _ = master.node().warm_up().await;
        });
    }

    /// Reconnects, in the background, the masters that have no connection (after a restart
    /// or a dropped connection), so renewals and releases, which do not wait for connects,
    /// reach them again.
    fn reconnect_missing(&self) {
        for i in 0..self.masters.len() {
            if !self.masters[i].node().is_connected() {
                self.connect_in_background(i);
            }
        }
    }

    fn quorum_unavailable(&self, key: &LockKey, answered: usize, granted: usize) -> LockError {
        self.quorum_unavailable_needing(key, answered, granted, self.quorum())
    }

    /// [`quorum_unavailable`](Self::quorum_unavailable) for a grant that needs `needed`
    /// masters (the kind's `quorum`).
    fn quorum_unavailable_needing(
        &self,
        key: &LockKey,
        answered: usize,
        granted: usize,
        needed: usize,
    ) -> LockError {
        tracing::warn!(
            target: crate::telemetry::LOG_TARGET,
            key = %key.name,
            answered,
            granted,
            needed,
            nodes = self.masters.len(),
            "Redlock quorum unavailable: too few masters answered"
        );
        LockError::QuorumUnavailable {
            key: key.name.clone(),
            answered,
            granted,
            needed,
            nodes: self.masters.len(),
        }
    }

    /// `force_unlock`'s first round: the counters raised to `token` on as many masters as
    /// answer; how many are at least at it now. A master that refuses for good (a counter of
    /// another application's, or one or a token at 2^53 or more: nothing written there) is
    /// the error, preferring a master that names its own counter's value to one that names
    /// `token`.
    async fn raise_fence(
        &self,
        key: &LockKey,
        token: FencingToken,
        lease: Duration,
        timeout: Duration,
    ) -> Result<usize, LockError> {
        let quorum = self.quorum();
        let raised = |answers: &[Answer<i64>]| {
            answers
                .iter()
                .filter(|answer| matches!(answer, Answer::Said(1)))
                .count()
        };
        let (answers, _) = self
            .until_decided(
                timeout,
                |_, master| {
                    let mut call = RAISE_FENCE.prepare_invoke();
                    call.key(key.fence())
                        .arg(token.0)
                        .arg(kind::millis(fence_ttl(lease)));
                    master.invoke::<i64>("raise the fencing counter", call)
                },
                |answers| {
                    raised(answers) >= quorum || raised(answers) + not_awaited(answers) < quorum
                },
            )
            .await;
        let count = raised(&answers);
        let token_named = token.0.to_string();
        let mut refusals: Vec<LockError> = answers
            .into_iter()
            .filter_map(|answer| match answer {
                Answer::Failed(err) if err.is_final_refusal() => Some(err),
                _ => None,
            })
            .collect();
        refusals.sort_by_key(|err| {
            matches!(err, LockError::FencingCounterTooLarge { value, .. } if *value == token_named)
        });
        match refusals.into_iter().next() {
            Some(err) => Err(err),
            None => Ok(count),
        }
    }

    /// [`raise_fence`](Self::raise_fence) to `token` for a forced release, which must reach a
    /// majority.
    async fn raise_fence_on_quorum(&self, key: &LockKey, token: u64) -> Result<(), LockError> {
        let raised = self
            .raise_fence(
                key,
                FencingToken(token),
                FORCED_FENCE_TTL,
                self.node_timeout,
            )
            .await?;
        if raised < self.quorum() {
            return Err(self.quorum_unavailable(key, raised, 0));
        }
        Ok(())
    }
}

/// A try as Redlock sends it to every master: one key ([`Try`]) or several at once
/// ([`MultiTry`]). The quorum's steps ([`RedlockStore::tally`]) are the same for both; this
/// is what they ask of either.
trait QuorumTry: Sync {
    /// What one master answers.
    type Reply: Send + Sync;
    /// The refusals among the answers, added up into the reply of a try that fell short.
    type Refusals: Default;

    fn lease(&self) -> Duration;

    /// When the request's wait ends ([`Try::deadline`]).
    fn deadline(&self) -> Option<Instant>;

    /// The keys, in the order of a grant's tokens.
    fn keys(&self) -> &[LockKey];

    /// How many masters must grant.
    fn quorum(&self, redlock: &RedlockStore) -> usize;

    /// Whether the masters take a token the tally proposes (a fenced write grant's,
    /// [`TokenRule::Fresh`]); the other grants' tokens are the masters' own.
    fn proposes(&self) -> bool;

    /// The same try, proposing `token` to every master.
    fn proposing(&self, token: Option<FencingToken>) -> Self;

    /// A master's refusal of the proposed token.
    fn too_low(reply: &Self::Reply) -> Option<TooLow>;

    /// The try on one master.
    fn send<'a>(
        &'a self,
        master: &'a NodeStore,
    ) -> impl Future<Output = Result<Self::Reply, LockError>> + Send + 'a;

    /// Gives back whatever the try may have taken on the masters in `undo`, waiting for the
    /// answers of those that answered the try (best effort: a master that does not answer
    /// lets the lease run out); a master whose answer to the try was not awaited gets the
    /// undo after the try on its connection, and is not waited for again ([`Undo`]). `true`
    /// when every undo sent was answered: none is left to run later, after a next round of
    /// the same owner (which a late undo would give back).
    fn undo<'a>(
        &'a self,
        redlock: &'a RedlockStore,
        timeout: Duration,
        undo: &'a Undo,
    ) -> impl Future<Output = bool> + Send + 'a;

    /// A grant's token per key; `None` when the answer is a refusal.
    fn granted(reply: &Self::Reply) -> Option<&[Option<FencingToken>]>;

    /// Counts one master's refusal.
    fn count(refusals: &mut Self::Refusals, reply: &Self::Reply);

    /// The grant, with the token `token_of` key `i`.
    fn acquired(&self, token_of: impl Fn(usize) -> Option<FencingToken>) -> Self::Reply;

    /// The reply to a try that `granted` masters granted, `quorum` being needed.
    fn refused(refusals: Self::Refusals, granted: usize, quorum: usize) -> Self::Reply;
}

impl QuorumTry for Try<'_> {
    type Reply = AcquireReply;
    type Refusals = Refusals;

    fn lease(&self) -> Duration {
        self.lease
    }

    fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    fn keys(&self) -> &[LockKey] {
        std::slice::from_ref(self.key)
    }

    /// A majority, and more for a semaphore (the kind's `quorum`).
    fn quorum(&self, redlock: &RedlockStore) -> usize {
        self.kind.quorum(redlock.masters.len())
    }

    fn proposes(&self) -> bool {
        self.fencing && self.kind.token_rule() == TokenRule::Fresh
    }

    fn proposing(&self, proposed: Option<FencingToken>) -> Self {
        Self { proposed, ..*self }
    }

    fn too_low(reply: &AcquireReply) -> Option<TooLow> {
        match *reply {
            AcquireReply::TooLow(too_low) => Some(too_low),
            _ => None,
        }
    }

    fn send<'a>(
        &'a self,
        master: &'a NodeStore,
    ) -> impl Future<Output = Result<AcquireReply, LockError>> + Send + 'a {
        master.acquire(self)
    }

    async fn undo(&self, redlock: &RedlockStore, timeout: Duration, undo: &Undo) -> bool {
        let holding = self.grant();
        // Owned: an undo not waited for finishes in the background.
        let (key, owner) = (Arc::new(self.key.clone()), Arc::<str>::from(self.owner));
        let (_, out) = redlock
            .until_decided(
                timeout,
                |i, master| {
                    let (needed, announced) = (undo.needed(i), undo.announced);
                    let (master, key, owner) = (master.clone(), key.clone(), owner.clone());
                    async move {
                        if needed {
                            master.give_back(holding, &key, &owner, announced).await
                        } else {
                            Ok(false)
                        }
                    }
                },
                |answers| undo.answered(answers),
            )
            .await;
        let settled = out.iter().all(Option::is_none);
        redlock.finish_in_background(out);
        settled
    }

    fn granted(reply: &AcquireReply) -> Option<&[Option<FencingToken>]> {
        match reply {
            AcquireReply::Acquired(token) => Some(std::slice::from_ref(token)),
            _ => None,
        }
    }

    fn count(refusals: &mut Refusals, reply: &AcquireReply) {
        refusals.count(reply);
    }

    fn acquired(&self, token_of: impl Fn(usize) -> Option<FencingToken>) -> AcquireReply {
        AcquireReply::Acquired(token_of(0))
    }

    /// Held, or a split between waiters.
    fn refused(refusals: Refusals, granted: usize, quorum: usize) -> AcquireReply {
        refusals.reply(granted, quorum)
    }
}

impl QuorumTry for MultiTry<'_> {
    type Reply = MultiReply;
    type Refusals = HeldKeys;

    fn lease(&self) -> Duration {
        self.lease
    }

    fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    fn keys(&self) -> &[LockKey] {
        self.keys
    }

    fn quorum(&self, redlock: &RedlockStore) -> usize {
        redlock.quorum()
    }

    /// Every key is a write lock.
    fn proposes(&self) -> bool {
        self.fencing
    }

    fn proposing(&self, proposed: Option<FencingToken>) -> Self {
        Self { proposed, ..*self }
    }

    fn too_low(reply: &MultiReply) -> Option<TooLow> {
        match *reply {
            MultiReply::TooLow(too_low) => Some(too_low),
            _ => None,
        }
    }

    fn send<'a>(
        &'a self,
        master: &'a NodeStore,
    ) -> impl Future<Output = Result<MultiReply, LockError>> + Send + 'a {
        master.acquire_all(self)
    }

    async fn undo(&self, redlock: &RedlockStore, timeout: Duration, undo: &Undo) -> bool {
        // Owned: an undo not waited for finishes in the background.
        let (keys, owner) = (Arc::new(self.keys.to_vec()), Arc::<str>::from(self.owner));
        let (_, out) = redlock
            .until_decided(
                timeout,
                |i, master| {
                    let (needed, announced) = (undo.needed(i), undo.announced);
                    let (master, keys, owner) = (master.clone(), keys.clone(), owner.clone());
                    async move {
                        let keys: Vec<&LockKey> = keys.iter().collect();
                        if needed {
                            master.give_back_all(&keys, &owner, announced).await
                        } else {
                            Ok(false)
                        }
                    }
                },
                |answers| undo.answered(answers),
            )
            .await;
        let settled = out.iter().all(Option::is_none);
        redlock.finish_in_background(out);
        settled
    }

    fn granted(reply: &MultiReply) -> Option<&[Option<FencingToken>]> {
        match reply {
            MultiReply::Acquired(tokens) => Some(tokens),
            MultiReply::Held(..) | MultiReply::TooLow(_) => None,
        }
    }

    fn count(refusals: &mut HeldKeys, reply: &MultiReply) {
        refusals.count(reply);
    }

    fn acquired(&self, token_of: impl Fn(usize) -> Option<FencingToken>) -> MultiReply {
        MultiReply::Acquired((0..self.keys.len()).map(token_of).collect())
    }

    fn refused(refusals: HeldKeys, _: usize, _: usize) -> MultiReply {
        let (remaining, at) = refusals.0.unwrap_or((None, 0));
        MultiReply::Held(remaining, at)
    }
}

/// The refusals of a multi-key try by several masters: the remaining lease of a held key (the
/// shortest that two known ones give) and the position of the first answer's held key.
#[derive(Default)]
struct HeldKeys(Option<(Option<Duration>, usize)>);

impl HeldKeys {
    fn count(&mut self, reply: &MultiReply) {
        let (remaining, at) = match *reply {
            MultiReply::Held(remaining, at) => (remaining, at),
            // Free, but for a token too low: try again at once.
            MultiReply::TooLow(_) => (Some(Duration::ZERO), 0),
            MultiReply::Acquired(_) => return,
        };
        self.0 = Some(match self.0 {
            None => (remaining, at),
            Some((known, first)) => (known.min(remaining).or(known), first),
        });
    }
}

/// The token key `i` of a grant takes: the largest of those its quorum handed out (`None`
/// without fencing) — a write grant's proposal, which every master of its quorum took.
fn quorum_token<Q: QuorumTry>(answers: &[Answer<Q::Reply>], i: usize) -> Option<FencingToken> {
    answers
        .iter()
        .filter_map(|answer| match answer {
            Answer::Said(reply) => Q::granted(reply),
            Answer::Failed(_) | Answer::NotAwaited => None,
        })
        .filter_map(|tokens| tokens.get(i).copied().flatten())
        .max()
}

/// The lead a client starts with: its node timeout (a master whose clock agrees and that
/// answers within it takes the token), which `Config` keeps within [`MAX_TOKEN_LEAD`]
/// ([`MAX_NODE_TIMEOUT`](crate::MAX_NODE_TIMEOUT)); capped here as well.
fn first_lead(node_timeout: Duration) -> Duration {
    node_timeout.min(MAX_TOKEN_LEAD)
}

/// How long a try may keep its caller: the wait for connects before it no longer than until
/// the request's deadline ([`RedlockStore::warm_up`]), each round and each undo at most the
/// node timeout, and nothing after the first round waited for past one node timeout after the
/// deadline — so a try sent before its deadline ends within one node timeout after it (or
/// after its first round, a try sent at its deadline: `wait(0)`), as a try on the other
/// stores ends within one response timeout.
#[derive(Clone, Copy)]
struct Bounds {
    /// The node timeout for the try's lease ([`RedlockStore::timeout_for`]).
    timeout: Duration,
    /// When the request's wait ends ([`Try::deadline`]; `None`: not within reach).
    deadline: Option<Instant>,
}

impl Bounds {
    /// Whether the request's wait lasts.
    fn wait_lasts(&self) -> bool {
        self.deadline
            .is_none_or(|deadline| Instant::now() < deadline)
    }

    /// How long a wait after the first round (an undo, the second round) may take: the node
    /// timeout, and no longer than until one node timeout past the deadline; zero once that
    /// has passed.
    fn left(&self) -> Duration {
        match self
            .deadline
            .and_then(|deadline| deadline.checked_add(self.timeout))
        {
            Some(end) => end
                .saturating_duration_since(Instant::now())
                .min(self.timeout),
            None => self.timeout,
        }
    }
}

/// How one round of a try ended.
enum Round<R> {
    /// Granted, or refused with this reply.
    Decided(R),
    /// Masters refused the proposed token as too low, and the others granted it, or enough
    /// would have without them; undone, and refused with this reply. `hint`: the largest
    /// token they would take now.
    TooLow { hint: u64, refused: R },
}

/// The quorum's steps, the same for one key and for several.
impl RedlockStore {
    /// One try on every master: granted when enough masters granted it within its validity,
    /// else undone everywhere and answered with what the refusals add up to, or the error
    /// that explains them. A fenced write try proposes its token ([`propose`](Self::propose));
    /// one that masters refused as too low, when the others granted it or would have made a
    /// quorum with them, is undone and tried once more at once with their largest hint (the
    /// module's "Fencing tokens").
    ///
    /// The second round and the undo before it wait at most until one node timeout past the
    /// request's deadline ([`Bounds`]). A try that a quorum granted in the first round is
    /// sent again only while the wait lasts (else its grant stands, with the first round's
    /// token); one that fell short, only while there is time left for it. One that cannot be
    /// sent again, or whose second round ran out of that time, is refused as held for no
    /// time: the acquire loop tries again at once or, past its deadline, times out.
    async fn tally<Q: QuorumTry>(&self, attempt: &Q) -> Result<Q::Reply, LockError> {
        let bounds = Bounds {
            timeout: self.timeout_for(attempt.lease()),
            deadline: attempt.deadline(),
        };
        self.warm_up(bounds.deadline).await;
        if let Some(refusal) = self
            .masters
            .iter()
            .find_map(|master| master.node().refusal())
        {
            // Replication defeats Redlock: refuse the deployment, not just the node.
            return Err(LockError::Config(format!(
                "a Redlock master is not a master: {refusal}"
            )));
        }
        let quorum = attempt.quorum(self);
        let first = attempt.proposing(attempt.proposes().then(|| self.propose(0)));
        let hint = match self.round(&first, quorum, bounds, true).await? {
            Round::Decided(reply) => return Ok(reply),
            // The time left ran out while the first round was undone.
            Round::TooLow { refused, .. } if bounds.left().is_zero() => return Ok(refused),
            Round::TooLow { hint, .. } => hint,
        };
        // The rare second round; should it fall short too, the acquire loop tries again.
        let again = attempt.proposing(Some(self.propose(hint)));
        match self.round(&again, quorum, bounds, false).await? {
            Round::Decided(reply) | Round::TooLow { refused: reply, .. } => Ok(reply),
        }
    }

    /// A write grant's token: this client's clock in microseconds plus its lead, and at
    /// least `floor` (a refused round's hint). The lead starts at the node timeout, so a
    /// master whose clock agrees with this client's takes the token when it answers in time,
    /// and never exceeds [`MAX_TOKEN_LEAD`].
    fn propose(&self, floor: u64) -> FencingToken {
        let lead = self.lead.load(Ordering::Relaxed);
        FencingToken(clock_micros().saturating_add(lead).max(floor))
    }

    /// Raises the lead after refusals of proposed tokens: up to the refusing master's clock
    /// plus the node timeout (this client's clock lags it), or up to its hint (its counter is
    /// ahead: another client's lead, which is matched, not exceeded, so that two clients'
    /// leads do not climb over each other).
    ///
    /// Never above [`MAX_TOKEN_LEAD`], whatever the settings: a lead makes every counter this
    /// client sets live that much longer, a read token exceed a later write token by up to as
    /// much, and a master restarted empty wait that much longer; so a master or client whose
    /// clock is further off costs a second round on each grant (the hint is that round's
    /// floor) instead of raising every later token.
    fn learn(&self, refusals: impl Iterator<Item = TooLow>) {
        let now = clock_micros();
        let margin = micros(first_lead(self.node_timeout));
        let cap = micros(MAX_TOKEN_LEAD);
        for TooLow { hint, clock } in refusals {
            let needed = hint.max(clock.saturating_add(margin)).saturating_sub(now);
            if needed > cap {
                tracing::warn!(target: crate::telemetry::LOG_TARGET, lead_us = needed, cap_us = cap,
                    "a Redlock master's clock or fencing counter is ahead of this client's clock \
                     by more than the lead it keeps; grants take a second round until the clocks \
                     agree (check NTP on the masters and clients)");
            }
            self.lead.fetch_max(needed.min(cap), Ordering::Relaxed);
        }
    }

    /// One round of a try: the try on every master, then the grant, or the undo and the
    /// refusal, or the error. A first round (`first`) whose token a master refused as too
    /// low is undone even when a quorum granted it, so that a grant's token is at least what
    /// every master that answered would take: the masters' counters keep together, and a
    /// master whose counter ran ahead costs one second round, not one on every later quorum
    /// it joins — unless the request's wait has ended ([`Bounds`]). The first round takes
    /// the node timeout; the undo and the second round at most what `bounds` leaves, and a
    /// second round cut short by that, too short for a quorum to answer, is a refusal.
    async fn round<Q: QuorumTry>(
        &self,
        attempt: &Q,
        quorum: usize,
        bounds: Bounds,
        first: bool,
    ) -> Result<Round<Q::Reply>, LockError> {
        let started = Instant::now();
        let timeout = if first { bounds.timeout } else { bounds.left() };
        // Decided as soon as enough masters granted, or so many refused that the rest cannot
        // make a quorum (or one refused for good); failures do not decide early, so the error
        // says how many answered. A master that answers late still runs the try, before the
        // release or undo sent to it afterwards, which also gives its late grant back
        // ([`until_decided`](Self::until_decided)).
        let refusals_decide = self.masters.len() - quorum;
        let (answers, _) = self
            .until_decided(
                timeout,
                |_, master| attempt.send(master),
                |answers| {
                    let (mut granted, mut refused) = (0, 0);
                    for answer in answers {
                        match answer {
                            Answer::Said(reply) if Q::granted(reply).is_some() => granted += 1,
                            Answer::Said(_) => refused += 1,
                            Answer::Failed(err) if err.is_final_refusal() => return true,
                            _ => {}
                        }
                    }
                    granted >= quorum || refused > refusals_decide
                },
            )
            .await;
        let mut answered = 0;
        let mut granted = 0;
        let mut too_low = 0;
        let mut hint = 0;
        let mut refusals = Q::Refusals::default();
        for answer in &answers {
            if let Answer::Said(reply) = answer {
                answered += 1;
                match Q::granted(reply) {
                    Some(_) => granted += 1,
                    None => Q::count(&mut refusals, reply),
                }
                if let Some(refused) = Q::too_low(reply) {
                    too_low += 1;
                    hint = hint.max(refused.hint);
                }
            }
        }
        if too_low > 0 {
            self.learn(answers.iter().filter_map(|answer| match answer {
                Answer::Said(reply) => Q::too_low(reply),
                _ => None,
            }));
        }
        // A semaphore of another count in use, or a key that holds no lock, as any master
        // says: refused, not granted by the others nor waited for.
        let refused = answers
            .iter()
            .any(|answer| matches!(answer, Answer::Failed(err) if err.is_final_refusal()));
        let valid_until = started + attempt.lease() - drift(attempt.lease());
        // A second round is the only way to a grant when the first fell short, and only
        // keeps the counters together when it did not: sent then only while the wait lasts.
        let rerun = first
            && too_low > 0
            && granted + too_low >= quorum
            && if granted < quorum {
                !bounds.left().is_zero()
            } else {
                bounds.wait_lasts()
            };
        if !refused && !rerun && granted >= quorum && Instant::now() < valid_until {
            return Ok(Round::Decided(
                attempt.acquired(|i| quorum_token::<Q>(&answers, i)),
            ));
        }
        // Too few grants, too late, or a token to propose again: undo wherever a grant may be
        // (also where the answer got lost or was not awaited), then report. A quorum's grant
        // kept the others out: its give-back wakes them, unless this request tries again at
        // once.
        let undo = Undo::of::<Q>(&answers, granted >= quorum && !rerun);
        // A second round reuses the owner token: only once every undo of this one has been
        // answered, so that none can run after it and give its grant back. An undo cut short
        // by the request's end finishes in the background (its masters are asked as slow ones
        // until they answer).
        let settled = !undo.any() || attempt.undo(self, bounds.left(), &undo).await;
        let out = not_awaited(&answers);
        // Masters that did not answer within the round's time: in a round cut short by the
        // request's end, for want of time rather than a failure of theirs.
        let timed_out = answers
            .iter()
            .filter(|answer| {
                matches!(answer, Answer::Failed(LockError::Backend(err))
                    if err.kind() == BackendErrorKind::Timeout)
            })
            .count();
        if let Some(Answer::Failed(err)) = answers
            .into_iter()
            .find(|answer| matches!(answer, Answer::Failed(err) if err.is_final_refusal()))
        {
            return Err(err);
        }
        // Too many masters failed for a quorum (those not awaited might still have granted);
        // in a second round cut short by the request's end, for want of time — unless those
        // that did answer or fail for other reasons (refused, reset) were too many for a
        // quorum anyway: that is a quorum unavailable, whatever time there was.
        if answered + out < quorum
            && timeout < bounds.timeout
            && answered + out + timed_out >= quorum
        {
            return Ok(Round::Decided(Q::refused(refusals, granted, quorum)));
        }
        if answered + out < quorum {
            let key = &attempt.keys()[0];
            return Err(self.quorum_unavailable_needing(key, answered, granted, quorum));
        }
        // A majority answered but did not grant in time.
        let refused = Q::refused(refusals, granted, quorum);
        if rerun && settled {
            return Ok(Round::TooLow { hint, refused });
        }
        Ok(Round::Decided(refused))
    }
}

impl Store for RedlockStore {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        self.tally(attempt).await
    }

    async fn release(
        &self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
    ) -> Result<bool, LockError> {
        self.reconnect_missing();
        let quorum = holding.kind().quorum(self.masters.len());
        let refusals_decide = self.masters.len() - quorum;
        // Owned: a release not waited for finishes in the background.
        let (shared_key, shared_owner) = (Arc::new(key.clone()), Arc::<str>::from(owner));
        let (answers, left) = self
            .until_decided(
                self.node_timeout,
                |_, master| {
                    let (master, key, owner) =
                        (master.clone(), shared_key.clone(), shared_owner.clone());
                    async move { master.release(holding, &key, &owner).await }
                },
                |answers| {
                    count_said(answers, |&was_ours| was_ours) >= quorum
                        || count_said(answers, |&was_ours| !was_ours) > refusals_decide
                },
            )
            .await;
        self.finish_in_background(left);
        let out = not_awaited(&answers);
        let mut answered = 0;
        let mut released = 0;
        let mut error = None;
        // Each master that held the grant announces its release; waiters listen on every
        // master (`wake.rs`), so the others need not.
        for answer in answers {
            match answer {
                Answer::Said(was_ours) => {
                    answered += 1;
                    released += usize::from(was_ours);
                }
                Answer::Failed(err) => error = Some(err),
                Answer::NotAwaited => {}
            }
        }
        // Decided without them, the masters not awaited count as not failed.
        if answered + out < self.quorum() {
            // Retried by the release path while the lease could still be in force.
            return Err(error.unwrap_or_else(|| self.quorum_unavailable(key, answered, released)));
        }
        Ok(released >= quorum)
    }

    /// A lease is renewed when a majority renewed it, lost when so many masters said it is not
    /// theirs that a majority no longer can, and unknown otherwise (the watchdog tries again:
    /// a master that missed the node timeout once must not cost a lease that is held).
    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        self.reconnect_missing();
        let shortest = leases
            .iter()
            .map(|l| l.lease)
            .min()
            .unwrap_or(Duration::MAX);
        let timeout = self.timeout_for(shortest);
        let quorums: Vec<usize> = leases
            .iter()
            .map(|lease| lease.kind.quorum(self.masters.len()))
            .collect();
        // Decided when every lease is: renewed by its quorum, or no longer ours on so many
        // masters that the rest cannot renew it.
        let masters = self.masters.len();
        let (answers, _) = self
            .until_decided(
                timeout,
                |_, master| master.extend_many(leases),
                |answers| {
                    quorums.iter().enumerate().all(|(i, &quorum)| {
                        let renewed = count_said(answers, |renewed: &Vec<Renewed>| {
                            renewed.get(i) == Some(&Renewed::Yes)
                        });
                        let lost = count_said(answers, |renewed: &Vec<Renewed>| {
                            renewed.get(i) == Some(&Renewed::No)
                        });
                        renewed >= quorum || lost > masters - quorum
                    })
                },
            )
            .await;
        let out = not_awaited(&answers);
        let mut answered = 0;
        let mut extended = vec![0usize; leases.len()];
        let mut error = None;
        for answer in answers {
            match answer {
                Answer::Said(renewed) => {
                    answered += 1;
                    for (count, renewed) in extended.iter_mut().zip(renewed) {
                        *count += usize::from(renewed == Renewed::Yes);
                    }
                }
                Answer::Failed(err) => error = Some(err),
                Answer::NotAwaited => {}
            }
        }
        if answered + out < self.quorum() {
            let key = leases.first().map(|l| l.key);
            return Err(match (error, key) {
                (_, Some(key)) => self.quorum_unavailable(key, answered, 0),
                (Some(err), None) => err,
                (None, None) => return Ok(Vec::new()),
            });
        }
        let unanswered = self.masters.len() - answered;
        Ok(extended
            .into_iter()
            .zip(quorums)
            .map(|(count, quorum)| {
                // A semaphore permit needs more than a majority, its renewal too.
                if count >= quorum {
                    Renewed::Yes
                } else if count + unanswered < quorum {
                    Renewed::No
                } else {
                    Renewed::Unknown
                }
            })
            .collect())
    }

    /// As [`acquire`](Self::acquire) for every key at once: each master runs the multi-key
    /// script, and counts towards the quorum when it granted every key. Every key takes the
    /// proposed token, as a write grant does (checked against each key's counter).
    async fn acquire_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        if attempt.keys.is_empty() {
            return Ok(MultiReply::Acquired(Vec::new()));
        }
        self.tally(attempt).await
    }

    async fn release_all(&self, keys: &[&LockKey], owner: &str) -> Result<bool, LockError> {
        let Some(first_key) = keys.first() else {
            return Ok(true);
        };
        self.reconnect_missing();
        let quorum = self.quorum();
        let refusals_decide = self.masters.len() - quorum;
        // Owned: a release not waited for finishes in the background.
        let (shared_keys, shared_owner) = (
            Arc::new(
                keys.iter()
                    .map(|&key| key.clone())
                    .collect::<Vec<LockKey>>(),
            ),
            Arc::<str>::from(owner),
        );
        let (answers, left) = self
            .until_decided(
                self.node_timeout,
                |_, master| {
                    let (master, keys, owner) =
                        (master.clone(), shared_keys.clone(), shared_owner.clone());
                    async move {
                        let keys: Vec<&LockKey> = keys.iter().collect();
                        master.release_all(&keys, &owner).await
                    }
                },
                |answers| {
                    count_said(answers, |&all_ours| all_ours) >= quorum
                        || count_said(answers, |&all_ours| !all_ours) > refusals_decide
                },
            )
            .await;
        self.finish_in_background(left);
        let out = not_awaited(&answers);
        let mut answered = 0;
        let mut released = 0;
        let mut error = None;
        for answer in answers {
            match answer {
                Answer::Said(all_ours) => {
                    answered += 1;
                    released += usize::from(all_ours);
                }
                Answer::Failed(err) => error = Some(err),
                Answer::NotAwaited => {}
            }
        }
        if answered + out < self.quorum() {
            return Err(
                error.unwrap_or_else(|| self.quorum_unavailable(first_key, answered, released))
            );
        }
        Ok(released >= self.quorum())
    }

    /// On every master, with one answer made of theirs by the operation's rule; a majority
    /// must answer.
    async fn run<O: KeyOperation>(&self, operation: &O) -> Result<O::Output, LockError> {
        self.reconnect_missing();
        let answers = self
            .on_all(self.node_timeout, |master| master.run(operation))
            .await;
        operation
            .agree(answers, self.quorum())
            .map_err(|no| match no {
                NoAgreement::Refused(err) => err,
                NoAgreement::TooFew { answered, granted } => {
                    self.quorum_unavailable(operation.key(), answered, granted)
                }
            })
    }

    /// Raises a majority's fencing counters above every token handed out for the lock, then
    /// frees it on every master; returns the evicted holders and that token. Raised first:
    /// every grant after a master freed the lock then takes a token above it (the largest of
    /// a quorum, which shares a master with the raised majority). Freeing first and raising
    /// after left a window in which a waiter granted by the masters already freed — whose
    /// clocks had not reached the token the last master's clock gave — got a smaller token
    /// than the one returned (`tests/inspect.rs` saw it about once in ten runs).
    async fn force_unlock(&self, key: &LockKey) -> Result<(Vec<RawHolder>, u64), LockError> {
        let token = self
            .run(&Inspect(key))
            .await?
            .token_ceiling
            .saturating_add(1);
        self.raise_fence_on_quorum(key, token).await?;
        let (evicted, answered_token) = self.run(&ForceUnlock(key)).await?;
        // A grant that landed between the view and the raise proposed a token of its own,
        // which may be above `token`; the masters' own answers are above their counters, so
        // the largest of them is above that grant's token. It is raised on a majority too,
        // so that every later grant's token stays above the one returned.
        if answered_token <= token {
            return Ok((evicted, token));
        }
        self.raise_fence_on_quorum(key, answered_token).await?;
        Ok((evicted, answered_token))
    }

    /// The union of the keys on the masters (a key on any master); an error when fewer than
    /// a majority answered.
    async fn scan_into(&self, pattern: &str, found: &mut Found) -> Result<(), LockError> {
        self.reconnect_missing();
        let mut answered = 0;
        let mut error = None;
        for master in &self.masters {
            match master.scan_into(pattern, found).await {
                Ok(()) => answered += 1,
                Err(err) => error = Some(err),
            }
            if found.full() {
                return Ok(());
            }
        }
        match error {
            Some(err) if answered < self.quorum() => Err(err),
            _ => Ok(()),
        }
    }

    /// Whether a majority of the masters answer a `PING` (each within the connect timeout,
    /// connecting where needed); the error names every master that did not, and why.
    async fn ping(&self) -> Result<(), LockError> {
        let answers = self
            .on_all(self.connect_timeout, |master| master.ping())
            .await;
        let failures: Vec<String> = answers
            .iter()
            .filter_map(|answer| answer.as_ref().err().map(ToString::to_string))
            .collect();
        let answered = answers.len() - failures.len();
        if answered >= self.quorum() {
            return Ok(());
        }
        let backend_errors = || {
            answers.iter().filter_map(|answer| match answer {
                Err(LockError::Backend(err)) => Some(err),
                _ => None,
            })
        };
        let kind = backend_errors()
            .next()
            .map_or(BackendErrorKind::Connection, BackendError::kind);
        // A master's ACL that refused the `PING` is named, with how to grant it.
        let refused = backend_errors().find(|err| err.refused_command().is_some());
        let summed = BackendError::new(
            "ping",
            kind,
            format!(
                "{answered} of {} Redlock masters answered, {} needed: {}",
                self.masters.len(),
                self.quorum(),
                failures.join("; ")
            ),
        );
        Err(match refused {
            Some(refused) => summed.refused_as(refused),
            None => summed,
        }
        .into())
    }

    /// From every master that answers: each announces a release.
    fn waker(&self) -> Option<&ReleaseListener> {
        Some(&self.waker)
    }

    /// The masters expire keys in real time.
    fn clock(&self) -> Clock {
        Clock::Real
    }

    /// Never: the acquire loop cuts a try off; a round decides what a late master means.
    fn cuts_tries(&self) -> bool {
        false
    }
}
