//! Graceful shutdown: `Client::shutdown().await` gives back every lock the client holds (so
//! the next holders need not wait out 30-second leases), tells each holder its lease is gone,
//! and refuses new requests — on a real `redis-server` and in-process.

use std::time::Duration;

use crate::support;
use crate::support::RedisServer;
use distlock::{Client, Config, LockError};

async fn gives_back_every_lock_and_refuses_new_requests(config: impl Fn() -> Config) {
    let client = Client::new(config()).expect("client");
    let other = Client::new(config()).expect("client");
    let lease = Duration::from_secs(30);
    let writer = client
        .lock("shut:w")
        .lease(lease)
        .acquire()
        .await
        .expect("free");
    let reader = client
        .read_lock("shut:r")
        .lease(lease)
        .acquire()
        .await
        .expect("free");
    let (granted, grant) = tokio::sync::oneshot::channel();
    let told = tokio::spawn({
        let client = client.clone();
        async move {
            // A holder in another task learns of it like of a lost lease.
            let guard = client.lock("shut:task").lease(lease).acquire().await?;
            let _ = granted.send(());
            guard.lost().await;
            Ok::<_, LockError>(guard.is_held())
        }
    });
    grant.await.expect("the task's grant");

    assert_eq!(client.shutdown().await.expect("shutdown"), 3);
    assert!(!writer.is_held());
    assert!(!reader.is_held());
    let held = tokio::time::timeout(Duration::from_secs(5), told)
        .await
        .expect("the holder is told at once")
        .expect("join")
        .expect("granted before the shutdown");
    assert!(!held);

    // Free at once for everyone else, long before the 30 s leases would run out.
    for key in ["shut:w", "shut:r", "shut:task"] {
        let guard = other
            .lock(key)
            .wait(Duration::ZERO)
            .acquire()
            .await
            .unwrap_or_else(|err| panic!("{key} was given back: {err}"));
        guard.release().await.expect("release");
    }
    let err = client
        .lock("shut:new")
        .acquire()
        .await
        .expect_err("shut down");
    assert!(matches!(&err, LockError::ShutDown), "{err:?}");
    assert_eq!(
        err.to_string(),
        "this distlock client was shut down (`Client::shutdown`): it takes no more locks and \
         gave back the ones it held; make a new client to take locks again"
    );
    // Guards dropped or released afterwards are harmless.
    assert!(!writer.release().await.expect("nothing left to release"));
    drop(reader);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let server = RedisServer::start();
    gives_back_every_lock_and_refuses_new_requests(|| {
        Config::from_url(&server.url()).expect("url")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process() {
    let store = Config::in_memory();
    gives_back_every_lock_and_refuses_new_requests(|| store.clone()).await;
}

/// A current-thread runtime (as `#[tokio::test]` makes): the in-process store's leases are
/// watched on it, and a shutdown gives them back too.
#[tokio::test]
async fn in_process_on_a_current_thread_runtime() {
    let store = Config::in_memory();
    gives_back_every_lock_and_refuses_new_requests(|| store.clone()).await;
}

/// A request still waiting when its client shuts down ends with the shutdown error instead of
/// taking the next grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_ends_at_the_shutdown() {
    let server = RedisServer::start();
    let config = || {
        Config::from_url(&server.url())
            .expect("url")
            .backoff(Duration::from_millis(50), Duration::from_millis(100))
    };
    let (client, other) = (
        Client::new(config()).expect("client"),
        Client::new(config()).expect("client"),
    );
    let holder = other.lock("shut:wait").acquire().await.expect("free");
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock("shut:wait")
                .wait(Duration::from_secs(30))
                .acquire()
                .await
        }
    });
    // The waiter is refused once when its writer-waiting mark is there.
    support::wait_until_async("the waiter to be refused", Duration::from_secs(5), || {
        let marked: bool = redis::cmd("EXISTS")
            .arg("distlock:{shut:wait}:writer-waiting")
            .query(&mut server.connection())
            .map_err(|e| e.to_string())?;
        marked.then_some(()).ok_or_else(|| "no mark yet".to_owned())
    })
    .await;
    client.shutdown().await.expect("shutdown");
    let ended = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter ends at its next try, not at its 30 s deadline")
        .expect("join");
    assert!(matches!(&ended, Err(LockError::ShutDown)), "{ended:?}");
    holder.release().await.expect("release");
}

/// An annotated fn whose lock the shutdown gives back stops at its next await with
/// `LockError::ShutDown`, which a caller tells from a lost lease (`LeaseLost`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotated_body_stopped_by_the_shutdown_says_so() {
    #[distlock::distributed_lock(key = "shut:body", client = locks, on_lost = "abort")]
    async fn work(
        locks: &Client,
        started: tokio::sync::oneshot::Sender<()>,
    ) -> Result<(), LockError> {
        let _ = started.send(());
        std::future::pending::<()>().await;
        Ok(())
    }

    let client = Client::new(Config::in_memory()).expect("client");
    let (started, running) = tokio::sync::oneshot::channel();
    let body = tokio::spawn({
        let client = client.clone();
        async move { work(&client, started).await }
    });
    running.await.expect("the body runs");
    assert_eq!(client.shutdown().await.expect("shutdown"), 1);
    let ended = tokio::time::timeout(Duration::from_secs(5), body)
        .await
        .expect("the body stops at once")
        .expect("join");
    assert!(matches!(ended, Err(LockError::ShutDown)), "{ended:?}");
}
