// `on_busy` is "skip" or "wait".
use distlock::{distributed_lock, LockError};

#[distributed_lock(key = "job", on_busy = "ignore")]
async fn job() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    drop(job());
}
