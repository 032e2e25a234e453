//! etcd as a store: every kind's rules run as their twins (`kind/`, the reference statement of
//! the rules) on the state of the keys they touch, read and written back by the store in two
//! round trips — one read of the keys' etcd keys, one transaction that writes what the twin
//! changed if what the decision rested on is unchanged (the bookkeeping's revision, no grant
//! created since on a side the new grant excludes, a give-back's key still the one read; read
//! again otherwise). A lock key is a directory of etcd keys (`etcd/layout.rs`): its
//! bookkeeping (the kinds' state but its holders, as JSON, `key_state.rs`) and one key per
//! grant, on an etcd lease of the grant's own (`etcd/leases.rs`), granted beside the read (a
//! first try) or before the transaction that creates the key. What holds a lock is what etcd still has: a grant whose lease ran out on the
//! server is gone from the directory, whatever any clock says, and the twins see it gone. A
//! grant's fencing token is its key's create revision: strictly increasing across holders,
//! cluster-wide, with no clock in the argument (`docs/guarantees.md`). Renewals are one
//! keep-alive per lease; a release deletes the grant's key and revokes its lease. Waiters are
//! woken by a watch on the key prefix (`etcd/watcher.rs`), with the backoff as the fallback.
//! Times that are not a grant's lease — a fair waiter's deadline, the writer-waiting mark —
//! are kept on the writing client's clock: they decide who goes first, never who holds.
//! Every request runs as a task on the client's I/O runtime and ends at its deadline.
//! Neighbours: the store contract (`store/mod.rs`), the twins (`kind/twins.rs`,
//! `kind/multi.rs`, the key operations' `twin`s), the state's JSON (`store/key_state.rs`).

mod errors;
mod layout;
mod leases;
mod watcher;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use tokio::runtime::Handle;

use self::errors::{etcd_error, store_error, timed_out};
use self::leases::{ttl_secs, Leases};
use self::watcher::Watcher;
use super::every_key::{EveryKeyFeed, Subscription};
use super::glob::glob_matches;
use super::key_state::{decode, encode, KeyState, Timeline};
use super::{Found, Store};
use crate::clock::Clock;
use crate::config::EtcdTarget;
use crate::error::{BackendErrorKind, LockError};
use crate::key_operation::KeyOperation;
use crate::kind::multi::{MultiReply, MultiTry};
use crate::kind::semaphore::Permits;
use crate::kind::twins::{State, TokenSource};
use crate::kind::{Holding, Renewal, Try, TwinEntry};
use crate::operator_scripts::{ForceUnlock, RawHolder};
use crate::protocol::{AcquireReply, FencingToken, LockKey, Renewed};
use crate::wake::{ReleaseListener, Waiters};

/// The etcd store of one client.
pub(crate) struct EtcdStore {
    shared: Arc<Shared>,
    watcher: Arc<Watcher>,
    waker: ReleaseListener,
}

/// Why a transaction did not happen.
enum Failure {
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
    fn into_error(self, operation: &'static str) -> LockError {
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

/// What the store's requests share: the client (made on first use), the key prefix, the
/// timeouts and the leases of this client's grants.
pub(crate) struct Shared {
    target: EtcdTarget,
    /// The key prefix every lock key starts with (`Config::key_prefix`).
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    io: Handle,
    /// A client per endpoint, connected on first use.
    clients: Vec<tokio::sync::OnceCell<Client>>,
    /// The endpoint in use: the next one after a failure.
    current: AtomicUsize,
    leases: Leases,
}

/// Microseconds since the Unix epoch on this process' wall clock: the clock of the times the
/// bookkeeping keeps (never a grant's lease).
pub(crate) fn wall_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

impl Shared {
    /// The client of the endpoint in use, connected on the I/O runtime on first use.
    async fn client(&self) -> Result<Client, LockError> {
        self.client_at(self.current.load(Ordering::Acquire)).await
    }

    /// The client of endpoint `index`, connected on first use.
    async fn client_at(&self, index: usize) -> Result<Client, LockError> {
        let endpoint = &self.target.endpoints[index % self.target.endpoints.len()];
        let client = self.clients[index % self.clients.len()]
            .get_or_try_init(|| async {
                let mut options = ConnectOptions::new()
                    .with_connect_timeout(self.connect_timeout)
                    .with_keep_alive(
                        self.response_timeout.max(Duration::from_secs(1)),
                        self.response_timeout,
                    )
                    .with_require_leader(true);
                if let Some((user, password)) = &self.target.user {
                    options = options.with_user(user.clone(), password.clone());
                }
                let endpoints = [endpoint.clone()];
                let connecting = self
                    .io
                    .spawn(async move { Client::connect(endpoints, Some(options)).await });
                match tokio::time::timeout(self.connect_timeout, connecting).await {
                    Ok(Ok(Ok(client))) => Ok(client),
                    Ok(Ok(Err(err))) => Err(LockError::from(store_error("connect", err))),
                    Ok(Err(_)) => Err(etcd_error(
                        "connect",
                        BackendErrorKind::Connection,
                        "the client's I/O runtime is gone",
                    )
                    .into()),
                    Err(_) => Err(etcd_error(
                        "connect",
                        BackendErrorKind::Connection,
                        format!("no connection to etcd at {endpoint} within the connect timeout"),
                    )
                    .connect_timed_out(true)
                    .into()),
                }
            })
            .await?;
        Ok(client.clone())
    }

    /// Moves on from endpoint `index` to the next, unless another request already did.
    fn move_on(&self, index: usize) {
        let next = (index + 1) % self.target.endpoints.len();
        let _ = self
            .current
            .compare_exchange(index, next, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Runs `request` on the client of the endpoint in use, as a task on the I/O runtime,
    /// and waits for it until `deadline`: a request without an answer by then fails with a
    /// timeout (and may still take effect). A failed connection, a member without a leader
    /// or a broken connection moves the client on to the next endpoint; a request that was
    /// never sent (its connection refused) is sent again there, within the deadline, once
    /// to each endpoint at most.
    async fn call<T, F, Fut>(
        &self,
        operation: &'static str,
        deadline: Instant,
        request: F,
    ) -> Result<T, LockError>
    where
        T: Send + 'static,
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            let index = self.current.load(Ordering::Acquire);
            let again = tries < self.target.endpoints.len() && Instant::now() < deadline;
            let client = match tokio::time::timeout_at(deadline.into(), self.client_at(index)).await
            {
                Ok(Ok(client)) => client,
                Ok(Err(err)) => {
                    self.move_on(index);
                    if again {
                        continue;
                    }
                    return Err(err);
                }
                Err(_) => return Err(timed_out(operation).into()),
            };
            let running = self.io.spawn(request(client));
            let err = match tokio::time::timeout_at(deadline.into(), running).await {
                Ok(Ok(Ok(answer))) => return Ok(answer),
                Ok(Ok(Err(err))) => err,
                Ok(Err(_)) => {
                    return Err(etcd_error(
                        operation,
                        BackendErrorKind::Connection,
                        "the client's I/O runtime is gone",
                    )
                    .into())
                }
                Err(_) => return Err(timed_out(operation).into()),
            };
            let unsent = errors::never_sent(&err);
            let error = store_error(if unsent { "connect" } else { operation }, err);
            if matches!(
                error.kind(),
                BackendErrorKind::Connection | BackendErrorKind::Unavailable
            ) {
                self.move_on(index);
            }
            if unsent && again {
                continue;
            }
            return Err(error.into());
        }
    }

    /// Grants a lease of `ttl` seconds.
    async fn grant(&self, ttl: i64, deadline: Instant) -> Result<Lease, LockError> {
        let granted = self
            .call("acquire", deadline, move |mut client| async move {
                client.lease_grant(ttl, None).await
            })
            .await?;
        Ok(Lease {
            id: granted.id(),
            asked: ttl,
            granted: granted.ttl(),
        })
    }

    /// Revokes `leases` in the background: grants given back or never written. One that
    /// cannot be revoked runs out by itself.
    fn revoke(self: &Arc<Self>, leases: Vec<i64>) {
        if leases.is_empty() {
            return;
        }
        let shared = self.clone();
        self.io.spawn(async move {
            let Ok(client) = shared.client().await else {
                return;
            };
            for lease in leases {
                let mut leases = client.lease_client();
                let _ = tokio::time::timeout(shared.response_timeout, leases.revoke(lease)).await;
            }
        });
    }
}

/// An etcd lease as granted: its id and the TTL etcd gave it (seconds).
#[derive(Debug, Clone, Copy)]
struct Lease {
    id: i64,
    /// The TTL asked for.
    asked: i64,
    /// The TTL etcd granted (at least its minimum).
    granted: i64,
}

/// A lease granted for a grant that has not used it yet: taken by the transaction that
/// creates the grant's key, revoked if none does.
struct SpareLease {
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

/// One grant's key as a read found it.
#[derive(Debug, Clone)]
struct HolderKey {
    /// `w`, `r` or `p`: writer, reader, permit.
    side: char,
    /// The key (`layout.rs`).
    path: String,
    create_revision: i64,
    lease: i64,
    /// The lease it was granted with, in seconds.
    ttl: i64,
    /// A permit's semaphore's count (0 for the other sides).
    permits: u32,
}

/// One lock key's etcd keys as a read found them.
#[derive(Debug, Default)]
struct Directory {
    /// The bookkeeping's revision (0: none) and JSON.
    state: Option<(i64, serde_json::Value)>,
    holders: HashMap<String, HolderKey>,
}

/// What one read found: the keys' directories, at one revision.
struct Loaded {
    revision: i64,
    keys: HashMap<String, Directory>,
}

/// What the twin runs at: the time of the read, and its revision.
pub(crate) struct Read {
    pub(crate) time: Timeline,
    pub(crate) revision: i64,
}

/// What a transaction left: its revision, and the create revision of every grant's key it
/// touched or found (a grant's fencing token).
struct Committed {
    revision: i64,
    created: HashMap<(String, String), i64>,
}

impl Committed {
    /// The fencing token of `owner`'s grant at `key`.
    fn token(&self, key: &LockKey, owner: &str) -> Result<FencingToken, LockError> {
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

/// The holders of an entry, by owner: when each lease ends, its side (`w`, `r`, `p`) and
/// a permit's semaphore's count.
fn holders(entry: &TwinEntry) -> HashMap<String, (Instant, char, u32)> {
    let mut all = HashMap::new();
    if let Some((owner, until)) = &entry.writer {
        all.insert(owner.clone(), (*until, 'w', 0));
    }
    for (owner, until) in &entry.readers {
        all.insert(owner.clone(), (*until, 'r', 0));
    }
    if let Some(permits) = &entry.permits {
        for (owner, until) in &permits.holders {
            all.insert(owner.clone(), (*until, 'p', permits.count));
        }
    }
    all
}

/// `state` without its holders: what the bookkeeping key keeps (the holders are keys of
/// their own).
fn bookkeeping(state: &KeyState) -> KeyState {
    let mut kept = state.clone();
    kept.entry.writer = None;
    kept.entry.readers.clear();
    kept.entry.permits = None;
    kept
}

/// `after` with each fair waiter's deadline and the writer-waiting mark as `before` had them
/// wherever the push is not needed yet: where the old time still has more than half of
/// the new one's distance from `now` ahead of it. A try that only pushes such times writes
/// nothing, so that the waiters behind the head (each trying every half heartbeat) do not
/// keep rewriting the key under the head's own try.
fn unpushed(after: &KeyState, before: &KeyState, now: Instant) -> KeyState {
    let keep = |old: Instant, new: Instant| {
        let half = new.saturating_duration_since(now) / 2;
        (old <= new && old > now + half).then_some(old)
    };
    let mut kept = after.clone();
    if let (Some(new), Some(old)) = (after.entry.writer_waiting, before.entry.writer_waiting) {
        if let Some(old) = keep(old, new) {
            kept.entry.writer_waiting = Some(old);
        }
    }
    if let (Some(queue), Some(old_queue)) = (&after.entry.queue, &before.entry.queue) {
        let old: HashMap<&str, (u64, Instant)> = old_queue
            .waiters()
            .map(|(waiter, ticket, deadline)| (waiter, (ticket, deadline)))
            .collect();
        kept.entry.queue = Some(crate::kind::fair::FairQueue::from_waiters(
            queue.waiters().map(|(waiter, ticket, deadline)| {
                let deadline = match old.get(waiter) {
                    Some(&(old_ticket, old_deadline)) if old_ticket == ticket => {
                        keep(old_deadline, deadline).unwrap_or(deadline)
                    }
                    _ => deadline,
                };
                (waiter.to_owned(), ticket, deadline)
            }),
        ));
    }
    kept
}

/// Puts in `entry` the grants whose keys etcd has, each until a lease from `now` (the
/// server ends it, not this time).
fn with_holders(
    entry: &mut TwinEntry,
    live: &HashMap<String, HolderKey>,
    now: Instant,
) -> Result<(), &'static str> {
    entry.writer = None;
    entry.readers.clear();
    entry.permits = None;
    for (owner, key) in live {
        let until = now + Duration::from_secs(u64::try_from(key.ttl).unwrap_or(1));
        match key.side {
            'w' if entry.writer.is_some() => return Err("two writers at once"),
            'w' => entry.writer = Some((owner.clone(), until)),
            'r' => {
                entry.readers.insert(owner.clone(), until);
            }
            _ => {
                entry
                    .permits
                    .get_or_insert_with(|| Permits {
                        count: key.permits,
                        holders: HashMap::new(),
                    })
                    .holders
                    .insert(owner.clone(), until);
            }
        }
    }
    Ok(())
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

    /// Reads the directories of `locks` in one transaction (one revision).
    async fn read(&self, locks: &[String], deadline: Instant) -> Result<Loaded, LockError> {
        let ops: Vec<TxnOp> = locks
            .iter()
            .map(|lock| {
                let directory = layout::directory(lock);
                let end = layout::range_end(&directory);
                TxnOp::get(directory, Some(GetOptions::new().with_range(end)))
            })
            .collect();
        let response = self
            .shared
            .call("read", deadline, |mut client| {
                let txn = Txn::new().and_then(ops.clone());
                async move { client.txn(txn).await }
            })
            .await?;
        let revision = response.header().map_or(0, |header| header.revision());
        let mut keys = HashMap::new();
        for (lock, op) in locks.iter().zip(response.op_responses()) {
            let TxnOpResponse::Get(range) = op else {
                continue;
            };
            let mut directory = Directory::default();
            for kv in range.kvs() {
                let key = String::from_utf8_lossy(kv.key());
                match layout::parse(&key) {
                    Some((_, layout::Part::State)) => {
                        let json = serde_json::from_slice(kv.value())
                            .map_err(|err| not_a_lock(lock, &err.to_string()))?;
                        directory.state = Some((kv.mod_revision(), json));
                    }
                    Some((_, layout::Part::Holder(side, name))) => {
                        let value = std::str::from_utf8(kv.value()).unwrap_or("");
                        let mut fields = value.split(' ');
                        let ttl = fields.next().and_then(|ttl| ttl.parse().ok());
                        // A permit's value: its lease, the semaphore's count, its owner.
                        let (permits, owner) = match side {
                            'p' => (
                                fields.next().and_then(|count| count.parse().ok()),
                                fields.next().filter(|_| layout::seat_of(&key).is_some()),
                            ),
                            _ => (Some(0), Some(name)),
                        };
                        let (Some(ttl), Some(permits), Some(owner), None) =
                            (ttl, permits, owner, fields.next())
                        else {
                            return Err(not_a_lock(lock, "a grant's key of another shape"));
                        };
                        let holder = HolderKey {
                            side,
                            path: key.to_string(),
                            create_revision: kv.create_revision(),
                            lease: kv.lease(),
                            ttl,
                            permits,
                        };
                        if directory.holders.insert(owner.to_owned(), holder).is_some() {
                            return Err(not_a_lock(lock, "one owner holding it twice"));
                        }
                    }
                    None => return Err(not_a_lock(lock, "a key the store does not write")),
                }
            }
            keys.insert(lock.clone(), directory);
        }
        Ok(Loaded { revision, keys })
    }

    /// Runs `twin` on the state of `keys` as etcd has it, and writes back what it changed in
    /// one transaction, if nobody wrote the keys since the read (else reads again, within the
    /// response timeout and `cut`): the twin's answer and what the transaction left. A grant
    /// the twin adds gets a key on a lease of its own; one it removes loses its key and its
    /// lease. `relet`: an owner whose grant keeps its key on a new lease, as long as the twin
    /// left it (a release within `hold_at_least`). `speculate`: the lease (in seconds) of a
    /// grant the request expects, granted beside the read.
    async fn transact<T>(
        &self,
        operation: &'static str,
        keys: &[&LockKey],
        cut: Option<Instant>,
        relet: Option<&str>,
        speculate: Option<i64>,
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
        loop {
            // A try that expects a grant has its lease granted beside the read: one round
            // trip less when it gets one, a revoked lease when it does not.
            let speculate = speculate.filter(|_| spare.lease.is_none());
            let loaded = match speculate {
                Some(ttl) => {
                    let (loaded, lease) = tokio::join!(
                        self.read(&locks, deadline),
                        self.shared.grant(ttl, deadline)
                    );
                    if let Ok(lease) = lease {
                        spare.put(lease);
                    }
                    loaded?
                }
                None => self.read(&locks, deadline).await?,
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
                before.insert(lock.clone(), holders(&key_state.entry));
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
            for lock in &locks {
                let directory = &loaded.keys[lock];
                let after = KeyState {
                    entry: state.locks.remove(lock).unwrap_or_default(),
                    record: state.records.remove(lock),
                };
                let now_holding = holders(&after.entry);
                let was_holding = &before[lock];
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
                let old = directory.state.as_ref().map(|(_, json)| json);
                let kept = bookkeeping(&after);
                let new = (!kept.is_empty()).then(|| encode(&kept, &read.time));
                let state_changed = match (&new, old) {
                    (Some(new), Some(old)) => decode(old, &read.time).map_or(true, |old| {
                        let old = bookkeeping(&old);
                        let old_json = encode(&old, &read.time);
                        old_json != *new
                            && old_json != encode(&unpushed(&kept, &old, now), &read.time)
                    }),
                    (None, None) => false,
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
                // The sides a new grant excludes: a writer every grant; a reader the writers
                // and permits; a permit the writers and readers (other permits take other
                // seats, or find theirs taken).
                let excluded: &[Option<char>] = if sides.contains(&'w') {
                    &[None]
                } else {
                    match (sides.contains(&'r'), sides.contains(&'p')) {
                        (true, true) => &[None],
                        (true, false) => &[Some('w'), Some('p')],
                        (false, true) => &[Some('w'), Some('r')],
                        (false, false) => &[],
                    }
                };
                for &side in excluded {
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
            // beside the read, if any). Each key of a `lock_all` has its own: its keys may be
            // given back one by one, and revoking a shared lease would free them all.
            let mut granted = Vec::new();
            let mut leases: HashMap<(String, String), Lease> = HashMap::new();
            for (lock, owner, path, side, permits, ttl) in &wanted {
                let lease = match leases.get(&(lock.clone(), owner.clone())) {
                    Some(lease) => *lease,
                    None => {
                        let lease = match spare.take(*ttl) {
                            Some(lease) => lease,
                            None => match self.shared.grant(*ttl, deadline).await {
                                Ok(lease) => lease,
                                Err(err) => {
                                    self.shared.revoke(leases.values().map(|l| l.id).collect());
                                    return Err(err.into());
                                }
                            },
                        };
                        leases.insert((lock.clone(), owner.clone()), lease);
                        lease
                    }
                };
                let value = match side {
                    'p' => format!("{} {permits} {owner}", lease.granted),
                    _ => lease.granted.to_string(),
                };
                ops.push(TxnOp::put(
                    path.clone(),
                    value,
                    Some(PutOptions::new().with_lease(lease.id)),
                ));
                granted.push((lease.id, (lock.clone(), owner.clone())));
            }
            let txn = Txn::new().when(compares).and_then(ops);
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

/// A key of the lock's directory that the store did not write.
fn not_a_lock(lock: &str, why: &str) -> LockError {
    etcd_error(
        "read",
        BackendErrorKind::Server,
        format!(
            "the etcd keys of `{lock}` are not a distlock lock ({why}); they were left \
             untouched"
        ),
    )
    .into()
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
                (!attempt.refused_before).then(|| ttl_secs(attempt.lease)),
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
                Err(_) => return Err(timed_out("extend").into()),
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
            _ => return Err(timed_out("extend").into()),
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
                (!attempt.refused_before).then(|| ttl_secs(attempt.lease)),
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
