#[distlock::distributed_lock(key = "order:{}")]
async fn reduce(order_id: u64) -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
