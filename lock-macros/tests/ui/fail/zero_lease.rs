#[distlock::distributed_lock(key = "k", lease = "0s")]
async fn zero() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
