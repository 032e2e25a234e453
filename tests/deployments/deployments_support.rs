//! The test support's Redis deployments checked against real processes: a 3+3 Redis Cluster
//! (forming, hash tags, manual failover, a SIGKILLed primary, a slot moved), a primary with
//! replicas under three sentinels (following a SIGKILL failover), and independent masters.
//! Other tests build on these; when one of them fails, this file says whether the support is
//! to blame.

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use crate::support::cluster::{RedisCluster, SLOTS};
use crate::support::masters::start_masters;
use crate::support::sentinel::SentinelSetup;
use crate::support::Role;

/// The cluster these tests share, held alone: a failover or a slot move in one test would
/// otherwise send another test's commands to a node that no longer serves them. Not the
/// binary's `shared_cluster`, which other tests expect as they left it.
fn shared() -> (&'static RedisCluster, MutexGuard<'static, ()>) {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    static ALONE: Mutex<()> = Mutex::new(());
    let alone = ALONE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    (CLUSTER.get_or_init(RedisCluster::start), alone)
}

#[test]
fn a_started_cluster_is_ok_on_every_node() {
    let (cluster, _alone) = shared();
    assert_eq!(cluster.urls().len(), 6);
    for index in cluster.live() {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut cluster.connection_to(index))
            .unwrap();
        assert!(info.contains("cluster_state:ok"), "node {index}: {info}");
        assert!(
            info.contains(&format!("cluster_slots_ok:{SLOTS}")),
            "{info}"
        );
    }
    assert_eq!(cluster.primaries().len(), 3);
    assert_eq!(cluster.replicas().len(), 3);
}

#[test]
fn keys_with_one_hash_tag_land_on_one_primary() {
    let (cluster, _alone) = shared();
    let keys = [
        "distlock:{order-7}",
        "distlock:{order-7}:readers",
        "{order-7}",
    ];
    let slot = cluster.slot_of(keys[0]);
    for key in keys {
        assert_eq!(cluster.slot_of(key), slot, "{key}");
    }
    let primary = cluster.primary_for_slot(slot);
    let mut redis = cluster.connection_to(primary);
    for key in keys {
        let _: () = redis::cmd("SET").arg(key).arg(1).query(&mut redis).unwrap();
    }
    let found: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(10)
        .query(&mut redis)
        .unwrap();
    assert_eq!(found.len(), keys.len(), "{found:?}");
}

#[test]
fn a_manual_failover_swaps_a_primary_and_its_replica() {
    let (cluster, _alone) = shared();
    let primary = cluster.primary_for_key("{failover}");
    let started = Instant::now();
    let promoted = cluster.failover(primary);
    eprintln!("manual failover took {:?}", started.elapsed());
    assert_eq!(cluster.role(promoted), Some(Role::Primary));
    assert_eq!(
        cluster.role(primary),
        Some(Role::Replica {
            primary_port: cluster.port(promoted)
        })
    );
    assert_eq!(cluster.primary_for_key("{failover}"), promoted);
}

#[test]
fn a_slot_moves_with_its_keys_and_answers_ask_half_way() {
    let (cluster, _alone) = shared();
    let key = "{moving}:a";
    let slot = cluster.slot_of(key);
    let from = cluster.primary_for_slot(slot);
    let to = *cluster.primaries().iter().find(|&&p| p != from).unwrap();
    let mut source = cluster.connection_to(from);
    for suffix in ["a", "b", "c"] {
        let _: () = redis::cmd("SET")
            .arg(format!("{{moving}}:{suffix}"))
            .arg(suffix)
            .query(&mut source)
            .unwrap();
    }

    let migration = cluster.start_migration(slot, from, to);
    assert_eq!(migration.move_keys(cluster, 1), 1);
    let moved: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(10)
        .query(&mut cluster.connection_to(to))
        .unwrap();
    let err = redis::cmd("GET")
        .arg(&moved[0])
        .query::<Option<String>>(&mut source)
        .unwrap_err();
    assert!(err.to_string().to_lowercase().contains("ask"), "{err}");
    migration.finish(cluster);

    assert_eq!(cluster.primary_for_slot(slot), to);
    let value: String = redis::cmd("GET")
        .arg(key)
        .query(&mut cluster.connection_to(to))
        .unwrap();
    assert_eq!(value, "a");
}

#[test]
fn a_killed_primarys_replica_takes_over_and_the_node_rejoins_empty() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start();
    eprintln!("cluster startup took {:?}", started.elapsed());
    let primary = cluster.primary_for_key("{crash}");
    let started = Instant::now();
    cluster.kill(primary);
    let promoted = cluster.wait_until_replica_promoted(primary);
    eprintln!("failover after SIGKILL took {:?}", started.elapsed());
    assert_eq!(cluster.primary_for_key("{crash}"), promoted);

    let started = Instant::now();
    cluster.restart(primary);
    eprintln!("rejoining took {:?}", started.elapsed());
    assert_eq!(
        cluster.role(primary),
        Some(Role::Replica {
            primary_port: cluster.port(promoted)
        })
    );
    cluster.script_flush_all();
}

#[test]
fn sentinels_name_the_primary_and_follow_a_killed_one() {
    let started = Instant::now();
    let mut setup = SentinelSetup::start("distlock-test");
    eprintln!("sentinel setup startup took {:?}", started.elapsed());
    assert_eq!(setup.sentinel_urls().len(), 3);
    let old = setup.current_primary_port();
    assert_eq!(setup.server(old).role(), Some(Role::Primary));
    assert_eq!(setup.primary_url(), format!("redis://127.0.0.1:{old}"));

    let started = Instant::now();
    assert_eq!(setup.kill_primary(), old);
    let new = setup.wait_for_failover(old);
    eprintln!(
        "sentinel failover after SIGKILL took {:?}",
        started.elapsed()
    );
    assert_ne!(new, old);
    assert_eq!(setup.current_primary_port(), new);

    setup.restart_killed();
    assert_eq!(
        setup.server(old).role(),
        Some(Role::Replica { primary_port: new })
    );
}

#[test]
fn independent_masters_each_say_master() {
    let masters = start_masters(3);
    let mut ports: Vec<u16> = masters.iter().map(|m| m.port()).collect();
    ports.dedup();
    assert_eq!(ports.len(), 3);
    for master in &masters {
        assert_eq!(master.role(), Some(Role::Primary), "{}", master.url());
    }
}

/// The README's "the tests never use a server already running on 6379": the support never
/// hands out Redis's or Sentinel's default port (every server, proxy and cluster node takes
/// its port from `free_port` or `claim_port`), and refuses to start a server on one. Shown to
/// fail with the default ports taken out of `claim_port` (6379 was handed out).
#[test]
fn the_support_never_hands_out_or_starts_a_server_on_a_redis_default_port() {
    for port in crate::support::DEFAULT_PORTS {
        assert!(
            !crate::support::claim_port(port),
            "port {port} could be handed out to a test"
        );
        let refused =
            crate::support::RedisServer::launch(port, crate::support::server_args(port, &[]));
        assert!(
            refused
                .as_ref()
                .is_err_and(|err| err.contains(&port.to_string())),
            "a server could be started on port {port}"
        );
    }
    assert!(!crate::support::DEFAULT_PORTS.contains(&crate::support::free_port()));
}
