#[distlock::distributed_lock(key = "k")]
async fn strings() -> Result<(), String> {
    Ok(())
}

#[distlock::distributed_lock(key = "k")]
async fn number() -> u32 {
    1
}

fn main() {}
