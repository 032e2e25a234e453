//! etcd as a store: every kind's rules run as their twins (`kind/`, the reference statement of
//! the rules) on the state of the keys they touch, read and written back by the store in two
//! round trips — one read of the keys' etcd keys, one transaction that writes what the twin
//! changed if what the decision rested on is unchanged (the bookkeeping's revision, no grant
//! created since on a side the new grant excludes, a give-back's key still the one read; read
//! again otherwise). A write grant's first try skips the read: its transaction, written as
//! if the key were free, creates the grant only if it is and else brings the key's etcd keys
//! back as the read (`FirstTry::Blind`). A lock key is a directory of etcd keys
//! (`etcd/layout.rs`): its bookkeeping (the kinds' state but its holders, as JSON,
//! `key_state.rs`) and one key per grant, on an etcd lease of the grant's own
//! (`etcd/leases.rs`), granted beside the read (a first try that reads) or before the
//! transaction that creates the key. What holds a lock is what etcd still has: a grant whose lease ran out on the
//! server is gone from the directory, whatever any clock says, and the twins see it gone. A
//! grant's fencing token is its key's create revision: strictly increasing across holders,
//! cluster-wide, with no clock in the argument (`docs/guarantees.md`). Renewals are one
//! keep-alive per lease; a release deletes the grant's key and revokes its lease (a write or
//! read grant of a lock with no bookkeeping in one transaction: `etcd/give_back.rs`). Waiters are
//! woken by a watch on the key prefix (`etcd/watcher.rs`), with the backoff as the fallback.
//! Times that are not a grant's lease — a fair waiter's deadline, the writer-waiting mark —
//! are kept on the writing client's clock: they decide who goes first, never who holds.
//! Every request runs as a task on the client's I/O runtime and ends at its deadline. Here:
//! the store contract's methods, each one operation (`etcd/transaction.rs`: read, twin,
//! compare-and-swap; `etcd/directory.rs`: a lock's keys to and from the twin's entry) through
//! the store's requests (`etcd/client.rs`: a client per endpoint, moving on from a failed one).
//! Neighbours: the store contract (`store/mod.rs`), the twins (`kind/twins.rs`,
//! `kind/multi.rs`, the key operations' `twin`s), the state's JSON (`store/key_state.rs`).

mod client;
mod directory;
mod errors;
mod give_back;
mod layout;
mod leases;
mod read;
mod transaction;
mod watcher;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use tokio::runtime::Handle;

use self::client::Shared;
use self::errors::{store_error, timed_out};
use self::leases::{ttl_secs, Leases};
use self::transaction::{Failure, FirstTry};
use self::watcher::Watcher;
use super::every_key::EveryKeyFeed;
use super::glob::glob_matches;
use super::{Found, Store};
use crate::clock::Clock;
use crate::config::EtcdTarget;
use crate::error::LockError;
use crate::key_operation::KeyOperation;
use crate::kind::multi::{MultiReply, MultiTry};
use crate::kind::{Holding, Renewal, Try};
use crate::operator_scripts::{ForceUnlock, RawHolder};
use crate::protocol::{AcquireReply, LockKey, Renewed};
use crate::wake::{ReleaseListener, Waiters};

/// The etcd store of one client.
pub(crate) struct EtcdStore {
    shared: Arc<Shared>,
    watcher: Arc<Watcher>,
    waker: ReleaseListener,
}

impl EtcdStore {
    pub(crate) fn new(
        target: EtcdTarget,
        prefix: String,
        connect_timeout: Duration,
        response_timeout: Duration,
        io: Handle,
    ) -> Self {
        let endpoints = target
            .endpoints
            .iter()
            .map(|_| tokio::sync::OnceCell::new())
            .collect();
        let shared = Arc::new(Shared {
            target,
            prefix,
            connect_timeout,
            response_timeout,
            io: io.clone(),
            clients: endpoints,
            current: AtomicUsize::new(0),
            leases: Leases::default(),
        });
        let waiters = Waiters::default();
        let watcher = Watcher::new(shared.clone(), io, waiters.clone());
        let waker = ReleaseListener::new(waiters, EveryKeyFeed(watcher.clone()));
        Self {
            shared,
            watcher,
            waker,
        }
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.watcher.stop();
    }
}

impl Store for EtcdStore {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        let tried = self
            .transact(
                "acquire",
                &[attempt.key],
                attempt.cut,
                None,
                (!attempt.refused_before).then(|| {
                    let ttl = ttl_secs(attempt.lease);
                    // A fair try's place is its read's revision: it reads first.
                    match attempt.seat {
                        Some(_) => FirstTry::Beside(ttl),
                        None => FirstTry::Blind(ttl),
                    }
                }),
                |state, read| {
                    let mut attempt = *attempt;
                    if let Some(seat) = attempt.seat.as_mut().filter(|seat| seat.place == 0) {
                        // A new fair waiter's place: the revision its join was read at, which
                        // only a later join can exceed (an earlier one's write changes the key).
                        seat.place = u64::try_from(read.revision).unwrap_or(1).max(1);
                    }
                    state.try_grant(&attempt, read.time.now)
                },
            )
            .await;
        let (reply, committed) = match tried {
            Ok(tried) => tried,
            Err(Failure::Busy) => return Ok(AcquireReply::Held(None)),
            Err(Failure::Error(err)) => return Err(err),
        };
        match reply {
            AcquireReply::Acquired(Some(_)) => Ok(AcquireReply::Acquired(Some(
                committed.token(attempt.key, attempt.owner)?,
            ))),
            other => Ok(other),
        }
    }

    async fn release(
        &self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
    ) -> Result<bool, LockError> {
        if let Some(slot) = holding.removes_alone() {
            if self.give_back_alone(slot, key, owner).await? {
                return Ok(true);
            }
        }
        let relet = matches!(holding, Holding::KeptFor(_)).then_some(owner);
        let (was_ours, _) = self
            .transact("release", &[key], None, relet, None, |state, read| {
                Ok(state.give_back(holding, key, owner, read.time.now))
            })
            .await
            .map_err(|failure| failure.into_error("release"))?;
        if relet.is_some() {
            self.shared.leases.remove(&key.lock, owner);
        }
        Ok(was_ours)
    }

    /// One keep-alive per grant's lease, all at once: a lease etcd no longer has is a lost
    /// grant.
    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        let deadline = Instant::now() + self.shared.response_timeout;
        let index = self.shared.current.load(Ordering::Acquire);
        let client =
            match tokio::time::timeout_at(deadline.into(), self.shared.client_at(index)).await {
                Ok(Ok(client)) => client,
                Ok(Err(err)) => {
                    self.shared.move_on(index);
                    return Err(err);
                }
                Err(_) => {
                    self.shared.move_on(index);
                    return Err(timed_out("extend").into());
                }
            };
        let ids: Vec<Option<i64>> = leases
            .iter()
            .map(|renewal| self.shared.leases.of(&renewal.key.lock, renewal.owner))
            .collect();
        let shared = self.shared.clone();
        let renewing = self.shared.io.spawn(async move {
            let renewals = ids.into_iter().map(|id| {
                let (shared, client) = (shared.clone(), client.clone());
                async move {
                    match id {
                        None => Ok(Renewed::No),
                        Some(id) => shared.leases.renew(&client, id).await,
                    }
                }
            });
            futures_util::future::join_all(renewals).await
        });
        let answers = match tokio::time::timeout_at(deadline.into(), renewing).await {
            Ok(Ok(answers)) => answers,
            _ => {
                // A member that answers nothing (frozen): the next round on the next one.
                self.shared.move_on(index);
                return Err(timed_out("extend").into());
            }
        };
        let mut renewed = Vec::with_capacity(answers.len());
        let mut first_error = None;
        for answer in answers {
            match answer {
                Ok(outcome) => renewed.push(outcome),
                Err(err) => {
                    first_error.get_or_insert(err);
                    renewed.push(Renewed::Unknown);
                }
            }
        }
        if let Some(err) = first_error {
            // The streams of the endpoint that failed open again on the next one.
            self.shared.move_on(index);
            if renewed.iter().all(|outcome| *outcome == Renewed::Unknown) {
                return Err(store_error("extend", err).into());
            }
        }
        Ok(renewed)
    }

    /// Every key read and written in one transaction: all or none.
    async fn acquire_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        let keys: Vec<&LockKey> = attempt.keys.iter().collect();
        let tried = self
            .transact(
                "acquire",
                &keys,
                attempt.cut,
                None,
                (!attempt.refused_before).then(|| FirstTry::Blind(ttl_secs(attempt.lease))),
                |state, read| Ok(state.try_grant_all(attempt, read.time.now)),
            )
            .await;
        let (reply, committed) = match tried {
            Ok(tried) => tried,
            Err(Failure::Busy) => return Ok(MultiReply::Held(None, 0)),
            Err(Failure::Error(err)) => return Err(err),
        };
        match reply {
            MultiReply::Acquired(tokens) => Ok(MultiReply::Acquired(
                tokens
                    .into_iter()
                    .zip(attempt.keys)
                    .map(|(token, key)| {
                        token
                            .map(|_| committed.token(key, attempt.owner))
                            .transpose()
                    })
                    .collect::<Result<_, _>>()?,
            )),
            other => Ok(other),
        }
    }

    async fn release_all(&self, keys: &[&LockKey], owner: &str) -> Result<bool, LockError> {
        let (all, _) = self
            .transact("release", keys, None, None, None, |state, read| {
                Ok(state.give_back_all(keys, owner, read.time.now))
            })
            .await
            .map_err(|failure| failure.into_error("release"))?;
        Ok(all)
    }

    /// The operation's twin, on the key's directory.
    async fn run<O: KeyOperation>(&self, operation: &O) -> Result<O::Output, LockError> {
        let (output, _) = self
            .transact(
                O::NAME,
                &[operation.key()],
                None,
                None,
                None,
                |state, read| Ok(operation.twin(state, read.time.now)),
            )
            .await
            .map_err(|failure| failure.into_error(O::NAME))?;
        Ok(output)
    }

    /// The twin of [`ForceUnlock`]; its token is the revision of the transaction that freed
    /// the key, above every grant's so far.
    async fn force_unlock(&self, key: &LockKey) -> Result<(Vec<RawHolder>, u64), LockError> {
        let ((evicted, _), committed) = self
            .transact(
                ForceUnlock::NAME,
                &[key],
                None,
                None,
                None,
                |state, read| Ok(ForceUnlock(key).twin(state, read.time.now)),
            )
            .await
            .map_err(|failure| failure.into_error(ForceUnlock::NAME))?;
        Ok((evicted, u64::try_from(committed.revision).unwrap_or(0)))
    }

    /// The lock keys in use matching `pattern` (read by its literal start, then matched here).
    async fn scan_into(&self, pattern: &str, found: &mut Found) -> Result<(), LockError> {
        let literal: String = pattern
            .chars()
            .take_while(|c| !matches!(c, '*' | '?' | '[' | '\\'))
            .collect();
        let start = layout::escape(&literal);
        let end = layout::range_end(&start);
        let deadline = Instant::now() + self.shared.response_timeout;
        let response = self
            .shared
            .call("scan", deadline, |mut client| {
                let (start, end) = (start.clone(), end.clone());
                async move {
                    let options = GetOptions::new().with_range(end).with_keys_only();
                    client.get(start, Some(options)).await
                }
            })
            .await?;
        let wanted = found.wanted();
        let mut seen = HashSet::new();
        found.extend(
            response
                .kvs()
                .iter()
                .filter_map(|kv| {
                    let key = String::from_utf8_lossy(kv.key());
                    layout::parse(&key).map(|(lock, _)| lock)
                })
                .filter(|lock| glob_matches(pattern.as_bytes(), lock.as_bytes()))
                .filter(|lock| seen.insert(lock.clone()))
                .take(wanted)
                .collect::<Vec<_>>(),
        );
        Ok(())
    }

    /// A linearizable read under the key prefix: answered only with a leader.
    async fn ping(&self) -> Result<(), LockError> {
        let key = layout::state_key(&self.shared.prefix);
        let deadline = Instant::now() + self.shared.response_timeout;
        self.shared
            .call("ping", deadline, |mut client| {
                let key = key.clone();
                async move {
                    client
                        .get(key, Some(GetOptions::new().with_count_only()))
                        .await
                }
            })
            .await
            .map(drop)
    }

    fn waker(&self) -> Option<&ReleaseListener> {
        Some(&self.waker)
    }

    /// Leases run on etcd's timers, in real time.
    fn clock(&self) -> Clock {
        Clock::Real
    }

    /// Each request of a try ends at its cut.
    fn cuts_tries(&self) -> bool {
        true
    }
}
