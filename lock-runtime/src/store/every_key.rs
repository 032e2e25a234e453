//! The wake-ups of a store whose one subscription covers every key — PostgreSQL's `LISTEN`
//! on one channel (`postgres/listener.rs`), etcd's watch on the key prefix
//! (`etcd/watcher.rs`): the subscription's task, started once and run again after a pause
//! each time it ends, for as long as its owner lives ([`EveryKey`]); and the [`Feed`] the
//! waiters ask ([`EveryKeyFeed`]): a waiter's first wait starts the subscription and waits,
//! at most the connect timeout, until it is up; nothing is subscribed per key. Neighbours:
//! `wake.rs` (the waiters and the `Feed` contract); each store's subscription delivers what
//! it hears to its `Waiters` itself.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::wake::Feed;

/// The pause before subscribing again after the subscription failed or ended.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// The task of one client's subscription to every key, and whether it is up.
pub(crate) struct EveryKey {
    io: Handle,
    connect_timeout: Duration,
    up: watch::Sender<bool>,
    started: AtomicBool,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl EveryKey {
    pub(crate) fn new(io: Handle, connect_timeout: Duration) -> Self {
        Self {
            io,
            connect_timeout,
            up: watch::Sender::new(false),
            started: AtomicBool::new(false),
            task: Mutex::new(None),
        }
    }

    /// From the first call on (later calls do nothing), runs `once` on the I/O runtime again
    /// and again, a pause apart, while `owner` lives: one subscription's life each, down
    /// once it ends.
    pub(crate) fn start<T, F, Fut>(owner: &Arc<T>, once: F)
    where
        T: Subscription,
        F: Fn(Arc<T>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let every_key = owner.every_key();
        if every_key.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(owner);
        let task = every_key.io.spawn(async move {
            loop {
                let Some(this) = weak.upgrade() else {
                    return;
                };
                once(this.clone()).await;
                this.every_key().set_up(false);
                drop(this);
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        });
        *every_key
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(task);
    }

    /// Says whether the subscription is up (heard by waiters waiting for it).
    pub(crate) fn set_up(&self, up: bool) {
        self.up.send_replace(up);
    }

    /// Stops the subscription (its store is gone).
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

/// A store's subscription to every key: how to start it, and its [`EveryKey`].
pub(crate) trait Subscription: Send + Sync + 'static {
    /// Its task and state.
    fn every_key(&self) -> &EveryKey;

    /// Starts it (once).
    fn start(self: &Arc<Self>);
}

/// The feed a client's [`ReleaseListener`](crate::wake::ReleaseListener) asks.
pub(crate) struct EveryKeyFeed<S>(pub(crate) Arc<S>);

impl<S: Subscription> Feed for EveryKeyFeed<S> {
    /// Starts the subscription on first use; a task that ends once it is up (the caller
    /// bounds the wait).
    fn subscribe(&self, _channel: &str) -> Option<JoinHandle<()>> {
        self.0.start();
        let every_key = self.0.every_key();
        if *every_key.up.borrow() {
            return None;
        }
        let mut up = every_key.up.subscribe();
        // Bounded, so that waits while the server is down leave no task behind for long.
        let within = every_key.connect_timeout;
        Some(every_key.io.spawn(async move {
            let _ = tokio::time::timeout(within, up.wait_for(|up| *up)).await;
        }))
    }

    fn retry_after_pause<'a>(
        &'a self,
        _channel: &'a str,
    ) -> BoxFuture<'a, Option<tokio::time::Instant>> {
        Box::pin(async { None })
    }

    fn listening(&self, _channel: &str) -> bool {
        *self.0.every_key().up.borrow()
    }

    fn unwanted(&self, _channel: String) {}
}
