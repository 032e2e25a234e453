#[distlock::distributed_lock(key = "")]
async fn empty() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
