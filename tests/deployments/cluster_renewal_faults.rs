//! Cluster renewals, sent as one pipeline per primary, under faults inside a pipeline: a live
//! migration of two slots (`TRYAGAIN` and `ASK` among the replies), a primary SIGKILLed or
//! SIGSTOPped past the response timeout (its leases fail this round, with no request per lease
//! and no lease of another primary lost). The requests are counted from the store's TRACE events,
//! told apart from other clients' by the client's first node URL (`seed`), which no other test
//! on the shared cluster puts first. Neighbour: `cluster.rs`, whose helpers these share.

use std::collections::HashSet;
use std::time::Duration;

use crate::cluster::{
    client, lock_key, names_sharing_slots, pipelined_rounds, ports_in, wait_for_renewal, DEDICATED,
};
use crate::support;
use crate::support::capture::Record;
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
        let to = *cluster
            .primaries()
            .iter()
            .find(|&&primary| primary != from)
            .expect("another primary");
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
    let _one_at_a_time = DEDICATED.lock().await;
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
                && r.field("first").is_some_and(|name| name.starts_with(&stem))
        })
        .collect();
    assert!(
        one_by_one.is_empty(),
        "calls split into a request per lease: {one_by_one:?}"
    );
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
