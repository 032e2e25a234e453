//! A grant's life on Redlock after it stands (`redlock.rs`): its renewal, which needs its
//! quorum of masters ([`renew`](RedlockStore::renew)), and its release on every master, one
//! key or several, counted once ([`give_back_on_quorum`](RedlockStore::give_back_on_quorum)).
//! A release not waited for finishes in the background. Neighbours: `answers.rs` asks the
//! masters; `tally.rs` undoes a try that did not stand.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::answers::{count_said, not_awaited, MasterAnswer};
use super::RedlockStore;
use crate::error::LockError;
use crate::kind::Renewal;
use crate::protocol::{LockKey, Renewed};
use crate::store::redis::NodeStore;
use crate::store::Store;

impl RedlockStore {
    /// A lease is renewed when a majority renewed it, lost when so many masters said it is not
    /// theirs that a majority no longer can, and unknown otherwise (the watchdog tries again:
    /// a master that missed the node timeout once must not cost a lease that is held).
    pub(super) async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        self.reconnect_missing();
        let shortest = leases
            .iter()
            .map(|l| l.lease)
            .min()
            .unwrap_or(Duration::MAX);
        let timeout = self.timeout_for(shortest);
        let quorums: Vec<usize> = leases
            .iter()
            .map(|lease| lease.kind.quorum(self.masters.len()))
            .collect();
        // Decided when every lease is: renewed by its quorum, or no longer ours on so many
        // masters that the rest cannot renew it.
        let masters = self.masters.len();
        let (answers, _) = self
            .until_decided(
                timeout,
                |_, master| master.extend_many(leases),
                |answers| {
                    quorums.iter().enumerate().all(|(i, &quorum)| {
                        let renewed = count_said(answers, |renewed: &Vec<Renewed>| {
                            renewed.get(i) == Some(&Renewed::Yes)
                        });
                        let lost = count_said(answers, |renewed: &Vec<Renewed>| {
                            renewed.get(i) == Some(&Renewed::No)
                        });
                        renewed >= quorum || lost > masters - quorum
                    })
                },
            )
            .await;
        let out = not_awaited(&answers);
        let mut answered = 0;
        let mut extended = vec![0usize; leases.len()];
        let mut error = None;
        for answer in answers {
            match answer {
                MasterAnswer::Said(renewed) => {
                    answered += 1;
                    for (count, renewed) in extended.iter_mut().zip(renewed) {
                        *count += usize::from(renewed == Renewed::Yes);
                    }
                }
                MasterAnswer::Failed(err) => error = Some(err),
                MasterAnswer::NotAwaited => {}
            }
        }
        if answered + out < self.quorum() {
            let key = leases.first().map(|l| l.key);
            return Err(match (error, key) {
                (_, Some(key)) => self.quorum_unavailable(key, answered, 0),
                (Some(err), None) => err,
                (None, None) => return Ok(Vec::new()),
            });
        }
        let unanswered = self.masters.len() - answered;
        Ok(extended
            .into_iter()
            .zip(quorums)
            .map(|(count, quorum)| {
                // A semaphore permit needs more than a majority, its renewal too.
                if count >= quorum {
                    Renewed::Yes
                } else if count + unanswered < quorum {
                    Renewed::No
                } else {
                    Renewed::Unknown
                }
            })
            .collect())
    }

    /// Gives back a grant on every master (`give_back` of master `i`): `true` when `quorum`
    /// masters (the kind's) said it was still theirs. Decided as soon as that many did, or so
    /// many said it was not that the rest cannot; the masters not awaited then finish it in
    /// the background. An error when fewer than a majority answered (the release path tries
    /// again while the lease could still be in force). Each master that held the grant
    /// announces its release; waiters listen on every master (`wake.rs`), so the others
    /// need not.
    pub(super) async fn give_back_on_quorum<F, Fut>(
        &self,
        key: &LockKey,
        quorum: usize,
        give_back: F,
    ) -> Result<bool, LockError>
    where
        F: Fn(Arc<NodeStore>) -> Fut,
        Fut: Future<Output = Result<bool, LockError>> + Send + 'static,
    {
        self.reconnect_missing();
        let refusals_decide = self.masters.len() - quorum;
        let (answers, left) = self
            .until_decided(
                self.node_timeout,
                |_, master| give_back(master.clone()),
                |answers| {
                    count_said(answers, |&was_ours| was_ours) >= quorum
                        || count_said(answers, |&was_ours| !was_ours) > refusals_decide
                },
            )
            .await;
        self.finish_in_background(left);
        let out = not_awaited(&answers);
        let mut answered = 0;
        let mut released = 0;
        let mut error = None;
        for answer in answers {
            match answer {
                MasterAnswer::Said(was_ours) => {
                    answered += 1;
                    released += usize::from(was_ours);
                }
                MasterAnswer::Failed(err) => error = Some(err),
                MasterAnswer::NotAwaited => {}
            }
        }
        // Decided without them, the masters not awaited count as not failed.
        if answered + out < self.quorum() {
            return Err(error.unwrap_or_else(|| self.quorum_unavailable(key, answered, released)));
        }
        Ok(released >= quorum)
    }
}
