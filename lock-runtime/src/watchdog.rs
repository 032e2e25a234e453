//! The client's watchdog: one task on the client's I/O runtime that renews every watched
//! [`Lease`] at about a third of its duration, batching leases that fall due at about the same
//! time into one call of the store (which sends it in as few requests as it can, and hands
//! back each lease's outcome as its server answers, so a late server costs only its own
//! leases), and declares a lease lost on a "not owner" reply or when its deadline passes
//! unrenewed.
//!
//! Leases wait in two ordered queues — by when the watchdog must next look at them (renewal or
//! deadline), and by when a renewal may be brought forward to join a batch — so a wake-up costs
//! the leases it acts on, not every lease held: a client holding 50,000 long leases renews a
//! 10 ms one on time. That task keeps the real clock (see [`crate::clock`]); a lease of the
//! in-process store taken on a current-thread runtime — the only kind of runtime whose clock
//! tokio can pause — is watched instead by a task of its own on that runtime, on its clock, so
//! a test that advances paused time past the lease sees it end unless it is renewed.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::Notify;

use crate::clock::Clock;
use crate::io::IoRuntime;
use crate::kind::Renewal;
use crate::lease::{Lease, LeaseState};
use crate::protocol::Renewed;
use crate::store::{AnyStore, Store};

/// A lease in the registry, with the queue positions it holds.
struct Watched {
    lease: Arc<Lease>,
    due: Instant,
    ripe: Option<Instant>,
}

#[derive(Default)]
struct Registry {
    watched: HashMap<u64, Watched>,
    /// (when the watchdog must look at the lease next, id): its next renewal, or its
    /// deadline while a renewal is under way or when it is not renewed.
    by_due: BTreeSet<(Instant, u64)>,
    /// (from when its renewal may join an earlier batch, id), for leases waiting for their
    /// next renewal.
    by_ripe: BTreeSet<(Instant, u64)>,
    /// When the watchdog will look next (`None`: not until a lease comes); a new lease due
    /// earlier wakes it.
    planned_wake: Option<Instant>,
}

impl Registry {
    /// Queues `lease`: for its next renewal, or (`renewing`, or not renewed at all) for its
    /// deadline. Returns when it is due.
    fn insert(&mut self, lease: Arc<Lease>, renewing: bool) -> Instant {
        let (due, ripe) = {
            let times = lease.times();
            if lease.renew && !renewing {
                let due = times.next_renewal.min(times.deadline);
                let ripe = times
                    .next_renewal
                    .checked_sub(renewal_slack(lease.duration))
                    .unwrap_or(times.next_renewal);
                (due, Some(ripe))
            } else {
                (times.deadline, None)
            }
        };
        let id = lease.id;
        self.by_due.insert((due, id));
        if let Some(ripe) = ripe {
            self.by_ripe.insert((ripe, id));
        }
        if let Some(old) = self.watched.insert(id, Watched { lease, due, ripe }) {
            self.unqueue(id, &old);
        }
        due
    }

    fn remove(&mut self, id: u64) -> Option<Arc<Lease>> {
        let watched = self.watched.remove(&id)?;
        self.unqueue(id, &watched);
        Some(watched.lease)
    }

    fn unqueue(&mut self, id: u64, watched: &Watched) {
        self.by_due.remove(&(watched.due, id));
        if let Some(ripe) = watched.ripe {
            self.by_ripe.remove(&(ripe, id));
        }
    }

    /// Whether a lease due at `due` must wake the watchdog to be served in time.
    fn wakes(&self, due: Instant) -> bool {
        self.planned_wake.is_none_or(|planned| due < planned)
    }
}

#[derive(Default)]
struct Shared {
    registry: Mutex<Registry>,
    /// The leases watched by a task of their own ([`follow`]), for [`Watchdog::drain`].
    followed: Mutex<HashMap<u64, Arc<Lease>>>,
    wake: Notify,
    /// How many times the watchdog has looked at its queues.
    #[cfg(test)]
    looks: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn unfollow(&self, id: u64) {
        self.followed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `lease` and wakes the watchdog if it would otherwise look too late. A
    /// cross-thread wake-up costs more than the rest of an acquire: only when needed.
    fn queue(&self, mut registry: std::sync::MutexGuard<'_, Registry>, lease: Arc<Lease>) {
        let due = registry.insert(lease, false);
        if registry.wakes(due) {
            registry.planned_wake = Some(due);
            drop(registry);
            self.wake.notify_one();
        }
    }

    /// Queues `lease` again after a renewal, if the registry still has it: one released
    /// meanwhile was removed (`forget` follows `end`), one past its deadline was declared lost.
    fn requeue(&self, lease: Arc<Lease>) {
        let mut registry = self.registry();
        if lease.state() == LeaseState::Held && registry.remove(lease.id).is_some() {
            self.queue(registry, lease);
        }
    }
}

/// The longest the watchdog sleeps while it watches any lease.
const TICK: Duration = Duration::from_millis(250);

/// The client's watchdog: one task on the I/O runtime for every lease of the client. Clones
/// are handles to the same one.
#[derive(Clone)]
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    store: Arc<AnyStore>,
}

impl Watchdog {
    pub(crate) fn start(io: &IoRuntime, store: Arc<AnyStore>) -> Self {
        let shared = Arc::new(Shared::default());
        io.spawn(run(shared.clone(), store.clone()));
        Self { shared, store }
    }

    /// Starts watching `lease`: renewing it (if it renews) and declaring it lost when its
    /// deadline passes. Called from the task that acquired it.
    pub(crate) fn watch(&self, lease: Arc<Lease>) {
        if lease.clock == Clock::Tokio {
            if let Some(caller) = Handle::try_current()
                .ok()
                .filter(|caller| caller.runtime_flavor() == RuntimeFlavor::CurrentThread)
            {
                self.shared
                    .followed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(lease.id, lease.clone());
                caller.spawn(follow(lease, self.store.clone(), self.shared.clone()));
                return;
            }
        }
        self.shared.queue(self.shared.registry(), lease);
    }

    /// Stops watching the lease `id`.
    pub(crate) fn forget(&self, id: u64) {
        self.shared.registry().remove(id);
        self.shared.unfollow(id);
    }

    /// Stops watching every lease, and returns them (for [`Client::shutdown`](crate::Client::shutdown)).
    pub(crate) fn drain(&self) -> Vec<Arc<Lease>> {
        let mut registry = self.shared.registry();
        let ids: Vec<u64> = registry.watched.keys().copied().collect();
        let mut leases: Vec<_> = ids
            .into_iter()
            .filter_map(|id| registry.remove(id))
            .collect();
        drop(registry);
        let mut followed = self
            .shared
            .followed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        leases.extend(followed.drain().map(|(_, lease)| lease));
        leases
    }
}

/// How soon a failed renewal is tried again.
fn retry_delay(lease: Duration) -> Duration {
    (lease / 10).min(Duration::from_secs(1))
}

/// Renewal is due a third of the lease after the last one; when any lease is due, every lease
/// due within a sixth of its own lease is renewed with it, so leases taken at about the same
/// time share requests.
fn renewal_slack(lease: Duration) -> Duration {
    lease / 6
}

async fn run(shared: Arc<Shared>, store: Arc<AnyStore>) {
    loop {
        let now = Instant::now();
        let mut batch = Vec::new();
        let wake_at = {
            let mut registry = shared.registry();
            while let Some(&(due, id)) = registry.by_due.first() {
                if due > now {
                    break;
                }
                let Some(lease) = registry.remove(id) else {
                    continue;
                };
                if lease.state() != LeaseState::Held {
                    continue;
                }
                if now >= lease.deadline() {
                    lease.mark_lost(lease.deadline_passed_why());
                    continue;
                }
                // Due and not yet renewing (a renewing lease is queued by its deadline).
                batch.push(lease);
            }
            if !batch.is_empty() {
                while let Some(&(ripe, id)) = registry.by_ripe.first() {
                    if ripe > now {
                        break;
                    }
                    if let Some(lease) = registry.remove(id) {
                        if lease.state() == LeaseState::Held {
                            batch.push(lease);
                        }
                    }
                }
                // While renewing, a lease is looked at again at its deadline.
                for lease in &batch {
                    registry.insert(lease.clone(), true);
                }
            }
            // With no lease at all, nothing is due until one comes, and `queue` wakes the
            // watchdog for it (a notification sent before the wait below is kept for it).
            let wake_at = registry.by_due.first().map(|&(due, _)| due.min(now + TICK));
            registry.planned_wake = wake_at;
            wake_at
        };
        #[cfg(test)]
        shared
            .looks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // One call of the store for the whole batch: it sends it in as few requests as it can
        // (one per Cluster primary), each script call of at most `MOST_PER_CALL` leases.
        if !batch.is_empty() {
            tokio::spawn(renew(batch, store.clone(), shared.clone()));
        }
        match wake_at {
            Some(wake_at) => tokio::select! {
                () = tokio::time::sleep_until(tokio::time::Instant::from_std(wake_at)) => {}
                () = shared.wake.notified() => {}
            },
            None => shared.wake.notified().await,
        }
    }
}

/// Watches one lease of the in-process store on the current-thread runtime that took it, on
/// that runtime's clock: renews it when due (if it renews) and declares it lost when its
/// deadline passes. A paused clock's auto-advance stops at each renewal (a timer of this
/// runtime), and the renewal, which needs no I/O, is done before the clock moves on; so a
/// renewed lease lives through any amount of virtual time, an unrenewed one ends at its
/// deadline. Ends with the lease, or with the runtime (its guard then sees the deadline pass
/// when it looks). The [`Shared`] registry never holds it; `renew` finds it gone and leaves it.
async fn follow(lease: Arc<Lease>, store: Arc<AnyStore>, shared: Arc<Shared>) {
    // Also when the runtime drops this task: the lease leaves the followed set.
    struct Unfollow<'a>(&'a Shared, u64);
    impl Drop for Unfollow<'_> {
        fn drop(&mut self) {
            self.0.unfollow(self.1);
        }
    }
    let _unfollow = Unfollow(&shared, lease.id);
    follow_until_over(&lease, store, &shared).await;
}

async fn follow_until_over(lease: &Arc<Lease>, store: Arc<AnyStore>, shared: &Arc<Shared>) {
    loop {
        let due = {
            let times = lease.times();
            if lease.renew {
                times.next_renewal.min(times.deadline)
            } else {
                times.deadline
            }
        };
        tokio::select! {
            () = lease.over() => return,
            () = tokio::time::sleep_until(tokio::time::Instant::from_std(due)) => {}
        }
        let now = lease.now();
        if lease.state() != LeaseState::Held {
            return;
        }
        if now >= lease.deadline() {
            lease.mark_lost(lease.deadline_passed_why());
            return;
        }
        if lease.renew && now >= lease.times().next_renewal {
            renew(vec![lease.clone()], store.clone(), shared.clone()).await;
        }
    }
}

/// Renews `leases` with one call of the store, and queues each for its next renewal as soon
/// as the store says what became of it: the store hands back each server's answers as that
/// server gives them, so a server that answers late (a frozen Cluster primary, or one whose
/// `WAIT` waits for a lagging replica) costs only the leases it holds, not those another
/// server renewed in time. A lease whose release is under way (its gate is taken) is left
/// out: no renewal may follow a release; a lease's gate is held until its outcome is known.
async fn renew(leases: Vec<Arc<Lease>>, store: Arc<AnyStore>, shared: Arc<Shared>) {
    let mut gates = Vec::with_capacity(leases.len());
    let mut live = Vec::with_capacity(leases.len());
    let mut left_out = Vec::new();
    for lease in &leases {
        if let Ok(gate) = lease.gate.try_lock() {
            // Its deadline passed while it waited for this batch: lost, not renewed.
            if lease.state() == LeaseState::Held && lease.now() >= lease.deadline() {
                lease.mark_lost(lease.deadline_passed_why());
            }
            if lease.state() == LeaseState::Held {
                gates.push(Some(gate));
                live.push(lease);
                continue;
            }
        }
        left_out.push(lease);
    }
    // One clock per call: the I/O task's batches are of real-clock leases, `follow` renews one.
    let clock = leases.first().map_or(Clock::Real, |lease| lease.clock);
    let sent = clock.now();
    // What became of `live[i]`: its gate is given up, then it is queued again.
    let mut settle = |i: usize, renewed: Renewed| {
        let (Some(lease), Some(gate)) = (live.get(i), gates.get_mut(i)) else {
            return;
        };
        if gate.take().is_none() {
            return;
        }
        match renewed {
            // A renewal that comes back after the deadline does not revive the lease: the
            // watchdog has declared it lost (or will, on its next look).
            Renewed::Yes => lease.renewed(sent),
            Renewed::No => lease.mark_lost("Redis says it is no longer the owner"),
            Renewed::Unknown => {
                lease.times().next_renewal = clock.now() + retry_delay(lease.duration);
            }
        }
        shared.requeue(Arc::clone(lease));
    };
    let mut outcome = Ok(());
    if !live.is_empty() {
        let renewals: Vec<Renewal<'_>> = live
            .iter()
            .map(|lease| Renewal {
                kind: lease.kind(),
                key: &lease.key,
                owner: &lease.owner,
                lease: lease.duration,
            })
            .collect();
        outcome = store.extend_many_as_answered(&renewals, &mut settle).await;
    }
    // Every lease is reported; one that was not is unknown, and tried again.
    for i in 0..live.len() {
        settle(i, Renewed::Unknown);
    }
    if let Err(err) = outcome {
        // Nothing was learnt of any lease. Only the leases still held are tried again (and
        // said to be): one whose deadline passed meanwhile is lost, and the watchdog says
        // that once, when it sees it.
        let held = live
            .iter()
            .filter(|lease| lease.state() == LeaseState::Held && clock.now() < lease.deadline())
            .count();
        if held > 0 {
            tracing::warn!(target: crate::telemetry::LOG_TARGET, leases = held, "lease renewal failed, retrying: {err}");
        }
    }
    // The leases left out: queued again after the call, so that one whose release is under
    // way is not looked at over and over meanwhile. (The others were as they were settled; a
    // settled one may be in a later batch by now, and is not queued again here.)
    for lease in left_out {
        shared.requeue(Arc::clone(lease));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;
    use crate::kind::twins::Twins;
    use crate::kind::{Kind, Try};
    use crate::protocol::{AcquireReply, LockKey};
    use crate::store::memory::MemoryStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_watchdog_sleeps_until_a_lease_comes_then_renews_it() {
        let io = IoRuntime::start().expect("I/O runtime");
        let store = Arc::new(Twins::default());
        let store = Arc::new(AnyStore::Memory(MemoryStore::new(store)));
        let watchdog = Watchdog::start(&io, store.clone());

        // The observation window: a watchdog that ticked every 250 ms would look 4 more times.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let idle_looks = watchdog.shared.looks.load(Relaxed);
        assert!(
            idle_looks <= 1,
            "an idle watchdog looked {idle_looks} times"
        );

        // A lease comes: the watchdog wakes for it and renews it past several leases.
        let key = LockKey::new("test:", "k".to_owned()).expect("key");
        let duration = Duration::from_millis(60);
        let sent = Instant::now();
        let attempt = Try {
            kind: Kind::Write,
            key: &key,
            owner: "owner",
            lease: duration,
            writer_waiting: duration,
            refused_before: false,
            fencing: true,
            seat: None,
            proposed: None,
            deadline: None,
            cut: None,
        };
        let reply = store.acquire(&attempt).await.expect("acquire");
        let AcquireReply::Acquired(token) = reply else {
            panic!("the lock is free");
        };
        let lease = Arc::new(Lease::new(
            crate::kind::Holding::Grant(Kind::Write),
            key,
            "owner".to_owned(),
            token,
            duration,
            true,
            None,
            sent,
            Clock::Real,
            crate::telemetry::Hold::detached(),
        ));
        watchdog.watch(lease.clone());
        tokio::time::sleep(duration * 6).await;
        assert!(lease.is_held(), "renewed for six leases");
        watchdog.forget(lease.id);
    }
}
