//! The ACL user `docs/keys-and-acls.md` documents, per deployment (issue 23, item 6; issue 35,
//! items 4 and 8): built from exactly its deployment's column of the table (and, for Sentinel,
//! the sentinels' sentence), it runs every kind of lock, the operator's tools and `ping`, and
//! rides out a server frozen past the default response or node timeout and thawed — on a
//! single server, Sentinel, the Cluster and three Redlock masters — with nothing in any
//! server's `ACL LOG`. Every command the scripts run is in every deployment's column.
//!
//! And a user without `PING`: `Client::ping` fails with an error that names it and how to
//! grant it; a Redlock master that refuses it, once it missed its node timeout, is asked once
//! per miss (not every 100 ms until the user gets `PING`), is waited for again, and the client
//! warns once.

use std::time::Duration;

use crate::support;
use crate::support::acl::{
    acl_log, documented_commands, documented_rules, documented_sentinel_rules, refusals_of,
    set_user, through_a_frozen_server, Deployment,
};
use crate::support::cluster::RedisCluster;
use crate::support::masters::start_masters;
use crate::support::sentinel::SentinelSetup;
use crate::support::RedisServer;
use distlock::{BackendErrorKind, Client, Config, LockError};

/// The URL `url` with the documented user's credentials.
fn as_documented(url: &str) -> String {
    url.replacen("redis://", "redis://documented:pw@", 1)
}

/// Asserts that no server of `servers` (named by what it is) has anything in its `ACL LOG`.
fn nothing_refused(servers: Vec<(String, redis::Connection)>) {
    let refused: Vec<String> = servers
        .into_iter()
        .flat_map(|(name, mut connection)| {
            acl_log(&mut connection)
                .into_iter()
                .map(move |entry| format!("{name}: {entry}"))
        })
        .collect();
    assert!(refused.is_empty(), "the ACL refused: {refused:#?}");
}

/// Every command a script runs by name (`redis.call('X'` / `redis.pcall('X'`).
fn script_commands() -> std::collections::BTreeSet<String> {
    fn walk(dir: &std::path::Path, found: &mut std::collections::BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).expect("scripts dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "lua") {
                let source = std::fs::read_to_string(&path).expect("script");
                for call in ["redis.call('", "redis.pcall('"] {
                    for (_, rest) in source
                        .match_indices(call)
                        .map(|(at, _)| source[at..].split_at(call.len()))
                    {
                        let name = rest.split('\'').next().unwrap_or_default();
                        found.insert(name.to_ascii_uppercase());
                    }
                }
            }
        }
    }
    let mut found = std::collections::BTreeSet::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lock-runtime/scripts"),
        &mut found,
    );
    found
}

#[test]
fn every_command_the_scripts_run_is_documented_for_every_deployment() {
    for deployment in [
        Deployment::Single,
        Deployment::Sentinel,
        Deployment::Cluster,
        Deployment::Redlock,
    ] {
        let documented = documented_commands(deployment);
        // `PUBSUB` is `PUBSUB NUMSUB` or `PUBSUB SHARDNUMSUB`, by the store's argument.
        let first_words: Vec<&str> = documented
            .iter()
            .filter_map(|command| command.split(' ').next())
            .collect();
        let missing: Vec<String> = script_commands()
            .into_iter()
            .filter(|command| !first_words.contains(&command.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "the scripts run {missing:?}, which the ACL table of docs/keys-and-acls.md does not \
             list for {deployment:?}: {documented:?}"
        );
    }
}

/// A single server at the default `Config`: every kind, the tools, `ping`, and the server
/// frozen past the response timeout (1 s) and thawed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_user_of_a_single_server_is_refused_nothing() {
    let server = RedisServer::start();
    set_user(
        &mut server.connection(),
        "documented",
        &documented_rules(Deployment::Single, &[]),
    );
    let url = as_documented(&server.url());
    let client = || Client::new(Config::from_url(&url).expect("url")).expect("client");
    let (a, b) = (client(), client());
    support::acl::every_kind_and_the_operator_tools(&a, &b).await;
    through_a_frozen_server(
        &a,
        Duration::from_millis(1500),
        || server.signal("STOP"),
        || server.signal("CONT"),
    )
    .await;
    nothing_refused(vec![("the server".into(), server.connection())]);
}

/// Sentinel at the default `Config`: the user on every data server (a failover may promote a
/// replica) and on the sentinels; the primary frozen past the response timeout (1 s; the
/// sentinels may fail it over meanwhile) and thawed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_user_of_sentinel_is_refused_nothing() {
    let setup = SentinelSetup::start("acl");
    let rules = documented_rules(Deployment::Sentinel, &[]);
    for port in setup.server_ports() {
        set_user(&mut setup.server(port).connection(), "documented", &rules);
    }
    let sentinel_rules = documented_sentinel_rules();
    for sentinel in setup.sentinels() {
        set_user(&mut sentinel.connection(), "documented", &sentinel_rules);
    }
    let urls: Vec<String> = setup
        .sentinel_urls()
        .iter()
        .map(|url| as_documented(url))
        .collect();
    let client = || {
        Client::new(Config::sentinel(&urls, setup.master_name()).expect("urls")).expect("client")
    };
    let (a, b) = (client(), client());
    support::acl::every_kind_and_the_operator_tools(&a, &b).await;
    let primary = setup.server(setup.current_primary_port());
    through_a_frozen_server(
        &a,
        Duration::from_millis(1500),
        || primary.signal("STOP"),
        || primary.signal("CONT"),
    )
    .await;
    let mut servers: Vec<(String, redis::Connection)> = setup
        .server_ports()
        .into_iter()
        .map(|port| {
            (
                format!("data server {port}"),
                setup.server(port).connection(),
            )
        })
        .collect();
    servers.extend(setup.sentinels().iter().map(|sentinel| {
        (
            format!("sentinel {}", sentinel.port()),
            sentinel.connection(),
        )
    }));
    nothing_refused(servers);
}

/// The Cluster at the default `Config` (scripts by slot, sharded pub/sub, the slot map): the
/// user on every node (ACLs are per node). A cluster of its own, three primaries whose
/// `cluster-node-timeout` outlasts the freeze, so that freezing one past the response timeout
/// (1 s) fails nothing over and disturbs no other test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_user_of_the_cluster_is_refused_nothing() {
    let cluster = RedisCluster::start_without_replicas(Duration::from_secs(60));
    let rules = documented_rules(Deployment::Cluster, &[]);
    for node in cluster.live() {
        set_user(&mut cluster.connection_to(node), "documented", &rules);
    }
    let urls: Vec<String> = cluster
        .urls()
        .iter()
        .map(|url| as_documented(url))
        .collect();
    let client = || Client::new(Config::cluster(&urls).expect("urls")).expect("client");
    let (a, b) = (client(), client());
    support::acl::every_kind_and_the_operator_tools(&a, &b).await;
    let frozen = cluster.primary_for_key("distlock:{tried-while-frozen}");
    through_a_frozen_server(
        &a,
        Duration::from_millis(1500),
        || cluster.node(frozen).signal("STOP"),
        || cluster.node(frozen).signal("CONT"),
    )
    .await;
    nothing_refused(
        cluster
            .live()
            .into_iter()
            .map(|node| (format!("node {node}"), cluster.connection_to(node)))
            .collect(),
    );
    // The same user without `PING`: the readiness probe says what to grant.
    let rules = documented_rules(Deployment::Cluster, &["PING"]);
    for node in cluster.live() {
        set_user(&mut cluster.connection_to(node), "documented", &rules);
    }
    ping_is_refused_by_name(&client()).await;
}

/// Three Redlock masters at the default `Config` (which also asks `ROLE`, and keeps fencing
/// counters): one master frozen past the node timeout (50 ms), so that it is asked in the
/// background until it answers, and thawed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_user_of_redlock_is_refused_nothing() {
    let masters = start_masters(3);
    let rules = documented_rules(Deployment::Redlock, &[]);
    for master in &masters {
        set_user(&mut master.connection(), "documented", &rules);
    }
    let urls: Vec<String> = masters.iter().map(|m| as_documented(&m.url())).collect();
    let client = || Client::new(Config::redlock(&urls).expect("urls")).expect("client");
    let (a, b) = (client(), client());
    support::acl::every_kind_and_the_operator_tools(&a, &b).await;
    through_a_frozen_server(
        &a,
        Duration::from_millis(500),
        || masters[0].signal("STOP"),
        || masters[0].signal("CONT"),
    )
    .await;
    nothing_refused(
        masters
            .iter()
            .map(|master| (format!("master {}", master.port()), master.connection()))
            .collect(),
    );
    // The same user without `PING` on every master: the readiness probe says what to grant.
    let rules = documented_rules(Deployment::Redlock, &["PING"]);
    for master in &masters {
        set_user(&mut master.connection(), "documented", &rules);
    }
    let message = ping_is_refused_by_name(&client()).await;
    assert!(
        message.contains("0 of 3 Redlock masters answered"),
        "{message}"
    );
}

/// Asserts that `client`'s `ping` fails with a server error that names `PING` and how to grant
/// it, and returns the message.
async fn ping_is_refused_by_name(client: &Client) -> String {
    let err = client.ping().await.expect_err("PING is refused");
    let LockError::Backend(backend) = &err else {
        panic!("a backend error: {err:?}");
    };
    assert_eq!(backend.kind(), BackendErrorKind::Server, "{err}");
    let message = err.to_string();
    assert!(message.contains("`PING`"), "{message}");
    assert!(message.contains("ACL SETUSER <user> +ping"), "{message}");
    assert!(message.contains("docs/keys-and-acls.md"), "{message}");
    message
}

/// A user without `PING`: locks work, and `Client::ping` fails with a server error that names
/// `PING` and how to grant it (before: a bare `NOPERM` and "check its log and ACLs").
#[tokio::test]
async fn ping_refused_by_the_acl_is_an_error_that_names_it_and_how_to_grant_it() {
    let server = RedisServer::start();
    set_user(
        &mut server.connection(),
        "documented",
        &documented_rules(Deployment::Single, &["PING"]),
    );
    let client =
        Client::new(Config::from_url(&as_documented(&server.url())).expect("url")).expect("client");
    let guard = client.lock("p").acquire().await.expect("locks work");
    assert!(guard.release().await.expect("release"));
    ping_is_refused_by_name(&client).await;
}

/// Freezes `master` (SIGSTOP) while `client` takes and gives back a lock — the master misses
/// the node timeout and is asked in the background — and thaws it (SIGCONT) within the
/// response timeout, so that the `PING` waiting on it is answered.
async fn a_missed_node_timeout(client: &Client, master: &RedisServer, name: &str) {
    master.signal("STOP");
    let guard = client
        .lock(name)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the two other masters grant it");
    // The freeze itself: nothing to await but time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    master.signal("CONT");
    assert!(guard.release().await.expect("release"));
}

/// A Redlock master whose ACL refuses `PING` (the others have the documented user) at the
/// default `Config`: once it missed its node timeout and answered again, it was asked every
/// 100 ms for good, each refusal in its `ACL LOG` (20 after 2 s), and never waited for again.
/// Now the refusal is its answer: one refusal per miss, a second miss is asked again (so the
/// first had ended: the master was waited for again), and the client warns once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_master_that_refuses_ping_is_asked_once_per_missed_timeout_and_told_once() {
    let captured = support::capture::install();
    let masters = start_masters(3);
    set_user(
        &mut masters[0].connection(),
        "documented",
        &documented_rules(Deployment::Redlock, &["PING"]),
    );
    for master in &masters[1..] {
        set_user(
            &mut master.connection(),
            "documented",
            &documented_rules(Deployment::Redlock, &[]),
        );
    }
    let urls: Vec<String> = masters.iter().map(|m| as_documented(&m.url())).collect();
    let client = Client::new(Config::redlock(&urls).expect("urls")).expect("client");
    let guard = client.lock("warm").acquire().await.expect("acquire");
    assert!(guard.release().await.expect("release"));
    a_missed_node_timeout(&client, &masters[0], "first").await;
    // Two seconds of asking: the old loop's 20 refusals.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first = refusals_of(&mut masters[0].connection(), "ping");
    // One per miss; a request of the release or the lock that itself ran past the 50 ms node
    // timeout on a loaded machine is another miss.
    assert!(
        (1..=3).contains(&first),
        "{first} refused PINGs in 2 s after one missed node timeout"
    );
    a_missed_node_timeout(&client, &masters[0], "second").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let second = loop {
        let seen = refusals_of(&mut masters[0].connection(), "ping");
        if seen > first || std::time::Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        second > first && second <= first + 3,
        "the second miss is asked again, once: {first} then {second} refusals"
    );
    // A majority answers the client's own `PING`.
    client.ping().await.expect("two of three masters answer");
    let port = format!(":{}", masters[0].port());
    let told: Vec<_> = captured
        .records()
        .into_iter()
        .filter(|record| record.level == tracing::Level::WARN)
        .filter(|record| record.name.contains("refuses `PING`"))
        .filter(|record| record.field("error").is_some_and(|e| e.contains(&port)))
        .collect();
    assert_eq!(told.len(), 1, "{told:#?}");
    assert!(
        told[0]
            .field("error")
            .is_some_and(|e| e.contains("ACL SETUSER <user> +ping")),
        "{told:#?}"
    );
    for master in &masters[1..] {
        nothing_refused(vec![(
            format!("master {}", master.port()),
            master.connection(),
        )]);
    }
}
