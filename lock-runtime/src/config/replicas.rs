//! The failover guard's settings ([`ReplicaGuard`], [`Config::replicas`](super::Config::replicas)):
//! how many replicas must acknowledge a grant, and how long its `WAIT` may take within a try
//! cut off by its request's wait. Neighbours: `config.rs` sets it; the Redis store sends the
//! `WAIT`.

use std::time::Duration;

/// The failover guard ([`Config::replicas`](super::Config::replicas)): a grant or renewal counts only once this many
/// replicas have it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaGuard {
    /// Replicas that must acknowledge.
    pub(crate) replicas: u32,
    /// How long to wait for them (`WAIT`'s timeout).
    pub(crate) timeout: Duration,
    /// When the try it guards is cut off (`None`: a renewal, or a try that is not):
    /// [`ReplicaGuard::by`].
    until: Option<std::time::Instant>,
}

/// What a try under the failover guard leaves, at most, for what follows its `WAIT` before the
/// try is cut off ([`ReplicaGuard::wait_timeout`]): the reply, and the give-back of a grant
/// too few replicas acknowledged (one more round trip), on a loaded machine.
const WAIT_REPLY_ALLOWANCE: Duration = Duration::from_millis(100);

impl ReplicaGuard {
    /// `replicas` acknowledgements, waited for at most `timeout`.
    pub(crate) fn new(replicas: u32, timeout: Duration) -> Self {
        Self {
            replicas,
            timeout,
            until: None,
        }
    }

    /// This guard for a try that the acquire loop cuts off at `cut` (at what is left of the
    /// request's wait): its `WAIT` gives up in time for the reply to come back before that
    /// ([`wait_timeout`](Self::wait_timeout)), so a grant too few replicas acknowledged by then
    /// is given back and reported as held, as at the guard's own timeout.
    pub(crate) fn by(self, cut: Option<std::time::Instant>) -> Self {
        Self { until: cut, ..self }
    }

    /// `WAIT`'s timeout for a `WAIT` sent now: the guard's timeout, or, for a try cut off
    /// sooner ([`by`](Self::by)), what is left until then less what follows it (half of what
    /// is left, or [`WAIT_REPLY_ALLOWANCE`] if less). At least a
    /// millisecond: `WAIT` with 0 would block for good.
    pub(crate) fn wait_timeout(&self) -> Duration {
        let timeout = match self.until {
            Some(until) => {
                let left = until.saturating_duration_since(std::time::Instant::now());
                self.timeout
                    .min(left.saturating_sub(WAIT_REPLY_ALLOWANCE.min(left / 2)))
            }
            None => self.timeout,
        };
        timeout.max(Duration::from_millis(1))
    }
}
