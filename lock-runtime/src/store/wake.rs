//! Wake-up on release for the Redis stores. A write release, the last reader's release
//! while a writer waits, and every semaphore permit's release publish on the lock's `…:released` channel (same hash tag as the lock
//! key); waiters of this client subscribe to it over one pub/sub connection per announcing
//! server (on Redlock, one per master: see below), made on the client's I/O runtime, and a reader task wakes, per release, **one** waiting writer of this
//! client, or **all** its waiting readers when no writer of this client waits (a waiting writer
//! has set the writer-waiting mark, which keeps readers out; readers share the lock, writers
//! would only collide). A semaphore waiter counts as a writer here: a release frees one permit,
//! so each client wakes one of its waiters for it. A fair lock's release names the head of its
//! queue (`f:` and its waiter id): only that waiter wakes, in whichever client it waits; any
//! other release also wakes one of the client's fair waiters. So a handoff costs about one round
//! trip and many writers do not all retry at once. An election's observers (`election/`)
//! register as observers: every message on the channel wakes each of them, and a new leader's
//! announcement (`e:` and its epoch) wakes only them. Anything lost here (a message, the
//! connection) only costs the waiter one backoff step: the acquire loop's backoff stays the
//! fallback. So when pub/sub fails (no connection, SUBSCRIBE refused or answered by a closed
//! connection), this client pauses it, for longer after each failure in a row ([`Pause`]),
//! instead of reconnecting on every wait; a waiter tries subscribing again when the pause ends,
//! within its wait.
//!
//! Two kinds of [`Announcer`] carry the subscriptions. On one server: plain pub/sub
//! (`SUBSCRIBE`) on a connection of its own. Redlock listens on each of its masters, a
//! connection and subscriptions of its own for each (one [`Announcer::Node`] per master): every
//! master announces a release, and the lock is free to a quorum only once the last master of a
//! majority has released it, so a waiter woken by the first announcement and refused because
//! another master had not released yet is woken again by that master's. A client then hears a
//! release once per master; the extra wake-ups cost at most one try each. On a Redis Cluster a release runs `SPUBLISH` on
//! the lock's shard, so waiters subscribe with `SSUBSCRIBE` over a RESP3 cluster connection
//! that routes each command by its channel's slot: **one command per channel**, never one
//! naming several (across slots that fails with `CROSSSLOT`). The `redis` crate resubscribes
//! on its own after a reconnect or a slot change with one command per node, which fails across
//! slots, so it is not relied on: when a node's connection drops, every channel is forgotten as
//! subscribed, and when the server unsubscribes a channel (its slot moved), that channel is;
//! the next wait on it subscribes it again, alone. A cluster error is no reason to drop the
//! cluster connection (it reconnects to nodes by itself), only to pause.
//!
//! Behind Sentinel, the subscription follows a failover: once any connection of the store has
//! been told of a new primary ([`Endpoint::moves`]), the next wait drops a subscription made
//! before that (it may sit on a demoted or cut-off server that no release reaches) and
//! subscribes on the primary the sentinels name now.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionInfo, PushKind, RedisResult, Value};
use tokio::runtime::Handle;
use tokio::sync::{watch, Notify};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;

use super::endpoint::Endpoint;
use crate::kind::{Kind, WakeRule};

/// One channel's waiters in this client.
struct Channel {
    /// Each fair waiter of this client, by waiter id: woken by a message naming it (its
    /// queue's head); one of them also by a release of the unfair kinds.
    fair: HashMap<String, Arc<Notify>>,
    /// Wakes one waiting writer; a wake-up with no writer waiting is kept for the next.
    writers: Arc<Notify>,
    /// Wakes every waiting reader: each sees the version change once, also when it was busy
    /// with a try when the release came.
    readers: watch::Sender<()>,
    /// Wakes every observer of an election ([`ReleaseListener::observe`]): each sees every
    /// message once, whatever it says.
    observers: watch::Sender<()>,
    waiting_writers: usize,
    waiting_readers: usize,
    observing: usize,
}

impl Channel {
    /// Wakes the waiters a message with `payload` is meant for: a fair queue's head names
    /// itself (`f:` and its id), and only that waiter wakes, if it is this client's; any other
    /// release wakes one waiting writer of this client, or all its waiting readers when no
    /// writer waits, and one of its fair waiters (which, finding the lock free but not at the
    /// head, wakes the head by name).
    fn wake(&self, payload: &[u8]) {
        self.observers.send_replace(());
        // A new leader's record (election/proclaim.lua): for observers alone.
        if payload.starts_with(crate::protocol::PROCLAIMED_PREFIX) {
            return;
        }
        if let Some(waiter) = payload.strip_prefix(crate::kind::fair::WAKE_PREFIX) {
            let waiter = std::str::from_utf8(waiter).unwrap_or_default();
            if let Some(notify) = self.fair.get(waiter) {
                notify.notify_one();
            }
            return;
        }
        if let Some(notify) = self.fair.values().next() {
            notify.notify_one();
        }
        if self.waiting_writers > 0 {
            self.writers.notify_one();
        } else {
            self.readers.send_replace(());
        }
    }
}

/// How long a channel stays subscribed after its last waiter of this client left.
const UNSUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

struct State {
    channels: Mutex<HashMap<String, Channel>>,
    /// For each announcer (by its index in [`Inner::announcers`]), the pub/sub connection's sink
    /// and the channels subscribed on it; one lock per announcer serialises its SUBSCRIBE and
    /// UNSUBSCRIBE so they cannot overtake each other.
    subscriptions: Vec<tokio::sync::Mutex<Subscriptions>>,
}

impl State {
    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
struct Subscriptions {
    sink: Option<Sink>,
    /// The task reading the connection: dropping the sink alone would leave it open.
    reader: Option<AbortHandle>,
    subscribed: HashSet<String>,
    /// Bumped when a connection is dropped, so its reader does not clear a newer one.
    generation: u64,
    /// No new tries before this after failures; waiters use their backoff meanwhile.
    pause: Pause,
    /// The announcers' [`Endpoint::moves`] when the connection was made.
    moves: u64,
}

impl Subscriptions {
    /// Drops the pub/sub connection (aborting its reader closes it) after it failed.
    fn reset(&mut self) {
        self.forget();
        self.pause.failed();
    }

    /// Drops the pub/sub connection: the next wait makes a new one.
    fn forget(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
        self.sink = None;
        self.subscribed.clear();
        self.generation += 1;
    }
}

/// A server (or a cluster) that announces releases, and how a waker reaches it.
pub(crate) enum Announcer {
    /// Plain pub/sub (`SUBSCRIBE`) on the store's server (for Sentinel, the primary it names
    /// now).
    Node(Arc<Endpoint>),
    /// Sharded pub/sub (`SSUBSCRIBE`) on a Redis Cluster found through these nodes, each
    /// channel subscribed on its own shard.
    Cluster(Vec<ConnectionInfo>),
}

impl Announcer {
    /// How many times the server that announces has changed ([`Endpoint::moves`]).
    fn moves(&self) -> u64 {
        match self {
            Announcer::Node(endpoint) => endpoint.moves(),
            Announcer::Cluster(_) => 0,
        }
    }
}

/// A live subscription connection.
enum Sink {
    Node(PubSubSink),
    Cluster(ClusterConnection),
}

impl Sink {
    /// Subscribes one channel.
    async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Sink::Node(sink) => sink.subscribe(channel).await,
            Sink::Cluster(connection) => connection.ssubscribe(channel).await,
        }
    }

    /// Unsubscribes one channel.
    async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Sink::Node(sink) => sink.unsubscribe(channel).await,
            Sink::Cluster(connection) => connection.sunsubscribe(channel).await,
        }
    }

    /// Whether a failed command means this connection is broken and must go. A cluster
    /// connection reconnects to its nodes by itself: an error there (a node down, a slot
    /// moving) is no reason to drop the connections to all the others.
    fn breaks_on_error(&self) -> bool {
        matches!(self, Sink::Node(_))
    }

    /// Whether an error reply refuses subscribing for good (permissions), as opposed to a
    /// passing state of the server or the cluster.
    fn is_refusal(&self, err: &redis::RedisError) -> bool {
        match self {
            Sink::Node(_) => matches!(err.kind(), redis::ErrorKind::Server(_)),
            Sink::Cluster(_) => err.code() == Some("NOPERM"),
        }
    }
}

/// How long a refused SUBSCRIBE keeps this client from trying again.
const REFUSED_PAUSE: Duration = Duration::from_secs(30);
/// The pause after the first connection-level failure in a row; it doubles with each further
/// one, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// When pub/sub may be tried again: after each failure in a row a pause twice as long as the
/// last (jittered between half and all of it, so clients that failed together do not come back
/// together), and none once a SUBSCRIBE succeeds.
#[derive(Default)]
struct Pause {
    until: Option<Instant>,
    failures: u32,
}

impl Pause {
    fn active(&self) -> bool {
        self.until.is_some_and(|until| Instant::now() < until)
    }

    /// A connection-level failure: no connection, or it broke.
    fn failed(&mut self) {
        let ceiling = FIRST_PAUSE
            .saturating_mul(1 << self.failures.min(16))
            .min(MAX_PAUSE);
        self.failures = self.failures.saturating_add(1);
        let ceiling_nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        let pause = Duration::from_nanos(fastrand::u64(ceiling_nanos / 2..=ceiling_nanos));
        self.until = Some(Instant::now() + pause);
    }

    /// The server refused SUBSCRIBE: permissions do not change in a hurry.
    fn refused(&mut self) {
        self.until = Some(Instant::now() + REFUSED_PAUSE);
    }

    fn succeeded(&mut self) {
        self.failures = 0;
        self.until = None;
    }
}

/// The client's waiters on released locks: it listens for release announcements and wakes the
/// waiters they concern. (Not `Waker`: that is `std::task`'s.)
pub(crate) struct ReleaseListener {
    inner: Arc<Inner>,
}

struct Inner {
    /// Where and how to subscribe: every one of them, each with its own connection.
    announcers: Vec<Announcer>,
    io: Handle,
    connect_timeout: Duration,
    response_timeout: Duration,
    state: Arc<State>,
}

/// A waiter's registration on a channel; the channel is unsubscribed [`UNSUBSCRIBE_AFTER`] after
/// the last one goes, unless another came meanwhile.
/// (Not `Interest`: that is `tokio::io`'s.)
pub(crate) struct WaitRegistration {
    inner: Arc<Inner>,
    name: String,
    side: Side,
}

/// How a waiter of one side of the lock is woken.
enum Side {
    Writer(Arc<Notify>),
    /// A fair waiter, with its id: woken by name.
    Fair(String, Arc<Notify>),
    Reader(watch::Receiver<()>),
    /// An election's observer: woken by every message on the channel.
    Observer(watch::Receiver<()>),
}

impl ReleaseListener {
    pub(crate) fn new(
        announcers: Vec<Announcer>,
        io: Handle,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        let subscriptions = announcers
            .iter()
            .map(|_| tokio::sync::Mutex::new(Subscriptions::default()))
            .collect();
        Self {
            inner: Arc::new(Inner {
                announcers,
                io,
                connect_timeout,
                response_timeout,
                state: Arc::new(State {
                    channels: Mutex::new(HashMap::new()),
                    subscriptions,
                }),
            }),
        }
    }

    /// Registers a waiter for a grant of `kind` on `channel`, woken as the kind's
    /// [`WakeRule`] says; a fair waiter (`waiter`: its id) is woken by the wake-ups naming it
    /// instead.
    pub(crate) fn interest(
        &self,
        channel: &str,
        kind: Kind,
        waiter: Option<&str>,
    ) -> WaitRegistration {
        self.register(channel, |entry| match (waiter, kind.wake_rule()) {
            (Some(waiter), _) => {
                let notify = Arc::new(Notify::new());
                entry.fair.insert(waiter.to_owned(), notify.clone());
                Side::Fair(waiter.to_owned(), notify)
            }
            (None, WakeRule::OnePerRelease) => {
                entry.waiting_writers += 1;
                Side::Writer(entry.writers.clone())
            }
            (None, WakeRule::AllReaders) => {
                entry.waiting_readers += 1;
                Side::Reader(entry.readers.subscribe())
            }
        })
    }

    /// Registers an election's observer on `channel`: woken by every release and every new
    /// leader's record announced there, never taking a wake-up from a waiter.
    pub(crate) fn observe(&self, channel: &str) -> WaitRegistration {
        self.register(channel, |entry| {
            entry.observing += 1;
            Side::Observer(entry.observers.subscribe())
        })
    }

    fn register(&self, channel: &str, side: impl FnOnce(&mut Channel) -> Side) -> WaitRegistration {
        let inner = &self.inner;
        let mut channels = inner.state.channels();
        let entry = channels
            .entry(channel.to_owned())
            .or_insert_with(|| Channel {
                fair: HashMap::new(),
                writers: Arc::new(Notify::new()),
                readers: watch::Sender::new(()),
                observers: watch::Sender::new(()),
                waiting_writers: 0,
                waiting_readers: 0,
                observing: 0,
            });
        let side = side(entry);
        WaitRegistration {
            inner: inner.clone(),
            name: channel.to_owned(),
            side,
        }
    }

    /// Waits until a release of `interest`'s lock is announced, or `delay` has passed, never
    /// longer; `true` when a release announcement ended it. Subscribing runs as a task of its own on the I/O runtime, so a wait that ends
    /// first cannot cut it short and leave a subscription nobody tracks.
    pub(crate) async fn wait(&self, interest: &mut WaitRegistration, delay: Duration) -> bool {
        let until = Instant::now() + delay;
        let woken = async {
            match &mut interest.side {
                Side::Writer(notify) | Side::Fair(_, notify) => notify.notified().await,
                Side::Reader(release) | Side::Observer(release) => {
                    if release.changed().await.is_err() {
                        // Unreachable while the interest lives (the channel keeps the sender).
                        std::future::pending::<()>().await;
                    }
                }
            }
        };
        tokio::pin!(woken);
        // Register for a wake-up before subscribing: a release announced meanwhile counts.
        let first = std::future::poll_fn(|cx| Poll::Ready(woken.as_mut().poll(cx))).await;
        if first.is_ready() {
            return true;
        }
        let listening = async {
            // A subscription that failed is tried again once its pause ends, within this
            // wait: a long backoff step would otherwise go without wake-ups (after a failover,
            // say) although pub/sub is back.
            loop {
                if let Some(subscribing) = self.subscribe(&interest.name) {
                    let _ = tokio::time::timeout_at(until, subscribing).await;
                }
                // Bounded too: a subscribe under way on a frozen server holds its state until
                // it times out, which must not keep this wait past its end.
                let retry = tokio::time::timeout_at(until, self.retry_after_pause(&interest.name));
                match retry.await.ok().flatten() {
                    Some(at) if at < until => tokio::time::sleep_until(at).await,
                    _ => break,
                }
            }
            tokio::time::sleep_until(until).await;
        };
        tokio::select! {
            () = &mut woken => true,
            () = listening => false,
        }
    }

    /// Subscribes `registration`'s channel now, unless it is already, waiting for it at most
    /// `within`: an election's observer (`election/observe.rs`) listens before its first read,
    /// so that no change announced after that read goes unheard.
    pub(crate) async fn listen(&self, registration: &WaitRegistration, within: Duration) {
        if let Some(subscribing) = self.subscribe(&registration.name) {
            let _ = tokio::time::timeout(within, subscribing).await;
        }
    }

    /// When `channel` is not subscribed on an announcer because its pub/sub is paused after a
    /// failure: the earliest end of such a pause, when subscribing may be tried again. `None`
    /// when it is subscribed on every announcer.
    async fn retry_after_pause(&self, channel: &str) -> Option<Instant> {
        let mut earliest: Option<Instant> = None;
        for subscriptions in &self.inner.state.subscriptions {
            let subscriptions = subscriptions.lock().await;
            if subscriptions.subscribed.contains(channel) || !subscriptions.pause.active() {
                continue;
            }
            if let Some(until) = subscriptions.pause.until {
                earliest = Some(earliest.map_or(until, |earliest| earliest.min(until)));
            }
        }
        earliest
    }

    /// Whether releases on `channel` reach this client now (its subscription is up on some
    /// announcer), as far as can be seen without waiting: `false` while subscriptions are
    /// being made.
    pub(crate) fn listening(&self, channel: &str) -> bool {
        self.inner.state.subscriptions.iter().any(|subscriptions| {
            subscriptions
                .try_lock()
                .is_ok_and(|subscriptions| subscriptions.subscribed.contains(channel))
        })
    }

    /// Starts subscribing to `channel` on every announcer where it is not known to be
    /// subscribed already (nor paused): one task for them all, which ends when each has
    /// answered or failed.
    fn subscribe(&self, channel: &str) -> Option<JoinHandle<()>> {
        let wanted: Vec<usize> = (0..self.inner.announcers.len())
            .filter(|&at| self.inner.needs_subscribing(at, channel))
            .collect();
        if wanted.is_empty() {
            return None;
        }
        let inner = self.inner.clone();
        let channel = channel.to_owned();
        Some(self.inner.io.spawn(async move {
            let subscribing = wanted.iter().map(|&at| inner.subscribe(at, &channel));
            futures_util::future::join_all(subscribing).await;
        }))
    }
}

impl Inner {
    /// Whether `channel` may need subscribing on announcer `at`, as far as can be seen without
    /// waiting (its state busy: yes, the task finds out).
    fn needs_subscribing(&self, at: usize, channel: &str) -> bool {
        let Ok(subscriptions) = self.state.subscriptions[at].try_lock() else {
            return true;
        };
        let current = subscriptions.moves == self.announcers[at].moves();
        !((current && subscriptions.subscribed.contains(channel)) || subscriptions.pause.active())
    }

    /// Subscribes `channel` on announcer `at`, connecting first if need be.
    async fn subscribe(&self, at: usize, channel: &str) {
        let mut subscriptions = self.state.subscriptions[at].lock().await;
        let moves = self.announcers[at].moves();
        if subscriptions.sink.is_some() && subscriptions.moves != moves {
            tracing::debug!(target: crate::telemetry::LOG_TARGET, "the primary has moved: wake-ups subscribe on the new one");
            subscriptions.forget();
        }
        let wanted = self.state.channels().contains_key(channel);
        if !wanted || subscriptions.pause.active() || subscriptions.subscribed.contains(channel) {
            return;
        }
        if subscriptions.sink.is_none() {
            match self.connect(at, subscriptions.generation).await {
                Ok((sink, reader)) => {
                    subscriptions.sink = Some(sink);
                    subscriptions.reader = Some(reader);
                    // Read after connecting: the connect asked the sentinels itself.
                    subscriptions.moves = self.announcers[at].moves();
                }
                Err(err) => {
                    tracing::debug!(target: crate::telemetry::LOG_TARGET, "no wake-up on release (backoff instead): {err}");
                    subscriptions.pause.failed();
                    return;
                }
            }
        }
        let Some(sink) = subscriptions.sink.as_mut() else {
            return;
        };
        match tokio::time::timeout(self.response_timeout, sink.subscribe(channel)).await {
            Ok(Ok(())) => {
                subscriptions.subscribed.insert(channel.to_owned());
                subscriptions.pause.succeeded();
            }
            Ok(Err(err)) if sink.is_refusal(&err) => {
                tracing::warn!(target: crate::telemetry::LOG_TARGET, "Redis refused subscribing to {channel} ({err}); waiters fall back to \
                     backoff. Grant the user the lock channels (e.g. `&distlock:*`) for \
                     wake-ups on release"
                );
                subscriptions.pause.refused();
            }
            Ok(Err(err)) if !sink.breaks_on_error() => {
                tracing::debug!(target: crate::telemetry::LOG_TARGET, "no wake-up on release for {channel} (backoff instead): {err}");
                subscriptions.pause.failed();
            }
            // Broken or half-open connection: drop it; the next wait connects again.
            Ok(Err(_)) | Err(_) => subscriptions.reset(),
        }
    }

    /// Connects (this runs on the I/O runtime, so the connection's driver lives there too) and
    /// starts the reader that wakes waiters.
    async fn connect(&self, at: usize, generation: u64) -> Result<(Sink, AbortHandle), String> {
        let (sink, reader) = tokio::time::timeout(self.connect_timeout, async {
            match &self.announcers[at] {
                Announcer::Node(endpoint) => {
                    let pubsub = endpoint.pubsub().await?;
                    let (sink, stream) = pubsub.split();
                    let reader =
                        tokio::spawn(read_node(stream, self.state.clone(), at, generation));
                    Ok::<_, redis::RedisError>((Sink::Node(sink), reader))
                }
                Announcer::Cluster(nodes) => {
                    let (pushes, received) = tokio::sync::mpsc::unbounded_channel();
                    let connection = ClusterClient::builder(nodes.clone())
                        .use_protocol(redis::ProtocolVersion::RESP3)
                        .push_sender(pushes)
                        .connection_timeout(self.connect_timeout)
                        .response_timeout(self.response_timeout)
                        .build()?
                        .get_async_connection()
                        .await?;
                    let reader =
                        tokio::spawn(read_cluster(received, self.state.clone(), at, generation));
                    Ok((Sink::Cluster(connection), reader))
                }
            }
        })
        .await
        .map_err(|_| "timed out connecting for pub/sub".to_owned())?
        .map_err(|err| err.to_string())?;
        Ok((sink, reader.abort_handle()))
    }
}

/// Wakes the waiters on `channel` that a message with `payload` is meant for, if this
/// client has any.
fn wake(state: &State, channel: &[u8], payload: &[u8]) {
    let Ok(channel) = std::str::from_utf8(channel) else {
        return;
    };
    if let Some(channel) = state.channels().get(channel) {
        channel.wake(payload);
    }
}

/// Reads a plain pub/sub connection (of announcer `at`) until it ends.
async fn read_node(
    mut stream: redis::aio::PubSubStream,
    state: Arc<State>,
    at: usize,
    generation: u64,
) {
    while let Some(message) = stream.next().await {
        wake(
            &state,
            message.get_channel_name().as_bytes(),
            message.get_payload_bytes(),
        );
    }
    connection_gone(&state, at, generation).await;
}

/// Reads the pushes of a cluster connection until it is dropped: messages wake waiters; a
/// dropped node connection forgets every channel as subscribed, an unsubscribe (ours, or the
/// server's after the slot moved) forgets its channel, so the next wait subscribes it again.
async fn read_cluster(
    mut pushes: tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
    state: Arc<State>,
    at: usize,
    generation: u64,
) {
    while let Some(push) = pushes.recv().await {
        match push.kind {
            PushKind::SMessage | PushKind::Message => {
                if let Some(Value::BulkString(channel)) = push.data.first() {
                    let payload = match push.data.get(1) {
                        Some(Value::BulkString(payload)) => payload.as_slice(),
                        _ => &[],
                    };
                    wake(&state, channel, payload);
                }
            }
            PushKind::SUnsubscribe | PushKind::Disconnection => {
                let channel = match push.data.first() {
                    Some(Value::BulkString(channel)) if push.kind == PushKind::SUnsubscribe => {
                        Some(String::from_utf8_lossy(channel).into_owned())
                    }
                    _ => None,
                };
                // Forgetting may wait for a subscribe under way; messages must not.
                let state = state.clone();
                tokio::spawn(async move {
                    let mut subscriptions = state.subscriptions[at].lock().await;
                    if subscriptions.generation != generation {
                        return;
                    }
                    match channel {
                        Some(channel) => {
                            subscriptions.subscribed.remove(&channel);
                        }
                        None => subscriptions.subscribed.clear(),
                    }
                });
            }
            _ => {}
        }
    }
    connection_gone(&state, at, generation).await;
}

/// Announcer `at`'s connection is gone: the next wait connects and subscribes again.
async fn connection_gone(state: &State, at: usize, generation: u64) {
    let mut subscriptions = state.subscriptions[at].lock().await;
    if subscriptions.generation == generation {
        subscriptions.reader = None; // this task, ending anyway
        subscriptions.reset();
    }
}

impl Drop for WaitRegistration {
    fn drop(&mut self) {
        let mut channels = self.inner.state.channels();
        let Some(entry) = channels.get_mut(&self.name) else {
            return;
        };
        match &self.side {
            Side::Writer(_) => entry.waiting_writers -= 1,
            Side::Reader(_) => entry.waiting_readers -= 1,
            Side::Observer(_) => entry.observing -= 1,
            Side::Fair(waiter, _) => {
                entry.fair.remove(waiter);
            }
        }
        if entry.waiting_writers + entry.waiting_readers + entry.observing + entry.fair.len() > 0 {
            return;
        }
        channels.remove(&self.name);
        drop(channels);
        let inner = self.inner.clone();
        let name = std::mem::take(&mut self.name);
        self.inner.io.spawn(async move {
            // Kept a moment: a lock contended in bursts would otherwise pay a SUBSCRIBE and an
            // UNSUBSCRIBE between two waits, and its next waiter a subscription's round trip.
            tokio::time::sleep(UNSUBSCRIBE_AFTER).await;
            let (state, timeout) = (&inner.state, inner.response_timeout);
            let unsubscribing = state.subscriptions.iter().map(|subscriptions| async {
                let mut subscriptions = subscriptions.lock().await;
                // A new waiter may have come meanwhile: it keeps the subscription.
                if state.channels().contains_key(&name) || !subscriptions.subscribed.remove(&name) {
                    return;
                }
                if let Some(sink) = subscriptions.sink.as_mut() {
                    let unsubscribed = tokio::time::timeout(timeout, sink.unsubscribe(&name)).await;
                    // A cluster channel left subscribed only brings a message nobody waits for.
                    if !matches!(unsubscribed, Ok(Ok(()))) && sink.breaks_on_error() {
                        subscriptions.reset();
                    }
                }
            });
            futures_util::future::join_all(unsubscribing).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remaining(pause: &Pause) -> Duration {
        pause
            .until
            .map_or(Duration::ZERO, |until| until - Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_double_after_each_failure_up_to_the_maximum_and_end_on_success() {
        let mut pause = Pause::default();
        assert!(!pause.active());
        let mut ceiling = FIRST_PAUSE;
        for _ in 0..10 {
            pause.failed();
            let left = remaining(&pause);
            assert!(
                left >= ceiling / 2 && left <= ceiling,
                "{left:?} not within half of {ceiling:?}"
            );
            assert!(pause.active());
            ceiling = (ceiling * 2).min(MAX_PAUSE);
        }
        assert_eq!(ceiling, MAX_PAUSE);
        pause.succeeded();
        assert!(!pause.active());
        pause.failed();
        assert!(remaining(&pause) <= FIRST_PAUSE, "a success starts over");
    }

    /// The figures how-it-works.md gives — 0.1 s after the first failure, doubling up to 5 s,
    /// 30 s after a refused SUBSCRIBE — are the pauses' (the two tests around this one check
    /// the pauses against these constants).
    #[test]
    fn the_pauses_are_the_figures_the_docs_give() {
        let doc = include_str!("../../../docs/how-it-works.md");
        let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            doc.contains(
                "0.1 s after the first failure, doubling up to 5 s, jittered; 30 s after Redis \
                 refuses SUBSCRIBE"
            ),
            "how-it-works.md no longer gives the pub/sub pauses' figures this test checks"
        );
        assert_eq!(
            (FIRST_PAUSE, MAX_PAUSE, REFUSED_PAUSE),
            (
                Duration::from_millis(100),
                Duration::from_secs(5),
                Duration::from_secs(30)
            )
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_subscribe_pauses_for_the_refusal_pause() {
        let mut pause = Pause::default();
        pause.refused();
        assert_eq!(remaining(&pause), REFUSED_PAUSE);
        tokio::time::advance(REFUSED_PAUSE).await;
        assert!(!pause.active());
    }
}
