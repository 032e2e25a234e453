//! The eviction check: on the first connection to a server, distlock reads its
//! `maxmemory-policy` and warns once (target `distlock`) when the policy may evict lock keys
//! (`volatile-*`, `allkeys-*`), naming the policy and the fix. Real servers started with each
//! policy; the events are read through a capturing subscriber, installed globally because the
//! check runs on distlock's I/O thread.

use std::time::Duration;

use crate::support::capture::{self, Captured, Record};
use crate::support::cluster::RedisCluster;
use crate::support::sentinel::SentinelSetup;
use crate::support::{wait_until_async, RedisServer};
use distlock::{Client, Config};
use tracing::Level;

/// Long enough for a `CONFIG GET` on loopback on a loaded machine.
const CHECKED_WITHIN: Duration = Duration::from_secs(10);

fn address(server: &RedisServer) -> String {
    format!("127.0.0.1:{}", server.port())
}

/// The events about `server` at `level` whose message contains `needle`.
fn events(captured: &Captured, server: &str, level: Level, needle: &str) -> Vec<Record> {
    captured
        .about("server", server)
        .into_iter()
        .filter(|r| r.kind == "event" && r.level == level && r.name.contains(needle))
        .collect()
}

/// Takes and gives back one lock through a new client of `config`, and returns the client:
/// the check runs on its I/O runtime, which ends with it.
async fn use_once(config: Config) -> Client {
    let client = Client::new(config).expect("valid config");
    let guard = client.lock("eviction").acquire().await.expect("acquire");
    guard.release().await.expect("release");
    client
}

/// Waits until the check of `server` has told its outcome (a warning or the debug event that
/// says the policy keeps lock keys) and returns the warnings.
async fn checked(captured: &Captured, server: &str) -> Vec<Record> {
    wait_until_async("the eviction check", CHECKED_WITHIN, || {
        let warnings = events(captured, server, Level::WARN, "maxmemory-policy");
        let fine = events(captured, server, Level::DEBUG, "keeps lock keys");
        let refused = events(
            captured,
            server,
            Level::DEBUG,
            "could not read maxmemory-policy",
        );
        if warnings.is_empty() && fine.is_empty() && refused.is_empty() {
            Err(format!("nothing told about {server} yet"))
        } else {
            Ok(warnings)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_may_evict_lock_keys_is_warned_about_once() {
    let captured = capture::install();
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let url = server.url();
    let _client = use_once(Config::from_url(&url).unwrap()).await;
    let warnings = checked(&captured, &address(&server)).await;
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    let warning = &warnings[0];
    assert_eq!(warning.target, "distlock");
    assert_eq!(warning.field("policy"), Some("allkeys-lru"));
    assert!(
        warning.name.contains("mutual exclusion"),
        "{}",
        warning.name
    );
    assert!(warning.name.contains("noeviction"), "{}", warning.name);

    // Another client, and a reconnect after a restart: still one warning in this process.
    let _client = use_once(Config::from_url(&url).unwrap()).await;
    let mut server = server;
    server.restart();
    let _client = use_once(Config::from_url(&url).unwrap()).await;
    let warnings = events(
        &captured,
        &address(&server),
        Level::WARN,
        "maxmemory-policy",
    );
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noeviction_server_gets_no_warning() {
    let captured = capture::install();
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let _client = use_once(Config::from_url(&server.url()).unwrap()).await;
    let warnings = checked(&captured, &address(&server)).await;
    assert!(warnings.is_empty(), "{warnings:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_redlock_master_that_may_evict_is_warned_about() {
    let captured = capture::install();
    let masters: Vec<RedisServer> = ["volatile-lru", "noeviction", "allkeys-lfu"]
        .iter()
        .map(|policy| RedisServer::start_with(&["--maxmemory-policy", policy]))
        .collect();
    let config = Config::redlock(masters.iter().map(RedisServer::url)).unwrap();
    // A grant needs a majority only, so on a loaded machine a master may still be connecting
    // when the first lock is done; keep locking until every master has been connected to.
    let client = Client::new(config).expect("valid config");
    let told = |master: &RedisServer| {
        let server = address(master);
        !events(&captured, &server, Level::WARN, "maxmemory-policy").is_empty()
            || !events(&captured, &server, Level::DEBUG, "keeps lock keys").is_empty()
    };
    let deadline = tokio::time::Instant::now() + CHECKED_WITHIN;
    while !masters.iter().all(told) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every Redlock master was checked within {CHECKED_WITHIN:?}"
        );
        let guard = client.lock("eviction").acquire().await.expect("acquire");
        guard.release().await.expect("release");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut warned = Vec::new();
    for master in &masters {
        warned.push(checked(&captured, &address(master)).await.len());
    }
    assert_eq!(warned, [1, 0, 1]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_server_that_refuses_config_is_used_without_a_warning() {
    // Managed Redis often renames or disables CONFIG.
    let captured = capture::install();
    let server = RedisServer::start_with(&[
        "--maxmemory-policy",
        "allkeys-lru",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    let _client = use_once(Config::from_url(&server.url()).unwrap()).await;
    let warnings = checked(&captured, &address(&server)).await;
    assert!(warnings.is_empty(), "{warnings:#?}");
    let refused = events(
        &captured,
        &address(&server),
        Level::DEBUG,
        "could not read maxmemory-policy",
    );
    assert_eq!(refused.len(), 1, "{refused:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cluster_primary_that_may_evict_is_warned_about() {
    let captured = capture::install();
    let cluster = RedisCluster::start();
    let primaries = cluster.primaries();
    for (at, &primary) in primaries.iter().enumerate() {
        let policy = if at == 0 {
            "volatile-ttl"
        } else {
            "noeviction"
        };
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .query(&mut cluster.connection_to(primary))
            .expect("CONFIG SET");
    }
    let _client = use_once(Config::cluster(cluster.urls()).unwrap()).await;
    let mut warned = Vec::new();
    for &primary in &primaries {
        let server = format!("127.0.0.1:{}", cluster.port(primary));
        warned.push(checked(&captured, &server).await.len());
    }
    assert_eq!(warned, [1, 0, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_sentinel_names_is_checked() {
    let captured = capture::install();
    let setup = SentinelSetup::start("evictmaster");
    let primary = setup.current_primary_port();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-random")
        .query(&mut setup.server(primary).connection())
        .expect("CONFIG SET");
    let _client =
        use_once(Config::sentinel(setup.sentinel_urls(), setup.master_name()).unwrap()).await;
    let warnings = checked(&captured, &format!("127.0.0.1:{primary}")).await;
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert_eq!(warnings[0].field("policy"), Some("allkeys-random"));
}
