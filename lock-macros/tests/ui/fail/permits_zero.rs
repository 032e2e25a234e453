#[distlock::distributed_lock(key = "partner-api", permits = 0)]
async fn call(id: u64) -> Result<(), distlock::LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
