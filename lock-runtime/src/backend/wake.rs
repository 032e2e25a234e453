//! Wake-up on release for the Redis backend. The release script publishes on the lock's
//! `…:released` channel (same hash tag as the lock key); waiters of this client subscribe to it
//! over one pub/sub connection, made on the client's I/O runtime, and a reader task wakes **one**
//! waiter of this client per release, so a handoff costs about one round trip and many waiters
//! do not all retry at once. Anything lost here (a message, the connection) only costs the
//! waiter one backoff step: the acquire loop's backoff stays the fallback.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;

/// One channel's waiters in this client.
struct Channel {
    notify: Arc<Notify>,
    interested: usize,
}

struct State {
    channels: Mutex<HashMap<String, Channel>>,
    /// The pub/sub connection's sink and the channels subscribed on it; one lock serialises
    /// SUBSCRIBE and UNSUBSCRIBE so they cannot overtake each other.
    subscriptions: tokio::sync::Mutex<Subscriptions>,
}

impl State {
    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
struct Subscriptions {
    sink: Option<PubSubSink>,
    /// The task reading the connection: dropping the sink alone would leave it open.
    reader: Option<AbortHandle>,
    subscribed: HashSet<String>,
    /// Bumped when a connection is dropped, so its reader does not clear a newer one.
    generation: u64,
    /// The server refused a SUBSCRIBE (e.g. an ACL user without channel permissions): no new
    /// tries before then; waiters use their backoff.
    refused_until: Option<Instant>,
}

impl Subscriptions {
    /// Drops the pub/sub connection (aborting its reader closes it).
    fn reset(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
        self.sink = None;
        self.subscribed.clear();
        self.generation += 1;
    }
}

/// How long a refused SUBSCRIBE keeps this client from trying again.
const REFUSED_PAUSE: Duration = Duration::from_secs(30);

/// The client's waiters on released locks.
pub(crate) struct Waker {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    io: Handle,
    connect_timeout: Duration,
    response_timeout: Duration,
    state: Arc<State>,
}

/// A waiter's registration on a channel; the channel is unsubscribed when the last one goes.
pub(crate) struct Interest {
    inner: Arc<Inner>,
    name: String,
    notify: Arc<Notify>,
}

impl Waker {
    pub(crate) fn new(
        client: redis::Client,
        io: Handle,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                io,
                connect_timeout,
                response_timeout,
                state: Arc::new(State {
                    channels: Mutex::new(HashMap::new()),
                    subscriptions: tokio::sync::Mutex::new(Subscriptions::default()),
                }),
            }),
        }
    }

    /// Registers a waiter on `channel`.
    pub(crate) fn interest(&self, channel: &str) -> Interest {
        let inner = &self.inner;
        let mut channels = inner.state.channels();
        let entry = channels
            .entry(channel.to_owned())
            .or_insert_with(|| Channel {
                notify: Arc::new(Notify::new()),
                interested: 0,
            });
        entry.interested += 1;
        Interest {
            inner: inner.clone(),
            name: channel.to_owned(),
            notify: entry.notify.clone(),
        }
    }

    /// Waits until a release of `interest`'s lock is announced, or `delay` has passed, never
    /// longer. Subscribing runs as a task of its own on the I/O runtime, so a wait that ends
    /// first cannot cut it short and leave a subscription nobody tracks.
    pub(crate) async fn wait(&self, interest: &Interest, delay: Duration) {
        let until = Instant::now() + delay;
        let notified = interest.notify.notified();
        tokio::pin!(notified);
        // Register for a wake-up before subscribing: a release announced meanwhile counts.
        notified.as_mut().enable();
        let subscribing = self.subscribe(&interest.name);
        tokio::select! {
            () = &mut notified => {}
            () = async {
                if let Some(subscribing) = subscribing {
                    let _ = tokio::time::timeout_at(until, subscribing).await;
                }
                tokio::time::sleep_until(until).await;
            } => {}
        }
    }

    /// Starts subscribing to `channel` unless it is known to be subscribed already.
    fn subscribe(&self, channel: &str) -> Option<JoinHandle<()>> {
        if let Ok(subscriptions) = self.inner.state.subscriptions.try_lock() {
            if subscriptions.subscribed.contains(channel) {
                return None;
            }
        }
        let inner = self.inner.clone();
        let channel = channel.to_owned();
        Some(
            self.inner
                .io
                .spawn(async move { inner.subscribe(&channel).await }),
        )
    }
}

impl Inner {
    async fn subscribe(&self, channel: &str) {
        let mut subscriptions = self.state.subscriptions.lock().await;
        let wanted = self.state.channels().contains_key(channel);
        let refused = subscriptions
            .refused_until
            .is_some_and(|until| Instant::now() < until);
        if !wanted || refused || subscriptions.subscribed.contains(channel) {
            return;
        }
        if subscriptions.sink.is_none() {
            match self.connect(subscriptions.generation).await {
                Ok((sink, reader)) => {
                    subscriptions.sink = Some(sink);
                    subscriptions.reader = Some(reader);
                }
                Err(err) => {
                    tracing::debug!("no wake-up on release (backoff instead): {err}");
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
            }
            Ok(Err(err)) if matches!(err.kind(), redis::ErrorKind::Server(_)) => {
                tracing::warn!(
                    "Redis refused SUBSCRIBE ({err}); waiters fall back to backoff. \
                     Grant the user the lock channels (e.g. `&distlock:*`) for wake-ups on release"
                );
                subscriptions.refused_until = Some(Instant::now() + REFUSED_PAUSE);
            }
            // Broken or half-open connection: drop it; the next wait connects again.
            Ok(Err(_)) | Err(_) => subscriptions.reset(),
        }
    }

    /// Connects (this runs on the I/O runtime, so the connection's driver lives there too) and
    /// starts the reader that wakes waiters.
    async fn connect(&self, generation: u64) -> Result<(PubSubSink, AbortHandle), String> {
        let pubsub = tokio::time::timeout(self.connect_timeout, self.client.get_async_pubsub())
            .await
            .map_err(|_| "timed out connecting for pub/sub".to_owned())?
            .map_err(|err| err.to_string())?;
        let (sink, mut stream) = pubsub.split();
        let state = self.state.clone();
        let reader = tokio::spawn(async move {
            while let Some(message) = stream.next().await {
                let notify = state
                    .channels()
                    .get(message.get_channel_name())
                    .map(|c| c.notify.clone());
                if let Some(notify) = notify {
                    // One waiter per release per client: no thundering herd.
                    notify.notify_one();
                }
            }
            // The connection is gone: the next wait connects and subscribes again.
            let mut subscriptions = state.subscriptions.lock().await;
            if subscriptions.generation == generation {
                subscriptions.reader = None; // this task, ending anyway
                subscriptions.reset();
            }
        });
        Ok((sink, reader.abort_handle()))
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut channels = self.inner.state.channels();
        let Some(entry) = channels.get_mut(&self.name) else {
            return;
        };
        entry.interested -= 1;
        if entry.interested > 0 {
            return;
        }
        channels.remove(&self.name);
        drop(channels);
        let inner = self.inner.clone();
        let name = std::mem::take(&mut self.name);
        self.inner.io.spawn(async move {
            let (state, timeout) = (&inner.state, inner.response_timeout);
            let mut subscriptions = state.subscriptions.lock().await;
            // A new waiter may have come meanwhile: it keeps the subscription.
            if state.channels().contains_key(&name) || !subscriptions.subscribed.remove(&name) {
                return;
            }
            if let Some(sink) = subscriptions.sink.as_mut() {
                let unsubscribed = tokio::time::timeout(timeout, sink.unsubscribe(&name)).await;
                if !matches!(unsubscribed, Ok(Ok(()))) {
                    subscriptions.reset();
                }
            }
        });
    }
}
