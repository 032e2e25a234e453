const LIMIT: usize = 5;

#[distlock::distributed_lock(key = "partner-api", permits = LIMIT)]
async fn call() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
