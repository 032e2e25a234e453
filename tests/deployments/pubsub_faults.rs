//! Wake-ups on release must not cost more than they save: when the pub/sub side fails at the
//! connection level (here a middlebox that closes every connection sending SUBSCRIBE), a
//! client pauses pub/sub, longer after each failure in a row, instead of opening a connection
//! on every wait, and its waiters still get the lock through their backoff. Against a real
//! `redis-server`, through the fault-injecting proxy.

use std::time::Duration;

use crate::support::proxy::Proxy;
use crate::support::RedisServer;
use distlock::{Client, Config};

/// How long the holder keeps the lock while the waiters wait: the observation window.
const HELD_FOR: Duration = Duration::from_secs(3);
const WAITERS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_behind_a_proxy_that_cuts_subscribe_back_off_instead_of_reconnecting_per_wait() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.cut_connections_sending(b"SUBSCRIBE");

    let holder = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
    let held = holder
        .lock("contended")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .expect("holder");

    let waiters = Client::new(
        Config::from_url(&proxy.url())
            .expect("url")
            .backoff(Duration::from_millis(5), Duration::from_millis(100)),
    )
    .expect("client");
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let waiters = waiters.clone();
            tokio::spawn(async move {
                let guard = waiters
                    .lock("contended")
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await?;
                guard.release().await
            })
        })
        .collect();

    // The scenario's duration, not a synchronisation: the waiters keep waiting all along.
    tokio::time::sleep(HELD_FOR).await;
    let opened = proxy.accepted();
    assert!(held.release().await.expect("release"));

    for task in tasks {
        let released = task
            .await
            .expect("waiter task")
            .expect("waiter got the lock");
        assert!(released, "a waiter's lease ran out before its release");
    }
    // One connection for the locks, and one per pub/sub try: pauses of 0.1, 0.2, 0.4 … 5 s
    // (jittered down to half) allow about 7 tries in 3 s; each wait reconnecting allowed
    // hundreds.
    assert!(
        opened <= 15,
        "{WAITERS} waiters opened {opened} connections in {HELD_FOR:?} behind a proxy that cuts SUBSCRIBE"
    );
}
