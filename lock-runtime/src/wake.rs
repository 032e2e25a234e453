//! Waiting for a release: this client's waiters, by the lock channel they wait on, and how one
//! message on that channel wakes them. The acquire loop (`acquire/`) registers a waiter
//! ([`ReleaseListener::interest`]) and waits on it ([`ReleaseListener::wait`]) between tries;
//! an election's observer (`election/observe.rs`) registers as an observer, woken by every
//! message. Whom a message wakes is the kinds' rule (`kind/wake_rule.rs`: one writer, else
//! every reader, and one fair waiter; a fair queue's head by its id; a new leader's record only
//! the observers), applied here. Anything lost (a message, a subscription) costs a waiter one
//! backoff step: the acquire loop's backoff stays the fallback.
//!
//! The seam to the stores is [`Feed`]: a store that announces releases delivers each message
//! as a channel and a payload ([`Waiters::wake`]) and answers subscription requests (the Redis
//! stores by pub/sub, `store/pubsub.rs`; a store that needs no subscription only delivers;
//! today's in-process store has no feed, and its waiters back off). This module sits between the kinds and the stores and
//! imports nothing from `store/`. The whole argument is in `docs/how-it-works.md`, "Wake-ups
//! on release".

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::kind::{Announcement, FairWake, Kind, WakeRule};

/// How a store's release announcements reach this client's [`Waiters`]: the store's side of
/// the seam. The store delivers every message it receives to [`Waiters::wake`]; this module
/// asks it to listen on a channel while a waiter waits there, and tells it when none does.
pub(crate) trait Feed: Send + Sync + 'static {
    /// Starts listening on `channel` wherever it is not known to be listened on already (nor
    /// paused after failures), as a task of its own that ends when each source has answered or
    /// failed; `None` when there is nothing to start. A wait that ends first must not cut it
    /// short and leave a subscription nobody tracks.
    fn subscribe(&self, channel: &str) -> Option<JoinHandle<()>>;

    /// When `channel` is not listened on somewhere because listening is paused after a
    /// failure: the earliest end of such a pause, when subscribing may be tried again. `None`
    /// when it is listened on everywhere (or nothing is paused).
    fn retry_after_pause<'a>(&'a self, channel: &'a str) -> BoxFuture<'a, Option<Instant>>;

    /// Whether messages on `channel` reach this client now, as far as can be seen without
    /// waiting.
    fn listening(&self, channel: &str) -> bool;

    /// The last waiter on `channel` has left: stop listening there when convenient, unless a
    /// waiter has come back by then ([`Waiters::wants`]). Called on a drop: must not block.
    fn unwanted(&self, channel: String);
}

/// This client's waiters, by channel: what a [`Feed`] delivers messages to.
#[derive(Clone, Default)]
pub(crate) struct Waiters {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl Waiters {
    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the waiters on `channel` that a message with `payload` is meant for, if this
    /// client has any.
    pub(crate) fn wake(&self, channel: &str, payload: &[u8]) {
        if let Some(channel) = self.channels().get(channel) {
            channel.wake(payload);
        }
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    /// Wakes this client's waiters on every channel as a release would: what a store does
    /// when its notifications may have been lost (its listening connection was made again),
    /// so that nobody sleeps a backoff step past a release it did not hear.
    pub(crate) fn wake_all(&self) {
        for channel in self.channels().values() {
            channel.wake(b"");
        }
    }

    /// Whether a waiter (or an observer) of this client waits on `channel`.
    pub(crate) fn wants(&self, channel: &str) -> bool {
        self.channels().contains_key(channel)
    }
}

/// One channel's waiters in this client.
struct Channel {
    /// Each fair waiter of this client, by waiter id: woken by a message naming it (its
    /// queue's head); one of them also by a release of the unfair kinds.
    fair: HashMap<String, Arc<Notify>>,
    /// Wakes one waiting writer ([`WakeRule::OnePerRelease`]); a wake-up with no writer
    /// waiting is kept for the next.
    writers: Arc<Notify>,
    /// Wakes every waiting reader ([`WakeRule::AllReaders`]): each sees the version change
    /// once, also when it was busy with a try when the release came.
    readers: watch::Sender<()>,
    /// Wakes every observer of an election ([`ReleaseListener::observe`]): each sees every
    /// message once, whatever it says.
    observers: watch::Sender<()>,
    waiting_writers: usize,
    waiting_readers: usize,
    observing: usize,
}

impl Channel {
    /// Wakes the observers, and the waiters the kinds' rule says a message with `payload` is
    /// for ([`Announcement::wakes`]).
    fn wake(&self, payload: &[u8]) {
        self.observers.send_replace(());
        let wake = Announcement::parse(payload).wakes(self.waiting_writers > 0);
        match wake.fair {
            Some(FairWake::Named(waiter)) => {
                if let Some(notify) = self.fair.get(waiter) {
                    notify.notify_one();
                }
            }
            Some(FairWake::Any) => {
                if let Some(notify) = self.fair.values().next() {
                    notify.notify_one();
                }
            }
            None => {}
        }
        match wake.rule {
            Some(WakeRule::OnePerRelease) => self.writers.notify_one(),
            Some(WakeRule::AllReaders) => {
                self.readers.send_replace(());
            }
            None => {}
        }
    }
}

/// The client's waiters on released locks, fed by its store's announcements. (Not `Waker`:
/// that is `std::task`'s.)
pub(crate) struct ReleaseListener {
    inner: Arc<ListenerInner>,
}

struct ListenerInner {
    waiters: Waiters,
    feed: Box<dyn Feed>,
}

/// A waiter's registration on a channel; the store is told when the last one goes
/// ([`Feed::unwanted`]). (Not `Interest`: that is `tokio::io`'s.)
pub(crate) struct WaitRegistration {
    inner: Arc<ListenerInner>,
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
    /// The listener over `waiters`, which `feed` delivers its store's messages to.
    pub(crate) fn new(waiters: Waiters, feed: impl Feed) -> Self {
        Self {
            inner: Arc::new(ListenerInner {
                waiters,
                feed: Box::new(feed),
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
        let mut channels = inner.waiters.channels();
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
    /// longer; `true` when a release announcement ended it. Subscribing runs as a task of its
    /// own ([`Feed::subscribe`]), so a wait that ends first cannot cut it short and leave a
    /// subscription nobody tracks.
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
        let feed = &self.inner.feed;
        let listening = async {
            // A subscription that failed is tried again once its pause ends, within this
            // wait: a long backoff step would otherwise go without wake-ups (after a failover,
            // say) although pub/sub is back.
            loop {
                if let Some(subscribing) = feed.subscribe(&interest.name) {
                    let _ = tokio::time::timeout_at(until, subscribing).await;
                }
                // Bounded too: a subscribe under way on a frozen server holds its state until
                // it times out, which must not keep this wait past its end.
                let retry = tokio::time::timeout_at(until, feed.retry_after_pause(&interest.name));
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
        if let Some(subscribing) = self.inner.feed.subscribe(&registration.name) {
            let _ = tokio::time::timeout(within, subscribing).await;
        }
    }

    /// Whether releases on `channel` reach this client now, as far as can be seen without
    /// waiting: `false` while subscriptions are being made.
    pub(crate) fn listening(&self, channel: &str) -> bool {
        self.inner.feed.listening(channel)
    }
}

impl Drop for WaitRegistration {
    fn drop(&mut self) {
        let mut channels = self.inner.waiters.channels();
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
        self.inner.feed.unwanted(std::mem::take(&mut self.name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that needs no subscription (as an in-process one would): it only delivers.
    struct Delivered;

    impl Feed for Delivered {
        fn subscribe(&self, _channel: &str) -> Option<JoinHandle<()>> {
            None
        }
        fn retry_after_pause<'a>(&'a self, _channel: &'a str) -> BoxFuture<'a, Option<Instant>> {
            Box::pin(async { None })
        }
        fn listening(&self, _channel: &str) -> bool {
            true
        }
        fn unwanted(&self, _channel: String) {}
    }

    fn listener() -> (Waiters, ReleaseListener) {
        let waiters = Waiters::default();
        (waiters.clone(), ReleaseListener::new(waiters, Delivered))
    }

    const SOON: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn a_delivered_release_wakes_one_writer_and_leaves_the_readers_waiting() {
        let (waiters, listener) = listener();
        let mut first = listener.interest("c", Kind::Write, None);
        let mut second = listener.interest("c", Kind::Write, None);
        let mut reader = listener.interest("c", Kind::Read, None);
        waiters.wake("c", b"");
        assert!(listener.wait(&mut first, SOON).await);
        assert!(!listener.wait(&mut second, SOON).await);
        assert!(!listener.wait(&mut reader, SOON).await);
    }

    #[tokio::test]
    async fn a_delivered_release_wakes_every_reader_when_no_writer_waits() {
        let (waiters, listener) = listener();
        let mut readers = [
            listener.interest("c", Kind::Read, None),
            listener.interest("c", Kind::Read, None),
        ];
        waiters.wake("c", b"");
        for reader in &mut readers {
            assert!(listener.wait(reader, SOON).await);
        }
    }

    #[tokio::test]
    async fn a_queue_head_is_woken_by_name_and_a_leader_record_wakes_only_observers() {
        let (waiters, listener) = listener();
        let mut head = listener.interest("c", Kind::Write, Some("head"));
        let mut behind = listener.interest("c", Kind::Write, Some("behind"));
        let mut writer = listener.interest("c", Kind::Write, None);
        let mut observer = listener.observe("c");
        waiters.wake("c", b"f:head");
        assert!(listener.wait(&mut head, SOON).await);
        assert!(!listener.wait(&mut behind, SOON).await);
        assert!(listener.wait(&mut observer, SOON).await);
        waiters.wake("c", b"e:7");
        assert!(listener.wait(&mut observer, SOON).await);
        assert!(!listener.wait(&mut writer, SOON).await);
        assert!(!listener.wait(&mut head, SOON).await);
    }

    #[tokio::test]
    async fn the_last_waiter_gone_the_channel_is_no_longer_wanted() {
        let (waiters, listener) = listener();
        let registration = listener.interest("c", Kind::Semaphore(2), None);
        assert!(waiters.wants("c"));
        drop(registration);
        assert!(!waiters.wants("c"));
    }
}
