//! A fair lock serving print jobs in the order they were submitted: a job is printing, five
//! more queue up one after the other (they could be five processes), and each is granted the
//! printer in turn — not whichever retries first after a release, as with an unfair lock. The
//! attribute's `fair = true` does the same for an annotated fn.
//!
//! Runs against `REDIS_URL` (default `redis://127.0.0.1:6379`); if nothing answers there it
//! says so and runs on the in-process backend instead.
//!
//!     cargo run --example fair

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Client, Config, LockError};

const JOBS: usize = 5;

/// Prints one job while it holds the printer (the attribute form of `lock(..).fair()`).
#[distlock::distributed_lock(key = "printer:{printer}", fair = true, client = client, wait = "30s")]
async fn print(
    client: &Client,
    printer: &str,
    job: usize,
    printed: Arc<Mutex<Vec<usize>>>,
) -> Result<(), LockError> {
    println!("job {job}: printing");
    tokio::time::sleep(Duration::from_millis(50)).await;
    printed.lock().expect("not poisoned").push(job);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let client = connect().await?;
    // A job is printing while the others come in.
    let current = client.lock("printer:lobby").fair().acquire().await?;
    let printed = Arc::new(Mutex::new(Vec::new()));
    let mut jobs = Vec::new();
    for job in 0..JOBS {
        let (printer, printed) = (client.clone(), printed.clone());
        jobs.push(tokio::spawn(async move {
            print(&printer, "lobby", job, printed).await
        }));
        // Submitted one after the other: wait until this job stands in the queue.
        while client.inspect("printer:lobby").await?.queued < job as u64 + 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        println!("job {job}: queued");
    }
    current.release().await?;
    for job in jobs {
        job.await.expect("job")?;
    }
    let printed = printed.lock().expect("not poisoned").clone();
    println!("printed in the order submitted: {printed:?}");
    assert_eq!(printed, (0..JOBS).collect::<Vec<_>>());
    Ok(())
}

/// A client for `REDIS_URL`, or for the in-process backend if no Redis answers.
async fn connect() -> Result<Client, LockError> {
    let config = Config::from_env_or(distlock::DEFAULT_REDIS_URL)?
        .connect_timeout(Duration::from_millis(500));
    let client = Client::new(config.clone())?;
    match client
        .lock("fair-example:probe")
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
