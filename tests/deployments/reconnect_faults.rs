//! What a broken or redirected connection must not leave behind: a request held up on a
//! connection the client gave up on cannot take a lock after its clean-up (the replacement
//! connection closes the old one on the server first); a request that may have run before its
//! retry failed to connect is still cleaned up; a server that turned into a replica (a
//! failover behind a stable endpoint) makes the client reconnect instead of failing forever.
//! Each against real `redis-server` processes, through the fault-injecting proxy.

use std::time::{Duration, Instant};

use crate::support;
use crate::support::proxy::{Mode, Proxy};
use crate::support::RedisServer;
use distlock::{BackendErrorKind, Client, Config, LockError};

fn client_through(proxy: &Proxy) -> Client {
    let config = Config::from_url(&proxy.url())
        .expect("url")
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300));
    Client::new(config).expect("client")
}

fn client_direct(server: &RedisServer) -> Client {
    Client::new(Config::from_url(&server.url()).expect("url")).expect("client")
}

async fn warm_up(client: &Client) {
    let warm = client.lock("warm").acquire().await.expect("warm up");
    assert!(warm.release().await.expect("release"));
}

fn exists(server: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(&mut server.connection())
        .expect("EXISTS")
        == 1
}

/// Polls (bounded by `within`) until `key` no longer exists; `false` if it still does.
async fn vanishes(server: &RedisServer, key: &str, within: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < within {
        if !exists(server, key) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn a_request_held_up_on_a_replaced_connection_cannot_take_the_lock_after_its_clean_up() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = client_through(&proxy);
    warm_up(&client).await;
    let monitor = support::monitor::Monitor::start(&server);

    // The acquire goes out on the current connection and is held up in the network.
    proxy.hold_current_connections();
    let result = client
        .lock("held-up")
        .lease(Duration::from_secs(10))
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(&result, Err(LockError::Backend(e)) if e.kind() == BackendErrorKind::Timeout),
        "{result:?}"
    );
    // Its clean-up runs on a new connection and finds nothing to delete yet.
    monitor.wait_for("distlock:{held-up}:released").await;
    // Now the held-up acquire reaches the server, long after its clean-up.
    proxy.release_held();
    // Observation window: the held bytes arrive within microseconds; a grant they made would
    // show in far less than this.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(500) {
        assert!(
            !exists(&server, "distlock:{held-up}"),
            "the held-up acquire took the lock after its clean-up: nobody holds it, all wait 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let other = client_direct(&server)
        .lock("held-up")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("the lock is free");
    assert!(other.release().await.expect("release"));
}

#[tokio::test]
async fn a_request_that_ran_before_its_retry_failed_to_connect_is_still_cleaned_up() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = client_through(&proxy);
    warm_up(&client).await;

    // The script runs but its reply is lost with the connection; the retry on a new
    // connection cannot connect (its handshake's replies are lost too).
    let (sets_before, scripts_before) = (server.command_calls(&["set"]), server.script_calls());
    proxy.set_mode(Mode::DropReplies);
    let result = client
        .lock("ran-then-cut")
        .lease(Duration::from_secs(10))
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(matches!(&result, Err(LockError::Backend(_))), "{result:?}");
    // The scenario under test: the first send ran on the server. Its key is there now, unless
    // the clean-up in the background (a script call) has already run: a new connection whose
    // handshake needs no reply gets through the proxy.
    let held = exists(&server, "distlock:{ran-then-cut}");
    let (sets, scripts) = (
        server.command_calls(&["set"]) - sets_before,
        server.script_calls() - scripts_before,
    );
    assert!(
        held || (sets >= 1 && scripts >= 1),
        "the first send did not run on the server: no key, {sets} SETs, {scripts} script calls"
    );
    proxy.set_mode(Mode::Pass);
    assert!(
        vanishes(&server, "distlock:{ran-then-cut}", Duration::from_secs(5)).await,
        "no clean-up ran: a grant nobody holds blocks the lock for its whole 10 s lease"
    );
}

#[tokio::test]
async fn a_client_follows_a_failover_behind_a_stable_endpoint() {
    let old_primary = RedisServer::start();
    let new_primary = RedisServer::start();
    let proxy = Proxy::start(old_primary.port());
    let client = client_through(&proxy);
    warm_up(&client).await;

    // Failover: the old primary becomes a replica of the new one, and the endpoint the client
    // uses now leads to the new primary.
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(new_primary.port())
        .query(&mut old_primary.connection())
        .expect("REPLICAOF");
    proxy.retarget(new_primary.port());

    let mut errors = Vec::new();
    let started = Instant::now();
    let guard = loop {
        match client
            .lock("after-failover")
            .wait(Duration::ZERO)
            .acquire()
            .await
        {
            Ok(guard) => break guard,
            Err(err) => errors.push(err.to_string()),
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "still failing 3 s after the failover (a new client works at once): {errors:#?}"
        );
    };
    assert!(
        errors.len() <= 1,
        "more than one failed request after the failover: {errors:#?}"
    );
    assert!(guard.release().await.expect("release"));
}

#[tokio::test]
async fn a_guard_dropped_while_the_connection_is_cut_is_still_released_once_it_is_back() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = client_through(&proxy);
    let guard = client
        .lock("dropped-in-outage")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire");

    // The guard is dropped while the network is cut: its background release fails at first.
    proxy.set_mode(Mode::Drop);
    drop(guard);
    // The outage under test, not a synchronisation: the release keeps failing meanwhile.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        exists(&server, "distlock:{dropped-in-outage}"),
        "the lock was held through the outage (the scenario under test)"
    );
    proxy.set_mode(Mode::Pass);
    assert!(
        vanishes(
            &server,
            "distlock:{dropped-in-outage}",
            Duration::from_secs(5)
        )
        .await,
        "the dropped guard's release gave up: the lock stays taken for its whole 10 s lease"
    );
}

#[tokio::test]
async fn a_user_without_permission_for_client_commands_still_locks_across_reconnects() {
    let server = RedisServer::start();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locks")
        .arg("on")
        .arg(">secret")
        .arg("~distlock:*")
        .arg("&distlock:*")
        .arg("+@all")
        .arg("-client")
        .query(&mut server.connection())
        .expect("ACL SETUSER");
    let proxy = Proxy::start(server.port());
    let url = format!("redis://locks:secret@127.0.0.1:{}", proxy.port());
    let client = Client::new(
        Config::from_url(&url)
            .expect("url")
            .response_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300)),
    )
    .expect("client");
    warm_up(&client).await;

    // A cut connection: the next request reconnects, and the new connection's `CLIENT KILL`
    // of the old one and its `CLIENT INFO` are refused by the ACL.
    proxy.set_mode(Mode::Drop);
    let cut = client.lock("acl").wait(Duration::ZERO).acquire().await;
    assert!(matches!(&cut, Err(LockError::Backend(_))), "{cut:?}");
    proxy.set_mode(Mode::Pass);
    let guard = client
        .lock("acl")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect("a refused CLIENT command does not stop the client from locking");
    assert!(guard.release().await.expect("release"));
    assert!(
        proxy.accepted() >= 2,
        "the client reconnected (the scenario under test)"
    );
}
