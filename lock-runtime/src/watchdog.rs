//! Leases and the watchdog that keeps them. A [`Lease`] is the shared state of one grant
//! (owner, fencing token, local deadline, lost flag); the guard holds it, and the client's one
//! watchdog task renews every watched lease at about a third of its duration and declares it
//! lost on a "not owner" reply or when its local deadline passes unrenewed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::backend::{Backend, LockBackend, LockKey, Renewal};
use crate::io::IoRuntime;
use crate::FencingToken;

static NEXT_LEASE_ID: AtomicU64 = AtomicU64::new(1);

/// Margin taken off every lease for clock drift between this process and Redis, as Redlock
/// does: 1% of the lease plus 2 ms.
pub(crate) fn drift(lease: Duration) -> Duration {
    (lease / 100 + Duration::from_millis(2)).min(lease / 2)
}

struct Times {
    /// When the lease ends for sure unless renewed: send time of the last successful
    /// acquire/renew, plus the lease, minus drift.
    deadline: Instant,
    /// When the next renewal is due.
    next_renewal: Instant,
    /// A renewal request is under way.
    renewing: bool,
}

/// One grant's shared state.
pub(crate) struct Lease {
    pub(crate) id: u64,
    pub(crate) key: LockKey,
    pub(crate) owner: String,
    pub(crate) token: FencingToken,
    pub(crate) duration: Duration,
    renew: bool,
    times: Mutex<Times>,
    lost: watch::Sender<bool>,
    /// Released or dropped: nothing more is sent for this lease but its release.
    ended: AtomicBool,
    /// Serialises a renewal with the release, so no renewal is sent after the release.
    pub(crate) gate: tokio::sync::Mutex<()>,
}

impl Lease {
    /// A lease granted by a request sent at `sent`.
    pub(crate) fn new(
        key: LockKey,
        owner: String,
        token: FencingToken,
        duration: Duration,
        renew: bool,
        sent: Instant,
    ) -> Self {
        Self {
            id: NEXT_LEASE_ID.fetch_add(1, Ordering::Relaxed),
            key,
            owner,
            token,
            duration,
            renew,
            times: Mutex::new(Times {
                deadline: sent + duration - drift(duration),
                next_renewal: sent + duration / 3,
                renewing: false,
            }),
            lost: watch::Sender::new(false),
            ended: AtomicBool::new(false),
            gate: tokio::sync::Mutex::new(()),
        }
    }

    fn times(&self) -> std::sync::MutexGuard<'_, Times> {
        self.times.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.times().deadline
    }

    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    pub(crate) fn has_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }

    /// Completes when the lease is lost (never, if it never is). Checks the local deadline
    /// itself, so a task woken after a long pause sees the loss at once, before the watchdog
    /// (on another thread) has run.
    pub(crate) async fn lost(&self) {
        let mut lost = self.lost.subscribe();
        loop {
            if *lost.borrow_and_update() {
                return;
            }
            let deadline = self.deadline();
            if Instant::now() >= deadline {
                self.mark_lost("its lease ran out before a renewal succeeded");
                return;
            }
            tokio::select! {
                changed = lost.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                // The deadline may have moved by then: look again.
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    fn mark_lost(&self, why: &str) {
        if self.has_ended() {
            return;
        }
        if self
            .lost
            .send_if_modified(|lost| !std::mem::replace(lost, true))
        {
            tracing::warn!(key = %self.key.name, token = %self.token, "lease lost: {why}");
        }
    }
}

#[derive(Default)]
struct Shared {
    registry: Mutex<Registry>,
    wake: Notify,
}

#[derive(Default)]
struct Registry {
    leases: HashMap<u64, Arc<Lease>>,
    /// When the watchdog will look next (set under this lock as it goes to sleep); `None`
    /// while it is scanning or about to rescan.
    planned_wake: Option<Instant>,
}

impl Shared {
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The longest the watchdog sleeps: a new lease due later than the planned wake-up waits for
/// it instead of waking the watchdog's thread on every acquire.
const TICK: Duration = Duration::from_millis(250);

/// The client's watchdog: one task on the I/O runtime for every lease of the client.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

impl Watchdog {
    pub(crate) fn start(io: &IoRuntime, backend: Arc<Backend>) -> Self {
        let shared = Arc::new(Shared::default());
        io.spawn(run(shared.clone(), backend));
        Self { shared }
    }

    /// Starts watching `lease`: renewing it (if it renews) and declaring it lost when due.
    pub(crate) fn watch(&self, lease: Arc<Lease>) {
        let due = {
            let times = lease.times();
            if lease.renew {
                times.next_renewal.min(times.deadline)
            } else {
                times.deadline
            }
        };
        let mut registry = self.shared.registry();
        registry.leases.insert(lease.id, lease);
        // A cross-thread wake-up costs more than the rest of an acquire: only when needed.
        let wake = match registry.planned_wake {
            Some(planned) => due < planned,
            None => false,
        };
        if wake {
            registry.planned_wake = None;
            drop(registry);
            self.shared.wake.notify_one();
        }
    }

    /// Stops watching the lease `id`.
    pub(crate) fn forget(&self, id: u64) {
        self.shared.registry().leases.remove(&id);
    }
}

/// How soon a failed renewal is tried again.
fn retry_delay(lease: Duration) -> Duration {
    (lease / 10).min(Duration::from_secs(1))
}

/// Most leases renewed in one request.
const BATCH: usize = 256;

/// Renewal is due a third of the lease after the last one; when any lease is due, every lease
/// due within a sixth of its own lease is renewed with it, so leases taken at about the same
/// time share requests.
fn renewal_slack(lease: Duration) -> Duration {
    lease / 6
}

async fn run(shared: Arc<Shared>, backend: Arc<Backend>) {
    loop {
        let now = Instant::now();
        let mut wake_at: Option<Instant> = None;
        // (`soon`, `any_due` and `wake_at` are filled from the registry under one lock.)
        let mut soon = Vec::new();
        let mut any_due = false;
        let wake_at = {
            let mut registry = shared.registry();
            registry.leases.retain(|_, lease| {
                if lease.has_ended() || lease.is_lost() {
                    return false;
                }
                let times = lease.times();
                if now >= times.deadline {
                    drop(times);
                    lease.mark_lost("its lease ran out before a renewal succeeded");
                    return false;
                }
                let mut next = times.deadline;
                if lease.renew && !times.renewing {
                    next = next.min(times.next_renewal);
                    if times.next_renewal <= now + renewal_slack(lease.duration) {
                        any_due |= times.next_renewal <= now;
                        soon.push(lease.clone());
                    }
                }
                wake_at = Some(wake_at.map_or(next, |w| w.min(next)));
                true
            });
            let wake_at = wake_at.map_or(now + TICK, |at| at.min(now + TICK));
            registry.planned_wake = (!any_due).then_some(wake_at);
            wake_at
        };
        if any_due {
            for lease in &soon {
                lease.times().renewing = true;
            }
            while !soon.is_empty() {
                let batch: Vec<_> = soon.drain(..soon.len().min(BATCH)).collect();
                tokio::spawn(renew(batch, backend.clone(), shared.clone()));
            }
            // Their next wake-ups come with the renewals' outcomes.
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep_until(wake_at) => {}
            () = shared.wake.notified() => {}
        }
    }
}

/// Renews `leases` in one request. A lease whose release is under way (its gate is taken) is
/// left out: no renewal may follow a release.
async fn renew(leases: Vec<Arc<Lease>>, backend: Arc<Backend>, shared: Arc<Shared>) {
    let mut gates = Vec::with_capacity(leases.len());
    let mut live = Vec::with_capacity(leases.len());
    for lease in &leases {
        match lease.gate.try_lock() {
            Ok(gate) if !lease.has_ended() => {
                gates.push(gate);
                live.push(lease);
            }
            _ => lease.times().renewing = false,
        }
    }
    if !live.is_empty() {
        let renewals: Vec<Renewal<'_>> = live
            .iter()
            .map(|lease| Renewal {
                key: &lease.key,
                owner: &lease.owner,
                lease: lease.duration,
            })
            .collect();
        let sent = Instant::now();
        let outcome = backend.extend_many(&renewals).await;
        drop(gates);
        match outcome {
            Ok(extended) => {
                for (lease, still_ours) in live.iter().zip(extended) {
                    if still_ours {
                        let mut times = lease.times();
                        times.deadline = times
                            .deadline
                            .max(sent + lease.duration - drift(lease.duration));
                        times.next_renewal = sent + lease.duration / 3;
                        times.renewing = false;
                    } else {
                        lease.mark_lost("Redis says it is no longer the owner");
                    }
                }
            }
            Err(err) => {
                tracing::warn!(leases = live.len(), "lease renewal failed, retrying: {err}");
                for lease in &live {
                    let mut times = lease.times();
                    times.next_renewal = Instant::now() + retry_delay(lease.duration);
                    times.renewing = false;
                }
            }
        }
    }
    shared.registry().planned_wake = None;
    shared.wake.notify_one();
}
