#[distlock::distributed_lock(key = "k", fair = true, fair = false)]
async fn twice() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
