#[distlock::distributed_lock(key = "k", mode = read)]
async fn bare() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", mode = 1)]
async fn number() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
