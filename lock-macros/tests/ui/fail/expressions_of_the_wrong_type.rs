// Expressions of the wrong type given to the attribute: the type error is at the expression.
// A module per misuse.

mod client_of_the_wrong_type {
    struct Service {
        name: String,
    }

    impl Service {
        #[distlock::distributed_lock(key = "k", client = self.name)]
        async fn run(&self) -> Result<(), distlock::LockError> {
            Ok(())
        }
    }
}

mod duration_expression_of_the_wrong_type {
    const LEASE_MS: u64 = 15_000;

    struct Settings {
        wait: std::time::Instant,
    }

    #[distlock::distributed_lock(key = "k", lease = LEASE_MS)]
    async fn milliseconds() -> Result<(), distlock::LockError> {
        Ok(())
    }

    #[distlock::distributed_lock(key = "k", wait = settings.wait)]
    async fn instant(settings: &Settings) -> Result<(), distlock::LockError> {
        Ok(())
    }
}

mod permits_expression_of_the_wrong_type {
    const LIMIT: usize = 5;

    #[distlock::distributed_lock(key = "partner-api", permits = LIMIT)]
    async fn call() -> Result<(), distlock::LockError> {
        Ok(())
    }
}

fn main() {}
