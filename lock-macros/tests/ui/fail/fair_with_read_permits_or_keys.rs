#[distlock::distributed_lock(key = "doc:{id}", mode = "read", fair = true)]
async fn read(id: u64) -> Result<(), distlock::LockError> {
    let _ = id;
    Ok(())
}

#[distlock::distributed_lock(key = "partner-api", permits = 5, fair = true)]
async fn permits() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(keys = ["acct:{from}", "acct:{to}"], fair = true)]
async fn keys(from: u64, to: u64) -> Result<(), distlock::LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
