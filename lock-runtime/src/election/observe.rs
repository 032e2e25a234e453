//! Following an election's leaders: [`LeaderChanges`], the stream [`Election::observe`]
//! returns. It reads the leader ([`Election::leader`]) whenever the lock's channel carries a
//! message — a new leader's announcement (`scripts/election/proclaim.lua`) or a release — through the client's
//! wake-ups (`store/wake.rs`, as an observer that never takes a waiter's wake-up), and at a
//! third of the lease besides, which notices a leader whose lease ran out (nothing announces
//! an expiry) and stands in for a lost message. The in-process store has no channel: there it
//! reads at that period, at most every 100 ms. Only a greater epoch than the last one yielded,
//! or the same epoch with a later revision (a `Leadership::proclaim`), is a change, so each
//! leader and each of its values is yielded at most once, and never one older than the last.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;

use super::Election;
use crate::error::LockError;
use crate::inspect::LeaderInfo;
use crate::protocol::FencingToken;
use crate::protocol::LockKey;
use crate::store::Store;
use crate::wake::WaitRegistration;

/// The longest the in-process store's observers go between reads (it has no wake-ups).
const IN_PROCESS_PERIOD: Duration = Duration::from_millis(100);

/// The changes of an election's leader ([`Election::observe`]): a
/// [`Stream`](futures_util::Stream) of [`LeaderInfo`], each new leader once, in epoch order,
/// and each new value a leader [proclaims](super::Leadership::proclaim), in order.
/// It ends only when the election cannot be read at all (no global client, an invalid name or
/// lease: logged at ERROR), and then stays ended; failures that may pass are logged at WARN and
/// read again.
#[must_use = "a stream does nothing unless polled"]
pub struct LeaderChanges {
    changes: Pin<Box<dyn Stream<Item = LeaderInfo> + Send>>,
}

impl LeaderChanges {
    pub(super) fn new(election: Election) -> Self {
        let watch = Watch {
            election,
            last: None,
            registration: None,
            failing: false,
        };
        // Fused: polled after its end it stays ended (`unfold` alone would panic).
        let changes = futures_util::StreamExt::fuse(futures_util::stream::unfold(
            watch,
            |mut watch| async move {
                let change = watch.next_change().await?;
                Some((change, watch))
            },
        ));
        Self {
            changes: Box::pin(changes),
        }
    }

    /// The next new leader (`None`: the stream ended, see above); the same as
    /// `StreamExt::next`, without importing it.
    pub async fn next(&mut self) -> Option<LeaderInfo> {
        futures_util::StreamExt::next(self).await
    }
}

impl Stream for LeaderChanges {
    type Item = LeaderInfo;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LeaderInfo>> {
        self.changes.as_mut().poll_next(cx)
    }
}

impl std::fmt::Debug for LeaderChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderChanges").finish_non_exhaustive()
    }
}

/// The stream's state between items.
struct Watch {
    election: Election,
    /// The epoch and revision yielded last ([`LeaderInfo::published`]).
    last: Option<(FencingToken, u64)>,
    /// Made, and its channel subscribed, before the first read, so a change announced after
    /// a read wakes the wait after it.
    registration: Option<WaitRegistration>,
    /// The last read failed (logged once per run of failures).
    failing: bool,
}

impl Watch {
    async fn next_change(&mut self) -> Option<LeaderInfo> {
        let client = match self.election.client() {
            Ok(client) => client,
            Err(err) => return self.give_up(err),
        };
        let key = match self.election.key(&client) {
            Ok(key) => key,
            Err(err) => return self.give_up(err),
        };
        let lease = match self.election.lease_of(&client) {
            Ok(lease) => lease,
            Err(err) => return self.give_up(err),
        };
        let waker = client.engine.store.waker();
        let period = match waker {
            Some(_) => lease / 3,
            None => (lease / 3).min(IN_PROCESS_PERIOD),
        };
        if let (None, Some(waker)) = (&self.registration, waker) {
            let registration = waker.observe(&LockKey::channel(&key));
            waker
                .listen(&registration, client.engine.config.response_timeout)
                .await;
            self.registration = Some(registration);
        }
        loop {
            match self.election.leader().await {
                Ok(leader) => {
                    self.failing = false;
                    if let Some(leader) =
                        leader.filter(|l| self.last.is_none_or(|last| l.published() > last))
                    {
                        self.last = Some(leader.published());
                        return Some(leader);
                    }
                }
                Err(err) => {
                    if !self.failing {
                        tracing::warn!(target: crate::telemetry::LOG_TARGET, election = %self.election.name,
                            error = %err, "reading the leader failed; reading again in {period:?}");
                    }
                    self.failing = true;
                }
            }
            match (waker, self.registration.as_mut()) {
                (Some(waker), Some(registration)) => {
                    waker.wait(registration, period).await;
                }
                _ => tokio::time::sleep(period).await,
            }
        }
    }

    fn give_up(&self, err: LockError) -> Option<LeaderInfo> {
        tracing::error!(target: crate::telemetry::LOG_TARGET, election = %self.election.name, error = %err,
            "cannot observe the election");
        None
    }
}
