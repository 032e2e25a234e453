//! The test support's etcd members and clusters checked against the real processes: a member
//! answers on loopback ports of its own, takes etcd's defaults unless a test passes flags (a
//! lease's minimum TTL shows which), keeps its writes across a SIGKILL, a frozen one answers
//! nothing until thawed, a cluster elects a new leader when its leader is killed or frozen and
//! takes the member back, two clusters stay apart, auth confines the limited user to its
//! prefix, and no process outlives a test that panics. The etcd store's tests build on it;
//! when one of them fails, this file says whether the support is to blame.

use std::ffi::OsStr;
use std::time::Duration;

use etcd_client::Client;

use crate::support::etcd::{
    find_etcd, shared_etcd, EtcdCluster, EtcdServer, CLUSTER_SIZE, DEFAULT_PORTS, LEADER_TIMEOUT,
    ROOT_USER,
};
use crate::support::process::{is_gone, is_stopped};

/// How long a request may take on a loaded machine where it should succeed.
const ANSWER: Duration = Duration::from_secs(10);

async fn put(client: &mut Client, key: &str, value: &str) -> Result<(), etcd_client::Error> {
    tokio::time::timeout(ANSWER, client.put(key, value, None))
        .await
        .unwrap_or_else(|_| panic!("no answer to put {key} in {ANSWER:?}"))
        .map(|_| ())
}

async fn get(client: &mut Client, key: &str) -> Result<Option<String>, etcd_client::Error> {
    let reply = tokio::time::timeout(ANSWER, client.get(key, None))
        .await
        .unwrap_or_else(|_| panic!("no answer to get {key} in {ANSWER:?}"))?;
    Ok(reply
        .kvs()
        .first()
        .map(|kv| kv.value_str().unwrap().to_string()))
}

#[tokio::test]
async fn a_member_answers_on_loopback_ports_of_its_own_and_leaves_nothing_when_dropped() {
    let server = EtcdServer::start();
    assert_eq!(
        server.endpoint(),
        format!("http://127.0.0.1:{}", server.port())
    );
    assert!(!DEFAULT_PORTS.contains(&server.port()));

    let mut client = server.client().await;
    put(&mut client, "greeting", "hello").await.unwrap();
    assert_eq!(
        get(&mut client, "greeting").await.unwrap().as_deref(),
        Some("hello")
    );
    let members = client.member_list().await.unwrap();
    let [member] = members.members() else {
        panic!("not one member: {:?}", members.members())
    };
    assert_eq!(member.client_urls(), [server.endpoint()]);
    assert_eq!(member.peer_urls(), [server.peer_url()]);

    let (pid, data_dir) = (server.pid(), server.data_dir());
    assert!(data_dir.join("member").is_dir());
    drop(server);
    assert!(is_gone(pid), "etcd {pid} outlives its server");
    assert!(!data_dir.exists(), "{} is left", data_dir.display());
}

#[tokio::test]
async fn a_lease_is_two_seconds_at_least_at_the_defaults_and_flags_change_that() {
    // etcd raises a shorter TTL to 1.5 election timeouts, rounded up to whole seconds.
    let granted = |server: EtcdServer| async move {
        let reply = server.client().await.lease_grant(1, None).await.unwrap();
        reply.ttl()
    };
    assert_eq!(granted(EtcdServer::start()).await, 2);
    let fast = [
        ("--heartbeat-interval", "50"),
        ("--election-timeout", "500"),
    ];
    assert_eq!(granted(EtcdServer::start_with(&fast)).await, 1);
}

#[tokio::test]
async fn the_shared_member_is_one_for_the_whole_binary() {
    assert_eq!(shared_etcd().pid(), shared_etcd().pid());
    let mut client = shared_etcd().client().await;
    let key = "etcd_server/the_shared_member_is_one_for_the_whole_binary";
    put(&mut client, key, "1").await.unwrap();
    assert_eq!(get(&mut client, key).await.unwrap().as_deref(), Some("1"));
}

#[tokio::test]
async fn a_member_keeps_its_writes_across_a_sigkill_and_a_restart_on_the_same_port() {
    let mut server = EtcdServer::start();
    let (endpoint, pid) = (server.endpoint(), server.pid());
    put(&mut server.client().await, "kept", "7").await.unwrap();

    server.kill();
    assert!(is_gone(pid));
    assert!(!server.is_running());
    server.restart();
    assert_eq!(server.endpoint(), endpoint);
    let mut client = server.client().await;
    assert_eq!(
        get(&mut client, "kept").await.unwrap().as_deref(),
        Some("7")
    );

    // A clean stop and a restart keep it too.
    put(&mut client, "kept", "8").await.unwrap();
    server.restart();
    let mut client = server.client().await;
    assert_eq!(
        get(&mut client, "kept").await.unwrap().as_deref(),
        Some("8")
    );
}

#[tokio::test]
async fn a_frozen_member_answers_nothing_until_thawed() {
    let server = EtcdServer::start();
    let mut client = server.client().await;
    put(&mut client, "frozen", "no").await.unwrap();

    server.freeze();
    assert!(is_stopped(server.pid()));
    let unanswered = tokio::time::timeout(Duration::from_millis(500), client.get("frozen", None));
    assert!(unanswered.await.is_err(), "a frozen member answered");

    server.thaw();
    assert!(!is_stopped(server.pid()));
    assert_eq!(
        get(&mut client, "frozen").await.unwrap().as_deref(),
        Some("no")
    );
}

#[tokio::test]
async fn a_cluster_takes_writes_after_its_leader_is_killed_and_takes_the_member_back() {
    let mut cluster = EtcdCluster::start();
    assert_eq!(cluster.endpoints().len(), CLUSTER_SIZE);
    let mut client = cluster.client().await;
    put(&mut client, "before", "1").await.unwrap();
    let members = client.member_list().await.unwrap();
    assert_eq!(members.members().len(), CLUSTER_SIZE);

    let old = cluster.leader().await;
    let old_pid = cluster.member(old).pid();
    cluster.kill(old);
    assert!(is_gone(old_pid));
    let new = cluster.wait_for_leader(LEADER_TIMEOUT, Some(old)).await;
    assert_ne!(new, old);
    for index in (0..CLUSTER_SIZE).filter(|index| *index != old) {
        let mut survivor = cluster.member(index).client().await;
        put(&mut survivor, &format!("after/{index}"), "2")
            .await
            .unwrap_or_else(|err| panic!("member {index} refused a write: {err}"));
    }

    cluster.restart(old);
    let mut rejoined = cluster.member(old).client().await;
    for index in (0..CLUSTER_SIZE).filter(|index| *index != old) {
        let written = get(&mut rejoined, &format!("after/{index}")).await.unwrap();
        assert_eq!(written.as_deref(), Some("2"));
    }
    assert_eq!(
        get(&mut rejoined, "before").await.unwrap().as_deref(),
        Some("1")
    );
    let leader = cluster.leader().await;
    assert!(leader < CLUSTER_SIZE);
}

#[tokio::test]
async fn a_frozen_leader_is_replaced_and_thawed_it_follows() {
    let cluster = EtcdCluster::start();
    let old = cluster.leader().await;
    cluster.freeze(old);
    let new = cluster.wait_for_leader(LEADER_TIMEOUT, Some(old)).await;
    assert_ne!(new, old);
    put(&mut cluster.member(new).client().await, "while-frozen", "1")
        .await
        .unwrap();

    cluster.thaw(old);
    // It leads no more once every member that answers, the thawed one too, follows another.
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT, Some(old)).await;
    assert_ne!(leader, old);
    let mut thawed = cluster.member(old).client().await;
    let written = get(&mut thawed, "while-frozen").await.unwrap();
    assert_eq!(written.as_deref(), Some("1"));
}

#[tokio::test]
async fn two_clusters_in_one_process_do_not_see_each_other() {
    let (first, second) = (EtcdCluster::start(), EtcdCluster::start());
    let mut first_client = first.client().await;
    let mut second_client = second.client().await;
    put(&mut first_client, "whose", "first").await.unwrap();
    assert_eq!(get(&mut second_client, "whose").await.unwrap(), None);

    for (cluster, client) in [(&first, &mut first_client), (&second, &mut second_client)] {
        let members = client.member_list().await.unwrap();
        let mut peers: Vec<String> = members
            .members()
            .iter()
            .flat_map(|member| member.peer_urls().to_vec())
            .collect();
        let mut own: Vec<String> = cluster.members().iter().map(EtcdServer::peer_url).collect();
        peers.sort();
        own.sort();
        assert_eq!(peers, own);
    }
    let cluster_id = |reply: etcd_client::StatusResponse| reply.header().unwrap().cluster_id();
    assert_ne!(
        cluster_id(first_client.status().await.unwrap()),
        cluster_id(second_client.status().await.unwrap())
    );
}

/// Whether `result` is etcd's refusal for lack of rights.
fn refused<T: std::fmt::Debug>(result: Result<T, etcd_client::Error>) -> bool {
    match result {
        Err(err) => err.to_string().contains("permission denied"),
        Ok(value) => panic!("allowed: {value:?}"),
    }
}

#[tokio::test]
async fn the_limited_user_writes_under_its_prefix_and_is_refused_outside_it() {
    let server = EtcdServer::start();
    let (user, password) = server.enable_auth("locks/").await;

    let mut limited = server.client_as(&user, &password).await;
    put(&mut limited, "locks/a", "mine").await.unwrap();
    assert_eq!(
        get(&mut limited, "locks/a").await.unwrap().as_deref(),
        Some("mine")
    );
    assert!(refused(put(&mut limited, "other/a", "no").await));
    assert!(refused(get(&mut limited, "other/a").await));
    // The prefix's end: `locks0` follows every `locks/...` key and is outside.
    assert!(refused(put(&mut limited, "locks0", "no").await));

    let root_password = server.root_password().unwrap();
    let mut root = server.client_as(ROOT_USER, &root_password).await;
    put(&mut root, "other/a", "root's").await.unwrap();
    let mut root = server.client().await;
    assert_eq!(
        get(&mut root, "locks/a").await.unwrap().as_deref(),
        Some("mine")
    );
}

#[tokio::test]
async fn auth_on_a_cluster_holds_on_every_member() {
    let cluster = EtcdCluster::start();
    let (user, password) = cluster.enable_auth("locks/").await;
    for (index, member) in cluster.members().iter().enumerate() {
        let mut limited = member.client_as(&user, &password).await;
        put(&mut limited, &format!("locks/{index}"), "mine")
            .await
            .unwrap_or_else(|err| panic!("member {index} refused the limited user: {err}"));
        assert!(refused(put(&mut limited, "other", "no").await));
    }
    // The leader is still found (a status needs no login).
    assert!(cluster.leader().await < CLUSTER_SIZE);
}

#[test]
fn no_process_outlives_a_test_that_panics() {
    let (sender, received) = std::sync::mpsc::channel();
    let test = std::thread::spawn(move || {
        let server = EtcdServer::start();
        let cluster = EtcdCluster::start();
        let mut left = vec![(server.pid(), server.data_dir())];
        left.extend(cluster.members().iter().map(|m| (m.pid(), m.data_dir())));
        sender.send(left).unwrap();
        panic!("the test fails with its etcd members running");
    });
    assert!(test.join().is_err());
    for (pid, data_dir) in received.recv().unwrap() {
        assert!(is_gone(pid), "etcd {pid} outlives the test");
        assert!(!data_dir.exists(), "{} is left", data_dir.display());
    }
}

#[test]
fn a_missing_etcd_fails_with_how_to_install_it() {
    let hint = find_etcd(OsStr::new("/nonexistent")).unwrap_err();
    assert!(
        hint.contains("sudo apt-get install -y etcd-server"),
        "{hint}"
    );
    let path = std::env::var_os("PATH").unwrap_or_default();
    assert!(find_etcd(&path).is_ok(), "{hint}");
}
