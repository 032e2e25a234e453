#[async_trait::async_trait]
trait Job {
    async fn run(&self, id: u64) -> Result<(), String>;
}

struct Worker;

#[async_trait::async_trait]
impl Job for Worker {
    #[distlock::distributed_lock(key = "job:{id}")]
    async fn run(&self, id: u64) -> Result<(), String> {
        Ok(())
    }
}

fn main() {}
