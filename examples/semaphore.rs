//! A semaphore capping concurrent calls to a rate-limited API: ten tasks (they could be ten
//! processes) each call a partner API that allows three calls at once; every call takes one
//! of the semaphore's three permits first, so never more than three are in flight.
//!
//! Runs against `REDIS_URL` (default `redis://127.0.0.1:6379`); if nothing answers there it
//! says so and runs on the in-process backend instead.
//!
//!     cargo run --example semaphore

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{Client, Config, LockError};

const PERMITS: u32 = 3;
const TASKS: usize = 10;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let client = connect().await?;
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (client, in_flight, most) = (client.clone(), in_flight.clone(), most.clone());
            tokio::spawn(async move {
                let permit = client
                    .semaphore("partner-api", PERMITS)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await?;
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                println!("task {task}: calling the API ({now} of {PERMITS} permits in use)");
                tokio::time::sleep(Duration::from_millis(100)).await; // the API call
                in_flight.fetch_sub(1, Ordering::SeqCst);
                permit.release().await?;
                Ok::<(), LockError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task")?;
    }
    println!(
        "at most {} calls were in flight at once (permits: {PERMITS})",
        most.load(Ordering::SeqCst)
    );
    Ok(())
}

/// A client for `REDIS_URL`, or for the in-process backend if no Redis answers.
async fn connect() -> Result<Client, LockError> {
    let config = Config::from_env_or(distlock::DEFAULT_REDIS_URL)?
        .connect_timeout(Duration::from_millis(500));
    let client = Client::new(config.clone())?;
    match client
        .lock("semaphore-example:probe")
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
            println!("no Redis answers ({err}); using the in-process backend");
            Client::new(Config::in_memory())
        }
        Err(err) => Err(err),
    }
}
