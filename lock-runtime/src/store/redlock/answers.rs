//! How Redlock asks every master at once (`redlock.rs`): each request bounded by a timeout
//! ([`on_all`](RedlockStore::on_all)), or waited for only until the answers settle the
//! outcome, with a master that runs late left out of the wait for later requests
//! ([`until_decided`](RedlockStore::until_decided)); what each master said
//! ([`MasterAnswer`]); and the requests left out, finished in the background. Neighbours:
//! `masters.rs` asks a late master until it answers; `tally.rs`, `leases.rs`, `fencing.rs`
//! and `operator.rs` count what the masters said.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::future::join_all;

use super::{node_timed_out, RedlockStore};
use crate::error::LockError;
use crate::store::redis::NodeStore;

/// What one master said to one request, or that it said nothing in time, or that its answer
/// was not awaited because the others' had settled the outcome.
pub(super) enum MasterAnswer<T> {
    Said(T),
    Failed(LockError),
    NotAwaited,
}

/// How many masters are still out.
pub(super) fn not_awaited<T>(answers: &[MasterAnswer<T>]) -> usize {
    answers
        .iter()
        .filter(|answer| matches!(answer, MasterAnswer::NotAwaited))
        .count()
}

/// How many masters said something `counts`.
pub(super) fn count_said<T>(answers: &[MasterAnswer<T>], counts: impl Fn(&T) -> bool) -> usize {
    answers
        .iter()
        .filter(|answer| matches!(answer, MasterAnswer::Said(said) if counts(said)))
        .count()
}

impl RedlockStore {
    /// Runs `request` on every master at once, each bounded by `timeout`: each master's
    /// answer, or its failure (a timeout when it did not answer in time).
    pub(super) async fn on_all<'a, T, F, Fut>(
        &'a self,
        timeout: Duration,
        request: F,
    ) -> Vec<Result<T, LockError>>
    where
        F: Fn(&'a NodeStore) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + 'a,
    {
        let request = &request;
        join_all(self.masters.iter().map(|master| async move {
            tokio::time::timeout(timeout, request(master))
                .await
                .unwrap_or_else(|_| Err(node_timed_out(timeout)))
        }))
        .await
    }

    /// Runs `request` on every master at once and waits for every answer, at most `timeout`
    /// (the masters still out then [`MasterAnswer::Failed`] with a timeout, and are marked slow) —
    /// but not for the masters marked slow once the others have answered and `decided` says
    /// their answers settle the outcome (enough masters granted, or too many refused): such a
    /// master is [`MasterAnswer::NotAwaited`]. So a frozen master costs one request its timeout,
    /// and the requests after it nothing while the others answer.
    ///
    /// Returns the answers and the requests still out, which the caller drops or finishes in
    /// the background ([`finish_in_background`](Self::finish_in_background)). Dropping one
    /// is safe for a try and a renewal: a step it sent still runs on its master (every
    /// request is polled once before anything is decided, and goes out on its first poll once
    /// the master has a connection), before anything sent to that master afterwards — each
    /// master has one ordered connection — and a step not yet sent (a try sent again after
    /// `NOSCRIPT`) is never sent. A release or an undo must finish instead: its later step is
    /// what gives the grant back.
    pub(super) async fn until_decided<'a, T, F, Fut>(
        &'a self,
        timeout: Duration,
        request: F,
        mut decided: impl FnMut(&[MasterAnswer<T>]) -> bool,
    ) -> (Vec<MasterAnswer<T>>, Vec<Option<Pin<Box<Fut>>>>)
    where
        F: Fn(usize, &'a Arc<NodeStore>) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + 'a,
    {
        let mut out: Vec<Option<Pin<Box<Fut>>>> = self
            .masters
            .iter()
            .enumerate()
            .map(|(i, master)| Some(Box::pin(request(i, master))))
            .collect();
        let mut answers: Vec<MasterAnswer<T>> = self
            .masters
            .iter()
            .map(|_| MasterAnswer::NotAwaited)
            .collect();
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        std::future::poll_fn(|cx| {
            // Every request still out is polled each round (the first round sends them all).
            for (slot, answer) in out.iter_mut().zip(answers.iter_mut()) {
                if let Some(request) = slot {
                    if let Poll::Ready(said) = request.as_mut().poll(cx) {
                        *answer = match said {
                            Ok(said) => MasterAnswer::Said(said),
                            Err(err) => MasterAnswer::Failed(err),
                        };
                        *slot = None;
                    }
                }
            }
            let only_slow_out = out
                .iter()
                .zip(&self.slow)
                .all(|(slot, slow)| slot.is_none() || slow.load(Ordering::Acquire));
            if out.iter().all(Option::is_none) || (only_slow_out && decided(&answers)) {
                return Poll::Ready(());
            }
            if deadline.as_mut().poll(cx).is_ready() {
                for (i, (slot, answer)) in out.iter().zip(answers.iter_mut()).enumerate() {
                    if slot.is_some() {
                        *answer = MasterAnswer::Failed(node_timed_out(timeout));
                        self.ask_until_it_answers(i);
                    }
                }
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
        (answers, out)
    }

    /// Lets the requests `until_decided` left out run to their end on the I/O runtime (each
    /// within the connection's response timeout), their answers unread.
    pub(super) fn finish_in_background<Fut>(&self, out: Vec<Option<Pin<Box<Fut>>>>)
    where
        Fut: Future + Send + 'static,
    {
        for request in out.into_iter().flatten() {
            self.io.spawn(async move {
                let _ = request.await;
            });
        }
    }
}
