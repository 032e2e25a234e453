//! Renewing on the Redis store (`redis.rs`): many leases in as few calls as the transport
//! allows — at most [`MOST_PER_CALL`] a call, one per hash slot on a Cluster, all at once
//! ([`Transport::call_each`]: one request per Cluster primary) — each lease's outcome handed
//! back as its call is answered; a call refused for the keys it names together sent again one
//! lease at a time ([`goes_one_by_one`]); under the failover guard, none counts unless enough
//! replicas acknowledged it. Neighbours: `kind/` builds the renewal call and reads its reply;
//! `watchdog.rs` takes the outcomes.

use std::collections::HashMap;

use futures_util::stream::StreamExt;
use redis::cluster_routing::Slot;
use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::RedisStore;
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::kind::{self, Renewal};
use crate::protocol::{Call, Renewed};
use crate::store::transport::Transport;

/// A renewal's answers under the failover guard: none counts unless enough replicas
/// acknowledged it.
fn count_only_replicated_renewals(
    renewed: Vec<Renewed>,
    replicated: bool,
) -> Result<Vec<Renewed>, LockError> {
    if replicated {
        return Ok(renewed);
    }
    Err(BackendError::new(
        "renew",
        BackendErrorKind::Unreplicated,
        "too few replicas acknowledged the renewal within the failover guard's timeout, so it \
         does not count",
    )
    .into())
}

/// The parts of a batch: one call each.
impl<T: Transport> RedisStore<T> {
    /// Renews leases that one call may name (on a Cluster: of one slot).
    async fn renew(&self, batch: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        let (extended, replicated) = self
            .call_guarded(
                "renew",
                Call::Script(&kind::extend_many_call(batch)),
                |_| true,
            )
            .await?;
        let renewed = kind::read_extend_many_reply(batch.len(), extended)?;
        count_only_replicated_renewals(renewed, replicated)
    }

    /// The calls a renewal of `leases` takes, as indices into it: the leases one call may
    /// name (all of them, or a slot's where the transport routes by slot), at most
    /// [`MOST_PER_CALL`] each.
    fn renewal_calls(leases: &[Renewal<'_>]) -> Vec<Vec<usize>> {
        let groups: Vec<Vec<usize>> = if T::ROUTES_BY_SLOT {
            let mut by_slot: HashMap<Slot, Vec<usize>> = HashMap::new();
            for (i, renewal) in leases.iter().enumerate() {
                by_slot
                    .entry(Slot::for_key(&renewal.key.lock))
                    .or_default()
                    .push(i);
            }
            by_slot.into_values().collect()
        } else {
            vec![(0..leases.len()).collect()]
        };
        groups
            .iter()
            .flat_map(|group| group.chunks(MOST_PER_CALL).map(<[usize]>::to_vec))
            .collect()
    }

    /// The renewal of `leases` in [`renewal_calls`](Self::renewal_calls), all sent at once by
    /// [`Transport::call_each`] (on a Cluster one request per primary), each lease's outcome
    /// handed to `report` as soon as its call is answered: a server that answers late (a
    /// frozen Cluster primary, or one whose `WAIT` waits for a lagging replica) delays only
    /// the leases it holds. A call that fails (its shard is failing over, say) leaves its
    /// leases unknown, not the leases of the others; a call refused only for naming its keys
    /// together (a half-moved slot) goes again as one call per lease ([`goes_one_by_one`]).
    /// Every lease is reported once; the error says why, when nothing was learnt of any.
    pub(super) async fn renew_all(
        &self,
        leases: &[Renewal<'_>],
        report: &mut (dyn FnMut(usize, Renewed) + Send),
    ) -> Result<(), LockError> {
        let slots = Self::renewal_calls(leases);
        let batches: Vec<Vec<Renewal<'_>>> = slots
            .iter()
            .map(|indices| indices.iter().map(|&i| leases[i]).collect())
            .collect();
        let calls: Vec<_> = batches
            .iter()
            .map(|batch| kind::extend_many_call(batch))
            .collect();
        // Under the guard, a Cluster's pipelines share one transport lent for the batch.
        let lent = match self.guard {
            Some(_) if T::ROUTES_BY_SLOT => Some(self.guarded.lend(&self.transport).await),
            _ => None,
        };
        let mut outcomes = self
            .call_each_guarded::<Vec<i64>>("renew", &calls, lent.as_deref())
            .map(|(at, reply)| {
                let batch = &batches[at];
                async move {
                    let renewed = reply.and_then(|(extended, replicated)| {
                        count_only_replicated_renewals(
                            kind::read_extend_many_reply(batch.len(), extended)?,
                            replicated,
                        )
                    });
                    let renewed = match renewed {
                        Err(err)
                            if T::ROUTES_BY_SLOT && batch.len() > 1 && goes_one_by_one(&err) =>
                        {
                            self.renew_one_by_one(batch, err).await
                        }
                        // Anything else (a timeout, a broken or refused connection, too few
                        // replicas): the leases are unknown this round and the watchdog tries
                        // again, rather than sending the sick server one request per lease.
                        renewed => renewed,
                    };
                    (at, renewed)
                }
            })
            .buffer_unordered(calls.len().max(1));
        let mut learnt = false;
        let mut failure = None;
        while let Some((at, outcome)) = outcomes.next().await {
            match outcome {
                Ok(renewed) => {
                    for (&i, renewed) in slots[at].iter().zip(renewed) {
                        learnt |= renewed != Renewed::Unknown;
                        report(i, renewed);
                    }
                }
                Err(err) => {
                    for &i in &slots[at] {
                        report(i, Renewed::Unknown);
                    }
                    failure.get_or_insert(err);
                }
            }
        }
        drop(outcomes);
        if let Some(lent) = lent {
            lent.give_back();
        }
        // Nothing learnt at all: say why.
        match failure {
            Some(err) if !learnt => Err(err),
            _ => Ok(()),
        }
    }

    /// Renews each of `batch` with a call of its own, after the call for all of them was
    /// refused with `err` for the keys it named together ([`goes_one_by_one`]; `err` is the
    /// answer when none of these goes through either).
    async fn renew_one_by_one(
        &self,
        batch: &[Renewal<'_>],
        err: LockError,
    ) -> Result<Vec<Renewed>, LockError> {
        let first = batch
            .first()
            .map_or("", |renewal| renewal.key.name.as_str());
        tracing::trace!(target: crate::telemetry::LOG_TARGET, leases = batch.len(), first, "renew: {} leases one by one after: {err}", batch.len());
        let singles = batch
            .iter()
            .map(|renewal| self.renew(std::slice::from_ref(renewal)));
        let renewed: Vec<Renewed> = futures_util::future::join_all(singles)
            .await
            .into_iter()
            .map(|single| match single.as_deref() {
                Ok([renewed]) => *renewed,
                _ => Renewed::Unknown,
            })
            .collect();
        if renewed.iter().all(|&r| r == Renewed::Unknown) {
            return Err(err);
        }
        Ok(renewed)
    }
}

/// Whether a renewal call for several leases that failed with `err` is sent again as one call
/// per lease ([`RedisStore::renew_one_by_one`]): only when the server refused the call for
/// the keys it names together, which each lease's keys alone would not be refused for —
///
/// - `TRYAGAIN` ([`ServerErrorKind::TryAgain`]): the slot is half-moved by a migration and the
///   call names keys on both of its nodes (or some missing on the node asked); each lock's own
///   keys are all on one of them;
/// - `CROSSSLOT` ([`ServerErrorKind::CrossSlot`]): the call names keys of more than one slot.
///
/// Never after a timeout, an I/O error, a broken or refused connection, `CLUSTERDOWN`,
/// `READONLY`, `LOADING`, too few replicas (the failover guard) or any other server error:
/// those say the server is sick or busy, not that the call was too big, and one request per
/// lease would only load it more (the leases stay unknown this round; the watchdog tries
/// again while they may be in force). `MOVED`, `ASK`, `READONLY` and `NOSCRIPT` are followed by the
/// transport itself.
fn goes_one_by_one(err: &LockError) -> bool {
    let LockError::Backend(err) = err else {
        return false;
    };
    err.cause().downcast_ref::<RedisError>().is_some_and(|err| {
        matches!(
            err.kind(),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::CrossSlot)
        )
    })
}

/// Most leases one renewal call names: one script call holds the server for as long as it
/// runs (a few microseconds a lease).
pub(crate) const MOST_PER_CALL: usize = 256;
