#[distlock::distributed_lock(lease = 5, key = "a" on_lost = "x")]
async fn broken() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
