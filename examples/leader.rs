//! Leader election: three "replicas" (tasks here; processes or machines in a service) campaign
//! to be the one that runs the scheduler. The leader publishes its address with its
//! leadership, works under its epoch (the fencing token that a fenced store checks), and
//! steps down after a while, as in a rolling deploy; the next replica takes over at once, with
//! a greater epoch. An observer prints every change of leader as it happens.
//!
//! ```sh
//! cargo run --example leader          # REDIS_URL, or redis://127.0.0.1:6379; else in-process
//! ```

use std::time::Duration;

use distlock::{Config, Election, LockError};

/// One replica: campaigns, leads for a while, resigns, and is done.
async fn replica(name: &'static str, election: Election) -> Result<(), LockError> {
    let leadership = election
        .value(format!("{name}.internal:8080"))
        .campaign()
        .await?;
    println!("{name}: leading with epoch {}", leadership.epoch());
    tokio::select! {
        () = lead(name, leadership.epoch()) => {}
        // Redis unreachable for longer than the lease, this process frozen, a forced unlock:
        // stop acting as the leader.
        () = leadership.lost() => {
            println!("{name}: lost the leadership");
            return Ok(());
        }
    }
    println!("{name}: stepping down");
    leadership.resign().await?;
    Ok(())
}

/// The leader's work: every write it makes carries its epoch (`distlock::fenced::set(conn,
/// key, value, epoch)` on Redis), so a deposed leader's late writes are refused.
async fn lead(name: &str, epoch: distlock::FencingToken) {
    for round in 1..=3 {
        println!("{name}: scheduling round {round} (epoch {epoch})");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let config = Config::from_env_or(distlock::DEFAULT_REDIS_URL)?;
    let client = distlock::Client::new(config.clone())?;
    match client.ping().await {
        Ok(()) => {
            println!(
                "electing on {}",
                std::env::var("REDIS_URL").unwrap_or_else(|_| distlock::DEFAULT_REDIS_URL.into())
            );
            distlock::init(config)?;
        }
        Err(err) => {
            println!("Redis did not answer ({err}); running on the in-process backend instead");
            distlock::init(Config::in_memory())?;
        }
    }
    let election = distlock::election("scheduler").lease(Duration::from_secs(10));

    // Who leads, as anyone (a dashboard, a client looking for the leader's address) sees it.
    let mut changes = election.observe();
    let observer = tokio::spawn(async move {
        while let Some(leader) = changes.next().await {
            let address = leader
                .value()
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            println!(
                "observer: the leader is now {address} (epoch {}, pid {:?})",
                leader.epoch(),
                leader.holder().pid
            );
        }
    });

    let replicas: Vec<_> = ["replica-a", "replica-b", "replica-c"]
        .into_iter()
        .map(|name| tokio::spawn(replica(name, election.clone())))
        .collect();
    for replica in replicas {
        replica.await.expect("replica task")?;
    }
    observer.abort();
    println!("every replica led once, one at a time, each with a greater epoch");
    distlock::shutdown().await?;
    Ok(())
}
