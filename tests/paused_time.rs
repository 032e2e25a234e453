//! Leases keep real time when the caller pauses tokio's clock (`start_paused = true`, as users'
//! tests do): Redis and the in-process store expire keys in real time, so the guard's view of
//! its lease must too — one clock for lease bookkeeping.
//!
//! On the in-process store only: requests to Redis still time out on the caller's clock (the
//! `redis` crate's response timeout runs there), so under paused time they fail before any
//! lease exists. Running requests on real time is the operability issue's part.

use std::time::{Duration, Instant};

use distlock::{Client, Config};

fn in_memory() -> Client {
    Client::new(Config::in_memory()).expect("client")
}

async fn a_renewed_lease_is_kept_while_virtual_time_races_ahead(client: Client) {
    let guard = client
        .lock("paused:renewed")
        .lease(Duration::from_millis(100))
        .acquire()
        .await
        .expect("acquire");
    // An hour passes on the caller's paused clock in no real time at all.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(
        guard.is_held(),
        "the lease follows the real clock, not the caller's paused one"
    );
    tokio::select! {
        biased;
        () = guard.lost() => panic!("a renewed lease was reported lost under paused time"),
        () = tokio::time::sleep(Duration::from_secs(60)) => {}
    }
    assert!(guard.release().await.expect("release"));
}

async fn a_hard_lease_is_lost_when_its_real_time_is_up(client: Client) {
    let lease = Duration::from_millis(200);
    let started = Instant::now();
    let guard = client
        .lock("paused:hard")
        .lease(lease)
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    guard.lost().await;
    let elapsed = started.elapsed();
    // The deadline keeps 1% + 2 ms for drift; allow the same again for the watchdog's timer.
    assert!(
        elapsed >= lease - Duration::from_millis(10),
        "lost after {elapsed:?} of real time: the store still held the key"
    );
    assert!(!guard.is_held());
}

#[tokio::test(start_paused = true)]
async fn in_memory_a_renewed_lease_is_kept_while_virtual_time_races_ahead() {
    a_renewed_lease_is_kept_while_virtual_time_races_ahead(in_memory()).await;
}

#[tokio::test(start_paused = true)]
async fn in_memory_a_hard_lease_is_lost_when_its_real_time_is_up() {
    a_hard_lease_is_lost_when_its_real_time_is_up(in_memory()).await;
}
