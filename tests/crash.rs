//! A holder process killed with SIGKILL while it holds a lock (no release, no renewal, its
//! connection gone) leaves the lock free again within its lease.
//!
//! A custom harness (`harness = false`): the binary runs the scenario, and re-executes itself
//! with `DISTLOCK_CRASH_HOLDER` set to play the holder process.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use distlock::{Client, Config};
use support::RedisServer;

const HOLDER_ENV: &str = "DISTLOCK_CRASH_HOLDER";
const LEASE: Duration = Duration::from_millis(1000);

fn main() {
    if let Ok(url) = std::env::var(HOLDER_ENV) {
        hold_until_killed(&url);
        return;
    }
    let name = "a_crashed_holder_frees_the_lock_within_its_lease";
    print!("test {name} ... ");
    a_crashed_holder_frees_the_lock_within_its_lease();
    println!("ok");
    println!("\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n");
}

/// The holder: takes the lock (watchdog on), reports its token, and works until killed.
fn hold_until_killed(url: &str) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = Client::new(Config::from_url(url).expect("url")).expect("client");
        let guard = client
            .lock("crash")
            .lease(LEASE)
            .acquire()
            .await
            .expect("acquire");
        println!("acquired {}", guard.fencing_token());
        std::future::pending::<()>().await;
    });
}

fn a_crashed_holder_frees_the_lock_within_its_lease() {
    let server = RedisServer::start();
    let mut holder = Command::new(std::env::current_exe().expect("own path"))
        .env(HOLDER_ENV, server.url())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder process");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the holder's report");
    let held_token: u64 = line
        .trim()
        .strip_prefix("acquired ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("holder said {line:?}"));

    // Let the holder's watchdog renew at least once, so the lock is not simply expiring.
    std::thread::sleep(LEASE);
    let killed_at = Instant::now();
    holder.kill().expect("SIGKILL the holder");
    holder.wait().expect("reap the holder");

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
        let guard = client
            .lock("crash")
            .wait(LEASE * 5)
            .acquire()
            .await
            .expect("the lock is free again after the holder died");
        let freed_after = killed_at.elapsed();
        assert!(
            freed_after <= LEASE + Duration::from_millis(400),
            "freed {freed_after:?} after the kill; lease {LEASE:?}"
        );
        assert!(guard.fencing_token().get() > held_token);
        assert!(guard.release().await.expect("release"));
    });
}
