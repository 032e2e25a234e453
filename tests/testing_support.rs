//! What the README's "Testing your code" promises, with the in-process store: every test of a
//! binary calls `distlock::try_init` and gets a working global client, whichever test runs
//! first and whatever runtime each runs on (every `#[tokio::test]` builds its own), paused
//! clocks included. (The same with a real `redis-server`: `tests/global_client.rs`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use distlock::{distributed_lock, Config, LockError};

/// How many `try_init` calls set the global client up: one, whichever test came first.
static SET_UP: AtomicUsize = AtomicUsize::new(0);

/// Held around a `try_init` and its count, so that no test reads the count between another
/// test's `try_init` that set the client up and that test's increment (seen once: 0).
static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The documented first line of every test.
fn set_up() {
    let _counting = COUNTING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if distlock::try_init(Config::in_memory()).expect("try_init") {
        SET_UP.fetch_add(1, Ordering::SeqCst);
    }
    assert_eq!(SET_UP.load(Ordering::SeqCst), 1, "set up exactly once");
}

async fn take_and_release(key: &str) {
    let guard = distlock::lock(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("acquire through the global client");
    assert_eq!(guard.key(), key);
    assert!(guard.release().await.expect("release"));
}

#[tokio::test]
async fn a_first_test_gets_a_working_global_client() {
    set_up();
    take_and_release("testing:first").await;
}

#[tokio::test]
async fn a_second_test_gets_a_working_global_client() {
    set_up();
    take_and_release("testing:second").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_threaded_test_gets_a_working_global_client() {
    set_up();
    take_and_release("testing:multi").await;
    // A renewed lease there too (the watchdog of the client's own runtime renews it).
    let guard = distlock::lock("testing:multi:renewed")
        .lease(Duration::from_millis(60))
        .acquire()
        .await
        .expect("acquire");
    // The subject is time passing with nobody but the watchdog at work.
    tokio::select! {
        () = guard.lost() => panic!("a renewed lease was lost"),
        () = tokio::time::sleep(Duration::from_millis(300)) => {}
    }
    assert!(guard.is_held(), "renewed past five leases");
    assert!(guard.release().await.expect("release"));
}

#[test]
fn tests_that_build_their_own_runtimes_one_after_another_share_the_global_client() {
    set_up();
    for round in 0..4 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(round % 2 == 1)
            .build()
            .expect("runtime");
        runtime.block_on(take_and_release("testing:rounds"));
    }
}

#[tokio::test]
async fn init_after_try_init_says_to_use_try_init_and_other_settings_are_refused() {
    set_up();
    let err = distlock::init(Config::in_memory()).expect_err("set up already");
    assert!(err.to_string().contains("try_init"), "{err}");
    let err = distlock::try_init(Config::in_memory().default_lease(Duration::from_secs(99)))
        .expect_err("other settings than the global client's");
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("other settings"), "{err}");
    let err = distlock::try_init(Config::in_memory().default_lease(Duration::ZERO))
        .expect_err("an unusable config is refused, set up or not");
    assert!(err.to_string().contains("default_lease"), "{err}");
    // The global client is still the first one.
    take_and_release("testing:still").await;
}

#[tokio::test(start_paused = true)]
async fn a_paused_test_moves_the_global_in_process_store_with_its_clock() {
    set_up();
    let holder = distlock::lock("testing:paused")
        .lease(Duration::from_secs(30))
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    tokio::time::advance(Duration::from_secs(31)).await;
    assert!(!holder.is_held());
    let next = distlock::lock("testing:paused")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("free once the paused clock passed the lease");
    // A guard dropped unreleased frees the lock before the next line, paused clock or not.
    drop(next);
    let again = distlock::lock("testing:paused")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("a dropped guard's lock is free at once");
    assert!(again.release().await.expect("release"));
}

#[distributed_lock(key = "testing:job:{id}", lease = "10s", watchdog = false)]
async fn job_with_a_hard_lease(id: u32, takes: Duration) -> Result<u32, LockError> {
    tokio::time::sleep(takes).await;
    Ok(id)
}

#[distributed_lock(key = "testing:job:{id}", lease = "10s")]
async fn job_renewed(id: u32, takes: Duration) -> Result<u32, LockError> {
    tokio::time::sleep(takes).await;
    Ok(id)
}

#[tokio::test(start_paused = true)]
async fn an_annotated_fn_under_a_paused_clock_is_aborted_past_a_hard_lease_and_kept_when_renewed() {
    set_up();
    assert_eq!(
        job_with_a_hard_lease(1, Duration::from_secs(5))
            .await
            .expect("within its lease"),
        1
    );
    let err = job_with_a_hard_lease(2, Duration::from_secs(3600))
        .await
        .expect_err("a virtual hour is past a 10 s lease");
    assert!(matches!(err, LockError::LeaseLost { .. }), "{err:?}");
    assert_eq!(
        job_renewed(3, Duration::from_secs(3600))
            .await
            .expect("renewed through a virtual hour"),
        3
    );
}
