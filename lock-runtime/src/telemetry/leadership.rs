//! What distlock tells of elections: this process's leadership (the gauge
//! `distlock_leader{election}`, the counter `distlock_leadership_changes_total{election, cause}`
//! and an INFO event as it is gained, lost or resigned) and what an observer sees (an INFO
//! event for each new leader and each vacancy). A [`Term`] is attached to the `hold` of the
//! leader's grant ([`Hold::lead`](super::Hold::lead)), so the end of the grant — released,
//! dropped, lost, given back at shutdown — ends the term at the moment the lease leaves its
//! held state, before [`Leadership::lost`](crate::Leadership::lost) wakes. Neighbours: the
//! rest of `telemetry.rs`; `election/` calls in.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::LOG_TARGET;

pub(super) const LEADER: &str = "distlock_leader";
pub(super) const LEADERSHIP_CHANGES: &str = "distlock_leadership_changes_total";

/// Describes the election metrics to the installed recorder.
#[cfg(feature = "metrics")]
pub(super) fn describe() {
    metrics::describe_gauge!(
        LEADER,
        "1 while this process leads the election, 0 otherwise."
    );
    metrics::describe_counter!(
        LEADERSHIP_CHANGES,
        "Changes of this process's leadership of the election, by cause (gained, lost, resigned)."
    );
}

/// How a term ended, for the counter's `cause` and the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TermEnd {
    /// The lease was lost (not renewed in time, freed by force).
    Lost,
    /// Given back: resigned, dropped, or at the client's shutdown.
    Resigned,
}

/// One term of this process as the leader of an election: gained when its record is written,
/// ended once.
pub(crate) struct Term {
    election: Arc<str>,
    epoch: u64,
    ended: AtomicBool,
}

impl Term {
    /// This process leads `election` with `epoch` from now on.
    pub(crate) fn gained(election: Arc<str>, epoch: u64) -> Self {
        #[cfg(feature = "metrics")]
        {
            metrics::gauge!(LEADER, "election" => election.to_string()).set(1.0);
            metrics::counter!(LEADERSHIP_CHANGES, "election" => election.to_string(), "cause" => "gained")
                .increment(1);
        }
        tracing::info!(target: LOG_TARGET, election = %election, epoch, "leadership gained");
        Self {
            election,
            epoch,
            ended: AtomicBool::new(false),
        }
    }

    /// The term ended `how` (the first call counts; later ones do nothing).
    pub(crate) fn ended(&self, how: TermEnd) {
        if self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        let election = &self.election;
        let epoch = self.epoch;
        #[cfg(feature = "metrics")]
        {
            let cause = match how {
                TermEnd::Lost => "lost",
                TermEnd::Resigned => "resigned",
            };
            metrics::gauge!(LEADER, "election" => election.to_string()).set(0.0);
            metrics::counter!(LEADERSHIP_CHANGES, "election" => election.to_string(), "cause" => cause)
                .increment(1);
        }
        match how {
            TermEnd::Lost => {
                tracing::info!(target: LOG_TARGET, election = %election, epoch, "leadership lost");
            }
            TermEnd::Resigned => {
                tracing::info!(target: LOG_TARGET, election = %election, epoch, "leadership resigned");
            }
        }
    }
}

/// An observer ([`Election::observe`](crate::Election::observe)) saw a new leader.
pub(crate) fn observed_leader(election: &str, epoch: u64) {
    tracing::info!(target: LOG_TARGET, election, epoch, "observed a new leader");
}

/// An observer saw that nobody leads; `after`: the epoch of the last leader it saw, if any.
pub(crate) fn observed_vacancy(election: &str, after: Option<u64>) {
    tracing::info!(target: LOG_TARGET, election, after, "observed that nobody leads");
}
