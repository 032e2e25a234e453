#[distlock::distributed_lock(key = "acct:{from}", keys = ["acct:{from}", "acct:{to}"])]
async fn both(from: u64, to: u64) -> Result<(), distlock::LockError> {
    let _ = (from, to);
    Ok(())
}

#[distlock::distributed_lock(keys = [])]
async fn none() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(keys = ["acct:{from}", 7, "acct:{from}"])]
async fn odd(from: u64) -> Result<(), distlock::LockError> {
    let _ = from;
    Ok(())
}

#[distlock::distributed_lock(keys = "acct:{from}")]
async fn not_an_array(from: u64) -> Result<(), distlock::LockError> {
    let _ = from;
    Ok(())
}

#[distlock::distributed_lock(keys = ["acct:{from}", "acct:{from}"])]
async fn twice(from: u64) -> Result<(), distlock::LockError> {
    let _ = from;
    Ok(())
}

fn main() {}
