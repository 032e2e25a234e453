//! Failures within `wait` (`Config::retry`): a try that failed for a reason that may pass — a
//! connection refused or cut, too few Redlock masters answering — is tried again while the
//! request may still wait, so a blip does not end a request that had time left; a request
//! that does not wait tries once; a failure that trying again cannot mend (data at the key
//! that is not a lock) ends the request at its first try. Real `redis-server` processes behind
//! the fault-injecting proxy.

use std::time::Duration;

use crate::support::monitor::Monitor;
use crate::support::proxy::{Mode, Proxy};
use crate::support::{wait_until_async, RedisServer};
use distlock::{BackendErrorKind, Client, Config, LockError};

fn config_through(proxy: &Proxy) -> Config {
    Config::from_url(&proxy.url())
        .expect("url")
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
}

/// Waits until `proxy` has been asked for more than `connections` connections: the client
/// came back after the connections it had were cut (a retry).
async fn connections_beyond(proxy: &Proxy, connections: u64) {
    wait_until_async(
        "the client to come back through the proxy",
        Duration::from_secs(10),
        || {
            let accepted = proxy.accepted();
            if accepted > connections {
                Ok(())
            } else {
                Err(format!("{accepted} connections accepted"))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_request_with_wait_left_rides_out_refused_connections() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = Client::new(config_through(&proxy)).expect("client");
    let warm = client.lock("retry:warm").acquire().await.expect("warm up");
    assert!(warm.release().await.expect("release"));

    // Every connection is cut, the one the client has and every new one.
    proxy.set_mode(Mode::Drop);
    let before = proxy.accepted();
    let request = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock("retry:blip")
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        }
    });
    // One try reconnects at most once; a third connection is a try sent again.
    connections_beyond(&proxy, before + 2).await;
    assert!(
        !request.is_finished(),
        "the request ended while it could still wait"
    );
    proxy.set_mode(Mode::Pass);
    let guard = request
        .await
        .expect("task")
        .expect("granted once the connections pass again");
    assert!(guard.fencing_token().is_some());
    assert!(guard.release().await.expect("release"));
}

#[tokio::test]
async fn a_request_that_does_not_wait_tries_once() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = Client::new(config_through(&proxy)).expect("client");
    proxy.set_mode(Mode::Drop);
    let result = client
        .lock("retry:once")
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(&result, Err(LockError::Backend(e)) if e.kind() == BackendErrorKind::Connection),
        "{result:?}"
    );
    // One try: its connect and the connection layer's one reconnect, no more.
    assert!(proxy.accepted() <= 2, "{} connections", proxy.accepted());
}

#[tokio::test]
async fn retries_end_after_the_configured_attempts_with_the_failure() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let config = config_through(&proxy).retry(2, Duration::from_millis(20));
    let client = Client::new(config).expect("client");
    proxy.set_mode(Mode::Drop);
    let result = client
        .lock("retry:exhausted")
        .wait(Duration::from_secs(60))
        .acquire()
        .await;
    // The failure, not a timeout: the wait had not run out.
    assert!(
        matches!(&result, Err(LockError::Backend(e)) if e.kind() == BackendErrorKind::Connection),
        "{result:?}"
    );
    // Three tries (the first and two retries), each with at most one reconnect.
    let accepted = proxy.accepted();
    assert!((3..=6).contains(&accepted), "{accepted} connections");
}

#[tokio::test]
async fn a_failure_retrying_cannot_mend_ends_the_request_at_its_first_try() {
    let server = RedisServer::start();
    redis::cmd("HSET")
        .arg("distlock:{retry:foreign}")
        .arg("field")
        .arg("value")
        .query::<i64>(&mut server.connection())
        .expect("HSET");
    let url = server.url();
    let retrying = Client::new(Config::from_url(&url).expect("url")).expect("client");
    let once = Client::new(
        Config::from_url(&url)
            .expect("url")
            .retry(0, Duration::ZERO),
    )
    .expect("client");
    let monitor = Monitor::start(&server);
    // Once first, which also loads the scripts the later requests run.
    let warm = retrying
        .lock("retry:foreign")
        .wait(Duration::from_secs(20))
        .acquire()
        .await;
    assert!(matches!(warm, Err(LockError::NotALock { .. })), "{warm:?}");

    // What a request that never retries sends, then what one with retries (and a long wait)
    // sends: the same.
    let mut sent = Vec::new();
    for (n, client) in [&once, &retrying].into_iter().enumerate() {
        let from = mark(&server, &monitor, &format!("retry:from:{n}")).await;
        let result = client
            .lock("retry:foreign")
            .wait(Duration::from_secs(20))
            .acquire()
            .await;
        assert!(
            matches!(result, Err(LockError::NotALock { .. })),
            "{result:?}"
        );
        let to = mark(&server, &monitor, &format!("retry:to:{n}")).await;
        // The tries on the lock key (the wake-up subscription, made when a client first
        // waits, is not a try).
        let tries: Vec<String> = monitor.lines()[from..to]
            .iter()
            .filter(|line| line.contains("distlock:{retry:foreign}") && !line.contains("SUBSCRIBE"))
            .cloned()
            .collect();
        sent.push(tries);
    }
    assert!(!sent[0].is_empty(), "{sent:#?}");
    assert_eq!(sent[0].len(), sent[1].len(), "{sent:#?}");
}

/// Sends `marker` to the server and waits until the monitor saw it: every command sent
/// before is in the log before it. Returns its line.
async fn mark(server: &RedisServer, monitor: &Monitor, marker: &str) -> usize {
    let _: String = redis::cmd("ECHO")
        .arg(marker)
        .query(&mut server.connection())
        .expect("ECHO");
    monitor.wait_for(marker).await
}

#[tokio::test]
async fn a_redlock_request_rides_out_a_majority_that_is_briefly_unreachable() {
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let proxies: Vec<Proxy> = masters.iter().map(|m| Proxy::start(m.port())).collect();
    // Cut-off masters fail at once; the timeout is for the live ones, slow at times on this
    // loaded machine (a release needs two of them to answer within it).
    let config = Config::redlock(proxies.iter().map(Proxy::url))
        .expect("redlock")
        .node_timeout(Duration::from_millis(500));
    let client = Client::new(config).expect("client");
    let warm = client.lock("retry:warm").acquire().await.expect("warm up");
    assert!(warm.release().await.expect("release"));

    // Two of three masters cut off: no quorum.
    proxies[1].set_mode(Mode::Drop);
    proxies[2].set_mode(Mode::Drop);
    let before = proxies[1].accepted();
    let request = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock("retry:quorum")
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        }
    });
    connections_beyond(&proxies[1], before + 2).await;
    assert!(
        !request.is_finished(),
        "the request ended while it could still wait"
    );
    proxies[1].set_mode(Mode::Pass);
    let guard = request
        .await
        .expect("task")
        .expect("granted once a majority answers again");
    assert!(guard.fencing_token().is_some());
    assert!(guard.release().await.expect("release"));
}

#[test]
fn a_retry_without_a_pause_is_refused() {
    let config = Config::in_memory().retry(3, Duration::ZERO);
    let err = Client::new(config).expect_err("refused");
    assert!(
        matches!(&err, LockError::Config(message) if message.contains("retry")),
        "{err}"
    );
    // No retries need no pause.
    assert!(Client::new(Config::in_memory().retry(0, Duration::ZERO)).is_ok());
}
