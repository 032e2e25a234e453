//! The etcd store's wake-ups: one watch per client on every key under the key prefix, with
//! each event's previous value. A change of a lock's bookkeeping announces what the change
//! did, as the scripts publish it (`key_state.rs`: the fair queue's new head, a new leader's
//! record), read from the state before and after; a grant's key deleted — given back,
//! revoked, or its lease run out on the server — announces a release, and wakes the fair
//! queue's head by name as the bookkeeping last showed it. A watch is a
//! hint: events lost while it is down (or compacted away) cost a waiter one backoff step, and
//! once it is back every waiter tries again. The watch's task and the waiters' feed are
//! `store/every_key.rs`'s (one watch covers every key, so nothing is subscribed per key).
//! Neighbours: `wake.rs` (the waiters), `layout.rs` (what a key names).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use etcd_client::{EventType, WatchOptions};
use tokio::runtime::Handle;

use super::client::{wall_micros, Shared};
use super::layout::{self, Part};
use crate::kind::fair::WAKE_PREFIX;
use crate::protocol::LockKey;
use crate::store::every_key::{EveryKey, Subscription};
use crate::store::key_state::{announcements, decode, KeyState, Timeline};
use crate::wake::Waiters;

/// The watch of one client, shared by its feed and its store.
pub(crate) struct Watcher {
    shared: Arc<Shared>,
    waiters: Waiters,
    every_key: EveryKey,
    /// Each lock's fair queue head, as its bookkeeping's last change showed it.
    heads: Mutex<HashMap<String, String>>,
}

impl Watcher {
    pub(super) fn new(shared: Arc<Shared>, io: Handle, waiters: Waiters) -> Arc<Self> {
        let every_key = EveryKey::new(io, shared.connect_timeout);
        Arc::new(Self {
            shared,
            waiters,
            every_key,
            heads: Mutex::new(HashMap::new()),
        })
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
                self.every_key.set_up(true);
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
                    db_micros: wall_micros(),
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
        self.every_key.stop();
    }
}

impl Subscription for Watcher {
    fn every_key(&self) -> &EveryKey {
        &self.every_key
    }

    /// Starts watching, once: at a waiter's first wait, or the client's first grant (whose
    /// key, deleted by someone else, it must learn of).
    fn start(self: &Arc<Self>) {
        EveryKey::start(
            self,
            |this: Arc<Self>| async move { this.watch_once().await },
        );
    }
}
