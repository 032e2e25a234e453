#[distlock::distributed_lock(key = "k", lease = "0s")]
async fn zero() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", lease = "5ms")]
async fn too_short() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
