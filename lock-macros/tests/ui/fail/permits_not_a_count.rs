#[distlock::distributed_lock(key = "partner-api", permits = "5")]
async fn call() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "partner-api", permits = 5000000000)]
async fn too_many() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
