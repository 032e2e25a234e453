// What the attribute cannot be put on: not a fn, not async, no result to carry a `LockError`.

#[distlock::distributed_lock(key = "k")]
struct NotAFn;

#[distlock::distributed_lock(key = "k")]
fn not_async() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k")]
async fn nothing() {}

fn main() {}
