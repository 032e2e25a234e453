//! One operation of the etcd store (`etcd.rs`) on the keys of some locks: read their
//! directories at one revision, run the twin on the state they hold, and write back what the
//! twin changed in one transaction that compares only what the decision rested on — the
//! bookkeeping's revision, no grant created since the read on a side the new grant excludes,
//! a permit's seat still free, a give-back's key still the one read — else read again (a
//! try's first attempt at a grant that excludes every other may skip the read: [`FirstTry`]). A grant
//! the twin adds gets a key on a lease of its own; one it removes loses its key and its
//! lease. Neighbours: `read.rs` reads the directories, `client.rs` sends the requests,
//! `layout.rs` names the keys, `store/key_state.rs` is the bookkeeping's JSON.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::client::{wall_micros, Lease, Shared};
use super::directory::{bookkeeping, holders, unpushed, with_holders, Directory};
use super::errors::etcd_error;
use super::leases::ttl_secs;
use super::read::{loaded_from, not_a_lock, read_ops, Loaded};
use super::{layout, EtcdStore};
use crate::error::{BackendErrorKind, LockError};
use crate::kind::twins::{State, TokenSource};
use crate::kind::HolderSlot;
use crate::protocol::{FencingToken, LockKey};
use crate::store::every_key::Subscription;
use crate::store::key_state::{decode, encode, KeyState, Timeline};

/// Why a transaction did not happen.
pub(super) enum Failure {
    /// The keys were busy until the deadline: other requests kept writing them between a read
    /// and its write (or every seat a permit could take was taken meanwhile). A try takes it as the
    /// key held.
    Busy,
    Error(LockError),
}

impl From<LockError> for Failure {
    fn from(err: LockError) -> Self {
        Failure::Error(err)
    }
}

impl Failure {
    /// As an error, for a request that is not a try.
    pub(super) fn into_error(self, operation: &'static str) -> LockError {
        match self {
            Failure::Error(err) => err,
            Failure::Busy => etcd_error(
                operation,
                BackendErrorKind::Timeout,
                "the keys kept changing between a read and its write for the whole response \
                 timeout",
            )
            .into(),
        }
    }
}

/// A lease granted for a grant that has not used it yet: taken by the transaction that
/// creates the grant's key, revoked if none does.
pub(super) struct SpareLease {
    shared: Arc<Shared>,
    lease: Option<Lease>,
}

impl SpareLease {
    /// Keeps `lease` (revoking the one kept before, if any).
    fn put(&mut self, lease: Lease) {
        if let Some(old) = self.lease.replace(lease) {
            self.shared.revoke(vec![old.id]);
        }
    }

    /// The lease, if it was asked with `ttl`.
    fn take(&mut self, ttl: i64) -> Option<Lease> {
        self.lease.take_if(|lease| lease.asked == ttl)
    }
}

impl Drop for SpareLease {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            self.shared.revoke(vec![lease.id]);
        }
    }
}

/// How a request that expects a grant (a try's first attempt) begins; either way its grant's
/// lease is asked with this many seconds.
#[derive(Clone, Copy)]
pub(super) enum FirstTry {
    /// Without a read: the twin runs on empty directories, and the transaction creates the
    /// grant only if they are (its compares say so: no key at all under them — no
    /// bookkeeping, no grant, nothing the store did not write), else brings back what they
    /// hold for the next attempt — on a free key, the
    /// lease's grant and one transaction, as etcd's own lock recipe. Sent only when the
    /// twin's grant excludes every side; otherwise (a read lock or a permit, which share the
    /// key) the attempt becomes [`FirstTry::Beside`]'s.
    Blind(i64),
    /// The read, with the grant's lease granted beside it.
    Beside(i64),
}

impl FirstTry {
    fn ttl(self) -> i64 {
        match self {
            FirstTry::Blind(ttl) | FirstTry::Beside(ttl) => ttl,
        }
    }
}

/// What the twin runs at: the time of the read, and its revision.
pub(super) struct Read {
    pub(crate) time: Timeline,
    pub(crate) revision: i64,
}

/// What a transaction left: its revision, and the create revision of every grant's key it
/// touched or found (a grant's fencing token).
pub(super) struct Committed {
    pub(super) revision: i64,
    pub(super) created: HashMap<(String, String), i64>,
}

impl Committed {
    /// The fencing token of `owner`'s grant at `key`.
    pub(super) fn token(&self, key: &LockKey, owner: &str) -> Result<FencingToken, LockError> {
        self.created
            .get(&(key.lock.clone(), owner.to_owned()))
            .and_then(|&revision| u64::try_from(revision).ok())
            .map(FencingToken)
            .ok_or_else(|| {
                etcd_error(
                    "acquire",
                    BackendErrorKind::Server,
                    "a grant was reported without its key",
                )
                .into()
            })
    }
}

impl EtcdStore {
    /// Runs `twin` on the state of `keys` as etcd has it, and writes back what it changed in
    /// one transaction, if nobody wrote the keys since the read (else reads again, within the
    /// response timeout and `cut`): the twin's answer and what the transaction left. A grant
    /// the twin adds gets a key on a lease of its own; one it removes loses its key and its
    /// lease. `relet`: an owner whose grant keeps its key on a new lease, as long as the twin
    /// left it (a release within `hold_at_least`). `first`: how a request that expects a
    /// grant begins ([`FirstTry`]).
    pub(super) async fn transact<T>(
        &self,
        operation: &'static str,
        keys: &[&LockKey],
        cut: Option<Instant>,
        relet: Option<&str>,
        first: Option<FirstTry>,
        mut twin: impl FnMut(&mut State, &Read) -> Result<T, LockError>,
    ) -> Result<(T, Committed), Failure> {
        let mut locks: Vec<String> = keys.iter().map(|key| key.lock.clone()).collect();
        locks.sort_unstable();
        locks.dedup();
        let give_up = Instant::now() + self.shared.response_timeout;
        let deadline = cut.map_or(give_up, |cut| cut.min(give_up));
        let mut spare = SpareLease {
            shared: self.shared.clone(),
            lease: None,
        };
        let mut blind = matches!(first, Some(FirstTry::Blind(_)));
        // What a blind try found instead of empty directories: the next attempt's read.
        let mut found: Option<Loaded> = None;
        loop {
            // A try that expects a grant and is not blind has its lease granted beside the
            // read: one round trip less when it gets one, a revoked lease when it does not.
            let speculate = first.map(FirstTry::ttl).filter(|_| spare.lease.is_none());
            let loaded = match (blind, found.take(), speculate) {
                (true, ..) => Loaded {
                    revision: 0,
                    keys: locks
                        .iter()
                        .map(|lock| (lock.clone(), Directory::default()))
                        .collect(),
                },
                (false, Some(loaded), _) => loaded,
                (false, None, Some(ttl)) => {
                    let (loaded, lease) = tokio::join!(
                        self.read(&locks, deadline),
                        self.shared.grant(ttl, deadline)
                    );
                    if let Ok(lease) = lease {
                        spare.put(lease);
                    }
                    loaded?
                }
                (false, None, None) => self.read(&locks, deadline).await?,
            };
            let read = Read {
                time: Timeline {
                    db_micros: wall_micros(),
                    now: Instant::now(),
                },
                revision: loaded.revision,
            };
            let now = read.time.now;
            let mut state = State {
                tokens: TokenSource::Store {
                    taken: 0,
                    last: u64::try_from(loaded.revision).unwrap_or(0),
                },
                ..State::default()
            };
            let mut before = HashMap::new();
            for lock in &locks {
                let directory = &loaded.keys[lock];
                let mut key_state = match &directory.state {
                    Some((_, json)) => {
                        decode(json, &read.time).map_err(|err| not_a_lock(lock, &err.0))?
                    }
                    None => KeyState::default(),
                };
                with_holders(&mut key_state.entry, &directory.holders, now)
                    .map_err(|why| not_a_lock(lock, why))?;
                before.insert(
                    lock.clone(),
                    (holders(&key_state.entry), bookkeeping(&key_state)),
                );
                state.locks.insert(lock.clone(), key_state.entry);
                if let Some(record) = key_state.record {
                    state.records.insert(lock.clone(), record);
                }
            }
            let answer = twin(&mut state, &read)?;

            let after_read = loaded.revision.saturating_add(1);
            let mut compares = Vec::new();
            let mut ops = Vec::new();
            // Grants to create: lock, owner, key, side, a permit's count, lease in seconds.
            let mut wanted: Vec<(String, String, String, char, u32, i64)> = Vec::new();
            let mut gone: Vec<(String, String, i64)> = Vec::new();
            let mut created = HashMap::new();
            // Whether the compares say every directory is empty (each lock's new grant
            // excludes every side): all a blind try may rest on.
            let mut all_excluded = true;
            for lock in &locks {
                let directory = &loaded.keys[lock];
                let after = KeyState {
                    entry: state.locks.remove(lock).unwrap_or_default(),
                    record: state.records.remove(lock),
                };
                let now_holding = holders(&after.entry);
                let (was_holding, old_kept) = &before[lock];
                // What the transaction must find unchanged since the read: the bookkeeping,
                // and no grant created on a side the new grants exclude.
                let mut sides = HashSet::new();
                let mut seats: HashSet<u32> = directory
                    .holders
                    .values()
                    .filter(|key| key.side == 'p')
                    .filter_map(|key| layout::seat_of(&key.path))
                    .collect();
                for (owner, &(until, side, permits)) in &now_holding {
                    let relet_here = relet == Some(owner.as_str());
                    let found = directory.holders.get(owner);
                    if let Some(key) = found.filter(|key| key.side == side && !relet_here) {
                        created.insert((lock.clone(), owner.clone()), key.create_revision);
                        continue;
                    }
                    let path = match found {
                        // The same key on a new lease: its create revision stays.
                        Some(key) if key.side == side => {
                            created.insert((lock.clone(), owner.clone()), key.create_revision);
                            gone.push((lock.clone(), owner.clone(), key.lease));
                            key.path.clone()
                        }
                        _ => {
                            if let Some(key) = found {
                                ops.push(TxnOp::delete(key.path.clone(), None));
                                gone.push((lock.clone(), owner.clone(), key.lease));
                            }
                            let path = match side {
                                'p' => {
                                    // A free seat, at random: two permits taken at once
                                    // rarely pick the same one.
                                    let free: Vec<u32> =
                                        (0..permits).filter(|seat| !seats.contains(seat)).collect();
                                    if free.is_empty() {
                                        return Err(Failure::Busy);
                                    }
                                    let seat = free[fastrand::usize(..free.len())];
                                    seats.insert(seat);
                                    layout::permit_key(lock, seat)
                                }
                                _ => layout::holder_key(lock, side, owner),
                            };
                            // Created only where no key is.
                            compares.push(Compare::create_revision(
                                path.clone(),
                                CompareOp::Equal,
                                0,
                            ));
                            path
                        }
                    };
                    wanted.push((
                        lock.clone(),
                        owner.clone(),
                        path,
                        side,
                        permits,
                        ttl_secs(until.saturating_duration_since(now)),
                    ));
                    sides.insert(side);
                }
                let creates = !sides.is_empty();
                for owner in was_holding.keys() {
                    if now_holding.contains_key(owner) {
                        continue;
                    }
                    if let Some(key) = directory.holders.get(owner) {
                        // Still the grant that was read (not run out and taken again since).
                        compares.push(Compare::create_revision(
                            key.path.clone(),
                            CompareOp::Equal,
                            key.create_revision,
                        ));
                        ops.push(TxnOp::delete(key.path.clone(), None));
                        gone.push((lock.clone(), owner.clone(), key.lease));
                    }
                }
                // Against the bookkeeping as the read decoded it (not decoded again).
                let kept = bookkeeping(&after);
                let new = (!kept.is_empty()).then(|| encode(&kept, &read.time));
                let state_changed = match (&new, directory.state.is_some()) {
                    (Some(new), true) => {
                        let old_json = encode(old_kept, &read.time);
                        old_json != *new
                            && old_json != encode(&unpushed(&kept, old_kept, now), &read.time)
                    }
                    (None, false) => false,
                    _ => true,
                };
                if creates || state_changed {
                    let revision = directory
                        .state
                        .as_ref()
                        .map_or(0, |(revision, _)| *revision);
                    compares.push(Compare::mod_revision(
                        layout::state_key(lock),
                        CompareOp::Equal,
                        revision,
                    ));
                }
                // The sides the new grants exclude (the kinds' rule, `HolderSlot::excludes`;
                // other permits take other seats, or find theirs taken): no grant there may
                // have been created since the read. All three: the whole range at once.
                let excluded: Vec<char> = HolderSlot::ALL
                    .into_iter()
                    .filter(|&other| {
                        HolderSlot::ALL
                            .into_iter()
                            .any(|slot| sides.contains(&layout::side(slot)) && slot.excludes(other))
                    })
                    .map(layout::side)
                    .collect();
                all_excluded &= excluded.len() == HolderSlot::ALL.len();
                let ranges: Vec<Option<char>> = if excluded.len() == HolderSlot::ALL.len() {
                    vec![None]
                } else {
                    excluded.into_iter().map(Some).collect()
                };
                for side in ranges {
                    let start = layout::holders_of(lock, side);
                    let end = layout::range_end(&start);
                    compares.push(
                        Compare::create_revision(start, CompareOp::Less, after_read)
                            .with_range(end),
                    );
                }
                if state_changed {
                    ops.push(match new {
                        Some(new) => TxnOp::put(layout::state_key(lock), new.to_string(), None),
                        None => TxnOp::delete(layout::state_key(lock), None),
                    });
                }
            }
            if blind && (wanted.is_empty() || !all_excluded) {
                // The twin's plan on empty directories does not say they are empty (a read
                // or a permit shares the key): read them first.
                blind = false;
                continue;
            }
            if ops.is_empty() && wanted.is_empty() {
                return Ok((
                    answer,
                    Committed {
                        revision: loaded.revision,
                        created,
                    },
                ));
            }
            // A lease for every grant the transaction creates, granted first (the one granted
            // beside the read, if any; the others all at once). Each key of a `lock_all` has
            // its own: its keys may be given back one by one, and revoking a shared lease
            // would free them all.
            let mut leases: HashMap<(String, String), Lease> = HashMap::new();
            let mut asked: Vec<((String, String), i64)> = Vec::new();
            for (lock, owner, _, _, _, ttl) in &wanted {
                let grant = (lock.clone(), owner.clone());
                if leases.contains_key(&grant) || asked.iter().any(|(asked, _)| *asked == grant) {
                    continue;
                }
                match spare.take(*ttl) {
                    Some(lease) => {
                        leases.insert(grant, lease);
                    }
                    None => asked.push((grant, *ttl)),
                }
            }
            let answers = futures_util::future::join_all(
                asked
                    .iter()
                    .map(|(_, ttl)| self.shared.grant(*ttl, deadline)),
            )
            .await;
            let mut failed = None;
            for ((grant, _), answer) in asked.into_iter().zip(answers) {
                match answer {
                    Ok(lease) => {
                        leases.insert(grant, lease);
                    }
                    Err(err) => failed = Some(err),
                }
            }
            if let Some(err) = failed {
                self.shared
                    .revoke(leases.values().map(|lease| lease.id).collect());
                return Err(err.into());
            }
            let mut granted = Vec::new();
            for (lock, owner, path, side, permits, _) in &wanted {
                let grant = (lock.clone(), owner.clone());
                let lease = leases[&grant];
                let value = match side {
                    'p' => format!("{} {permits} {owner}", lease.granted),
                    _ => lease.granted.to_string(),
                };
                ops.push(TxnOp::put(
                    path.clone(),
                    value,
                    Some(PutOptions::new().with_lease(lease.id)),
                ));
                granted.push((lease.id, grant));
            }
            if blind {
                // Nothing at all in the directories — not even a key the store does not
                // write, which the read would refuse as not a lock's.
                for lock in &locks {
                    let start = layout::directory(lock);
                    let end = layout::range_end(&start);
                    compares
                        .push(Compare::create_revision(start, CompareOp::Less, 1).with_range(end));
                }
            }
            let mut txn = Txn::new().when(compares).and_then(ops);
            if blind {
                txn = txn.or_else(read_ops(&locks));
            }
            let written = self
                .shared
                .call(operation, deadline, |mut client| {
                    let txn = txn.clone();
                    async move { client.txn(txn).await }
                })
                .await;
            let response = match written {
                Ok(response) => response,
                Err(err) => {
                    // It may have been written: the leases stay (a clean-up finds them).
                    return Err(crate::store::ambiguous(err).into());
                }
            };
            if !response.succeeded() {
                // Kept for the next read's grant, if it still needs one; else revoked.
                let mut unused = leases.into_values();
                if let Some(lease) = unused.next() {
                    spare.put(lease);
                }
                self.shared.revoke(unused.map(|lease| lease.id).collect());
                if blind {
                    // The directories were not empty: what they hold, read by the same
                    // transaction, is the next attempt's read.
                    blind = false;
                    let revision = response.header().map_or(0, |header| header.revision());
                    found = Some(loaded_from(&locks, revision, response.op_responses())?);
                }
                if Instant::now() < deadline {
                    continue;
                }
                return Err(Failure::Busy);
            }
            let revision = response.header().map_or(0, |header| header.revision());
            if !granted.is_empty() {
                self.watcher.start();
            }
            let mut revoked = Vec::new();
            for (lock, owner, lease) in gone {
                if relet != Some(owner.as_str()) {
                    self.shared.leases.remove(&lock, &owner);
                }
                revoked.push(lease);
            }
            for (lease, (lock, owner)) in granted {
                created
                    .entry((lock.clone(), owner.clone()))
                    .or_insert(revision);
                if relet != Some(owner.as_str()) {
                    self.shared.leases.insert(&lock, &owner, lease);
                }
            }
            self.shared.revoke(revoked);
            return Ok((answer, Committed { revision, created }));
        }
    }
}
