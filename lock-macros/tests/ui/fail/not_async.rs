#[distlock::distributed_lock(key = "k")]
fn not_async() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
