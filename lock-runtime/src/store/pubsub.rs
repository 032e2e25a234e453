//! The Redis stores' release announcements, fed to this client's waiters (`wake.rs`'s
//! [`Feed`]). A release publishes on the lock's `…:released` channel (same hash tag as the
//! lock key); while a waiter of this client waits on a channel, [`PubSub`] keeps it subscribed
//! over one pub/sub connection per announcing server ([`Announcer`]), made on the client's I/O
//! runtime, and a reader task hands each message to [`Waiters::wake`]. On one server (or
//! Sentinel's primary): `SUBSCRIBE`; after a failover ([`Endpoint::moves`]) the next wait
//! subscribes again on the primary the sentinels name now. Redlock: one connection per master,
//! each announcing every release. Cluster: `SSUBSCRIBE` on the lock's shard, one command per
//! channel (never several across slots), resubscribed by the next wait after a node's
//! connection drops or a slot moves. When pub/sub fails this client pauses it ([`Pause`]) and
//! its waiters back off meanwhile. The argument for each of these is in
//! `docs/how-it-works.md`, "Wake-ups on release". Neighbours: `redis.rs`, `cluster.rs` and
//! `redlock.rs` make their listener here ([`PubSub::listener`]); `endpoint.rs` connects.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionInfo, PushKind, RedisResult, Value};
use tokio::runtime::Handle;
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;

use super::endpoint::Endpoint;
use crate::wake::{Feed, ReleaseListener, Waiters};

/// How long a channel stays subscribed after its last waiter of this client left.
const UNSUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// What the connections' reader tasks share with the subscribing side.
struct ReaderState {
    /// The waiters the messages wake, and whose wants decide what stays subscribed.
    waiters: Waiters,
    /// For each announcer (by its index in [`PubSubInner::announcers`]), the pub/sub connection's sink
    /// and the channels subscribed on it; one lock per announcer serialises its SUBSCRIBE and
    /// UNSUBSCRIBE so they cannot overtake each other.
    subscriptions: Vec<tokio::sync::Mutex<Subscriptions>>,
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

/// This client's Redis pub/sub: the [`Feed`] of the Redis stores' waiters.
pub(crate) struct PubSub {
    inner: Arc<PubSubInner>,
}

struct PubSubInner {
    /// Where and how to subscribe: every one of them, each with its own connection.
    announcers: Vec<Announcer>,
    io: Handle,
    connect_timeout: Duration,
    response_timeout: Duration,
    state: Arc<ReaderState>,
}

impl PubSub {
    /// A listener for waiters woken by releases that `announcers` announce, subscribing on
    /// the I/O runtime `io` within these timeouts.
    pub(crate) fn listener(
        announcers: Vec<Announcer>,
        io: Handle,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> ReleaseListener {
        let waiters = Waiters::default();
        let subscriptions = announcers
            .iter()
            .map(|_| tokio::sync::Mutex::new(Subscriptions::default()))
            .collect();
        let pubsub = PubSub {
            inner: Arc::new(PubSubInner {
                announcers,
                io,
                connect_timeout,
                response_timeout,
                state: Arc::new(ReaderState {
                    waiters: waiters.clone(),
                    subscriptions,
                }),
            }),
        };
        ReleaseListener::new(waiters, pubsub)
    }
}

impl Feed for PubSub {
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

    /// When `channel` is not subscribed on an announcer because its pub/sub is paused after a
    /// failure: the earliest end of such a pause. `None` when it is subscribed on every
    /// announcer.
    fn retry_after_pause<'a>(&'a self, channel: &'a str) -> BoxFuture<'a, Option<Instant>> {
        Box::pin(async move {
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
        })
    }

    /// Whether `channel`'s subscription is up on some announcer, as far as can be seen
    /// without waiting: `false` while subscriptions are being made.
    fn listening(&self, channel: &str) -> bool {
        self.inner.state.subscriptions.iter().any(|subscriptions| {
            subscriptions
                .try_lock()
                .is_ok_and(|subscriptions| subscriptions.subscribed.contains(channel))
        })
    }

    /// Unsubscribes `channel` [`UNSUBSCRIBE_AFTER`] from now, unless a waiter came meanwhile.
    fn unwanted(&self, channel: String) {
        let inner = self.inner.clone();
        self.inner.io.spawn(async move {
            // Kept a moment: a lock contended in bursts would otherwise pay a SUBSCRIBE and an
            // UNSUBSCRIBE between two waits, and its next waiter a subscription's round trip.
            tokio::time::sleep(UNSUBSCRIBE_AFTER).await;
            let (state, timeout) = (&inner.state, inner.response_timeout);
            let unsubscribing = state.subscriptions.iter().map(|subscriptions| async {
                let mut subscriptions = subscriptions.lock().await;
                // A new waiter may have come meanwhile: it keeps the subscription.
                if state.waiters.wants(&channel) || !subscriptions.subscribed.remove(&channel) {
                    return;
                }
                if let Some(sink) = subscriptions.sink.as_mut() {
                    let unsubscribed =
                        tokio::time::timeout(timeout, sink.unsubscribe(&channel)).await;
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

impl PubSubInner {
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
        let wanted = self.state.waiters.wants(channel);
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

/// Hands a message on `channel` to the waiters ([`Waiters::wake`]).
fn wake(state: &ReaderState, channel: &[u8], payload: &[u8]) {
    let Ok(channel) = std::str::from_utf8(channel) else {
        return;
    };
    state.waiters.wake(channel, payload);
}

/// Reads a plain pub/sub connection (of announcer `at`) until it ends.
async fn read_node(
    mut stream: redis::aio::PubSubStream,
    state: Arc<ReaderState>,
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
    state: Arc<ReaderState>,
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
async fn connection_gone(state: &ReaderState, at: usize, generation: u64) {
    let mut subscriptions = state.subscriptions[at].lock().await;
    if subscriptions.generation == generation {
        subscriptions.reader = None; // this task, ending anyway
        subscriptions.reset();
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
