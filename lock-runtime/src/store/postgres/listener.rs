//! The PostgreSQL store's wake-ups: one connection of its own per client `LISTEN`s on the
//! store's channel (the schema's name), and every notification — `<payload> <lock channel>`,
//! sent by the statement that changed a key (`statements.rs`, at its commit) — is delivered to
//! this client's waiters ([`Waiters::wake`]), which apply the kinds' rule of whom it wakes.
//! A notification is a hint: one lost while the connection is down (or to a server restart)
//! costs a waiter one backoff step, and the connection is made again after a pause. The
//! [`Feed`] side: a waiter's subscription starts the listener on first use and waits until it
//! listens; there is one channel for every key, so nothing is subscribed per key.
//! Neighbours: `wake.rs` (the waiters), `connections.rs` (how a connection is made).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Config, NoTls};

use crate::wake::{Feed, Waiters};

/// The pause before listening again after the connection failed or broke.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// The listener of one client, shared by its feed and its store.
pub(crate) struct Listener {
    config: Config,
    io: Handle,
    /// The channel: the schema's name.
    channel: String,
    waiters: Waiters,
    connect_timeout: Duration,
    /// Whether notifications reach this client now.
    listening: watch::Sender<bool>,
    started: AtomicBool,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Listener {
    pub(crate) fn new(
        config: Config,
        io: Handle,
        channel: String,
        waiters: Waiters,
        connect_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            config,
            io,
            channel,
            waiters,
            connect_timeout,
            listening: watch::Sender::new(false),
            started: AtomicBool::new(false),
            task: Mutex::new(None),
        })
    }

    /// Starts listening, once.
    fn start(self: &Arc<Self>) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let listener = Arc::downgrade(self);
        let task = self.io.spawn(async move {
            loop {
                let Some(this) = listener.upgrade() else {
                    return;
                };
                this.listen_once().await;
                this.listening.send_replace(false);
                drop(this);
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        });
        *self.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
    }

    /// One connection's life: connect, `LISTEN`, deliver until it breaks.
    async fn listen_once(&self) {
        let connecting = tokio::time::timeout(self.connect_timeout, self.config.connect(NoTls));
        let Ok(Ok((client, mut connection))) = connecting.await else {
            return;
        };
        let waiters = self.waiters.clone();
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        let deliver = async move {
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(note) = message {
                    let (payload, channel) = note
                        .payload()
                        .split_once(' ')
                        .unwrap_or(("", note.payload()));
                    waiters.wake(channel, payload.as_bytes());
                }
            }
        };
        tokio::pin!(deliver);
        let statement = format!("LISTEN \"{}\"", self.channel);
        let listen = client.batch_execute(&statement);
        tokio::select! {
            () = &mut deliver => return,
            listened = listen => if listened.is_err() { return },
        }
        self.listening.send_replace(true);
        // Releases announced while nobody listened were not heard: every waiter tries again.
        self.waiters.wake_all();
        deliver.await;
    }

    /// Stops listening (the store is gone).
    pub(crate) fn stop(&self) {
        if let Some(task) = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// The feed a client's [`ReleaseListener`](crate::wake::ReleaseListener) asks.
pub(crate) struct ListenerFeed(pub(crate) Arc<Listener>);

impl Feed for ListenerFeed {
    /// Starts the listener on first use; a task that ends once it listens (the caller bounds
    /// the wait).
    fn subscribe(&self, _channel: &str) -> Option<JoinHandle<()>> {
        self.0.start();
        if *self.0.listening.borrow() {
            return None;
        }
        let mut listening = self.0.listening.subscribe();
        // Bounded, so that waits while the server is down leave no task behind for long.
        let within = self.0.connect_timeout;
        Some(self.0.io.spawn(async move {
            let _ = tokio::time::timeout(within, listening.wait_for(|up| *up)).await;
        }))
    }

    fn retry_after_pause<'a>(
        &'a self,
        _channel: &'a str,
    ) -> BoxFuture<'a, Option<tokio::time::Instant>> {
        Box::pin(async { None })
    }

    fn listening(&self, _channel: &str) -> bool {
        *self.0.listening.borrow()
    }

    fn unwanted(&self, _channel: String) {}
}
