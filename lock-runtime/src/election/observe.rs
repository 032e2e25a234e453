//! Following an election's leaders: [`LeaderChanges`], the stream [`Election::observe`]
//! returns. It reads the leader ([`Election::leader`]) whenever the lock's channel carries a
//! message — a new leader's announcement (`scripts/election/proclaim.lua`) or a release — through the client's
//! wake-ups (`store/wake.rs`, as an observer that never takes a waiter's wake-up), and at a
//! third of the lease besides, which notices a leader whose lease ran out (nothing announces
//! an expiry) and stands in for a lost message. The in-process store has no channel: there it
//! reads at that period, at most every 100 ms. Only a greater epoch than the last one yielded,
//! or the same epoch with a later revision (a `Leadership::proclaim`), is a change, so each
//! leader and each of its values is yielded at most once, and never one older than the last; a
//! read that finds nobody leading after a leader (or at the start) is a vacancy, which
//! [`LeaderStates`] ([`LeaderChanges::with_vacancies`]) yields as `None`. Each change seen is
//! logged at INFO (`telemetry/leadership.rs`).

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
///
/// It yields leaders only: a time when nobody leads (a leader resigned or died, and no other
/// has written its record yet) is not an item here. To be told of it, turn the stream into
/// [`LeaderStates`] with [`with_vacancies`](Self::with_vacancies). Either way, each new leader
/// and each vacancy the observer sees is logged at INFO ("observed a new leader", "observed
/// that nobody leads").
#[must_use = "a stream does nothing unless polled"]
pub struct LeaderChanges {
    states: LeaderStates,
    /// The epoch and revision yielded last: a leader seen again after a vacancy is not
    /// yielded twice.
    last: Option<(FencingToken, u64)>,
}

/// The states of an election's leadership as an observer sees them
/// ([`LeaderChanges::with_vacancies`]): a [`Stream`](futures_util::Stream) of
/// `Option<LeaderInfo>` — what [`Election::leader`] returns — yielding each change once:
/// `Some(leader)` for a new leader (in epoch order, as [`LeaderChanges`]), `None` when the
/// observer sees that nobody leads (a leader resigned, or died and its lease ran out, and no
/// other has written its record yet). The first item is the state when it starts: the leader,
/// or `None` if nobody leads. Two vacancies always have a leader between them, and a leader
/// seen again after a vacancy (the same epoch: its record was unreadable for a moment) is
/// yielded again, so the last item is always the state as last read. A leader, or a vacancy,
/// that came and went between two reads is not shown. It ends as [`LeaderChanges`] ends.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// let client = distlock::Client::in_memory();
/// let election = client.election("scheduler");
/// let mut states = election.observe().with_vacancies();
/// assert!(states.next().await.expect("the state at the start").is_none(), "nobody leads");
/// let leadership = election.campaign().await?;
/// let leader = states.next().await.expect("a change").expect("a leader");
/// assert_eq!(leader.epoch(), leadership.epoch());
/// leadership.resign().await?;
/// assert!(states.next().await.expect("a change").is_none(), "nobody leads again");
/// # Ok(()) }
/// ```
#[must_use = "a stream does nothing unless polled"]
pub struct LeaderStates {
    changes: Pin<Box<dyn Stream<Item = Option<LeaderInfo>> + Send>>,
}

impl LeaderChanges {
    pub(super) fn new(election: Election) -> Self {
        let watch = Watch {
            election,
            last: None,
            vacant: false,
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
            states: LeaderStates {
                changes: Box::pin(changes),
            },
            last: None,
        }
    }

    /// The next new leader (`None`: the stream ended, see above); the same as
    /// `StreamExt::next`, without importing it.
    pub async fn next(&mut self) -> Option<LeaderInfo> {
        futures_util::StreamExt::next(self).await
    }

    /// The same observation, also telling when nobody leads: see [`LeaderStates`]. Call it
    /// before the first item (the state at the start is the first item it yields then).
    pub fn with_vacancies(self) -> LeaderStates {
        self.states
    }
}

impl Stream for LeaderChanges {
    type Item = LeaderInfo;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LeaderInfo>> {
        loop {
            match self.states.changes.as_mut().poll_next(cx) {
                Poll::Ready(Some(Some(leader))) => {
                    if self.last.is_none_or(|last| leader.published() > last) {
                        self.last = Some(leader.published());
                        return Poll::Ready(Some(leader));
                    }
                }
                // A vacancy is not an item of this stream.
                Poll::Ready(Some(None)) => {}
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl LeaderStates {
    /// The next change: `Some(Some(leader))` a new leader, `Some(None)` nobody leads, `None`
    /// the stream ended; the same as `StreamExt::next`, without importing it.
    pub async fn next(&mut self) -> Option<Option<LeaderInfo>> {
        futures_util::StreamExt::next(self).await
    }
}

impl Stream for LeaderStates {
    type Item = Option<LeaderInfo>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Option<LeaderInfo>>> {
        self.changes.as_mut().poll_next(cx)
    }
}

impl std::fmt::Debug for LeaderStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderStates").finish_non_exhaustive()
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
    /// The last change yielded was a vacancy.
    vacant: bool,
    /// Made, and its channel subscribed, before the first read, so a change announced after
    /// a read wakes the wait after it.
    registration: Option<WaitRegistration>,
    /// The last read failed (logged once per run of failures).
    failing: bool,
}

impl Watch {
    /// The next change: `Some(Some(leader))`, `Some(None)` a vacancy, `None` the end.
    async fn next_change(&mut self) -> Option<Option<LeaderInfo>> {
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
                    if let Some(change) = self.change(leader) {
                        return Some(change);
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

    /// What a read that found `leader` changes, if anything: a greater epoch than the last
    /// one yielded, the last one again after a vacancy, or a vacancy after a leader (or at
    /// the start).
    fn change(&mut self, leader: Option<LeaderInfo>) -> Option<Option<LeaderInfo>> {
        let name = &self.election.name;
        match leader {
            Some(leader) => {
                let epoch = leader.epoch();
                let published = leader.published();
                let new = match self.last {
                    None => true,
                    Some(last) => published > last || (self.vacant && published == last),
                };
                if !new {
                    return None;
                }
                self.last = Some(published);
                self.vacant = false;
                crate::telemetry::observed_leader(name, epoch.get());
                Some(Some(leader))
            }
            None if self.vacant => None,
            None => {
                self.vacant = true;
                crate::telemetry::observed_vacancy(name, self.last.map(|(epoch, _)| epoch.get()));
                Some(None)
            }
        }
    }

    fn give_up(&self, err: LockError) -> Option<Option<LeaderInfo>> {
        tracing::error!(target: crate::telemetry::LOG_TARGET, election = %self.election.name, error = %err,
            "cannot observe the election");
        None
    }
}
