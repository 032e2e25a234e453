#[distlock::distributed_lock(key = "k", mode = "read", mode = "write")]
async fn twice() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
