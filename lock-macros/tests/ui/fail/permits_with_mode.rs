#[distlock::distributed_lock(key = "partner-api", permits = 5, mode = "read")]
async fn call() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
