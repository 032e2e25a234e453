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
    subscribed: HashSet<String>,
    /// Bumped when a connection dies, so its reader does not clear a newer one.
    generation: u64,
}

impl Subscriptions {
    fn reset(&mut self) {
        self.sink = None;
        self.subscribed.clear();
        self.generation += 1;
    }
}

/// The client's waiters on released locks.
pub(crate) struct Waker {
    client: redis::Client,
    io: Handle,
    connect_timeout: Duration,
    state: Arc<State>,
}

/// A waiter's registration on a channel; the channel is unsubscribed when the last one goes.
pub(crate) struct Interest {
    state: Arc<State>,
    io: Handle,
    name: String,
    notify: Arc<Notify>,
}

impl Waker {
    pub(crate) fn new(client: redis::Client, io: Handle, connect_timeout: Duration) -> Self {
        Self {
            client,
            io,
            connect_timeout,
            state: Arc::new(State {
                channels: Mutex::new(HashMap::new()),
                subscriptions: tokio::sync::Mutex::new(Subscriptions::default()),
            }),
        }
    }

    /// Registers a waiter on `channel`.
    pub(crate) fn interest(&self, channel: &str) -> Interest {
        let mut channels = self.state.channels();
        let entry = channels
            .entry(channel.to_owned())
            .or_insert_with(|| Channel {
                notify: Arc::new(Notify::new()),
                interested: 0,
            });
        entry.interested += 1;
        Interest {
            state: self.state.clone(),
            io: self.io.clone(),
            name: channel.to_owned(),
            notify: entry.notify.clone(),
        }
    }

    /// Waits until a release of `interest`'s lock is announced, or `delay` has passed. The
    /// subscription is confirmed before the wait, so no release after that point is missed
    /// while the pub/sub connection holds.
    pub(crate) async fn wait(&self, interest: &Interest, delay: Duration) {
        let notified = interest.notify.notified();
        tokio::pin!(notified);
        // Register for a wake-up before subscribing: a release announced meanwhile counts.
        notified.as_mut().enable();
        let subscribed = tokio::time::timeout(delay, self.subscribe(&interest.name)).await;
        if let Ok(Err(err)) = subscribed {
            tracing::debug!("no wake-up on release for this wait (backoff instead): {err}");
        }
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep(delay) => {}
        }
    }

    async fn subscribe(&self, channel: &str) -> Result<(), String> {
        let mut subscriptions = self.state.subscriptions.lock().await;
        if subscriptions.subscribed.contains(channel) {
            return Ok(());
        }
        if subscriptions.sink.is_none() {
            let sink = self.connect(subscriptions.generation).await?;
            subscriptions.sink = Some(sink);
        }
        let Some(sink) = subscriptions.sink.as_mut() else {
            return Err("no pub/sub connection".to_owned());
        };
        match sink.subscribe(channel).await {
            Ok(()) => {
                subscriptions.subscribed.insert(channel.to_owned());
                Ok(())
            }
            Err(err) => {
                subscriptions.reset();
                Err(err.to_string())
            }
        }
    }

    /// Connects on the I/O runtime and starts the reader that wakes waiters.
    async fn connect(&self, generation: u64) -> Result<PubSubSink, String> {
        let client = self.client.clone();
        let timeout = self.connect_timeout;
        let connected = self
            .io
            .spawn(async move { tokio::time::timeout(timeout, client.get_async_pubsub()).await })
            .await;
        let pubsub = match connected {
            Ok(Ok(Ok(pubsub))) => pubsub,
            Ok(Ok(Err(err))) => return Err(err.to_string()),
            Ok(Err(_)) => return Err("timed out connecting for pub/sub".to_owned()),
            Err(_) => return Err("the client's I/O runtime has shut down".to_owned()),
        };
        let (sink, mut stream) = pubsub.split();
        let state = self.state.clone();
        self.io.spawn(async move {
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
                subscriptions.reset();
            }
        });
        Ok(sink)
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut channels = self.state.channels();
        let Some(entry) = channels.get_mut(&self.name) else {
            return;
        };
        entry.interested -= 1;
        if entry.interested > 0 {
            return;
        }
        channels.remove(&self.name);
        drop(channels);
        let state = self.state.clone();
        let name = std::mem::take(&mut self.name);
        self.io.spawn(async move {
            let mut subscriptions = state.subscriptions.lock().await;
            // A new waiter may have come meanwhile: it keeps the subscription.
            if state.channels().contains_key(&name) || !subscriptions.subscribed.remove(&name) {
                return;
            }
            if let Some(sink) = subscriptions.sink.as_mut() {
                if sink.unsubscribe(&name).await.is_err() {
                    subscriptions.reset();
                }
            }
        });
    }
}
