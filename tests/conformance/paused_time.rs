//! Tests that pause tokio's clock (`start_paused = true`), as users' own tests do.
//!
//! The in-process store (`Config::in_memory()`) keeps tokio's time: advancing the paused clock
//! past a lease frees a lock that nobody renews and reports it lost to its holder, while the
//! watchdog, ticking on the same clock, keeps a renewed lease through hours of virtual time;
//! `wait` ends at its virtual deadline.
//!
//! The Redis stores keep real time, as Redis does: advancing the clock neither expires nor
//! renews their leases, and requests to Redis work under the paused clock (their timeouts run
//! on the real clock, so auto-advance does not fire them at once).

use std::time::{Duration, Instant};

use crate::support;
use crate::support::RedisServer;
use distlock::{Client, Config, LockError, LockGuard};

fn in_memory() -> Client {
    Client::new(Config::in_memory()).expect("client")
}

/// Whether `guard.lost()` has completed, without letting the paused clock move.
async fn reported_lost(guard: &LockGuard) -> bool {
    tokio::select! {
        biased;
        () = guard.lost() => true,
        () = std::future::ready(()) => false,
    }
}

async fn try_once(client: &Client, key: &str) -> Result<LockGuard, LockError> {
    client.lock(key).wait(Duration::ZERO).acquire().await
}

#[tokio::test(start_paused = true)]
async fn in_memory_advancing_past_the_lease_frees_a_lock_nobody_renews() {
    let client = in_memory();
    let lease = Duration::from_secs(30);
    let holder = client
        .lock("paused:advance")
        .lease(lease)
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    let err = try_once(&client, "paused:advance")
        .await
        .expect_err("held for its lease");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");

    tokio::time::advance(lease - Duration::from_secs(1)).await;
    assert!(holder.is_held(), "a second before its lease runs out");
    assert!(!reported_lost(&holder).await);

    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(
        !holder.is_held(),
        "the lease ran out on the paused clock, which the in-process store keeps"
    );
    assert!(reported_lost(&holder).await, "lost() did not complete");
    let next = try_once(&client, "paused:advance")
        .await
        .expect("the store freed the lock once the paused clock passed its lease");
    assert!(next.fencing_token() > holder.fencing_token());
    assert!(
        !holder.release().await.expect("release"),
        "the expired holder's release must not free the next holder's lock"
    );
    assert!(next.is_held());
}

#[tokio::test(start_paused = true)]
async fn in_memory_sleeping_past_the_lease_frees_a_lock_nobody_renews() {
    let client = in_memory();
    let holder = client
        .lock("paused:sleep")
        .lease(Duration::from_secs(10))
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    let started = tokio::time::Instant::now();
    // Auto-advance: the runtime jumps to the lease's end (the watchdog's timer on this
    // runtime), where the loss is reported.
    holder.lost().await;
    let lost_after = started.elapsed();
    assert!(
        (Duration::from_secs(9)..=Duration::from_secs(10)).contains(&lost_after),
        "lost after {lost_after:?} of virtual time, for a 10 s lease"
    );
    // The holder gives up a little early (its deadline keeps a margin for clock drift); the
    // store frees the lock at the lease's end.
    let _next = client
        .lock("paused:sleep")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("free once the lease ran out");
    let free_after = started.elapsed();
    assert!(
        (Duration::from_secs(10)..Duration::from_secs(11)).contains(&free_after),
        "free after {free_after:?} of virtual time, for a 10 s lease"
    );
}

#[tokio::test(start_paused = true)]
async fn in_memory_a_renewed_lease_survives_hours_of_virtual_time() {
    let client = in_memory();
    let lease = Duration::from_secs(10);
    let renewed = client
        .lock("paused:renewed")
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");
    let hard = client
        .lock("paused:hard")
        .lease(lease)
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    let real = Instant::now();
    tokio::select! {
        biased;
        () = renewed.lost() => panic!("a renewed lease was lost under paused time"),
        () = tokio::time::sleep(Duration::from_secs(2 * 3600)) => {}
    }
    assert!(
        real.elapsed() < Duration::from_secs(30),
        "two virtual hours took {:?} of real time",
        real.elapsed()
    );
    assert!(!hard.is_held(), "two hours passed on the store's clock");
    assert!(renewed.is_held(), "the watchdog renews on the paused clock");
    let err = try_once(&client, "paused:renewed")
        .await
        .expect_err("still held after two hours");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert!(renewed.release().await.expect("release"));
    let _next = try_once(&client, "paused:renewed")
        .await
        .expect("free after its release");
}

/// `tokio::time::advance` in steps keeps a renewed lease, as `sleep` does: the watchdog runs
/// between the steps. One jump past the lease is different: no task runs during it, as in a
/// process frozen that long, and the lease is lost — what a real clock does too, and what a
/// test of a frozen holder needs (README, "Paused time").
#[tokio::test(start_paused = true)]
async fn in_memory_advance_in_steps_keeps_a_renewed_lease_and_one_jump_past_it_loses_it() {
    let client = in_memory();
    let lease = Duration::from_secs(30);
    let renewed = client
        .lock("paused:steps")
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");
    // A hundred seconds in steps of a sixth of the lease (the watchdog renews at a third).
    for _ in 0..20 {
        tokio::time::advance(lease / 6).await;
    }
    assert!(renewed.is_held(), "advanced in steps, the watchdog renews");
    assert!(!reported_lost(&renewed).await);
    let err = try_once(&client, "paused:steps")
        .await
        .expect_err("still held");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");

    tokio::time::advance(lease + Duration::from_secs(1)).await;
    assert!(!renewed.is_held(), "one jump past the lease is a pause");
    let next = try_once(&client, "paused:steps")
        .await
        .expect("free after the jump");
    assert!(next.fencing_token() > renewed.fencing_token());
}

#[tokio::test(start_paused = true)]
async fn in_memory_max_hold_ends_a_renewed_lease_at_its_virtual_time() {
    let client = in_memory();
    let started = tokio::time::Instant::now();
    let guard = client
        .lock("paused:max_hold")
        .lease(Duration::from_secs(10))
        .max_hold(Duration::from_secs(60))
        .acquire()
        .await
        .expect("acquire");
    guard.lost().await;
    let held_for = started.elapsed();
    assert!(
        (Duration::from_secs(59)..=Duration::from_secs(60)).contains(&held_for),
        "given up after {held_for:?} of virtual time, for a max_hold of 60 s"
    );
    assert!(!guard.is_held());
}

#[tokio::test(start_paused = true)]
async fn in_memory_a_wait_ends_at_its_virtual_deadline_or_when_the_lease_runs_out() {
    let client = in_memory();
    // A renewed holder: the waiter gives up at its virtual deadline.
    let holder = client
        .lock("paused:wait")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire");
    let started = tokio::time::Instant::now();
    let err = client
        .lock("paused:wait")
        .wait(Duration::from_secs(60))
        .acquire()
        .await
        .expect_err("held for the whole wait");
    let LockError::Timeout { waited, .. } = err else {
        panic!("{err:?}");
    };
    let elapsed = started.elapsed();
    assert!(
        waited >= Duration::from_secs(60) && elapsed < Duration::from_secs(61),
        "gave up after {waited:?} ({elapsed:?} on the paused clock)"
    );
    drop(holder);

    // A holder nobody renews: the waiter gets the lock when its lease runs out.
    let hard = client
        .lock("paused:wait:hard")
        .lease(Duration::from_secs(20))
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    let started = tokio::time::Instant::now();
    let next = client
        .lock("paused:wait:hard")
        .wait(Duration::from_secs(60))
        .acquire()
        .await
        .expect("the lease runs out within the wait");
    let elapsed = started.elapsed();
    assert!(
        (Duration::from_secs(20)..Duration::from_secs(30)).contains(&elapsed),
        "got the lock after {elapsed:?} on the paused clock, for a 20 s lease"
    );
    assert!(next.fencing_token() > hard.fencing_token());
}

#[tokio::test(start_paused = true)]
async fn redis_requests_work_and_leases_keep_real_time_under_a_paused_clock() {
    let server = RedisServer::start();
    let client = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
    let lease = Duration::from_secs(2);
    let holder = client
        .lock("paused:redis")
        .lease(lease)
        .watchdog(false)
        .acquire()
        .await
        .expect("a request to Redis under a paused clock");
    // An hour on the paused clock is no time for Redis, which expires keys in real time.
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(holder.is_held(), "Redis leases keep real time");
    let err = try_once(&client, "paused:redis")
        .await
        .expect_err("Redis still holds the key");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert!(holder.release().await.expect("release"));
    let next = try_once(&client, "paused:redis")
        .await
        .expect("free after its release");

    // Two real leases pass with the runtime kept from auto-advancing (a blocking task holds
    // it back): the subject is real time, in which the watchdog renews and Redis expires.
    tokio::task::spawn_blocking(move || std::thread::sleep(lease * 2))
        .await
        .expect("sleeper");
    assert!(next.is_held(), "renewed by the watchdog on the real clock");
    assert!(next.release().await.expect("release"));
}

#[tokio::test(start_paused = true)]
async fn redlock_requests_work_under_a_paused_clock() {
    let masters = support::masters::start_masters(3);
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    // Generous for a loaded machine: a release needs two masters to answer within it.
    let config = Config::redlock(&urls)
        .expect("urls")
        .node_timeout(Duration::from_secs(1));
    let client = Client::new(config).expect("client");
    let guard = client
        .lock("paused:redlock")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .expect("a quorum under a paused clock");
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(guard.is_held(), "Redlock leases keep real time");
    assert!(guard.release().await.expect("release"));
}
