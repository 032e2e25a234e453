#[distlock::distributed_lock(key = "k", timeout = "5s")]
async fn unknown() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
