// Durations the attribute refuses, at the offending token: a module per misuse, a function
// per message.

mod bad_duration {
    #[distlock::distributed_lock(key = "k", lease = "15 seconds")]
    async fn bad_lease() -> Result<(), distlock::LockError> {
        Ok(())
    }

    #[distlock::distributed_lock(key = "k", wait = "5")]
    async fn bad_wait() -> Result<(), distlock::LockError> {
        Ok(())
    }
}

mod bad_max_hold {
    #[distlock::distributed_lock(key = "k", max_hold = "five minutes")]
    async fn words() -> Result<(), distlock::LockError> {
        Ok(())
    }

    #[distlock::distributed_lock(key = "k", max_hold = 300)]
    async fn number() -> Result<(), distlock::LockError> {
        Ok(())
    }

    #[distlock::distributed_lock(key = "k", max_hold = "5m", max_hold = "6m")]
    async fn twice() -> Result<(), distlock::LockError> {
        Ok(())
    }
}

mod duration_number_without_unit {
    #[distlock::distributed_lock(key = "k", lease = 15, max_hold = 2.5)]
    async fn seconds_meant() -> Result<(), distlock::LockError> {
        Ok(())
    }
}

mod max_hold_shorter_than_lease {
    #[distlock::distributed_lock(key = "k", lease = "30s", max_hold = "10s")]
    async fn shorter() -> Result<(), distlock::LockError> {
        Ok(())
    }

    #[distlock::distributed_lock(key = "k", lease = "1s", max_hold = "0s")]
    async fn zero() -> Result<(), distlock::LockError> {
        Ok(())
    }
}

mod hold_at_least_longer_than_max_hold {
    // A lock cannot be held at least longer than it may be held at most.
    use distlock::{distributed_lock, LockError};

    #[distributed_lock(key = "job", max_hold = "1m", hold_at_least = "2m")]
    async fn job() -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {}
