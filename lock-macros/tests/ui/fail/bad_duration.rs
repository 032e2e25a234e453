#[distlock::distributed_lock(key = "k", lease = "15 seconds")]
async fn bad_lease() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", wait = "5")]
async fn bad_wait() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
