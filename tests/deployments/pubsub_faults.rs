//! Wake-ups on release must not cost more than they save: when the pub/sub side fails at the
//! connection level (here a middlebox that closes every connection sending SUBSCRIBE), a
//! client pauses pub/sub, longer after each failure in a row, instead of opening a connection
//! on every wait, and its waiters still get the lock through their backoff. Nor may they miss
//! what they are for: a release that comes before a waiter's subscription is up does not cost
//! the waiter its backoff step. Against a real `redis-server`, through the fault-injecting
//! proxy.

use std::time::{Duration, Instant};

use crate::support::proxy::Proxy;
use crate::support::{self, RedisServer};
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

/// A release that comes after a waiter's try was refused but before its subscription is up
/// reaches no subscriber: the waiter, once subscribed, tries again at once instead of sleeping
/// out its backoff step (up to 20 s here). The proxy holds each `SUBSCRIBE` 500 ms (a pub/sub
/// connection still being made, say), which holds the window open: the holder releases as
/// soon as the server has run the waiter's try. Three rounds, a lock each (a fresh
/// subscription each). Shown to fail (granted 9.6 s and 14.6 s after the release) with the wait
/// sleeping out its step once subscribed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_before_the_waiters_subscription_is_up_does_not_cost_it_its_backoff() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let holder = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
    let waiter = Client::new(
        Config::from_url(&proxy.url())
            .expect("url")
            .backoff(Duration::from_secs(20), Duration::from_secs(20)),
    )
    .expect("client");
    // `SUBSCRIBE` as RESP frames it (not `UNSUBSCRIBE`, which a channel left without waiters
    // gets a second later, and which must not hold up the next round's `SUBSCRIBE`).
    proxy.delay_requests_sending(b"$9\r\nSUBSCRIBE", Duration::from_millis(500));
    for round in 0..3 {
        let name = format!("window-{round}");
        let channel = format!("distlock:{{{name}}}:released");
        let guard = holder.lock(&name).acquire().await.expect("holder");
        let waiting = tokio::spawn({
            let (waiter, name) = (waiter.clone(), name.clone());
            async move {
                let guard = waiter
                    .lock(&name)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .expect("the waiter gets the lock");
                (Instant::now(), guard)
            }
        });
        // A refused first try (a bare `SET`) is followed at once by the script, which says how
        // long to wait and sets the writer-waiting mark: its refusal is the one the waiter
        // then waits on.
        let mark = format!("distlock:{{{name}}}:writer-waiting");
        support::wait_until_async("the waiter's script ran", Duration::from_secs(10), || {
            let marked: bool = redis::cmd("EXISTS")
                .arg(&mark)
                .query(&mut server.connection())
                .expect("EXISTS");
            marked.then_some(()).ok_or(format!("no {mark} yet"))
        })
        .await;
        // Its `SUBSCRIBE` is still held by the proxy: nobody listens for the release yet.
        assert_eq!(
            server.subscribers(&channel),
            0,
            "round {round}: the waiter subscribed before the release (no window)"
        );
        assert!(guard.release().await.expect("release"));
        let released = Instant::now();
        let (granted, next) = waiting.await.expect("waiter task");
        let took = granted.saturating_duration_since(released);
        assert!(
            took < Duration::from_secs(3),
            "round {round}: granted {took:?} after a release its subscription missed"
        );
        assert!(next.release().await.expect("release"));
    }
}
