#[async_trait::async_trait]
trait Job {
    async fn run(&self, pair: (u64, u64)) -> Result<(), distlock::LockError>;
}

struct Worker;

#[async_trait::async_trait]
impl Job for Worker {
    #[distlock::distributed_lock(key = "job:{c}")]
    async fn run(&self, (a, b): (u64, u64)) -> Result<(), distlock::LockError> {
        Ok(())
    }
}

fn main() {}
