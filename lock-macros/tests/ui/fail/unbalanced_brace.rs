#[distlock::distributed_lock(key = "order:{order_id")]
async fn open(order_id: u64) -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "order:order_id}")]
async fn close(order_id: u64) -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
