//! The failover guard's connections (deployments.md: guarded writes run on connections of
//! their own, "up to 16 at once per client, kept for the next writes"), counted on the
//! primary with `CLIENT LIST` while thirty guarded grants at once wait for replicas that are
//! frozen (SIGSTOP), each grant's `WAIT` running out.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::{query_port, wait_until, RedisServer};
use distlock::{BackendErrorKind, Client, Config, LockError};

/// What deployments.md promises at most.
const AT_ONCE: usize = 16;

/// Guarded grants sent at once: more than [`AT_ONCE`].
const GRANTS: usize = 30;

/// A primary and two replicas that acknowledge its writes.
fn primary_with_replicas() -> (RedisServer, Vec<RedisServer>) {
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let replicas: Vec<RedisServer> = (0..2)
        .map(|_| RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]))
        .collect();
    wait_until(
        "both replicas to acknowledge writes",
        Duration::from_secs(30),
        || {
            let acknowledged: (i64,) = redis::pipe()
                .cmd("SET")
                .arg("sync-probe")
                .arg(1)
                .ignore()
                .cmd("WAIT")
                .arg(2)
                .arg(200)
                .query(&mut primary.connection())
                .map_err(|err| err.to_string())?;
            if acknowledged.0 < 2 {
                return Err(format!("{} of 2 replicas acknowledge", acknowledged.0));
            }
            Ok(())
        },
    );
    (primary, replicas)
}

/// The primary's clients other than its replicas' links and the connection that asks: their
/// ids, and how many of them are in `WAIT`.
fn clients(port: u16) -> (BTreeSet<u64>, usize) {
    let list: String = query_port(port, redis::cmd("CLIENT").arg("LIST")).expect("CLIENT LIST");
    let field = |line: &str, name: &str| {
        line.split_whitespace()
            .find_map(|field| field.strip_prefix(name).map(str::to_owned))
    };
    let mut ids = BTreeSet::new();
    let mut waiting = 0;
    for line in list.lines() {
        let flags = field(line, "flags=").unwrap_or_default();
        let cmd = field(line, "cmd=").unwrap_or_default();
        if flags.contains('S') || cmd == "client|list" {
            continue;
        }
        if cmd == "wait" {
            waiting += 1;
        }
        ids.extend(field(line, "id=").and_then(|id| id.parse::<u64>().ok()));
    }
    (ids, waiting)
}

/// Sends [`GRANTS`] guarded grants at once (distinct keys, no wait), each held up by its
/// `WAIT`, and returns the most of the primary's clients seen in `WAIT` at one time.
async fn burst(client: &Client, port: u16, round: usize) -> usize {
    let tries: Vec<_> = (0..GRANTS)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .lock(format!("guarded:{round}:{i}"))
                    .wait(Duration::ZERO)
                    .acquire()
                    .await
            })
        })
        .collect();
    let watcher = tokio::task::spawn_blocking(move || {
        let mut most = 0;
        let started = std::time::Instant::now();
        // Each batch of WAITs lasts the guard's timeout; two batches at least.
        while started.elapsed() < Duration::from_millis(1500) {
            most = most.max(clients(port).1);
            std::thread::sleep(Duration::from_millis(10));
        }
        most
    });
    for try_ in tries {
        let result = try_.await.expect("task");
        // Refused (the guard gave the grant back), or, on a loaded machine, cut off unanswered
        // at the response timeout while its `WAIT` and give-back ran: neither hands it out.
        let cut_off = matches!(
            &result,
            Err(LockError::Backend(err)) if err.kind() == BackendErrorKind::Timeout
        );
        assert!(
            matches!(result, Err(LockError::Timeout { .. })) || cut_off,
            "a grant the frozen replicas did not acknowledge is not handed out: {result:?}"
        );
    }
    watcher.await.expect("watcher")
}

/// Thirty guarded grants at once, twice: at most sixteen of the client's connections are in
/// `WAIT` at one time (and sixteen are, so the bound is what holds them back), and the
/// second burst makes no new connection: the first burst's are kept. At the default response
/// timeout (1 s), the guard's timeout 0.5 s. Seen: 16 in `WAIT` at most, 18 connections kept
/// (the shared one, the sixteen, one more), the same ids after both bursts. Shown to fail with
/// `GUARDED_CONNECTIONS` at 32 (30 in `WAIT` at once), and with `Lent::give_back` dropping
/// the connection (one connection kept after the writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_use_at_most_sixteen_connections_at_once_kept_for_the_next_writes() {
    let (primary, replicas) = primary_with_replicas();
    let port = primary.port();
    let client = Client::new(
        Config::from_url(&primary.url())
            .expect("valid url")
            .replicas(2, Duration::from_millis(500)),
    )
    .expect("client");
    let warm = client
        .lock("warm")
        .acquire()
        .await
        .expect("replicas in sync");
    assert!(warm.release().await.expect("release"));

    for replica in &replicas {
        replica.signal("STOP");
    }
    let first = burst(&client, port, 0).await;
    let (after_first, _) = clients(port);
    let second = burst(&client, port, 1).await;
    let (after_second, _) = clients(port);
    for replica in &replicas {
        replica.signal("CONT");
    }
    for most in [first, second] {
        assert!(
            most <= AT_ONCE,
            "{most} of the client's connections were in WAIT at once"
        );
        assert!(
            most >= AT_ONCE * 3 / 4,
            "only {most} guarded writes ran at once of {GRANTS} sent: the bound was not reached"
        );
    }
    // The shared connection and the sixteen guarded ones, idle now.
    assert!(
        after_first.len() > AT_ONCE,
        "after the writes the client keeps {} connections: the guarded ones were closed",
        after_first.len()
    );
    let new: Vec<_> = after_second.difference(&after_first).collect();
    assert!(
        new.is_empty(),
        "the second burst made new connections {new:?} (after the first: {after_first:?})"
    );
}
