#[distlock::distributed_lock(key = "k", max_hold = "five minutes")]
async fn words() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", max_hold = 300)]
async fn number() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", max_hold = "5m", max_hold = "6m")]
async fn twice() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
