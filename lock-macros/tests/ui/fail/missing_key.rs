#[distlock::distributed_lock(lease = "15s")]
async fn no_key() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
