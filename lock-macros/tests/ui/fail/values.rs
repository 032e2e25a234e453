// Argument values the attribute refuses, and arguments that do not go together, at the
// offending token: a module per misuse, a function per message.

mod bad_on_lost {
    #[distlock::distributed_lock(key = "k", on_lost = "panic")]
    async fn bad() -> Result<(), distlock::LockError> {
        Ok(())
    }
}

mod fair_not_a_bool {
    #[distlock::distributed_lock(key = "k", fair = "true")]
    async fn string() -> Result<(), distlock::LockError> {
        Ok(())
    }

    #[distlock::distributed_lock(key = "k", fair = 1)]
    async fn number() -> Result<(), distlock::LockError> {
        Ok(())
    }

    const FAIR: bool = true;

    #[distlock::distributed_lock(key = "k", fair = FAIR)]
    async fn expression() -> Result<(), distlock::LockError> {
        Ok(())
    }
}

mod fair_with_read_permits_or_keys {
    #[distlock::distributed_lock(key = "doc:{id}", mode = "read", fair = true)]
    async fn read(id: u64) -> Result<(), distlock::LockError> {
        let _ = id;
        Ok(())
    }

    #[distlock::distributed_lock(key = "partner-api", permits = 5, fair = true)]
    async fn permits() -> Result<(), distlock::LockError> {
        Ok(())
    }

    #[distlock::distributed_lock(keys = ["acct:{from}", "acct:{to}"], fair = true)]
    async fn keys(from: u64, to: u64) -> Result<(), distlock::LockError> {
        let _ = (from, to);
        Ok(())
    }
}

mod mode_not_a_string {
    #[distlock::distributed_lock(key = "k", mode = read)]
    async fn bare() -> Result<(), distlock::LockError> {
        Ok(())
    }

    #[distlock::distributed_lock(key = "k", mode = 1)]
    async fn number() -> Result<(), distlock::LockError> {
        Ok(())
    }
}

mod permits_not_a_count {
    #[distlock::distributed_lock(key = "partner-api", permits = "5")]
    async fn call() -> Result<(), distlock::LockError> {
        Ok(())
    }

    #[distlock::distributed_lock(key = "partner-api", permits = 5000000000)]
    async fn too_many() -> Result<(), distlock::LockError> {
        Ok(())
    }
}

mod keys_misuse {
    #[distlock::distributed_lock(key = "acct:{from}", keys = ["acct:{from}", "acct:{to}"])]
    async fn both(from: u64, to: u64) -> Result<(), distlock::LockError> {
        let _ = (from, to);
        Ok(())
    }

    #[distlock::distributed_lock(keys = [])]
    async fn none() -> Result<(), distlock::LockError> {
        Ok(())
    }

    #[distlock::distributed_lock(keys = ["acct:{from}", 7, "acct:{from}"])]
    async fn odd(from: u64) -> Result<(), distlock::LockError> {
        let _ = from;
        Ok(())
    }

    #[distlock::distributed_lock(keys = "acct:{from}")]
    async fn not_an_array(from: u64) -> Result<(), distlock::LockError> {
        let _ = from;
        Ok(())
    }

    #[distlock::distributed_lock(keys = ["acct:{from}", "acct:{from}"])]
    async fn twice(from: u64) -> Result<(), distlock::LockError> {
        let _ = from;
        Ok(())
    }
}

mod keys_with_read_or_permits {
    #[distlock::distributed_lock(keys = ["a:{from}", "a:{to}"], mode = "read")]
    async fn read(from: u64, to: u64) -> Result<(), distlock::LockError> {
        let _ = (from, to);
        Ok(())
    }

    #[distlock::distributed_lock(keys = ["a:{from}", "a:{nope}"], permits = 2)]
    async fn permits(from: u64) -> Result<(), distlock::LockError> {
        let _ = from;
        Ok(())
    }
}

fn main() {}
