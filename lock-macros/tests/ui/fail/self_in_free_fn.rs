#[distlock::distributed_lock(key = "user:{self.id}")]
async fn free(id: u64) -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
