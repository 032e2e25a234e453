//! Redlock's masters in the background (`redlock.rs`): their connects before a try
//! ([`warm_up`](RedlockStore::warm_up)) and after a lost connection
//! ([`reconnect_missing`](RedlockStore::reconnect_missing)), each on a task of its own so
//! that a master that is down or drops packets slows nobody; and a master that let a request
//! run past its timeout, asked until it answers (`probe.rs`), meanwhile not waited for once
//! the others have settled an outcome. Neighbours: `answers.rs` sends a request to every
//! master and marks the slow ones; `tally.rs` warms up before a try.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;

use super::RedlockStore;

/// A master's connect in the background.
#[derive(Default)]
pub(super) struct MasterConnect {
    running: AtomicBool,
    ended: Notify,
}

/// Ends a background connect when dropped: when it finished, and also when the runtime it ran
/// on shut down under it (else the master would never be connected again).
struct ConnectEnds(Arc<MasterConnect>);

impl Drop for ConnectEnds {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
        self.0.ended.notify_waiters();
    }
}

impl RedlockStore {
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
    /// before it still ends within one node timeout past it ([`Bounds`](super::tally::Bounds)); past it, it does
    /// not wait (the first round's requests connect on their own, within the node timeout) —
    /// except on first use, a fresh client's one try (`wait(0)`), which could otherwise
    /// hardly be granted: that waits the connect timeout, before its first round.
    pub(super) async fn warm_up(&self, deadline: Option<Instant>) {
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
    /// its end is announced on the master's [`MasterConnect::ended`]. The connect runs on the
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
    pub(super) fn reconnect_missing(&self) {
        for i in 0..self.masters.len() {
            if !self.masters[i].node().is_connected() {
                self.connect_in_background(i);
            }
        }
    }

    /// Marks master `i` slow and asks it, in the background, until it answers a `PING` (which
    /// queues behind whatever it has not run yet; an ACL's refusal of it is an answer too:
    /// [`crate::store::probe`]), then clears the mark. One asker per master.
    pub(super) fn ask_until_it_answers(&self, i: usize) {
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
            crate::store::probe::until_it_answers(&master, pause, &told).await;
            slow.store(false, Ordering::Release);
        });
    }
}
