//! `permits = N` as a literal and as an expression, on a free fn and on a method.

use std::sync::atomic::{AtomicUsize, Ordering};

static CALLS: AtomicUsize = AtomicUsize::new(0);

#[distlock::distributed_lock(key = "partner-api", permits = 5, lease = "10s", wait = "2s")]
async fn call_partner(id: u64) -> Result<u64, distlock::LockError> {
    CALLS.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

struct Exporter {
    limit: u32,
    locks: distlock::Client,
}

impl Exporter {
    #[distlock::distributed_lock(key = "exports:{tenant}", permits = self.limit, client = self.locks)]
    async fn export(&self, tenant: &str) -> Result<(), distlock::LockError> {
        let _ = tenant;
        Ok(())
    }
}

pub(crate) fn run() {
    drop(call_partner(1));
    let exporter = Exporter {
        limit: 3,
        locks: distlock::Client::new(distlock::Config::in_memory()).unwrap(),
    };
    drop(exporter.export("acme"));
}
