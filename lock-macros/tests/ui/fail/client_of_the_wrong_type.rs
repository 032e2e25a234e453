struct Service {
    name: String,
}

impl Service {
    #[distlock::distributed_lock(key = "k", client = self.name)]
    async fn run(&self) -> Result<(), distlock::LockError> {
        Ok(())
    }
}

fn main() {}
