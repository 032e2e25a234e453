const LEASE_MS: u64 = 15_000;

struct Settings {
    wait: std::time::Instant,
}

#[distlock::distributed_lock(key = "k", lease = LEASE_MS)]
async fn milliseconds() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", wait = settings.wait)]
async fn instant(settings: &Settings) -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
