//! A real Redis Cluster for tests: three primaries and three replicas on free loopback ports
//! (or three primaries alone), each an ordinary [`RedisServer`] (so the watcher in `mod.rs`
//! kills it with the test process), formed by `redis-cli --cluster create`. It offers the
//! faults a cluster test needs: a manual failover, a SIGKILLed primary and its replica taking
//! over (or, without replicas, the cluster going down), a node coming back empty, a slot
//! moved between primaries (also stopped half-way, for ASK), and a flushed script cache.
//! Readiness is polled (`CLUSTER INFO`, `CLUSTER NODES`, `ROLE`) because an external cluster
//! offers no event to wait on. [`shared_cluster`] lets one test binary start a single cluster.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::{
    connect, free_port, info_field, query_port, require_redis_server, role_of, scratch_dir,
    server_args, wait_until, RedisServer, Role,
};

/// How long a node may be unreachable before the others call it failed. Short, so that a
/// killed primary's replica takes over within a few seconds.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// The number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// How long forming, failing over or converging may take before a test gives up.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

/// One cluster for the whole test binary, started on first use. Its servers die with the test
/// process (the watcher); its config directory is swept by the next run's [`scratch_dir`].
/// It cannot be killed or restarted (those need `&mut`); a test that does so starts its own.
pub fn shared_cluster() -> &'static RedisCluster {
    static SHARED: OnceLock<RedisCluster> = OnceLock::new();
    SHARED.get_or_init(RedisCluster::start)
}

/// A 3-primary/3-replica (or 3-primary) Redis Cluster; every node is stopped and the config
/// files removed on drop. Nodes are named by their index, `0..6` (`0..3`), which stays with
/// the port across restarts; which indices are primaries is decided by `redis-cli` and
/// changes with failovers.
pub struct RedisCluster {
    dir: PathBuf,
    nodes: Vec<Node>,
}

struct Node {
    server: RedisServer,
    bus_port: u16,
    config: PathBuf,
    /// The node id (`CLUSTER MYID`); a node restarted empty gets a new one.
    id: String,
    /// When killed as a primary: the replicas it had, one of which should take over.
    replicas_when_killed: Vec<usize>,
}

/// A slot half-way between two primaries: MIGRATING on the source, IMPORTING on the target,
/// so a client asking the source for a key already moved is sent on with `-ASK`.
#[must_use = "a migration left unfinished leaves the slot in MIGRATING/IMPORTING state"]
pub struct SlotMigration {
    slot: u16,
    from: usize,
    to: usize,
}

impl RedisCluster {
    /// Starts six nodes, forms the cluster and waits until every node sees all slots served
    /// and every replica is in sync.
    pub fn start() -> Self {
        Self::start_with_node_timeout(DEFAULT_NODE_TIMEOUT)
    }

    /// Like [`start`](Self::start), with another `cluster-node-timeout`.
    pub fn start_with_node_timeout(node_timeout: Duration) -> Self {
        Self::form(1, node_timeout)
    }

    /// Three primaries and no replica, with `node_timeout`: a killed primary's slots stay
    /// unserved, so once the others mark it failed the cluster is down
    /// (`cluster-require-full-coverage`, Redis's default) and every node answers `CLUSTERDOWN`.
    pub fn start_without_replicas(node_timeout: Duration) -> Self {
        Self::form(0, node_timeout)
    }

    /// Starts three primaries with `replicas` replicas each, forms the cluster and waits until
    /// it is ok.
    fn form(replicas: usize, node_timeout: Duration) -> Self {
        require_redis_server();
        let dir = scratch_dir("cluster");
        let timeout_ms = node_timeout.as_millis().to_string();
        let nodes: Vec<Node> = (0..3 * (1 + replicas))
            .map(|index| Node::start(&dir, index, &timeout_ms))
            .collect();
        let mut cluster = Self { dir, nodes };

        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.server.port()));
        }
        let output = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create (it comes with redis-server)");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        for index in 0..cluster.nodes.len() {
            cluster.nodes[index].id = cluster.query(index, redis::cmd("CLUSTER").arg("MYID"));
        }
        cluster.wait_ok();
        cluster
    }

    /// `redis://127.0.0.1:PORT` of every node, killed ones included, in index order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.server.url()).collect()
    }

    /// The URL of node `index`.
    pub fn url(&self, index: usize) -> String {
        self.nodes[index].server.url()
    }

    /// The port of node `index`.
    pub fn port(&self, index: usize) -> u16 {
        self.nodes[index].server.port()
    }

    /// The node `index` itself, e.g. to freeze it with [`RedisServer::signal`].
    pub fn node(&self, index: usize) -> &RedisServer {
        &self.nodes[index].server
    }

    /// The indices of the running nodes.
    pub fn live(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&index| self.nodes[index].server.is_running())
            .collect()
    }

    /// What running node `index` says it is, or `None` if it does not answer.
    pub fn role(&self, index: usize) -> Option<Role> {
        role_of(self.port(index))
    }

    /// The indices of the running primaries.
    pub fn primaries(&self) -> Vec<usize> {
        self.live()
            .into_iter()
            .filter(|&index| self.role(index) == Some(Role::Primary))
            .collect()
    }

    /// A running primary other than `than` (to move a slot of `than`'s to).
    pub fn another_primary(&self, than: usize) -> usize {
        self.primaries()
            .into_iter()
            .find(|&primary| primary != than)
            .expect("another primary")
    }

    /// The indices of the running replicas.
    pub fn replicas(&self) -> Vec<usize> {
        self.live()
            .into_iter()
            .filter(|&index| matches!(self.role(index), Some(Role::Replica { .. })))
            .collect()
    }

    /// The indices of the running replicas of node `primary`.
    pub fn replicas_of(&self, primary: usize) -> Vec<usize> {
        let port = self.port(primary);
        self.live()
            .into_iter()
            .filter(|&index| self.role(index) == Some(Role::Replica { primary_port: port }))
            .collect()
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        self.query(
            self.any_live(),
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
        )
    }

    /// The index of the primary serving `slot`, as a running node sees it.
    pub fn primary_for_slot(&self, slot: u16) -> usize {
        let view = self.view(self.any_live()).expect("read CLUSTER NODES");
        let port = view
            .owners
            .iter()
            .find(|(range, _)| range.0 <= slot && slot <= range.1)
            .map(|(_, port)| *port)
            .unwrap_or_else(|| panic!("no node serves slot {slot}"));
        self.index_of_port(port)
    }

    /// The index of the primary serving `key`'s slot.
    pub fn primary_for_key(&self, key: &str) -> usize {
        self.primary_for_slot(self.slot_of(key))
    }

    /// A synchronous connection to node `index` (plain, not cluster-aware), for inspection.
    pub fn connection_to(&self, index: usize) -> redis::Connection {
        connect(self.port(index)).unwrap_or_else(|err| panic!("node {index}: {err}"))
    }

    /// Runs `CLUSTER FAILOVER` on a replica of `primary` and waits until the replica is a
    /// primary and every running node agrees. Returns the new primary's index.
    pub fn failover(&self, primary: usize) -> usize {
        let replica = *self
            .replicas_of(primary)
            .first()
            .unwrap_or_else(|| panic!("node {primary} has no running replica"));
        let _: () = self.query(replica, redis::cmd("CLUSTER").arg("FAILOVER"));
        wait_until(
            &format!("node {replica} to take over from node {primary}"),
            CONVERGE_TIMEOUT,
            || match self.role(replica) {
                Some(Role::Primary) => Ok(()),
                other => Err(format!("ROLE says {other:?}")),
            },
        );
        self.wait_ok();
        replica
    }

    /// SIGKILLs node `index`. If it was a primary, its replicas are remembered for
    /// [`wait_until_replica_promoted`](Self::wait_until_replica_promoted).
    pub fn kill(&mut self, index: usize) {
        let replicas = if self.role(index) == Some(Role::Primary) {
            self.replicas_of(index)
        } else {
            Vec::new()
        };
        let node = &mut self.nodes[index];
        node.replicas_when_killed = replicas;
        node.server.stop();
    }

    /// After [`kill`](Self::kill) of a primary: waits until one of its replicas has been
    /// promoted and every running node agrees on who serves every slot (about two node
    /// timeouts). Returns the promoted replica's index.
    pub fn wait_until_replica_promoted(&self, killed: usize) -> usize {
        let candidates = self.nodes[killed].replicas_when_killed.clone();
        assert!(
            !candidates.is_empty(),
            "node {killed} was not a killed primary with replicas"
        );
        let promoted = wait_until(
            &format!("a replica of killed node {killed} to take over"),
            CONVERGE_TIMEOUT,
            || {
                candidates
                    .iter()
                    .copied()
                    .find(|&index| self.role(index) == Some(Role::Primary))
                    .ok_or_else(|| format!("none of {candidates:?} is a primary yet"))
            },
        );
        self.wait_ok();
        promoted
    }

    /// Brings killed node `index` back on its port as an empty node with a new id: the others
    /// forget the old id, it meets the cluster and replicates the primary with the fewest
    /// replicas (after a failover, the promoted one). Waits until the cluster agrees.
    pub fn restart(&mut self, index: usize) {
        assert!(
            !self.nodes[index].server.is_running(),
            "node {index} is running; kill it first"
        );
        let old_id = self.nodes[index].id.clone();
        let _ = std::fs::remove_file(&self.nodes[index].config);
        self.nodes[index].server.restart();
        self.nodes[index].id = self.query(index, redis::cmd("CLUSTER").arg("MYID"));
        let others: Vec<usize> = self.live().into_iter().filter(|&i| i != index).collect();
        for &other in &others {
            // Fails on a node that never knew it; that is fine.
            let _: Result<(), _> = redis::cmd("CLUSTER")
                .arg("FORGET")
                .arg(&old_id)
                .query(&mut self.connection_to(other));
        }
        let _: () = self.query(
            index,
            redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(self.port(others[0]))
                .arg(self.nodes[others[0]].bus_port),
        );
        let primary = self
            .primaries()
            .into_iter()
            .filter(|&p| p != index)
            .min_by_key(|&p| self.replicas_of(p).len())
            .expect("a running primary");
        let primary_id = self.nodes[primary].id.clone();
        wait_until(
            &format!("restarted node {index} to replicate node {primary}"),
            CONVERGE_TIMEOUT,
            || {
                // "Unknown node" until the gossip has reached it.
                query_port::<()>(
                    self.port(index),
                    redis::cmd("CLUSTER").arg("REPLICATE").arg(&primary_id),
                )
            },
        );
        self.wait_ok();
    }

    /// Empties the script cache of every running node (`SCRIPT FLUSH`), so the next `EVALSHA`
    /// meets `NOSCRIPT`.
    pub fn script_flush_all(&self) {
        for index in self.live() {
            let _: () = self.query(index, redis::cmd("SCRIPT").arg("FLUSH"));
        }
    }

    /// Moves `slot` with its keys from primary `from` to primary `to` and waits until every
    /// node agrees.
    pub fn migrate_slot(&self, slot: u16, from: usize, to: usize) {
        self.start_migration(slot, from, to).finish(self);
    }

    /// Starts moving `slot` from primary `from` to primary `to` (IMPORTING on `to`, MIGRATING
    /// on `from`) and moves no keys yet; see [`SlotMigration::move_keys`] and
    /// [`SlotMigration::finish`].
    pub fn start_migration(&self, slot: u16, from: usize, to: usize) -> SlotMigration {
        let (from_id, to_id) = (self.nodes[from].id.clone(), self.nodes[to].id.clone());
        let _: () = self.query(
            to,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("IMPORTING")
                .arg(from_id),
        );
        let _: () = self.query(
            from,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("MIGRATING")
                .arg(to_id),
        );
        SlotMigration { slot, from, to }
    }

    /// Waits until every running node reports `cluster_state:ok` with all slots served by
    /// running nodes, all agree on who serves what and which node is a primary, and every
    /// running replica is in sync with its primary.
    pub fn wait_ok(&self) {
        wait_until("the cluster to converge", CONVERGE_TIMEOUT, || {
            self.convergence_problem().map_or(Ok(()), Err)
        });
    }

    /// After a primary without replicas was killed: waits until every running node reports
    /// `cluster_state:fail` (about two node timeouts), so that each answers `CLUSTERDOWN`.
    pub fn wait_until_down(&self) {
        wait_until("the cluster to go down", CONVERGE_TIMEOUT, || {
            for index in self.live() {
                let info: String = query_port(self.port(index), redis::cmd("CLUSTER").arg("INFO"))?;
                let state = info_field(&info, "cluster_state");
                if state != Some("fail") {
                    return Err(format!("node {index} says cluster_state {state:?}"));
                }
            }
            Ok(())
        });
    }

    fn convergence_problem(&self) -> Option<String> {
        let live = self.live();
        let mut live_ports: Vec<u16> = live.iter().map(|&index| self.port(index)).collect();
        live_ports.sort_unstable();
        let mut first: Option<View> = None;
        for &index in &live {
            let info: String = match query_port(self.port(index), redis::cmd("CLUSTER").arg("INFO"))
            {
                Ok(info) => info,
                Err(err) => return Some(err),
            };
            if info_field(&info, "cluster_state") != Some("ok")
                || info_field(&info, "cluster_slots_ok") != Some("16384")
            {
                return Some(format!("node {index} says: {info}"));
            }
            let view = match self.view(index) {
                Ok(view) => view,
                Err(err) => return Some(err),
            };
            if let Some(port) = view.owners.values().find(|p| !live_ports.contains(p)) {
                return Some(format!("node {index} sees slots on stopped port {port}"));
            }
            let known: Vec<u16> = view.roles.keys().copied().collect();
            if known != live_ports {
                return Some(format!(
                    "node {index} knows healthy nodes {known:?}, running are {live_ports:?}"
                ));
            }
            match &first {
                None => first = Some(view),
                Some(first) if *first != view => {
                    return Some(format!("node {index} disagrees with node {}", live[0]))
                }
                Some(_) => {}
            }
            if let Some(Role::Replica { .. }) = role_of(self.port(index)) {
                let replication: String =
                    match query_port(self.port(index), redis::cmd("INFO").arg("replication")) {
                        Ok(info) => info,
                        Err(err) => return Some(err),
                    };
                if info_field(&replication, "master_link_status") != Some("up") {
                    return Some(format!("replica {index} is not in sync yet"));
                }
            }
        }
        None
    }

    /// What node `index` thinks of the cluster, from `CLUSTER NODES`.
    fn view(&self, index: usize) -> Result<View, String> {
        let nodes: String = query_port(self.port(index), redis::cmd("CLUSTER").arg("NODES"))?;
        Ok(View::parse(&nodes))
    }

    fn any_live(&self) -> usize {
        *self.live().first().expect("no node is running")
    }

    fn index_of_port(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|node| node.server.port() == port)
            .unwrap_or_else(|| panic!("port {port} is not a node of this cluster"))
    }

    fn query<T: redis::FromRedisValue>(&self, index: usize, cmd: &redis::Cmd) -> T {
        query_port(self.port(index), cmd).unwrap_or_else(|err| panic!("node {index}: {err}"))
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.server.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl SlotMigration {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// Moves up to `max` of the slot's keys still on the source to the target (`MIGRATE`).
    /// Returns how many it moved.
    pub fn move_keys(&self, cluster: &RedisCluster, max: usize) -> usize {
        let keys: Vec<String> = cluster.query(
            self.from,
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(self.slot)
                .arg(max),
        );
        if !keys.is_empty() {
            let _: redis::Value = cluster.query(
                self.from,
                redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(cluster.port(self.to))
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(&keys),
            );
        }
        keys.len()
    }

    /// Moves the keys named (`MIGRATE … KEYS`), replacing what the target has under those
    /// names when `replace` (as `redis-cli --cluster reshard --cluster-replace` does).
    pub fn move_named(&self, cluster: &RedisCluster, keys: &[String], replace: bool) {
        let mut migrate = redis::cmd("MIGRATE");
        migrate
            .arg("127.0.0.1")
            .arg(cluster.port(self.to))
            .arg("")
            .arg(0)
            .arg(5000);
        if replace {
            migrate.arg("REPLACE");
        }
        let _: redis::Value = cluster.query(self.from, migrate.arg("KEYS").arg(keys));
    }

    /// The slot's keys still on the source.
    pub fn keys_left(&self, cluster: &RedisCluster) -> Vec<String> {
        cluster.query(
            self.from,
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(self.slot)
                .arg(1000),
        )
    }

    /// Moves the remaining keys, hands the slot to the target on every primary (target first,
    /// then source, then the rest) and waits until every node agrees.
    pub fn finish(self, cluster: &RedisCluster) {
        while self.move_keys(cluster, 100) > 0 {}
        let to_id = cluster.nodes[self.to].id.clone();
        let mut order = vec![self.to, self.from];
        order.extend(
            cluster
                .primaries()
                .into_iter()
                .filter(|&p| p != self.to && p != self.from),
        );
        for index in order {
            let _: () = cluster.query(
                index,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(self.slot)
                    .arg("NODE")
                    .arg(&to_id),
            );
        }
        cluster.wait_ok();
    }
}

impl Node {
    /// Starts cluster node `index` on a free port with a free bus port (`--cluster-port`, as
    /// port + 10000 may be taken or past 65535).
    fn start(dir: &std::path::Path, index: usize, node_timeout_ms: &str) -> Self {
        let config = dir.join(format!("node-{index}.conf"));
        let mut last_error = String::new();
        for _ in 0..5 {
            let (port, bus_port) = (free_port(), free_port());
            if port == bus_port {
                continue;
            }
            let args = server_args(
                port,
                &[
                    // Not the shared temp dir: a `dump.rdb` left there by any other server
                    // would be loaded, and a node with keys cannot join a new cluster.
                    "--dir",
                    &dir.to_string_lossy(),
                    "--dbfilename",
                    &format!("node-{index}.rdb"),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &config.to_string_lossy(),
                    "--cluster-node-timeout",
                    node_timeout_ms,
                    "--cluster-port",
                    &bus_port.to_string(),
                    // A replica may take over however long it was cut off: tests kill freely.
                    "--cluster-replica-validity-factor",
                    "0",
                ],
            );
            match RedisServer::launch(port, args) {
                Ok(server) => {
                    return Self {
                        server,
                        bus_port,
                        config,
                        id: String::new(),
                        replicas_when_killed: Vec::new(),
                    }
                }
                Err(err) => last_error = err,
            }
        }
        panic!("could not start cluster node {index}: {last_error}");
    }
}

/// One node's `CLUSTER NODES`, reduced to what must agree across nodes.
#[derive(Debug, PartialEq, Eq)]
struct View {
    /// Slot ranges and the port of the primary serving each.
    owners: BTreeMap<(u16, u16), u16>,
    /// The healthy nodes by port: whether each is a primary.
    roles: BTreeMap<u16, bool>,
}

impl View {
    /// Parses lines like
    /// `<id> 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 [93->-<id>]`.
    fn parse(nodes: &str) -> Self {
        let mut view = View {
            owners: BTreeMap::new(),
            roles: BTreeMap::new(),
        };
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                continue;
            }
            let flags = fields[2];
            if flags
                .split(',')
                .any(|f| matches!(f, "fail" | "fail?" | "noaddr" | "handshake"))
            {
                continue;
            }
            let Some(port) = fields[1]
                .split(['@', ','])
                .next()
                .and_then(|addr| addr.rsplit(':').next())
                .and_then(|port| port.parse().ok())
            else {
                continue;
            };
            let primary = flags.split(',').any(|f| f == "master");
            view.roles.insert(port, primary);
            for range in fields[8..].iter().filter(|s| !s.starts_with('[')) {
                let (start, end) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(start), Ok(end)) = (start.parse(), end.parse()) {
                    view.owners.insert((start, end), port);
                }
            }
        }
        view
    }
}
