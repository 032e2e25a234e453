//! Panics counted by where they were raised: one process-wide panic hook (installed on first
//! use, passing every panic on to the hook before it) counts those raised in distlock's library
//! code and those raised in the `redis` crate's, on any thread — a connection task's, say — so
//! a fault test can assert that neither panicked; a test's own failed assertions are not
//! counted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

static IN_LIBRARY: AtomicUsize = AtomicUsize::new(0);
static IN_REDIS_CRATE: AtomicUsize = AtomicUsize::new(0);
static HOOK: Once = Once::new();

fn install() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(at) = info.location() {
                if at.file().contains("lock-runtime/src") {
                    IN_LIBRARY.fetch_add(1, Ordering::SeqCst);
                } else if at.file().contains("/redis-") {
                    IN_REDIS_CRATE.fetch_add(1, Ordering::SeqCst);
                }
            }
            previous(info);
        }));
    });
}

/// Panics raised so far in the `redis` crate's code.
pub fn redis_crate_panics() -> usize {
    install();
    IN_REDIS_CRATE.load(Ordering::SeqCst)
}

/// Panics raised so far in distlock's library code or in the `redis` crate's.
pub fn library_panics() -> usize {
    install();
    IN_LIBRARY.load(Ordering::SeqCst) + IN_REDIS_CRATE.load(Ordering::SeqCst)
}
