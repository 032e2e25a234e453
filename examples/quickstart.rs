//! The programmatic API in one page: several workers decrement one stock counter, first
//! without a lock (updates get lost), then under a distlock lock (none do), and the fencing
//! tokens each grant carried.
//!
//! Runs against `REDIS_URL` (default `redis://127.0.0.1:6379`); if nothing answers there it
//! says so and runs on the in-process backend instead.
//!
//!     cargo run --example quickstart

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{Client, Config, LockError};

const WORKERS: usize = 8;
const ORDERS_PER_WORKER: i64 = 25;
const INITIAL_STOCK: i64 = 1_000;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let client = connect().await?;

    let unlocked = run(&client, false).await?;
    let locked = run(&client, true).await?;
    let expected = INITIAL_STOCK - WORKERS as i64 * ORDERS_PER_WORKER;
    println!("expected final stock: {expected}");
    println!(
        "without the lock:     {unlocked}  ({} updates lost)",
        unlocked - expected
    );
    println!(
        "with distlock:        {locked}  ({} updates lost)",
        locked - expected
    );

    let guard = client.lock("stock:sku-1").acquire().await?;
    println!(
        "a grant of `{}` carries fencing token {}: hand it to the store you protect",
        guard.key(),
        guard.fencing_token().expect("fenced")
    );
    guard.release().await?;
    Ok(())
}

/// A client for `REDIS_URL`, or for the in-process backend if no Redis answers.
async fn connect() -> Result<Client, LockError> {
    let config = Config::from_env_or(distlock::DEFAULT_REDIS_URL)?
        .connect_timeout(Duration::from_millis(500));
    let client = Client::new(config.clone())?;
    match client
        .lock("quickstart:probe")
        .wait(Duration::ZERO)
        .acquire()
        .await
    {
        Ok(guard) => {
            guard.release().await?;
            println!("using Redis ({config:?})");
            Ok(client)
        }
        Err(LockError::Backend(err)) => {
            println!("no Redis answered ({err});");
            println!("running on the in-process backend instead\n");
            Client::new(Config::in_memory())
        }
        Err(other) => Err(other),
    }
}

/// Every worker sells `ORDERS_PER_WORKER` items with a read-modify-write of the stock.
async fn run(client: &Client, with_lock: bool) -> Result<i64, LockError> {
    let stock = Arc::new(AtomicI64::new(INITIAL_STOCK));
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (client, stock) = (client.clone(), stock.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..ORDERS_PER_WORKER {
                let guard = if with_lock {
                    Some(client.lock("stock:sku-1").acquire().await?)
                } else {
                    None
                };
                let read = stock.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(300)).await; // "talk to the database"
                stock.store(read - 1, Ordering::SeqCst);
                if let Some(guard) = guard {
                    guard.release().await?;
                }
            }
            Ok::<(), LockError>(())
        }));
    }
    for worker in workers {
        worker.await.expect("worker panicked")?;
    }
    Ok(stock.load(Ordering::SeqCst))
}
