#[distlock::distributed_lock(key = 42)]
async fn numeric() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
