//! The etcd store's wake-ups: one watch per client on every key under the key prefix, with
//! each event's previous value. A change of a lock's bookkeeping announces what the change
//! did, as the scripts publish it (`key_state.rs`: the fair queue's new head, a new leader's
//! record), read from the state before and after; a grant's key deleted — given back,
//! revoked, or its lease run out on the server — announces a release, and wakes the fair
//! queue's head by name as the bookkeeping last showed it. A watch is a
//! hint: events lost while it is down (or compacted away) cost a waiter one backoff step, and
//! once it is back every waiter tries again. The [`Feed`] side: a waiter's subscription starts
//! the watch on first use and waits until it runs; one watch covers every key, so nothing is
//! subscribed per key. Neighbours: `wake.rs` (the waiters), `layout.rs` (what a key names).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{EventType, WatchOptions};
use futures_util::future::BoxFuture;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::layout::{self, Part};
use super::Shared;
use crate::kind::fair::WAKE_PREFIX;
use crate::protocol::LockKey;
use crate::store::key_state::{announcements, decode, KeyState, Timeline};
use crate::wake::{Feed, Waiters};

/// The pause before watching again after the watch failed or ended.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// The watch of one client, shared by its feed and its store.
pub(crate) struct Watcher {
    shared: Arc<Shared>,
    io: Handle,
    waiters: Waiters,
    /// Whether events reach this client now.
    watching: watch::Sender<bool>,
    /// Each lock's fair queue head, as its bookkeeping's last change showed it.
    heads: Mutex<HashMap<String, String>>,
    started: AtomicBool,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Watcher {
    pub(super) fn new(shared: Arc<Shared>, io: Handle, waiters: Waiters) -> Arc<Self> {
        Arc::new(Self {
            shared,
            io,
            waiters,
            watching: watch::Sender::new(false),
            heads: Mutex::new(HashMap::new()),
            started: AtomicBool::new(false),
            task: Mutex::new(None),
        })
    }

    /// Starts watching, once: at a waiter's first wait, or the client's first grant (whose
    /// key, deleted by someone else, it must learn of).
    pub(super) fn start(self: &Arc<Self>) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let watcher = Arc::downgrade(self);
        let task = self.io.spawn(async move {
            loop {
                let Some(this) = watcher.upgrade() else {
                    return;
                };
                this.watch_once().await;
                this.watching.send_replace(false);
                drop(this);
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        });
        *self.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
    }

    /// One watch's life: open it, deliver until it ends or fails.
    async fn watch_once(&self) {
        let Ok(client) = self.shared.client().await else {
            return;
        };
        let prefix = layout::escape(&self.shared.prefix);
        let options = WatchOptions::new()
            .with_range(layout::range_end(&prefix))
            .with_prev_key();
        let mut watches = client.watch_client();
        let opening = tokio::time::timeout(
            self.shared.connect_timeout,
            watches.watch(prefix.clone(), Some(options)),
        );
        let Ok(Ok(mut stream)) = opening.await else {
            return;
        };
        let mut created = false;
        while let Ok(Some(response)) = stream.message().await {
            if response.canceled() || response.compact_revision() > 0 {
                return;
            }
            if !created {
                created = true;
                self.watching.send_replace(true);
                // Releases made while nobody watched were not seen: every waiter tries again.
                self.waiters.wake_all();
            }
            for event in response.events() {
                self.deliver(event);
            }
        }
    }

    /// Wakes the waiters an event concerns.
    fn deliver(&self, event: &etcd_client::Event) {
        let Some(kv) = event.kv() else {
            return;
        };
        let Ok(key) = std::str::from_utf8(kv.key()) else {
            return;
        };
        let Some((lock, part)) = layout::parse(key) else {
            return;
        };
        let channel = LockKey {
            name: String::new(),
            lock: lock.clone(),
        }
        .channel();
        match part {
            Part::Holder(side, name) => {
                if event.event_type() == EventType::Delete {
                    // A grant of this client whose key is gone is lost, whatever its lease
                    // says (an operator deleted the key): its next renewal says so. A
                    // permit's owner is the last word of its value.
                    let owner = match side {
                        'p' => event
                            .prev_kv()
                            .and_then(|kv| std::str::from_utf8(kv.value()).ok())
                            .and_then(|value| value.rsplit(' ').next())
                            .map(str::to_owned),
                        _ => Some(name.to_owned()),
                    };
                    if let Some(owner) = owner {
                        self.shared.leases.remove(&lock, &owner);
                    }
                    self.waiters.wake(&channel, b"");
                    let head = self
                        .heads
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .get(&lock)
                        .cloned();
                    if let Some(head) = head {
                        let mut payload = WAKE_PREFIX.to_vec();
                        payload.extend_from_slice(head.as_bytes());
                        self.waiters.wake(&channel, &payload);
                    }
                }
            }
            Part::State => {
                let time = Timeline {
                    db_micros: super::wall_micros(),
                    now: Instant::now(),
                };
                let read = |value: &[u8]| -> KeyState {
                    serde_json::from_slice(value)
                        .ok()
                        .and_then(|json| decode(&json, &time).ok())
                        .unwrap_or_default()
                };
                let before = event
                    .prev_kv()
                    .map(|kv| read(kv.value()))
                    .unwrap_or_default();
                let after = match event.event_type() {
                    EventType::Put => read(kv.value()),
                    EventType::Delete => KeyState::default(),
                };
                {
                    let mut heads = self.heads.lock().unwrap_or_else(PoisonError::into_inner);
                    match after.entry.queue.as_ref().and_then(|queue| queue.first()) {
                        Some(head) => heads.insert(lock, head.to_owned()),
                        None => heads.remove(&lock),
                    };
                }
                for payload in announcements(&before, &after) {
                    self.waiters.wake(&channel, payload.as_bytes());
                }
            }
        }
    }

    /// Stops watching (the store is gone).
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
pub(crate) struct WatcherFeed(pub(crate) Arc<Watcher>);

impl Feed for WatcherFeed {
    /// Starts the watch on first use; a task that ends once it runs (the caller bounds the
    /// wait).
    fn subscribe(&self, _channel: &str) -> Option<JoinHandle<()>> {
        self.0.start();
        if *self.0.watching.borrow() {
            return None;
        }
        let mut watching = self.0.watching.subscribe();
        let within = self.0.shared.connect_timeout;
        Some(self.0.io.spawn(async move {
            let _ = tokio::time::timeout(within, watching.wait_for(|up| *up)).await;
        }))
    }

    fn retry_after_pause<'a>(
        &'a self,
        _channel: &'a str,
    ) -> BoxFuture<'a, Option<tokio::time::Instant>> {
        Box::pin(async { None })
    }

    fn listening(&self, _channel: &str) -> bool {
        *self.0.watching.borrow()
    }

    fn unwanted(&self, _channel: String) {}
}
