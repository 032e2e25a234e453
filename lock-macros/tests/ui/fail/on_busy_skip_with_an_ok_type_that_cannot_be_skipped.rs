// `on_busy = "skip"` needs a value that says "skipped": `Result<(), E>` or
// `Result<Option<T>, E>`. A fn returning `Result<u32, E>` has none; the error is at the argument.
use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", on_busy = "skip")]
async fn count() -> Result<u32, LockError> {
    Ok(7)
}

fn main() {
    drop(count());
}
