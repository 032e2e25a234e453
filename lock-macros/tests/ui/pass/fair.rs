//! `fair = true` on the exclusive lock (however it is named, beside other arguments), and
//! `fair = false` with every kind, which it leaves as it is.
#![allow(dead_code)]

struct Billing {
    locks: distlock::Client,
}

impl Billing {
    #[distlock::distributed_lock(key = "invoice:{id}", fair = true, client = self.locks, lease = "10s", wait = "5s")]
    async fn settle(&self, id: u64) -> Result<u64, distlock::LockError> {
        Ok(id)
    }
}

#[distlock::distributed_lock(key = "doc:{id}", mode = "write", fair = true, fencing = false)]
async fn write(id: u64) -> Result<(), distlock::LockError> {
    let _ = id;
    Ok(())
}

#[distlock::distributed_lock(key = "doc:{id}", mode = "exclusive", fair = true, watchdog = false)]
async fn exclusive(id: u64) -> Result<(), distlock::LockError> {
    let _ = id;
    Ok(())
}

#[distlock::distributed_lock(key = "doc:{id}", mode = "read", fair = false)]
async fn read(id: u64) -> Result<(), distlock::LockError> {
    let _ = id;
    Ok(())
}

#[distlock::distributed_lock(key = "partner-api", permits = 5, fair = false)]
async fn permit() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(keys = ["acct:{from}", "acct:{to}"], fair = false)]
async fn transfer(from: u64, to: u64) -> Result<(), distlock::LockError> {
    let _ = (from, to);
    Ok(())
}

pub(crate) fn run() {
    let billing = Billing {
        locks: distlock::Client::new(distlock::Config::in_memory()).unwrap(),
    };
    drop(billing.settle(1));
}
