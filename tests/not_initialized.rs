//! Using the global client before `init` is a clear error, and `init` works once only.
//! (Its own test binary: the global client is per process.)

use distlock::{Config, LockError};

#[tokio::test]
async fn a_lock_before_init_says_what_to_call_and_init_works_once() {
    let err = distlock::lock("early")
        .acquire()
        .await
        .expect_err("no init yet");
    assert!(matches!(err, LockError::NotInitialized), "{err:?}");
    assert!(err.to_string().contains("distlock::init("), "{err}");

    distlock::init(Config::in_memory()).expect("first init");
    let again = distlock::init(Config::in_memory()).expect_err("second init");
    assert!(matches!(again, LockError::Config(_)), "{again:?}");
    assert!(again.to_string().contains("already called"), "{again}");

    let guard = distlock::lock("after-init")
        .acquire()
        .await
        .expect("works now");
    assert!(guard.release().await.expect("release"));
}
