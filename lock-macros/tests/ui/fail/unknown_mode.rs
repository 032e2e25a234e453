#[distlock::distributed_lock(key = "k", mode = "shared")]
async fn shared() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", mode = "Read")]
async fn capitalised() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", mode = "upgradable")]
async fn unknown() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
