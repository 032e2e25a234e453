// `client = <expr>` in every shape that reaches a `Client` (a field, a reference, an `Arc`, a
// static, a method call), and duration arguments as consts, fields and calls.
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use distlock::{distributed_lock, Client, Config, LockError};

const LEASE: Duration = Duration::from_secs(15);
static LOCKS: LazyLock<Client> = LazyLock::new(|| Client::new(Config::in_memory()).unwrap());

struct Service {
    locks: Client,
    wait: Duration,
}

struct Borrowing<'a> {
    locks: &'a Client,
}

struct Shared {
    locks: Arc<Client>,
}

fn max_hold() -> Duration {
    Duration::from_secs(60)
}

impl Service {
    fn locks(&self) -> &Client {
        &self.locks
    }

    #[distributed_lock(key = "a:{id}", client = self.locks, lease = LEASE, wait = self.wait)]
    async fn field(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[distributed_lock(key = "b:{id}", client = self.locks(), max_hold = max_hold())]
    async fn method(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    // The body moves `self`: the client was taken from it before.
    #[distributed_lock(key = "c", client = self.locks, lease = Duration::from_millis(500))]
    async fn by_value(self) -> Result<Service, LockError> {
        Ok(self)
    }
}

impl Borrowing<'_> {
    #[distributed_lock(key = "d", client = self.locks, mode = "read")]
    async fn reference(&self) -> Result<(), LockError> {
        Ok(())
    }
}

impl Shared {
    #[distributed_lock(key = "e", client = self.locks, lease = "5s", max_hold = max_hold())]
    async fn arc(self: Arc<Self>) -> Result<Arc<Self>, LockError> {
        Ok(self)
    }
}

#[distributed_lock(key = "f:{id}", client = &LOCKS, wait = Duration::ZERO)]
async fn static_client(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "g", client = locks)]
async fn parameter(locks: &Client) -> Result<(), LockError> {
    Ok(())
}

#[async_trait::async_trait]
trait Job {
    async fn run(self: Arc<Self>, id: u64) -> Result<u64, LockError>;
}

#[async_trait::async_trait]
impl Job for Shared {
    #[distributed_lock(key = "job:{id}", client = self.locks, lease = LEASE)]
    async fn run(self: Arc<Self>, id: u64) -> Result<u64, LockError> {
        let moved = self;
        Ok(id + moved.locks.lock("x").acquire().await.is_ok() as u64)
    }
}
