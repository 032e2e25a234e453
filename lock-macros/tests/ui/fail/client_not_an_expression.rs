#[distlock::distributed_lock(key = "k", client = "locks")]
async fn named_as_a_string() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", client = struct)]
async fn not_an_expression() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
