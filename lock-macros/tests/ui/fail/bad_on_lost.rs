#[distlock::distributed_lock(key = "k", on_lost = "panic")]
async fn bad() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
