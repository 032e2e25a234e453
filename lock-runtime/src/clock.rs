//! Which clock a client keeps: the real one for the Redis stores, which expire keys in real
//! time, and tokio's for the in-process store, so that users' tests that pause it
//! (`start_paused = true`) can move leases with `tokio::time::advance`. Leases (`lease.rs`)
//! take their deadlines from it, the watchdog (`watchdog.rs`) renews on it, the in-process
//! store (`store/memory.rs`) expires entries by it; requests to Redis run their timeouts on
//! the I/O runtime's real clock (`io.rs`) whatever the caller's clock says.

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::future::Either;

use tokio::runtime::Handle;

use crate::io::IoRuntime;

/// Margin taken off every lease for clock drift between this process and Redis, as Redlock
/// does: 1% of the lease plus 2 ms.
pub(crate) fn drift(lease: Duration) -> Duration {
    (lease / 100 + Duration::from_millis(2)).min(lease / 2)
}

/// The clock a client's leases and store keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Clock {
    /// `std::time::Instant`: Redis expires keys in real time, whatever tokio's clock says.
    Real,
    /// Tokio's clock of the runtime the code runs on ([`tokio_now`]): the in-process store.
    Tokio,
}

impl Clock {
    pub(crate) fn now(self) -> Instant {
        match self {
            Self::Real => Instant::now(),
            Self::Tokio => tokio_now(),
        }
    }

    /// Sends `request` to the store from the caller's task. To Redis, with its timeouts on the
    /// real clock ([`IoRuntime::with_real_timers`]): under a paused caller clock, auto-advance
    /// would otherwise fire them while the reply is on its way. The in-process store answers
    /// at once and reads the caller's clock, so its requests are left as they are.
    ///
    /// Not an `async fn`: a request from a multi-thread caller (whose clock tokio cannot pause)
    /// is returned as it is, so the hot path adds no layer around it.
    pub(crate) fn send<'a, F: Future + 'a>(
        self,
        io: &'a IoRuntime,
        request: F,
    ) -> impl Future<Output = F::Output> + 'a {
        match self {
            Self::Real if crate::io::multi_thread_caller().is_none() => {
                Either::Right(io.with_real_timers(request))
            }
            Self::Real | Self::Tokio => Either::Left(request),
        }
    }
}

/// Tokio's clock of the runtime this runs on: paused and moved by `tokio::time::advance` in a
/// test runtime with `start_paused`, the real clock elsewhere (outside any runtime, on a
/// runtime whose clock runs, and on a thread whose runtime context is already torn down —
/// where tokio itself would panic).
pub(crate) fn tokio_now() -> Instant {
    match Handle::try_current() {
        Err(err) if err.is_thread_local_destroyed() => Instant::now(),
        _ => tokio::time::Instant::now().into_std(),
    }
}
