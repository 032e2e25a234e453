//! A connect outlives the request that started it: a request's try is cut off at what is left
//! of its wait (`silent_server.rs`), its connect included, but the connect — and the set-up of
//! the new connection (`CLIENT INFO`, the transaction check, the role check through Sentinel)
//! — goes on by itself, and the next request takes it up. So a server whose connect takes
//! longer than a request's wait is still reached after a few requests, where starting over
//! each time would never reach it. Real `redis-server` processes behind the fault-injecting
//! proxy, which holds every reply back: a slow network.

use std::time::Duration;

use crate::support::cluster::RedisCluster;
use crate::support::proxy::Proxy;
use crate::support::RedisServer;
use distlock::{Client, Config, LockError};

/// How late every reply comes: a connect and its set-up take four round trips (the `redis`
/// crate's handshake, `CLIENT INFO`, `EXEC`, `MULTI`/`EXEC`), 600 ms, and a try one more.
const LATE: Duration = Duration::from_millis(150);

/// The wait of each request: shorter than a connect, longer than a try.
const WAIT: Duration = Duration::from_millis(300);

/// Asks for `key` with [`WAIT`] until a grant, at most `tries` times, and returns how many it
/// took; every request that is not granted fails as the store's (too slow) failure, or times
/// out behind a try of its own: a try cut off unanswered may have landed, and until its
/// give-back (one more slow round trip) reaches the server, the next request finds the key
/// held by it. Either way no request is granted without the connection.
async fn granted_within(client: &Client, key: &str, tries: usize) -> usize {
    for request in 1..=tries {
        match client.lock(key).wait(WAIT).acquire().await {
            Ok(guard) => {
                assert!(guard.release().await.expect("release"));
                return request;
            }
            Err(LockError::Backend(err)) => eprintln!("request {request}: {err}"),
            // The key held by the previous request's cut try, not yet given back: the
            // connection answered.
            Err(err @ LockError::Timeout { .. }) if request > 1 => {
                eprintln!("request {request}: {err}")
            }
            Err(other) => panic!("request {request}: expected the store's failure, got {other}"),
        }
    }
    panic!("no grant in {tries} requests of {WAIT:?} each: the connect never finished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_longer_than_a_wait_is_finished_for_the_next_request() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.delay_replies(LATE);
    let client = Client::new(Config::from_url(&proxy.url()).expect("url")).expect("client");
    let requests = granted_within(&client, "slow:connect", 6).await;
    eprintln!("granted at request {requests}");
    // One connection made, not one per request.
    assert_eq!(proxy.accepted(), 1, "connections through the proxy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_connect_longer_than_a_wait_is_finished_for_the_next_request() {
    let cluster = RedisCluster::start_without_replicas(Duration::from_secs(5));
    // The seed alone is slow: the cluster connection's first requests (the slot map) go to it.
    let proxy = Proxy::start(cluster.port(0));
    proxy.delay_replies(Duration::from_millis(400));
    let client = Client::new(Config::cluster([proxy.url()]).expect("urls")).expect("client");
    let requests = granted_within(&client, "slow:cluster", 6).await;
    eprintln!("granted at request {requests}");
}
