//! Connections of their own for the failover guard's writes. `WAIT` blocks the connection it
//! is sent on until the replicas acknowledge or its timeout passes, and it must follow the
//! write on that same connection; on the store's shared connection one lagging replica would
//! hold up every request behind it — refusals, releases, health checks — for up to the guard's
//! timeout. So a guarded try or renewal borrows a transport of its own from [`Guarded`]
//! (a sibling of the store's: `Transport::sibling`), uses it alone, and gives it back; at most
//! [`GUARDED_CONNECTIONS`] are in use at once, each made on first need and kept for the next
//! writes. Neighbours: `redis.rs` borrows from it; `connection.rs` and `cluster.rs` make the
//! siblings.

use std::ops::Deref;
use std::sync::{Mutex, PoisonError};

use tokio::sync::{Semaphore, SemaphorePermit};

use super::transport::Transport;

/// How many guarded writes of one store may be under way at once, each on its own connection;
/// more wait for one of them to end.
pub(crate) const GUARDED_CONNECTIONS: usize = 16;

/// The transports of one store's guarded writes: idle ones, and a bound on those in use.
pub(crate) struct Guarded<T> {
    idle: Mutex<Vec<T>>,
    in_use: Semaphore,
}

/// A transport lent to one guarded write. Given back by [`give_back`](Self::give_back) once
/// the write's reply (and its `WAIT`) came; one dropped before that (the write was cancelled)
/// is closed instead, since a request may still be under way on it.
pub(crate) struct Lent<'a, T> {
    transport: Option<T>,
    pool: &'a Guarded<T>,
    _slot: Option<SemaphorePermit<'a>>,
}

impl<T: Transport> Guarded<T> {
    pub(crate) fn new() -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
            in_use: Semaphore::new(GUARDED_CONNECTIONS),
        }
    }

    /// A transport for one guarded write: an idle one, or a new sibling of `shared`.
    pub(crate) async fn lend(&self, shared: &T) -> Lent<'_, T> {
        // The semaphore is never closed: an error cannot happen, and would only lift the bound.
        let slot = self.in_use.acquire().await.ok();
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        Lent {
            transport: Some(idle.unwrap_or_else(|| shared.sibling())),
            pool: self,
            _slot: slot,
        }
    }
}

impl<T> Lent<'_, T> {
    /// The write is done with it: it serves the next one.
    pub(crate) fn give_back(mut self) {
        if let Some(transport) = self.transport.take() {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(transport);
        }
    }
}

impl<T> Deref for Lent<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // Taken only by `give_back`, which consumes the loan.
        self.transport.as_ref().unwrap_or_else(|| unreachable!())
    }
}
