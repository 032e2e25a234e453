// Key templates the attribute refuses, at the template: one function per message.

#[distlock::distributed_lock(key = "")]
async fn empty() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "order:{}")]
async fn empty_placeholder(order_id: u64) -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = 42)]
async fn numeric() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "order:{order}")]
async fn unknown_placeholder(order_id: u64, amount: u32) -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "user:{self.id}")]
async fn self_in_a_free_fn(id: u64) -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
