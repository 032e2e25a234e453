//! The global client keeps working when used from several tokio runtimes one after another:
//! every `#[tokio::test]` below builds its own runtime, and one test builds and drops runtimes
//! in a loop. A connection driver tied to the first runtime would fail all later ones. Every
//! test sets the client up the way the README's "Testing your code" says, with
//! `distlock::try_init`, against one real `redis-server` for the binary; one test pauses its
//! clock.

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use distlock::LockError;
use support::RedisServer;

/// One server for the whole test binary (it dies with the process), and the documented first
/// line of every test: `try_init`, whichever test runs first.
fn init_once() {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    let server = SERVER.get_or_init(RedisServer::start);
    distlock::try_init(distlock::Config::from_url(&server.url()).expect("url")).expect("try_init");
}

async fn take_and_release(key: &str) {
    let guard = distlock::lock(key)
        .lease(Duration::from_secs(5))
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("acquire through the global client");
    assert_eq!(guard.key(), key);
    assert!(guard.release().await.expect("release"));
}

#[tokio::test]
async fn the_global_client_works_in_a_first_test_runtime() {
    init_once();
    take_and_release("global:first").await;
}

#[tokio::test]
async fn the_global_client_works_in_a_second_test_runtime() {
    init_once();
    take_and_release("global:second").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_client_works_in_a_multi_threaded_test_runtime() {
    init_once();
    take_and_release("global:third").await;
}

#[test]
fn runtimes_created_and_dropped_in_a_loop_keep_the_global_client_working() {
    init_once();
    let mut last_token = None;
    for round in 0..8 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let token = runtime.block_on(async {
            let guard = distlock::lock("global:loop")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .unwrap_or_else(|err| panic!("round {round}: {err}"));
            let token = guard.fencing_token().expect("fenced");
            if round % 2 == 0 {
                assert!(guard.release().await.expect("release"));
            }
            // Odd rounds drop the guard unreleased, inside a runtime that dies right after:
            // its release must still happen, and the next round must get the lock.
            token
        });
        drop(runtime);
        assert!(last_token < Some(token), "round {round}");
        last_token = Some(token);
    }
}

fn multi_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A multi-thread runtime that asks for a connection gets its driver on itself (no hop to the
/// client's thread per request); when that runtime is dropped, the watchdog, which runs on the
/// client's own runtime, must still renew: its next request finds the connection broken and is
/// sent again on a new one.
#[test]
fn a_lease_taken_in_a_multi_thread_runtime_is_renewed_after_that_runtime_is_gone() {
    init_once();
    let lease = Duration::from_millis(300);
    for round in 0..4 {
        let first = multi_thread_runtime();
        let guard = first.block_on(async {
            distlock::lock(format!("global:outlives:{round}"))
                .lease(lease)
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .unwrap_or_else(|err| panic!("round {round}: {err}"))
        });
        drop(first);
        // Four leases: the subject is time passing with nobody but the watchdog at work.
        std::thread::sleep(lease * 4);
        assert!(
            guard.is_held(),
            "round {round}: the lease was lost once the runtime that connected was gone"
        );
        let second = multi_thread_runtime();
        second.block_on(async {
            assert!(guard.release().await.expect("release"), "round {round}");
        });
    }
}

/// A test that pauses its clock uses the global Redis client like any other: requests keep
/// their timeouts on the real clock, leases keep Redis's real time, `wait` keeps the test's.
#[tokio::test(start_paused = true)]
async fn a_paused_test_uses_the_global_redis_client() {
    init_once();
    let holder = distlock::lock("global:paused")
        .lease(Duration::from_secs(5))
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire under a paused clock");
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(holder.is_held(), "Redis keeps real time");
    let real = std::time::Instant::now();
    let started = tokio::time::Instant::now();
    let err = distlock::lock("global:paused")
        .wait(Duration::from_secs(60))
        .acquire()
        .await
        .expect_err("held for the whole (virtual) wait");
    let LockError::Timeout { waited, .. } = err else {
        panic!("{err:?}");
    };
    assert!(
        waited >= Duration::from_secs(60) && started.elapsed() < Duration::from_secs(61),
        "gave up after {waited:?} on the paused clock"
    );
    assert!(
        real.elapsed() < Duration::from_secs(5),
        "a virtual minute of waiting took {:?} of real time",
        real.elapsed()
    );
    assert!(holder.release().await.expect("release"));
}
