//! Whether a Cluster's batches go one pipeline per primary ([`Batching`]). Batching turns
//! itself off when the per-primary connections cannot work where the cluster connection does:
//! a primary refuses the seed node's credentials or TLS settings, or `CLUSTER SLOTS` names a
//! host no client can be made for. That is logged once, as a warning; while it is off every
//! call goes alone and the map is not read, and after a pause (doubling up to [`MOST_PAUSE`])
//! one batch tries again, so batching comes back by itself once the cause is gone. Each batch
//! reports what it learnt as its primaries answer ([`BatchRound`]). Neighbours: `primaries.rs`
//! sends the batches; `slot_map.rs` finds a host unusable.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::Primaries;

/// Whether batches are sent one pipeline per primary: on, or off since a per-primary
/// connection could not be made to work (bad credentials or TLS settings for the primaries,
/// an unusable host in `CLUSTER SLOTS`), until `retry_at`, when one batch tries again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Batching {
    On,
    Off {
        /// Why, for the logs.
        cause: String,
        /// The primary whose connection failed (`None`: an unusable host in the map): only a
        /// batch that reaches it and works there turns batching on again, so that batches
        /// which happen to miss it do not, each, warn anew and start the pauses over.
        culprit: Option<String>,
        /// How long this pause lasts; the next one, after a failed try, lasts twice as long
        /// (at most [`MOST_PAUSE`]).
        pause: Duration,
        retry_at: Instant,
    },
}

/// The first pause of batching after it turned off.
const FIRST_PAUSE: Duration = Duration::from_secs(1);

/// The longest pause of batching between two tries.
const MOST_PAUSE: Duration = Duration::from_secs(30);

/// What one batch learns of batching, as its primaries answer one by one.
pub(super) struct BatchRound {
    pub(super) state: Mutex<BatchRoundState>,
}

pub(super) struct BatchRoundState {
    /// Primaries yet to answer.
    pub(super) pending: usize,
    /// No primary's connection failed to work, and the map names no unusable host.
    pub(super) all_usable: bool,
    /// The primaries that answered, by address.
    pub(super) reached: Vec<String>,
}

impl BatchRound {
    /// The primary at `address` answered, its connection `usable` or not. When it was the
    /// last, and every one was usable: the primaries reached (batching may be on again).
    pub(super) fn answered(&self, usable: bool, address: &str) -> Option<Vec<String>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.all_usable &= usable;
        state.reached.push(address.to_owned());
        state.pending = state.pending.saturating_sub(1);
        (state.pending == 0 && state.all_usable).then(|| std::mem::take(&mut state.reached))
    }
}

impl Primaries {
    pub(super) fn batching(&self) -> std::sync::MutexGuard<'_, Batching> {
        self.batching.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether batching is off and its pause not over: every call goes alone, and the map is
    /// not read.
    pub(super) fn paused(&self) -> bool {
        matches!(&*self.batching(), Batching::Off { retry_at, .. } if Instant::now() < *retry_at)
    }

    /// Turns batching off for a pause, because of `cause` (at the primary `culprit`): with a
    /// warning when it was on; when this was a try after a pause, for twice as long as that
    /// pause. The map is read again at the next try.
    pub(super) fn switch_off(&self, cause: String, culprit: Option<String>) {
        let now = Instant::now();
        let mut batching = self.batching();
        let pause = match &*batching {
            Batching::On => {
                tracing::warn!(target: crate::telemetry::LOG_TARGET, seed = %self.seed.addr(), cause = %cause,
                    "Redis Cluster renewals are no longer sent one pipeline per primary: {cause}. \
                     Each slot's renewal goes alone through the cluster connection (one request \
                     per slot instead of one per primary) until a per-primary connection works; \
                     tried again after {FIRST_PAUSE:?}, then less and less often (at most every \
                     {MOST_PAUSE:?}). Check that the credentials and TLS settings of the first \
                     node URL are valid on every primary, and that the addresses CLUSTER SLOTS \
                     announces (cluster-announce-ip, cluster-announce-hostname, \
                     cluster-preferred-endpoint-type) are reachable from this client.");
                FIRST_PAUSE
            }
            // Another primary of the same batch failed too: one pause for both.
            Batching::Off { retry_at, .. } if now < *retry_at => return,
            Batching::Off { pause, .. } => {
                let pause = (*pause * 2).min(MOST_PAUSE);
                tracing::debug!(target: crate::telemetry::LOG_TARGET, seed = %self.seed.addr(), "Redis Cluster renewals still not sent per primary ({cause}); tried again after {pause:?}");
                pause
            }
        };
        *batching = Batching::Off {
            cause,
            culprit,
            pause,
            retry_at: now + pause,
        };
        self.out_of_date();
    }

    /// A batch went through with nothing that turns batching off, at the primaries `reached`
    /// (their addresses): it is on again if it was off because of one of them, or of an
    /// unusable host in a map that has none now. A batch that did not reach the primary that
    /// failed leaves it off; once its pause is over batches go per primary anyway, and the
    /// next one to reach that primary either turns batching on or starts a longer pause.
    pub(super) fn switch_on(&self, reached: &[&str]) {
        let mut batching = self.batching();
        if let Batching::Off { cause, culprit, .. } = &*batching {
            if culprit
                .as_deref()
                .is_some_and(|culprit| !reached.contains(&culprit))
            {
                return;
            }
            tracing::info!(target: crate::telemetry::LOG_TARGET, seed = %self.seed.addr(), "Redis Cluster renewals are sent one pipeline per primary again (they were not: {cause})");
            *batching = Batching::On;
        }
    }
}
