#[distlock::distributed_lock(key = "{nope}", lease = "0ms", on_lost = "later", mode = "upgrade", fifo = true)]
async fn many(id: u64) -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
