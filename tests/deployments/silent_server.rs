//! A request never outlives its wait, also against a server that takes connections and never
//! answers (issue 35, item 5): a frozen process behind a live socket, a proxy whose backend is
//! gone. Each try is cut off at what is left of the request's wait — its connect included —
//! and a request that does not wait (`wait(0)`, `try_acquire`) gets the response timeout for
//! its one try. At the DEFAULT `Config` (1 s response timeout, 2 s connect timeout, retries
//! on), on a fresh client and on one that has already tried, on every deployment: a single
//! silent server and a SIGSTOPped `redis-server`, a silent sentinel and a sentinel that names
//! a silent primary, a silent Cluster seed and a frozen Cluster primary, and Redlock with
//! every master silent. The error is the store's (`LockError::Backend`, or Redlock's
//! `QuorumUnavailable`), never `LockError::Timeout`, which says the lock stayed held.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::support::cluster::RedisCluster;
use crate::support::silent::SilentServer;
use crate::support::{free_port, scratch_dir, wait_until_async, RedisServer};
use distlock::{Client, Config, LockError};

/// What a request may take beyond its bound: timers and tasks running late on a loaded
/// 2-core machine shared with other builds. The defect this guards against overran by a
/// connect or response timeout (1–2 s).
const MARGIN: Duration = Duration::from_millis(300);

/// The default response timeout, the bound of a try that does not wait.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

fn client(config: Config) -> Client {
    Client::new(config).expect("client")
}

/// Runs `request`, asserts it ended within `bound` plus [`MARGIN`], and returns its result.
async fn within<T>(what: &str, bound: Duration, request: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let result = request.await;
    let took = started.elapsed();
    eprintln!("{what}: {took:?} (bound {bound:?} + {MARGIN:?})");
    assert!(
        took <= bound + MARGIN,
        "{what} took {took:?}, past its bound of {bound:?} (+{MARGIN:?})"
    );
    result
}

/// Asserts a failure of the store: a backend error (or Redlock's quorum short), with advice
/// for a server that may be frozen — not a timeout, which would say the lock stayed held.
fn assert_store_failure<T: std::fmt::Debug>(what: &str, result: Result<T, LockError>) {
    match result {
        Err(LockError::Backend(err)) => {
            let message = err.to_string();
            assert!(
                message.contains("frozen") && message.contains("SIGSTOP"),
                "{what}: the advice should fit a frozen server: {message}"
            );
        }
        Err(LockError::QuorumUnavailable { .. }) => {}
        other => panic!("{what}: expected the store's failure, got {other:?}"),
    }
}

/// `lock(..).wait(0.5 s)` and `wait(3 s)`, `try_acquire` and a campaign waiting 1.5 s, each
/// twice on `client` (a fresh client, then one that already tried): each ends within its
/// wait — the one that does not wait within the response timeout — with the store's failure.
async fn every_request_ends_within_its_wait(deployment: &str, client: &Client) {
    for round in ["fresh client", "client that already tried"] {
        for wait in [Duration::from_millis(500), Duration::from_secs(3)] {
            let what = format!("{deployment}, {round}: lock(..).wait({wait:?})");
            let result = within(&what, wait, client.lock("silent:wait").wait(wait).acquire()).await;
            assert_store_failure(&what, result);
        }
        let what = format!("{deployment}, {round}: try_acquire");
        let result = within(
            &what,
            RESPONSE_TIMEOUT,
            client.lock("silent:try").try_acquire(),
        )
        .await;
        assert_store_failure(&what, result);
        let wait = Duration::from_millis(1500);
        let what = format!("{deployment}, {round}: campaign with wait({wait:?})");
        let election = client.election("silent:election").wait(wait);
        let result = within(&what, wait, election.campaign()).await;
        assert_store_failure(&what, result.map(|_| ()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_does_not_stretch_any_request_past_its_wait() {
    let silent = SilentServer::start();
    let client = client(Config::from_url(&silent.url()).expect("url"));
    every_request_ends_within_its_wait("single silent server", &client).await;
}

/// [`a_silent_server_does_not_stretch_any_request_past_its_wait`] at a response timeout far
/// past every wait (an hour: `Config` sets no bound): a request that waits still ends within
/// its wait (its first try's floor, a tenth of the response timeout, stops at 100 ms: at an
/// hour's tenth a 500 ms wait lasted six minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_does_not_stretch_a_wait_at_the_largest_response_timeout() {
    let silent = SilentServer::start();
    let client = client(
        Config::from_url(&silent.url())
            .expect("url")
            .response_timeout(Duration::from_secs(3600)),
    );
    for round in ["fresh client", "client that already tried"] {
        let wait = Duration::from_millis(500);
        let what = format!("silent server, response timeout 1 h, {round}: wait({wait:?})");
        let result = within(
            &what,
            wait,
            client.lock("silent:largest").wait(wait).acquire(),
        )
        .await;
        assert_store_failure(&what, result);
    }
}

/// A `redis-server` that served the client and then froze (SIGSTOP): the client's connection
/// is open, and a new one is taken into the kernel's backlog but never answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_server_does_not_stretch_any_request_past_its_wait() {
    let server = RedisServer::start();
    let client = client(Config::from_url(&server.url()).expect("url"));
    let guard = client.lock("silent:warm").acquire().await.expect("acquire");
    assert!(guard.release().await.expect("release"));
    server.signal("STOP");
    for round in ["connected client", "client that already tried"] {
        let wait = Duration::from_millis(500);
        let what = format!("frozen redis-server, {round}: lock(..).wait({wait:?})");
        let result = within(&what, wait, client.lock("silent:wait").wait(wait).acquire()).await;
        assert_store_failure(&what, result);
        let what = format!("frozen redis-server, {round}: try_acquire");
        let result = within(
            &what,
            RESPONSE_TIMEOUT,
            client.lock("silent:try").try_acquire(),
        )
        .await;
        assert_store_failure(&what, result);
    }
    server.signal("CONT");
    // Thawed, it serves again; the tries cut off above were given back.
    let guard = client
        .lock("silent:wait")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("acquire once the server runs again");
    assert!(guard.release().await.expect("release"));
}

/// A server that answered "held" and then froze while the request waited: the request still
/// ends within its wait, as a timeout — the lock was held when the store last answered — and
/// its try cut off is given back once the server runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_freezes_while_a_request_waits_for_a_held_lock_ends_it_within_its_wait() {
    let server = RedisServer::start();
    let holder = client(Config::from_url(&server.url()).expect("url"));
    let waiter = client(Config::from_url(&server.url()).expect("url"));
    let key = "silent:held";
    let guard = holder.lock(key).acquire().await.expect("acquire");
    let scripts = server.script_calls();
    let wait = Duration::from_secs(2);
    let started = Instant::now();
    let request = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.lock(key).wait(wait).acquire().await }
    });
    // The waiter's script found the lock held (a first try is a bare `SET`; its refusal is
    // followed by the script).
    wait_until_async("the waiter to be refused", Duration::from_secs(5), || {
        let calls = server.script_calls();
        if calls > scripts {
            Ok(())
        } else {
            Err(format!("{calls} script calls"))
        }
    })
    .await;
    server.signal("STOP");
    let result = request.await.expect("task");
    let took = started.elapsed();
    server.signal("CONT");
    eprintln!("frozen while waiting for a held lock: wait({wait:?}) took {took:?}");
    assert!(
        took <= wait + MARGIN,
        "took {took:?}, past its wait of {wait:?} (+{MARGIN:?})"
    );
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{result:?}"
    );
    assert!(guard.release().await.expect("release"));
    let again = waiter
        .lock(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("free once the holder released and the cut tries were given back");
    assert!(again.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_sentinel_does_not_stretch_any_request_past_its_wait() {
    let silent = SilentServer::start();
    let config = Config::sentinel([silent.url()], "mymaster").expect("sentinel config");
    every_request_ends_within_its_wait("silent sentinel", &client(config)).await;
}

/// A sentinel that answers, and names a primary that takes connections and never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_naming_a_silent_primary_does_not_stretch_any_request_past_its_wait() {
    let primary = SilentServer::start();
    let dir = scratch_dir("silent-sentinel");
    let sentinel = loop {
        let port = free_port();
        let config = dir.join(format!("sentinel-{port}.conf"));
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor mymaster 127.0.0.1 {} 1\n",
                dir.display(),
                primary.port()
            ),
        )
        .expect("write the sentinel's config");
        let args = vec![config.to_string_lossy().into_owned(), "--sentinel".into()];
        if let Ok(sentinel) = RedisServer::launch(port, args) {
            break sentinel;
        }
    };
    let config = Config::sentinel([sentinel.url()], "mymaster").expect("sentinel config");
    every_request_ends_within_its_wait("sentinel naming a silent primary", &client(config)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_cluster_seed_does_not_stretch_any_request_past_its_wait() {
    let silent = SilentServer::start();
    let config = Config::cluster([silent.url()]).expect("cluster config");
    every_request_ends_within_its_wait("silent cluster seed", &client(config)).await;
}

/// A Cluster primary that served the client and then froze: requests for its slots end
/// within their wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_cluster_primary_does_not_stretch_any_request_past_its_wait() {
    // A long node timeout: the others do not mark the frozen primary failed meanwhile.
    let cluster = RedisCluster::start_without_replicas(Duration::from_secs(30));
    let client = client(Config::cluster(cluster.urls()).expect("cluster config"));
    let key = "silent:wait";
    let guard = client.lock(key).acquire().await.expect("acquire");
    assert!(guard.release().await.expect("release"));
    let primary = cluster.primary_for_key(&format!("distlock:{{{key}}}"));
    cluster.node(primary).signal("STOP");
    for round in ["connected client", "client that already tried"] {
        let wait = Duration::from_millis(500);
        let what = format!("frozen cluster primary, {round}: lock(..).wait({wait:?})");
        let result = within(&what, wait, client.lock(key).wait(wait).acquire()).await;
        assert_store_failure(&what, result);
        let what = format!("frozen cluster primary, {round}: try_acquire");
        let result = within(&what, RESPONSE_TIMEOUT, client.lock(key).try_acquire()).await;
        assert_store_failure(&what, result);
    }
    cluster.node(primary).signal("CONT");
}

/// Redlock with every master silent: too few masters answer, within the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_with_every_master_silent_does_not_stretch_any_request_past_its_wait() {
    let masters: Vec<SilentServer> = (0..3).map(|_| SilentServer::start()).collect();
    let config = Config::redlock(masters.iter().map(SilentServer::url)).expect("redlock config");
    every_request_ends_within_its_wait("redlock, every master silent", &client(config)).await;
}
