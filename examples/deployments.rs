//! The same locks on every deployment distlock supports: a Redis Cluster, a primary behind
//! Sentinel, and Redlock over independent masters. The example starts the deployment itself
//! (real `redis-server` processes on free loopback ports, with the tests' support code), runs
//! eight tasks that each add to a shared counter with a non-atomic read-modify-write under one
//! lock, then breaks the deployment the way production does and locks again:
//!
//!     cargo run --example deployments -- cluster    # 3 primaries + 3 replicas; a failover
//!     cargo run --example deployments -- sentinel   # primary, 2 replicas, 3 sentinels; primary killed
//!     cargo run --example deployments -- redlock    # 3 masters; one frozen, then one down
//!     cargo run --example deployments -- env        # whatever Config::from_env() names
//!
//! With `env`, set one of `DISTLOCK_CLUSTER_URLS`, `DISTLOCK_SENTINEL_URLS` (and
//! `DISTLOCK_SENTINEL_MASTER`), `DISTLOCK_REDLOCK_URLS` or `REDIS_URL` (see `Config::from_env`).

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{Client, Config, LockError};
use support::cluster::RedisCluster;
use support::masters::start_masters;
use support::sentinel::SentinelSetup;

const TASKS: u64 = 8;
const ROUNDS: u64 = 25;

/// Eight tasks add one to a counter `ROUNDS` times each, reading and writing it in two steps
/// with a pause between (so without the lock they would overwrite each other). Returns the
/// counter and whether every grant's fencing token was larger than the one before it.
async fn contend(client: &Client, key: &str) -> Result<(u64, bool), LockError> {
    let counter = Arc::new(AtomicU64::new(0));
    let last_token = Arc::new(AtomicU64::new(0));
    let increasing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (client, key) = (client.clone(), key.to_owned());
        let (counter, last_token, increasing) =
            (counter.clone(), last_token.clone(), increasing.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = client
                    .lock(&key)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await?;
                let token = guard.fencing_token().expect("fenced").get();
                if last_token.swap(token, Ordering::SeqCst) >= token {
                    increasing.store(false, Ordering::SeqCst);
                }
                let seen = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(seen + 1, Ordering::SeqCst);
                guard.release().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for task in tasks {
        task.await.expect("task panicked")?;
    }
    Ok((
        counter.load(Ordering::SeqCst),
        increasing.load(Ordering::SeqCst),
    ))
}

/// Locks until it works again (a failover takes a few seconds), then contends.
async fn after_the_fault(client: &Client, key: &str) -> Result<(), LockError> {
    let started = std::time::Instant::now();
    loop {
        match client
            .lock(key)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
        {
            Ok(guard) => {
                guard.release().await?;
                println!(
                    "  locking again after {:.1} s",
                    started.elapsed().as_secs_f64()
                );
                break;
            }
            Err(err) if started.elapsed() < Duration::from_secs(30) => {
                println!("  during the failover window: {err}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(err) => return Err(err),
        }
    }
    report(contend(client, key).await?);
    Ok(())
}

fn report((counter, increasing): (u64, bool)) {
    println!(
        "  counter {counter} of {} (no update lost: {}), fencing tokens strictly increasing: {increasing}",
        TASKS * ROUNDS,
        counter == TASKS * ROUNDS
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let deployment = std::env::args().nth(1).unwrap_or_default();
    let key = "account:7";
    match deployment.as_str() {
        "cluster" => {
            println!("starting a Redis Cluster (3 primaries, 3 replicas)…");
            let cluster = RedisCluster::start();
            let client = Client::new(Config::cluster(cluster.urls())?)?;
            report(contend(&client, key).await?);
            let primary = cluster.primary_for_key(&format!("distlock:{{{key}}}"));
            println!("failing over the primary of the lock's slot (node {primary})…");
            cluster.failover(primary);
            after_the_fault(&client, key).await?;
        }
        "sentinel" => {
            println!("starting a primary, 2 replicas and 3 sentinels…");
            let mut setup = SentinelSetup::start("mymaster");
            let client = Client::new(Config::sentinel(
                setup.sentinel_urls(),
                setup.master_name(),
            )?)?;
            report(contend(&client, key).await?);
            println!("killing the primary (SIGKILL); the sentinels promote a replica…");
            setup.kill_primary();
            after_the_fault(&client, key).await?;
        }
        "redlock" => {
            println!("starting 3 independent masters…");
            let mut masters = start_masters(3);
            let client = Client::new(Config::redlock(
                masters.iter().map(support::RedisServer::url),
            )?)?;
            let started = std::time::Instant::now();
            report(contend(&client, key).await?);
            let all_up = started.elapsed();
            println!(
                "  {} grants in {:.2} s",
                TASKS * ROUNDS,
                all_up.as_secs_f64()
            );
            // SIGSTOP: the master keeps its connections and takes requests, and answers none.
            println!("freezing one master: it takes requests and answers none…");
            masters[2].signal("STOP");
            let started = std::time::Instant::now();
            report(contend(&client, key).await?);
            let frozen = started.elapsed();
            println!(
                "  {} grants in {:.2} s ({:.1}× the time with all three up)",
                TASKS * ROUNDS,
                frozen.as_secs_f64(),
                frozen.as_secs_f64() / all_up.as_secs_f64()
            );
            masters[2].signal("CONT");
            println!("stopping one master: two of three are still a majority…");
            masters[0].stop();
            after_the_fault(&client, key).await?;
        }
        "env" => {
            let client = Client::new(Config::from_env()?)?;
            println!("{client:?}");
            report(contend(&client, key).await?);
        }
        _ => {
            eprintln!("usage: cargo run --example deployments -- cluster|sentinel|redlock|env");
            std::process::exit(2);
        }
    }
    Ok(())
}
