#[distlock::distributed_lock(key = "k", lease = "5s", lease = "10s")]
async fn twice() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
