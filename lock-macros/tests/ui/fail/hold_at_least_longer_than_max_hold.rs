// A lock cannot be held at least longer than it may be held at most.
use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", max_hold = "1m", hold_at_least = "2m")]
async fn job() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    drop(job());
}
