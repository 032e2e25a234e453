//! Cluster renewals, sent as one pipeline per primary, under faults inside a pipeline: a live
//! migration of two slots (`TRYAGAIN` and `ASK` among the replies), a primary SIGKILLed or
//! SIGSTOPped past the response timeout (its leases fail this round, with no request per lease
//! and no lease of another primary lost), a cluster down after a primary with no replica was
//! killed (`CLUSTERDOWN` from every node: the calls fail, none goes alone), and per-primary
//! connections refused for their credentials (batching turns off with one warning, reads the
//! slot map only when it tries again, and comes back by itself). At the default `Config`, a
//! frozen primary, or under the failover guard a primary whose replica is frozen, costs only
//! its own leases: the other primaries' answers reach their leases as they come. The requests
//! are counted from the store's TRACE events, told apart from other clients' by the client's
//! first node URL (`seed`), which no other test on the shared cluster puts first. Neighbour:
//! `cluster.rs`, whose helpers these share.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::cluster::{
    client, lock_key, names_sharing_slots, pipelined_rounds, ports_in, wait_for_renewal, DEDICATED,
};
use crate::support;
use crate::support::capture::{Captured, Record};
use crate::support::cluster::{shared_cluster, RedisCluster, SlotMigration};
use distlock::{Client, Config, LockGuard};
use redis::cluster_routing::Slot;

/// The port a record's `field` names (`host:port`; the first of a list).
fn port_in(record: &Record, field: &str) -> Option<u16> {
    ports_in(record, field).first().copied()
}

/// The cluster's node URLs with node `first` first: its address is then the `seed` of this
/// client's events.
fn urls_from(cluster: &RedisCluster, first: usize, user: Option<(&str, &str)>) -> Vec<String> {
    let mut nodes = cluster.live();
    let at = nodes.iter().position(|&n| n == first).expect("a live node");
    nodes.rotate_left(at);
    nodes
        .into_iter()
        .map(|node| match user {
            Some((user, password)) => {
                format!("redis://{user}:{password}@127.0.0.1:{}", cluster.port(node))
            }
            None => format!("redis://127.0.0.1:{}", cluster.port(node)),
        })
        .collect()
}

async fn acquire_all(client: &Client, names: &[String], lease: Duration) -> Vec<LockGuard> {
    let tasks: Vec<_> = names
        .iter()
        .map(|name| tokio::spawn(client.lock(name).lease(lease).acquire()))
        .collect();
    let mut guards = Vec::new();
    for task in tasks {
        guards.push(task.await.expect("task").expect("lock"));
    }
    guards
}

/// Slot migrations under way on the shared cluster, finished (the rest of their keys moved,
/// the slot handed over) however the test ends, so the next test finds the cluster as it was.
struct Migrating<'a> {
    cluster: &'a RedisCluster,
    migrations: Vec<SlotMigration>,
}

impl Drop for Migrating<'_> {
    fn drop(&mut self) {
        for migration in self.migrations.drain(..) {
            let left = migration.keys_left(self.cluster);
            if !left.is_empty() {
                migration.move_named(self.cluster, &left, true);
            }
            migration.finish(self.cluster);
        }
    }
}

/// Pipelined renewals of many leases over many slots go on through a live migration of two
/// of their slots: in one, half of its locks' keys have moved (the slot's call names keys on
/// both nodes: `TRYAGAIN`, then one call per lock), in the other all of them (`ASK`: the call
/// goes alone through the cluster connection, which follows it). After two leases every lease
/// is still held, the locks of both slots were renewed, and every round still went out as one
/// request per primary for the other slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_renewals_go_on_while_two_of_their_slots_migrate() {
    const SPREAD: usize = 90;
    let captured = support::capture::install();
    let cluster = shared_cluster();
    let seed_node = 1;
    let seed = cluster.port(seed_node);
    let run = fastrand::u32(..);
    let lease = Duration::from_millis(1500);
    let client = Client::new(
        Config::cluster(urls_from(cluster, seed_node, None))
            .expect("urls")
            .response_timeout(Duration::from_millis(500)),
    )
    .expect("client");
    let groups = names_sharing_slots(&format!("migrating{run}-"), 2, 4);
    let (split, moved) = (&groups[0], &groups[1]);
    let spread: Vec<String> = (0..SPREAD).map(|i| format!("spread{run}-{i}")).collect();
    let names: Vec<String> = groups.iter().flatten().chain(&spread).cloned().collect();
    let guards = acquire_all(&client, &names, lease).await;
    let slots: HashSet<Slot> = names.iter().map(|n| Slot::for_key(lock_key(n))).collect();

    let mut migrating = Migrating {
        cluster,
        migrations: Vec::new(),
    };
    for (group, keys_moved) in [(split, 2), (moved, 4)] {
        let slot = cluster.slot_of(&lock_key(&group[0]));
        let from = cluster.primary_for_slot(slot);
        let to = cluster.another_primary(from);
        let migration = cluster.start_migration(slot, from, to);
        let keys: Vec<String> = group[..keys_moved].iter().map(|n| lock_key(n)).collect();
        migration.move_named(cluster, &keys, false);
        migrating.migrations.push(migration);
    }
    let seen_before = captured.records().len();
    // What is tested is time itself: two leases' worth of renewals with both slots migrating.
    let window = lease * 2;
    tokio::time::sleep(window).await;
    for guard in &guards {
        assert!(
            guard.is_held(),
            "{}: lost while its slot migrates",
            guard.key()
        );
    }
    for name in split.iter().chain(moved) {
        wait_for_renewal(&client, name, lease / 2).await;
    }
    let records = captured.records().split_off(seen_before);
    let calls: usize = records
        .iter()
        .filter(|r| {
            r.name.starts_with("renew: one request for") && port_in(r, "seed") == Some(seed)
        })
        .filter_map(|r| r.field("calls")?.parse::<usize>().ok())
        .sum();
    // Every slot's call goes every third of a lease: six times in the window.
    let rounds = (window.as_millis() / (lease / 3).as_millis()) as usize;
    assert!(
        calls >= (slots.len() - 2) * (rounds - 2),
        "{calls} slot calls sent per primary for {} slots over {rounds} periods",
        slots.len()
    );
    drop(migrating);
    for guard in guards {
        assert!(guard.release().await.expect("release"), "still ours");
    }
}

/// How a primary is made sick.
#[derive(Debug, Clone, Copy)]
enum Sickness {
    /// SIGKILL: its connections are refused.
    Killed,
    /// SIGSTOP: it answers nothing, past any response timeout.
    Frozen,
}

/// Leases in 24 slots, three per slot, renewed one pipeline per primary, while one primary is
/// sick and no failover comes (a minute's node timeout): the leases of the other primaries are
/// all still held after two leases, their primaries got the renewal calls of every round, and
/// the sick primary's calls just failed — none was sent alone through the cluster connection
/// and none was split into one call per lease — costing it at most one request per batch.
async fn a_sick_primary_costs_no_request_per_lease_and_no_lease_elsewhere(sickness: Sickness) {
    const SLOTS: usize = 24;
    const PER_SLOT: usize = 3;
    let _turn = DEDICATED.acquire().await.expect("never closed");
    let captured = support::capture::install();
    let mut cluster = RedisCluster::start_with_node_timeout(Duration::from_secs(60));
    let ports: Vec<u16> = (0..6).map(|index| cluster.port(index)).collect();
    let lease = Duration::from_millis(1500);
    let client = client(&cluster, |config| {
        config.response_timeout(Duration::from_millis(300))
    });
    let stem = format!("sick-{sickness:?}-");
    let groups = names_sharing_slots(&stem, SLOTS, PER_SLOT);
    let names: Vec<String> = groups.iter().flatten().cloned().collect();
    let since = captured.records().len();
    let guards = acquire_all(&client, &names, lease).await;
    let sick = cluster.primary_for_key(&lock_key(&names[0]));
    let sick_port = cluster.port(sick);
    // Asked before the primary is sick: a frozen node would not answer.
    let on_sick: HashSet<&String> = names
        .iter()
        .filter(|n| cluster.primary_for_key(&lock_key(n)) == sick)
        .collect();
    let healthy_slots: HashSet<Slot> = names
        .iter()
        .filter(|n| !on_sick.contains(n))
        .map(|n| Slot::for_key(lock_key(n)))
        .collect();
    assert!(
        !healthy_slots.is_empty() && healthy_slots.len() < SLOTS,
        "the slots must be on the sick primary and on others"
    );
    pipelined_rounds(&captured, since, &ports, SLOTS * 2).await;
    let seen_before = captured.records().len();
    match sickness {
        Sickness::Killed => cluster.kill(sick),
        Sickness::Frozen => cluster.node(sick).signal("STOP"),
    }
    // What is tested is time itself: two leases' worth of renewals with the primary sick.
    let window = lease * 2;
    tokio::time::sleep(window).await;
    let records = captured.records().split_off(seen_before);
    let healthy = |guard: &LockGuard| !on_sick.contains(&guard.key().to_owned());
    let lost: Vec<&str> = guards
        .iter()
        .filter(|guard| healthy(guard) && !guard.is_held())
        .map(LockGuard::key)
        .collect();
    assert!(
        lost.is_empty(),
        "leases of healthy primaries lost: {lost:?}"
    );
    assert_none_alone_or_split(&records, &ports, &stem);
    let ours = |r: &Record, field: &str| ports_in(r, field).iter().any(|p| ports.contains(p));
    let requests: Vec<&Record> = records
        .iter()
        .filter(|r| r.name.starts_with("renew: one request for") && ours(r, "server"))
        .collect();
    let healthy_calls: usize = requests
        .iter()
        .filter(|r| port_in(r, "server") != Some(sick_port))
        .filter_map(|r| r.field("calls")?.parse::<usize>().ok())
        .sum();
    let rounds = (window.as_millis() / (lease / 3).as_millis()) as usize;
    assert!(
        healthy_calls >= healthy_slots.len() * (rounds - 2),
        "{healthy_calls} calls to the healthy primaries for {} slots over {rounds} periods",
        healthy_slots.len()
    );
    let batches = (window.as_millis() / (lease / 6).as_millis()) as usize + 1;
    let to_sick = requests
        .iter()
        .filter(|r| port_in(r, "server") == Some(sick_port))
        .count();
    assert!(
        to_sick <= batches,
        "{to_sick} requests to the sick primary in {batches} batches at most"
    );
    for guard in guards {
        if healthy(&guard) {
            assert!(guard.release().await.expect("release"), "still ours");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_primary_costs_no_request_per_lease_and_no_lease_elsewhere() {
    a_sick_primary_costs_no_request_per_lease_and_no_lease_elsewhere(Sickness::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_costs_no_request_per_lease_and_no_lease_elsewhere() {
    a_sick_primary_costs_no_request_per_lease_and_no_lease_elsewhere(Sickness::Frozen).await;
}

/// How many pipelines (`renew: one request for …`) each of `ports` was sent in `records`.
/// Asserts that no renewal call to the primaries at `ports` went alone, and none of the locks
/// named from `stem` had its call split into a request per lease.
fn assert_none_alone_or_split(records: &[Record], ports: &[u16], stem: &str) {
    let ours = |r: &Record, field: &str| ports_in(r, field).iter().any(|p| ports.contains(p));
    let alone: Vec<&Record> = records
        .iter()
        .filter(|r| {
            r.name.starts_with("renew:") && r.name.ends_with("sent alone") && ours(r, "nodes")
        })
        .collect();
    assert!(alone.is_empty(), "calls sent alone: {alone:?}");
    let one_by_one: Vec<&Record> = records
        .iter()
        .filter(|r| {
            r.name.starts_with("renew:")
                && r.field("leases").is_some()
                && r.field("first").is_some_and(|name| name.starts_with(stem))
        })
        .collect();
    assert!(
        one_by_one.is_empty(),
        "calls split into a request per lease: {one_by_one:?}"
    );
}

fn pipelines_to(records: &[Record], ports: &[u16]) -> Vec<usize> {
    ports
        .iter()
        .map(|&port| {
            records
                .iter()
                .filter(|r| {
                    r.name.starts_with("renew: one request for")
                        && port_in(r, "server") == Some(port)
                })
                .count()
        })
        .collect()
}

/// Waits until each of `ports` was sent `rounds` renewal pipelines since record `since`.
async fn renewal_rounds(captured: &Captured, since: usize, ports: &[u16], rounds: usize) {
    support::wait_until_async(
        &format!("{rounds} renewal rounds on each of {ports:?}"),
        Duration::from_secs(15),
        || {
            let sent = pipelines_to(&captured.records().split_off(since), ports);
            if sent.iter().all(|&n| n >= rounds) {
                Ok(())
            } else {
                Err(format!("pipelines sent: {sent:?}"))
            }
        },
    )
    .await;
}

/// A primary with no replica is SIGKILLed: once the others mark it failed, the cluster is down
/// (`cluster-require-full-coverage`, Redis's default) and every node answers `CLUSTERDOWN` to
/// every call. Renewal rounds go on as one pipeline per primary, each `CLUSTERDOWN` failing its
/// call for the round (the leases are unknown, tried again while they may be in force): no call
/// is sent alone through the cluster connection (which would retry it until its response
/// timeout, one request per slot on every primary every round), none is split into a request
/// per lease, and nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_down_costs_no_request_per_call_and_none_per_lease() {
    const SLOTS: usize = 24;
    const PER_SLOT: usize = 3;
    const ROUNDS: usize = 3;
    let _turn = DEDICATED.acquire().await.expect("never closed");
    let captured = support::capture::install();
    let panics_before = support::panics::library_panics();
    let mut cluster = RedisCluster::start_without_replicas(Duration::from_millis(1000));
    let ports: Vec<u16> = cluster.live().iter().map(|&i| cluster.port(i)).collect();
    // Long enough for a few rounds (retried every tenth of a lease) between the cluster going
    // down and the leases running out.
    let lease = Duration::from_secs(6);
    let client = client(&cluster, |config| {
        config.response_timeout(Duration::from_millis(300))
    });
    let stem = "clusterdown-";
    let groups = names_sharing_slots(stem, SLOTS, PER_SLOT);
    let names: Vec<String> = groups.iter().flatten().cloned().collect();
    let since = captured.records().len();
    let guards = acquire_all(&client, &names, lease).await;
    let killed = cluster.primary_for_key(&lock_key(&names[0]));
    let on_every_primary: HashSet<usize> = names
        .iter()
        .map(|n| cluster.primary_for_key(&lock_key(n)))
        .collect();
    assert_eq!(on_every_primary.len(), 3, "leases on every primary");
    pipelined_rounds(&captured, since, &ports, SLOTS * 2).await;
    cluster.kill(killed);
    cluster.wait_until_down();
    let seen_before = captured.records().len();
    let healthy: Vec<u16> = cluster.live().iter().map(|&i| cluster.port(i)).collect();
    renewal_rounds(&captured, seen_before, &healthy, ROUNDS).await;
    let records = captured.records().split_off(seen_before);
    assert_none_alone_or_split(&records, &ports, stem);
    assert_eq!(
        support::panics::library_panics(),
        panics_before,
        "panics in distlock or the redis crate while the cluster was down"
    );
    drop(guards);
}

/// An ACL user of the shared cluster, deleted from every node however the test ends.
struct AclUser<'a> {
    cluster: &'a RedisCluster,
    name: String,
}

impl AclUser<'_> {
    /// Sets the user's rules on every live node.
    fn set(&self, rules: &[&str]) {
        for node in self.cluster.live() {
            let () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg(&self.name)
                .arg(rules)
                .query(&mut self.cluster.connection_to(node))
                .unwrap_or_else(|err| panic!("ACL SETUSER on node {node}: {err}"));
        }
    }
}

impl AclUser<'_> {
    /// Sets the user's rules on `node` alone.
    fn set_on(&self, node: usize, rules: &[&str]) {
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&self.name)
            .arg(rules)
            .query(&mut self.cluster.connection_to(node))
            .unwrap_or_else(|err| panic!("ACL SETUSER on node {node}: {err}"));
    }

    /// A client of the cluster logged in as this user with `first-password`, seeded with node
    /// `seed_node`, its cluster connection made now (the per-primary ones come at the first
    /// renewal).
    async fn client(&self, seed_node: usize) -> Client {
        let client = Client::new(
            Config::cluster(urls_from(
                self.cluster,
                seed_node,
                Some((&self.name, "first-password")),
            ))
            .expect("urls"),
        )
        .expect("client");
        client.ping().await.expect("ping");
        client
    }
}

impl Drop for AclUser<'_> {
    fn drop(&mut self) {
        for node in self.cluster.live() {
            let _: Result<i64, _> = redis::cmd("ACL")
                .arg("DELUSER")
                .arg(&self.name)
                .query(&mut self.cluster.connection_to(node));
        }
    }
}

/// When the primaries refuse the credentials of new connections (the password changed after
/// the cluster connection logged in), renewals go on alone through the cluster connection,
/// batching turns off with exactly one warning (not one per round), the slot map is read only
/// when batching tries again (a doubling pause), not every batch, and once the password is
/// accepted again batching comes back by itself: the renewals go one request per primary again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_refused_by_the_primaries_warns_once_and_comes_back_by_itself() {
    let captured = support::capture::install();
    let cluster = shared_cluster();
    let user = AclUser {
        cluster,
        name: format!("batcher{}", fastrand::u32(..)),
    };
    user.set(&["reset", "on", ">first-password", "~*", "&*", "+@all"]);
    let seed_node = 2;
    let seed = cluster.port(seed_node);
    let ours = |r: &Record| port_in(r, "seed") == Some(seed);
    let lease = Duration::from_millis(900);
    // The cluster connection logs in now; the per-primary ones only at the first renewal.
    let client = user.client(seed_node).await;
    user.set(&["resetpass", ">second-password"]);
    let seen_before = captured.records().len();
    let names: Vec<String> = (0..30)
        .map(|i| format!("refused-{}-{i}", user.name))
        .collect();
    let guards = acquire_all(&client, &names, lease).await;
    // What is tested is time itself: four leases of renewals with batching refused.
    let window = lease * 4;
    tokio::time::sleep(window).await;
    for guard in &guards {
        assert!(
            guard.is_held(),
            "{}: lost while batching is off",
            guard.key()
        );
    }
    let records = captured.records().split_off(seen_before);
    let warnings: Vec<&Record> = records
        .iter()
        .filter(|r| r.level == tracing::Level::WARN && ours(r))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning that batching is off, not one per round: {warnings:?}"
    );
    let warning = &warnings[0];
    assert!(
        warning.name.contains("credentials") && warning.field("cause").is_some(),
        "the warning says why and what to check: {warning:?}"
    );
    let reads = records
        .iter()
        .filter(|r| r.name.starts_with("reading the Redis Cluster's slot map") && ours(r))
        .count();
    // Tries after 1 s, 2 s more and 4 s more: at most three reads in 3.6 s, where a read per
    // batch would be one per sixth of a lease (24).
    assert!(
        reads <= 3,
        "{reads} reads of the slot map while batching is off"
    );
    // Only the tries send pipelines (each refused), one per primary.
    let pipelines_while_off = records
        .iter()
        .filter(|r| r.name.starts_with("renew: one request for") && ours(r))
        .count();
    let primaries = cluster.primaries().len();
    assert!(
        pipelines_while_off <= (reads + 1) * primaries,
        "{pipelines_while_off} pipelines while batching is off, after {reads} tries"
    );

    user.set(&[">first-password"]);
    let restored_at = captured.records().len();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let records = captured.records().split_off(restored_at);
        let back = records.iter().any(|r| {
            r.name
                .starts_with("Redis Cluster renewals are sent one pipeline")
                && ours(r)
        });
        let batched = records
            .iter()
            .any(|r| r.name.starts_with("renew: one request for") && ours(r));
        if back && batched {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "batching did not come back within 40 s of the password being accepted again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for guard in guards {
        assert!(guard.release().await.expect("release"), "still ours");
    }
}

/// One primary refuses the credentials of new connections; this client's leases on it are
/// long (3 s: renewed every second, early by up to half a second to join another round) and
/// its leases elsewhere short (450 ms: a round every 150 ms), so most renewal rounds do not
/// reach that primary and the others do. Batching
/// turns off with one warning and stays off: a round that does not reach the failed primary
/// and works elsewhere does not turn it on again (which made the next round that reached it
/// warn anew and start the pauses over — three warnings and two "again" in 4 s).
/// Once the password is accepted there again, batching comes back by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_off_for_one_primary_stays_off_though_rounds_that_miss_it_work() {
    let captured = support::capture::install();
    let cluster = shared_cluster();
    let user = AclUser {
        cluster,
        name: format!("onebatcher{}", fastrand::u32(..)),
    };
    user.set(&["reset", "on", ">first-password", "~*", "&*", "+@all"]);
    let culprit = cluster.primaries()[0];
    let seed_node = cluster.another_primary(culprit);
    let seed = cluster.port(seed_node);
    let ours = |r: &Record| port_in(r, "seed") == Some(seed);
    let (long, short) = (Duration::from_secs(3), Duration::from_millis(450));
    let client = user.client(seed_node).await;
    user.set_on(culprit, &["resetpass", ">second-password"]);
    let on_culprit =
        |name: &String| cluster.primary_for_key(&format!("distlock:{{{name}}}")) == culprit;
    let all: Vec<String> = (0..200).map(|i| format!("one-{}-{i}", user.name)).collect();
    let there: Vec<String> = all
        .iter()
        .filter(|n| on_culprit(n))
        .take(10)
        .cloned()
        .collect();
    let elsewhere: Vec<String> = all
        .iter()
        .filter(|n| !on_culprit(n))
        .take(10)
        .cloned()
        .collect();
    assert_eq!(
        (there.len(), elsewhere.len()),
        (10, 10),
        "names on both sides"
    );
    let seen_before = captured.records().len();
    let mut guards = acquire_all(&client, &there, long).await;
    guards.extend(acquire_all(&client, &elsewhere, short).await);
    // What is tested is time itself: 4 s of rounds, pauses of 1 s and 2 s among them.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for guard in &guards {
        assert!(
            guard.is_held(),
            "{}: lost while batching is off",
            guard.key()
        );
    }
    let records = captured.records().split_off(seen_before);
    let warnings = records
        .iter()
        .filter(|r| r.level == tracing::Level::WARN && ours(r))
        .count();
    let again = records
        .iter()
        .filter(|r| {
            r.name
                .starts_with("Redis Cluster renewals are sent one pipeline")
                && ours(r)
        })
        .count();
    assert_eq!(
        (warnings, again),
        (1, 0),
        "one warning, and batching not on again while the primary still refuses"
    );

    user.set_on(culprit, &[">first-password"]);
    let restored_at = captured.records().len();
    let deadline = Instant::now() + Duration::from_secs(40);
    while !captured.records().split_off(restored_at).iter().any(|r| {
        r.name
            .starts_with("Redis Cluster renewals are sent one pipeline")
            && ours(r)
    }) {
        assert!(
            Instant::now() < deadline,
            "batching did not come back within 40 s of the password being accepted again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for guard in guards {
        assert!(guard.release().await.expect("release"), "still ours");
    }
}

/// A node of a cluster SIGSTOPped for as long as this lives, thawed (`SIGCONT`) when it is
/// dropped, also when the test panics meanwhile (and the cluster's drop kills it anyway).
struct Frozen<'a> {
    cluster: &'a RedisCluster,
    node: usize,
}

impl<'a> Frozen<'a> {
    fn freeze(cluster: &'a RedisCluster, node: usize) -> Self {
        cluster.node(node).signal("STOP");
        Self { cluster, node }
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        self.cluster.node(self.node).signal("CONT");
    }
}

/// `healthy` names whose locks live on primaries other than `sick` (spread over them, each in
/// a slot of its own), and one name whose lock lives on `sick`; all start with `stem`.
fn names_around(
    cluster: &RedisCluster,
    stem: &str,
    sick: usize,
    healthy: usize,
) -> (Vec<String>, String) {
    let mut on_sick = None;
    let mut elsewhere: Vec<String> = Vec::new();
    let mut per_primary: std::collections::HashMap<usize, usize> = Default::default();
    let others = cluster.primaries().len() - 1;
    for i in 0.. {
        let name = format!("{stem}{i}");
        let primary = cluster.primary_for_key(&lock_key(&name));
        if primary == sick {
            on_sick.get_or_insert(name);
        } else if elsewhere.len() < healthy
            && per_primary.get(&primary).copied().unwrap_or(0) < healthy.div_ceil(others)
            && !elsewhere
                .iter()
                .any(|other| Slot::for_key(lock_key(other)) == Slot::for_key(lock_key(&name)))
        {
            *per_primary.entry(primary).or_default() += 1;
            elsewhere.push(name);
        }
        if elsewhere.len() == healthy && on_sick.is_some() {
            break;
        }
    }
    (elsewhere, on_sick.expect("a name on the sick primary"))
}

/// For each lease: four locks on the healthy primaries and one on `sick`'s, all renewed by
/// one client made by `config`; then `node` (the sick primary itself, or its replica) is
/// frozen for two leases, which costs the sick primary's lock (asserted: the fault took
/// effect). Returns, per lease, the healthy locks lost meanwhile (none may be: a slow or
/// frozen server costs only the leases whose renewals wait on it), and how long their releases
/// took, made before the node is thawed.
async fn healthy_leases_lost_while_frozen(
    cluster: &RedisCluster,
    config: impl Fn(Config) -> Config,
    sick: usize,
    node: usize,
    stem: &str,
) -> Vec<WhileFrozen> {
    let captured = support::capture::install();
    let ports: Vec<u16> = cluster
        .primaries()
        .iter()
        .map(|&p| cluster.port(p))
        .collect();
    let client = client(cluster, config);
    let mut seen = Vec::new();
    for millis in [1600, 1800, 2000] {
        let lease = Duration::from_millis(millis);
        let (healthy, on_sick) = names_around(cluster, &format!("{stem}{millis}-"), sick, 4);
        let names: Vec<String> = healthy.iter().cloned().chain([on_sick]).collect();
        let since = captured.records().len();
        let guards = acquire_all(&client, &names, lease).await;
        // Renewals go one pipeline per primary before the node freezes (the first round of a
        // new client may go alone, to load the script).
        pipelined_rounds(&captured, since, &ports, names.len() * 2).await;
        // The client's own cluster connection, which releases use, is made before the node
        // freezes: under the guard, grants and renewals go on connections of their own, and
        // a cluster connection first made while a node is frozen waits out its connect
        // timeout there (not what this test is about).
        client.inspect(&names[0]).await.expect("inspect");
        let frozen = Frozen::freeze(cluster, node);
        // What is tested is time itself: two leases with the node frozen.
        tokio::time::sleep(lease * 2).await;
        let lost: Vec<String> = guards[..healthy.len()]
            .iter()
            .filter(|guard| !guard.is_held())
            .map(|guard| guard.key().to_owned())
            .collect();
        let fault_took_effect = !guards[healthy.len()].is_held();
        // Released while the node is still frozen: a release waits for nothing of it.
        let mut slowest_release = Duration::ZERO;
        for (at, guard) in guards.into_iter().enumerate() {
            if at < healthy.len() && guard.is_held() {
                let started = Instant::now();
                assert!(guard.release().await.expect("release"), "still ours");
                slowest_release = slowest_release.max(started.elapsed());
            }
        }
        drop(frozen);
        assert!(
            fault_took_effect,
            "the lease whose renewals wait on the frozen node was kept: nothing was tested"
        );
        seen.push(WhileFrozen {
            lease,
            lost,
            slowest_release,
        });
    }
    seen
}

/// What became of the healthy locks of one lease while a node was frozen.
#[derive(Debug)]
struct WhileFrozen {
    lease: Duration,
    /// The healthy locks lost.
    lost: Vec<String>,
    /// The longest a healthy lock's release took, the node still frozen.
    slowest_release: Duration,
}

/// Asserts that no healthy lease was lost, and that each release, made while the node was
/// still frozen, took less than half the default response timeout (a round trip to a healthy
/// primary; a release that waited for the frozen node's renewal answer would take up to the
/// response timeout).
fn assert_only_the_frozen_node_cost_anything(what: &str, seen: &[WhileFrozen]) {
    let most = distlock::DEFAULT_RESPONSE_TIMEOUT / 2;
    let failed: Vec<String> = seen
        .iter()
        .filter(|seen| !seen.lost.is_empty() || seen.slowest_release >= most)
        .map(|seen| {
            format!(
                "lease {:?}: {} of the healthy leases lost {:?}, slowest release {:?}",
                seen.lease,
                seen.lost.len(),
                seen.lost,
                seen.slowest_release
            )
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{what}: healthy leases lost, or a release took {most:?} or more: {failed:#?}"
    );
}

/// Four locks on healthy primaries and one on a primary that is SIGSTOPped for two leases,
/// at the DEFAULT `Config` (a 1 s response timeout) and leases of 1.6, 1.8 and 2 s: every
/// healthy lease stays held (the frozen primary's own lease is lost), and its release, made
/// while the primary is still frozen, waits for nothing of it. A renewal round sends one
/// pipeline per primary; each primary's answers reach its leases as they come, while the
/// frozen primary's calls wait out the response timeout. On `f597559` the round waited for
/// every primary, its answers came after the healthy leases' deadlines, and 4 of 4 healthy
/// leases were lost at each of these leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_costs_no_lease_of_another_primary_at_the_default_config() {
    let _turn = DEDICATED.acquire().await.expect("never closed");
    let cluster = RedisCluster::start_with_node_timeout(Duration::from_secs(60));
    let sick = cluster.primaries()[0];
    let seen =
        healthy_leases_lost_while_frozen(&cluster, |config| config, sick, sick, "frozen-").await;
    assert_only_the_frozen_node_cost_anything("a primary frozen", &seen);
}

/// The same under the failover guard at its largest timeout the DEFAULT response timeout
/// accepts (999 ms): the replica of one primary is SIGSTOPped, so that primary's `WAIT` waits
/// out the guard's timeout every round (its lease is lost: its renewals do not count); the
/// other primaries' guarded renewals do not wait for it, every healthy lease stays held and
/// its release waits for nothing of it. Guarded renewals run on transports lent for them, and
/// one made while the replica is frozen goes by its parent's slot map at once rather than
/// first making a cluster connection (which connects to every node, the frozen one too). On
/// `f597559` each round waited for that `WAIT`, and 4 of 4 healthy leases were lost at each
/// lease; with the rounds fixed but a new transport waiting for its cluster connection, 4 of 4
/// were lost at 1.8 s in one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_costs_no_guarded_lease_of_another_primary() {
    let _turn = DEDICATED.acquire().await.expect("never closed");
    let cluster = RedisCluster::start_with_node_timeout(Duration::from_secs(60));
    let sick = cluster.primaries()[0];
    let replica = cluster.replicas_of(sick)[0];
    let guard_timeout = distlock::DEFAULT_RESPONSE_TIMEOUT - Duration::from_millis(1);
    let seen = healthy_leases_lost_while_frozen(
        &cluster,
        |config| config.replicas(1, guard_timeout),
        sick,
        replica,
        "lagging-",
    )
    .await;
    assert_only_the_frozen_node_cost_anything("a primary's replica frozen (guarded)", &seen);
}
