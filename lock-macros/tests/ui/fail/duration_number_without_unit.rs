#[distlock::distributed_lock(key = "k", lease = 15, max_hold = 2.5)]
async fn seconds_meant() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
