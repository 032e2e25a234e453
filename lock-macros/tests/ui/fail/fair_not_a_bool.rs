#[distlock::distributed_lock(key = "k", fair = "true")]
async fn string() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", fair = 1)]
async fn number() -> Result<(), distlock::LockError> {
    Ok(())
}

const FAIR: bool = true;

#[distlock::distributed_lock(key = "k", fair = FAIR)]
async fn expression() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
