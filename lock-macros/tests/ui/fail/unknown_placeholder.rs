#[distlock::distributed_lock(key = "order:{order}")]
async fn reduce(order_id: u64, amount: u32) -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
