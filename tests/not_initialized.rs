//! Using the global client before `init` is a clear error, and `init` works once only; an
//! annotated fn with `client = …` needs no `init`. (Its own test binary: the global client is
//! per process.)

use distlock::{distributed_lock, Client, Config, LockError};

#[distributed_lock(key = "global")]
async fn through_the_global_client() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "explicit:{id}", client = locks)]
async fn through(locks: &Client, id: u32) -> Result<String, LockError> {
    Ok(distlock::current().expect("locked").key().to_owned())
}

#[tokio::test]
async fn a_lock_before_init_says_what_to_call_and_init_works_once() {
    let err = distlock::lock("early")
        .acquire()
        .await
        .expect_err("no init yet");
    assert!(matches!(err, LockError::NotInitialized), "{err:?}");
    assert!(err.to_string().contains("distlock::init("), "{err}");
    let err = through_the_global_client()
        .await
        .expect_err("the attribute's global client needs init too");
    assert!(matches!(err, LockError::NotInitialized), "{err:?}");
    let locks = Client::new(Config::in_memory()).expect("client");
    assert_eq!(
        through(&locks, 1).await.expect("no init needed"),
        "explicit:1"
    );

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
