//! Giving a grant back: the one path by which distlock deletes a lock it holds or may hold —
//! [`LockGuard::release`](crate::LockGuard::release) (awaited), a dropped guard (in the
//! background), and an acquire whose outcome is unknown (timed out, cancelled mid-request, or
//! granted too late to use). Each stops the lease's renewals first, then runs the store's
//! compare-and-delete, so a late release never deletes someone else's lock. Neighbours:
//! `guard.rs` and the client (`client/`) hold a [`Releaser`]; `watchdog.rs` is told to forget the lease;
//! the store (`store/`) runs the script; background work runs on the client's I/O runtime
//! (`io.rs`), which a `Releaser` keeps alive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use crate::clock::drift;
use crate::clock::Clock;
use crate::error::LockError;
use crate::io::IoRuntime;
use crate::kind::Holding;
use crate::lease::Lease;
use crate::protocol::LockKey;
use crate::store::{AnyStore, Store};
use crate::telemetry::Ended;
use crate::watchdog::Watchdog;

/// First pause before a failed background release is tried again; it doubles up to
/// [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(50);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(1);

/// The narrow handle a guard and the acquire loop give grants back through.
pub(crate) struct Releaser {
    store: Arc<AnyStore>,
    watchdog: Watchdog,
    io: Arc<IoRuntime>,
}

impl Releaser {
    pub(crate) fn new(store: Arc<AnyStore>, watchdog: Watchdog, io: Arc<IoRuntime>) -> Self {
        Self {
            store,
            watchdog,
            io,
        }
    }

    /// The store the grants are kept in.
    #[cfg(feature = "postgres")]
    pub(crate) fn store(&self) -> &AnyStore {
        &self.store
    }

    /// Stops the renewals of `lease`, lets a renewal in flight finish, then deletes its key if
    /// it is still ours: `Ok(true)` it was, `Ok(false)` it no longer was.
    pub(crate) async fn release(self: &Arc<Self>, lease: &Arc<Lease>) -> Result<bool, LockError> {
        if lease.is_known_lost() && lease.max_hold_passed().is_none() {
            // Lost: Redis said it is no longer ours, or no renewal reached it before its
            // deadline (a server that froze, say). The caller is not held up by such a server:
            // one compare-and-delete goes in the background, for a key still ours when the
            // server answers again. (A lease that ran into its `max_hold` is given back as
            // usual: its server is fine, and the key is still ours.)
            self.give_back_in_background(lease.clone(), Ended::Released);
            return Ok(false);
        }
        // Within its `hold_at_least` window the release keeps the lock: the log says so, not
        // "released".
        let holding = lease.holding_now();
        self.stop_renewing(lease, ended_as(holding, Ended::Released));
        let _gate = lease.gate.lock().await;
        let release = self.store.release(holding, &lease.key, &lease.owner);
        lease.clock.send(&self.io, release).await
    }

    /// [`release`](Self::release) in the background, for a guard dropped unreleased. Never
    /// blocks or panics; a failed try is repeated while the lease could still be in force.
    /// (The in-process store's release is done at once instead: it needs no I/O.)
    pub(crate) fn release_in_background(self: &Arc<Self>, lease: Arc<Lease>) {
        self.give_back_in_background(lease, Ended::Dropped);
    }

    /// Stops renewing `lease` (it ended `how`) and deletes its key in the background.
    fn give_back_in_background(self: &Arc<Self>, lease: Arc<Lease>, how: Ended) {
        self.stop_renewing(&lease, ended_as(lease.holding_now(), how));
        if lease.clock == Clock::Tokio && self.release_in_memory_now(&lease) {
            return;
        }
        let this = self.clone();
        self.io.spawn(async move {
            let _gate = lease.gate.lock().await;
            // Past the deadline (and the drift it allows for) Redis has let the key go.
            let until = lease.deadline() + drift(lease.duration);
            this.delete(
                lease.holding_now(),
                &lease.key,
                &lease.owner,
                until,
                "a dropped guard's lock",
            )
            .await;
        });
    }

    /// Deletes in the background a grant that a try with `owner` may have made without our
    /// knowing; `until` is when such a grant would expire at the latest, after which trying
    /// is pointless.
    pub(crate) fn clean_up(
        self: &Arc<Self>,
        holding: Holding,
        key: LockKey,
        owner: String,
        until: Instant,
    ) {
        let this = self.clone();
        self.io.spawn(async move {
            this.delete(
                holding,
                &key,
                &owner,
                until,
                "the grant of an interrupted acquire",
            )
            .await;
        });
    }

    /// Releases a lease of the in-process store here and now, on the dropping task's clock
    /// (a test's paused one, say; the I/O thread's is real): the store answers without
    /// waiting. `false` when a renewal holds the gate at this moment (the release is then
    /// left to the background).
    fn release_in_memory_now(&self, lease: &Lease) -> bool {
        let Ok(_gate) = lease.gate.try_lock() else {
            return false;
        };
        let release = self
            .store
            .release(lease.holding_now(), &lease.key, &lease.owner);
        let Some(released) = release.now_or_never() else {
            return false;
        };
        if let Holding::KeptFor(left) = lease.holding_now() {
            tracing::debug!(target: crate::telemetry::LOG_TARGET, key = %lease.key.name, ?released, "kept a dropped guard's lock until its hold_at_least window ends, in {left:?}");
        } else {
            tracing::debug!(target: crate::telemetry::LOG_TARGET, key = %lease.key.name, ?released, "released a dropped guard's lock");
        }
        true
    }

    fn stop_renewing(&self, lease: &Lease, how: Ended) {
        lease.end(how);
        self.watchdog.forget(lease.id);
    }

    /// The compare-and-delete, tried again with growing pauses while it fails and `until` has
    /// not passed.
    async fn delete(
        &self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
        until: Instant,
        what: &str,
    ) {
        let mut delay = FIRST_RETRY_DELAY;
        loop {
            match self.store.release(holding, key, owner).await {
                Ok(true) => {
                    if let Holding::KeptFor(left) = holding {
                        tracing::debug!(target: crate::telemetry::LOG_TARGET, key = %key.name, "kept {what} until its hold_at_least window ends, in {left:?}");
                    } else {
                        tracing::debug!(target: crate::telemetry::LOG_TARGET, key = %key.name, "released {what}");
                    }
                    return;
                }
                Ok(false) => {
                    tracing::debug!(target: crate::telemetry::LOG_TARGET, key = %key.name, "{what} was no longer ours");
                    return;
                }
                Err(err) if Instant::now() + delay < until => {
                    tracing::debug!(target: crate::telemetry::LOG_TARGET, key = %key.name, "could not release {what}, retrying: {err}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(MAX_RETRY_DELAY);
                }
                Err(err) => {
                    tracing::warn!(target: crate::telemetry::LOG_TARGET, key = %key.name,
                        "could not release {what}; its lease will expire: {err}"
                    );
                    return;
                }
            }
        }
    }
}

/// How a grant given back `how` ended, as a release of `holding` gives it back: kept, within
/// its `hold_at_least` window.
fn ended_as(holding: Holding, how: Ended) -> Ended {
    match holding {
        Holding::KeptFor(left) => Ended::Kept(left),
        _ => how,
    }
}
