#[distlock::distributed_lock(key = "k", lease = "30s", max_hold = "10s")]
async fn shorter() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", lease = "1s", max_hold = "0s")]
async fn zero() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
