//! Run-once jobs: four "replicas" (tasks here; processes or machines in a service) each run the
//! same job every second. With `on_busy = "skip"` a replica that finds the job running
//! elsewhere skips it instead of waiting, and `hold_at_least` keeps a run that ends quickly
//! from being repeated by a replica whose timer fires a little later — so the job runs once
//! per second, whichever replica gets it. The job writes with its fencing token, so a replica
//! that stalled past its lease could not overwrite a later run's result.
//!
//! ```sh
//! cargo run --example cron            # REDIS_URL, or redis://127.0.0.1:6379; else in-process
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{distributed_lock, Config, LockError};

/// One replica of the service.
struct Replica {
    name: &'static str,
    runs: AtomicUsize,
}

impl Replica {
    /// The job: whichever replica takes the lock runs it; the others skip this round.
    #[distributed_lock(
        key = "job:send-digest",
        lease = "30s",
        on_busy = "skip",
        hold_at_least = "900ms"
    )]
    async fn send_digest(&self) -> Result<(), LockError> {
        let token = distlock::fencing_token()?; // for fenced writes (`distlock::fenced`)
        self.runs.fetch_add(1, Ordering::SeqCst);
        println!(
            "{}: sending the digest (fencing token {})",
            self.name,
            token.get()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let config = Config::from_env_or(distlock::DEFAULT_REDIS_URL)?;
    let client = distlock::Client::new(config.clone())?;
    match client.ping().await {
        Ok(()) => {
            println!(
                "locking on {}",
                std::env::var("REDIS_URL").unwrap_or_else(|_| distlock::DEFAULT_REDIS_URL.into())
            );
            distlock::init(config)?;
        }
        Err(err) => {
            println!("Redis did not answer ({err}); running on the in-process backend instead");
            distlock::init(Config::in_memory())?;
        }
    }
    let replicas: Vec<Arc<Replica>> = ["replica-a", "replica-b", "replica-c", "replica-d"]
        .into_iter()
        .map(|name| {
            Arc::new(Replica {
                name,
                runs: AtomicUsize::new(0),
            })
        })
        .collect();
    let seconds = 5;
    let tasks: Vec<_> = replicas
        .iter()
        .enumerate()
        .map(|(i, replica)| {
            let replica = replica.clone();
            tokio::spawn(async move {
                // Timers a little apart, as on different machines.
                tokio::time::sleep(Duration::from_millis(30 * i as u64)).await;
                let mut every = tokio::time::interval(Duration::from_secs(1));
                for _ in 0..seconds {
                    every.tick().await;
                    replica.send_digest().await?;
                }
                Ok::<_, LockError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("replica task")?;
    }
    let total: usize = replicas.iter().map(|r| r.runs.load(Ordering::SeqCst)).sum();
    println!(
        "\n{} replicas, {seconds} ticks each: the digest went out {total} times (once per tick), \
         the other {} calls were skipped",
        replicas.len(),
        replicas.len() * seconds - total
    );
    distlock::shutdown().await?;
    Ok(())
}
