#[distlock::distributed_lock(keys = ["a:{from}", "a:{to}"], mode = "read")]
async fn read(from: u64, to: u64) -> Result<(), distlock::LockError> {
    let _ = (from, to);
    Ok(())
}

#[distlock::distributed_lock(keys = ["a:{from}", "a:{nope}"], permits = 2)]
async fn permits(from: u64) -> Result<(), distlock::LockError> {
    let _ = from;
    Ok(())
}

fn main() {}
