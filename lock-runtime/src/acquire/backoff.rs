//! The pauses of the acquire loop (`acquire/mod.rs`): [`Backoff`], exponential with full
//! jitter, and how long a waiting writer's mark keeps new readers out between its tries
//! ([`writer_waiting_mark`]), which must outlast those pauses.

use std::time::Duration;

/// Added to twice the longest backoff step for how long a waiting writer's mark keeps new
/// readers out: the round trip of its next try.
const WRITER_WAITING_MARGIN: Duration = Duration::from_millis(100);
/// The longest a waiting writer's mark lives, whatever the backoff.
const MAX_WRITER_WAITING_MARK: Duration = Duration::from_secs(60);

/// How long a writer's try that finds the lock held keeps new readers out: longer than any
/// pause before its next try (twice the longest backoff step, plus a round trip), but not past
/// the end of its wait, and nothing on its last try — a writer that will not try again must
/// not hold readers up.
pub(crate) fn writer_waiting_mark(backoff_max: Duration, left_to_wait: Duration) -> Duration {
    if left_to_wait.is_zero() {
        return Duration::ZERO;
    }
    backoff_max
        .saturating_mul(2)
        .min(left_to_wait)
        .saturating_add(WRITER_WAITING_MARGIN)
        .min(MAX_WRITER_WAITING_MARK)
}

/// Exponential backoff with full jitter: each delay is uniform in `0..=ceiling`, the ceiling
/// doubling from `min` up to `max`.
pub(crate) struct Backoff {
    ceiling: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        Self { ceiling: min, max }
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = u64::try_from(self.ceiling.as_nanos()).unwrap_or(u64::MAX);
        self.ceiling = self.ceiling.saturating_mul(2).min(self.max);
        Duration::from_nanos(fastrand::u64(0..=ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writers_mark_outlives_its_pauses_but_not_its_wait() {
        let step = Duration::from_millis(200);
        assert_eq!(writer_waiting_mark(step, Duration::ZERO), Duration::ZERO);
        assert_eq!(
            writer_waiting_mark(step, Duration::from_secs(10)),
            2 * step + WRITER_WAITING_MARGIN
        );
        assert_eq!(
            writer_waiting_mark(step, Duration::from_millis(30)),
            Duration::from_millis(30) + WRITER_WAITING_MARGIN
        );
        assert_eq!(
            writer_waiting_mark(Duration::MAX, Duration::MAX),
            MAX_WRITER_WAITING_MARK
        );
    }

    #[test]
    fn an_unbounded_backoff_maximum_never_overflows() {
        let mut backoff = Backoff::new(Duration::from_secs(1 << 40), Duration::MAX);
        for _ in 0..200 {
            backoff.next_delay();
        }
        assert_eq!(backoff.ceiling, Duration::MAX);
    }

    #[test]
    fn backoff_ceilings_double_up_to_the_maximum() {
        let max = Duration::from_millis(40);
        let mut backoff = Backoff::new(Duration::from_millis(5), max);
        for expected in [5, 10, 20, 40, 40, 40] {
            assert_eq!(backoff.ceiling, Duration::from_millis(expected));
            assert!(backoff.next_delay() <= Duration::from_millis(expected));
        }
        assert_eq!(backoff.ceiling, max);
    }
}
