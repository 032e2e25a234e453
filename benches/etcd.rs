//! distlock on etcd beside the raw floor (the transactions distlock sends, sent by hand) and
//! etcd's own lock service (`Lock`/`Unlock` of its v3lock API: what a Go or `etcdctl` user
//! picks), in one run, on a single member and on a 3-member cluster started for the purpose
//! (issue 39, item 7). Its siblings are `locks.rs` (Redis) and `postgres.rs`, whose
//! conventions it keeps; what the three share is `benches/support/`'s.
//!
//!     cargo bench --bench etcd --features etcd        # both deployments, 5 alternating rounds, pinned
//!     BENCH_RUNS=9 cargo bench --bench etcd --features etcd
//!     BENCH_DEPLOYMENTS=single BENCH_LIBS=raw,distlock BENCH_WORKLOADS=W1,W3 cargo bench --bench etcd --features etcd
//!     BENCH_RUNS=1 BENCH_SCALE=0.1 cargo bench --bench etcd --features etcd   # a smoke run
//!     BENCH_PIN=0 cargo bench --bench etcd --features etcd                   # no pinning
//!
//! Pinning, as in `locks.rs`: unless `BENCH_PIN=0` (or the machine has one CPU), the bench
//! sets `DISTLOCK_SERVER_CPUS=0` (unless set; `tests/support/etcd.rs` starts every member under
//! `taskset -c` with it: the cluster's three members share CPU 0) and pins itself with
//! `taskset -p -c` to `BENCH_CLIENT_CPUS` (default `1`) before any thread starts. Members keep
//! their data in `/dev/shm` (the support's `memory_scratch_dir`): etcd syncs its log at every
//! write, and here that costs nothing, so the figures are CPU and round trips, not a disk's.
//!
//! The shape a user runs: [`run`] is a `#[tokio::main]` function — on the one client CPU a
//! multi-thread runtime with one worker, the workloads' loops on the calling thread.
//!
//! Deployments (`BENCH_DEPLOYMENTS`, default `single,cluster`), one after the other, each on
//! members of its own (stopped before the next one starts): `single`, one member; `cluster`,
//! three (`EtcdCluster`). Every library talks to one member, the same: on the cluster the
//! leader at the start, first in distlock's endpoints (distlock uses its first endpoint
//! until a connection fails), the only endpoint of the other two — so no library's requests
//! are forwarded by a follower, and a leader change is reported.
//!
//! Rounds (`BENCH_RUNS`, default 5): each round runs every selected workload with every
//! selected library, the libraries' order rotated by one each round. Reported: the median over
//! the rounds of every metric (ratio to raw's median in brackets), and each workload's main
//! figures round by round divided by raw's and by v3lock's of the same round, with the median
//! of those ratios (a ratio within one round cancels what drifts between rounds).
//!
//! Libraries (`BENCH_LIBS`, default all three), each under a key prefix of its own, so that
//! distlock's watch (on its prefix) sees none of the others' keys:
//! - `distlock`: `Config::etcd(endpoints)` with its defaults (fencing tokens from revisions,
//!   the watchdog, wake-ups by the watch). Its cycle: acquire = a lease grant, then the
//!   transaction that creates the grant's key on that lease if the key's directory is empty
//!   (else gets the directory: `FirstTry::Blind` in `store/etcd/transaction.rs`); release =
//!   the transaction that deletes the key if the
//!   lock still keeps no bookkeeping and the key is still on the grant's lease
//!   (`store/etcd/give_back.rs`), then the lease's revoke (in the background). 3 round trips
//!   by design (not counted here: the client does not expose them).
//! - `raw`: the floor — those requests (`lock-runtime/src/store/etcd/{transaction,layout,
//!   directory,leases}.rs`; the key layout copied in [`layout`]) sent by hand with
//!   `etcd-client` on one client, the lease revoked in the background as distlock does. A
//!   try that finds the key held tries again 1 ms later with a read first (distlock's try
//!   after a refusal), as the other benches' raw floors poll.
//! - `v3lock`: `etcd_client::LockClient`'s `lock` with a lease of its own (granted first: etcd's
//!   lock service needs one per lock; 10 s, kept alive by nobody) and `unlock`, the lease then
//!   revoked in the background: 3 round trips per cycle. A waiter waits in the server (the
//!   service watches the key before it, in etcd's own client); no fencing token but the key's
//!   revision, no renewal.
//!
//! Workloads (`BENCH_WORKLOADS`, default all; `BENCH_SCALE`, default 1, scales W1–W3's counts):
//! - W1: one task, 2,000 acquire+release cycles on fresh keys: cycles/s, cycle p50/p99.
//! - W2: 64 tasks sharing one client, 200 cycles each on their own keys: cycles/s.
//! - W3: 8 workers on one key, 1,000 grants, 1 ms outside the lock after each release:
//!   grants/s, handoff latency (a release to the next grant by another worker) p50/p99, the
//!   grants that came within 5 ms of the previous release (`grants_within_5ms`, and its share:
//!   distlock's waiters are woken by the watch; its backoff's steps are random up to 5, 10, 20
//!   … 200 ms, so past a waiter's first retries a backoff lands within 5 ms of a release only
//!   by chance), overlaps seen (two holders at once: must be 0).
//! - W4 (distlock only): 1,000 locks taken one after the other with a 2 s lease (etcd's
//!   minimum at its defaults), then held 10 s, measured from one lease after the last was
//!   taken (every lease's keep-alive stream is open by then), renewed by the watchdog every
//!   third of the lease — 15 rounds: the keep-alive messages etcd received in the hold
//!   (`grpc_server_msg_received_total` of `LeaseKeepAlive`) per lease per round (target 1; a
//!   renewal brought forward to join another lease's batch, up to a sixth of the lease early,
//!   makes a lease's rounds more than 15), the keep-alive streams opened in the hold (one per
//!   lease for its life, opened before: must be 0), the leases etcd renewed
//!   (`etcd_debugging_lease_renewed_total`), locks lost (`is_held`) and grants' keys missing
//!   from etcd at the end (both must be 0).
//!
//! Costs per cycle (per grant on W3), from readings of every member's `/metrics` (its client
//! URL) and `/proc` before and after each measurement:
//! - `round_trips`: raw and v3lock count them as they send (requests sent at once are one).
//! - `server_requests`: unary gRPC calls the members handled (`grpc_server_handled_total`,
//!   every code; the streams — watch, keep-alives — are not in it), and by method
//!   (`rpc_txn`, `rpc_lease_grant`, `rpc_lease_revoke`, `rpc_lock`, …). A revoke sent in the
//!   background after a measurement's last release may fall into the next one.
//! - `raft_writes`: entries the cluster committed (`etcd_server_proposals_committed_total`,
//!   the highest of the members'): writes, lease grants and revokes; reads and keep-alives
//!   are none.
//! - `client_cpu_us`: this process's CPU time, all threads; `server_cpu_us`: every member's
//!   (user + system from `/proc`), in clock ticks (10 ms).
//!
//! Output: a header (date, commit, CPUs, CPU model, etcd's version, pinning, rounds), a line
//! per deployment (its members, the one the libraries talk to), a line per measurement on
//! stderr, the gRPC calls per method of each deployment's whole run (stderr), the medians, the
//! per-round ratios, the targets (and whether raw sent the requests distlock sent, by
//! method: a check that [`layout`] and the raw floor still match the store); the header and a
//! line per (deployment, workload, library) appended to `target/bench.jsonl`.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "support/mod.rs"]
mod bench_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bench_support::header::{self, Header};
use bench_support::pinning;
use bench_support::process_cpu::{clock_ticks, process_cpu, ProcessCpu};
use bench_support::rounds::{self, pct, scaled, selected, Measured};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LockOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse,
};
use futures_util::future::join_all;
use support::etcd::{EtcdCluster, EtcdServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The lease of W1–W3's locks (every library's).
const LEASE: Duration = Duration::from_secs(10);

/// [`LEASE`] in etcd's seconds.
const LEASE_SECS: i64 = LEASE.as_secs() as i64;

/// W2's tasks.
const W2_TASKS: usize = 64;

/// W3's workers.
const W3_WORKERS: usize = 8;

/// W4's locks, their lease and how long they are held.
const W4_LOCKS: usize = 1000;
const W4_LEASE: Duration = Duration::from_secs(2);
const W4_HOLD: Duration = Duration::from_secs(10);

/// How long the bench's own requests (a connection, a reading of `/metrics`) may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// distlock's key layout on etcd, copied from `lock-runtime/src/store/etcd/layout.rs`
/// (`pub(super)` there): keep it in step with that file. A lock key is a directory of etcd
/// keys: `<escaped lock key>/s` (the bookkeeping) and `<escaped lock key>/h/<side>/<owner>`
/// (a grant, on its lease).
mod layout {
    /// `lock` with `%` and `/` escaped.
    pub fn escape(lock: &str) -> String {
        lock.replace('%', "%25").replace('/', "%2F")
    }

    /// Every etcd key of `lock` starts with this.
    pub fn directory(lock: &str) -> String {
        format!("{}/", escape(lock))
    }

    /// The lock's bookkeeping.
    pub fn state_key(lock: &str) -> String {
        format!("{}/s", escape(lock))
    }

    /// The key of `owner`'s writer grant.
    pub fn writer_key(lock: &str, owner: &str) -> String {
        format!("{}/h/w/{owner}", escape(lock))
    }

    /// The start of the keys of `lock`'s grants, every side.
    pub fn holders(lock: &str) -> String {
        format!("{}/h/", escape(lock))
    }

    /// The end of the range of every key that starts with `prefix`.
    pub fn range_end(prefix: &str) -> Vec<u8> {
        let mut end = prefix.as_bytes().to_vec();
        while let Some(last) = end.pop() {
            if last < 0xff {
                end.push(last + 1);
                return end;
            }
        }
        vec![0]
    }
}

/// Where the locks live.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Deployment {
    Single,
    Cluster,
}

impl Deployment {
    const ALL: [Deployment; 2] = [Deployment::Single, Deployment::Cluster];

    fn name(self) -> &'static str {
        match self {
            Deployment::Single => "single",
            Deployment::Cluster => "cluster",
        }
    }
}

/// The members of one deployment, stopped when dropped.
enum Members {
    Single(EtcdServer),
    Cluster(EtcdCluster),
}

impl Members {
    fn servers(&self) -> Vec<&EtcdServer> {
        match self {
            Members::Single(server) => vec![server],
            Members::Cluster(cluster) => cluster.members().iter().collect(),
        }
    }
}

/// A deployment, running: its members, the endpoints the libraries are given (the one they
/// talk to first), and the bench's own client for the checks outside the measurements.
struct Deployed {
    deployment: Deployment,
    members: Members,
    endpoints: Vec<String>,
    probe: Client,
    /// Clock ticks per second (`/proc`'s CPU times).
    ticks: f64,
}

impl Deployed {
    async fn start(deployment: Deployment) -> Self {
        let (members, talked_to) = match deployment {
            Deployment::Single => (Members::Single(EtcdServer::start()), 0),
            Deployment::Cluster => {
                let cluster = EtcdCluster::start();
                let leader = cluster.leader().await;
                (Members::Cluster(cluster), leader)
            }
        };
        let mut endpoints: Vec<String> = members.servers().iter().map(|m| m.endpoint()).collect();
        endpoints.swap(0, talked_to);
        let servers = members.servers();
        println!(
            "{:<12} {} member{}, every library talking to {} ({})",
            deployment.name(),
            servers.len(),
            if servers.len() == 1 { "" } else { "s" },
            servers[talked_to].name(),
            if servers.len() == 1 {
                "the only one"
            } else {
                "the leader"
            },
        );
        let probe = connect(&endpoints[0], ConnectOptions::new()).await;
        Self {
            deployment,
            members,
            endpoints,
            probe,
            ticks: clock_ticks(),
        }
    }

    /// Every member's counters so far, summed (the committed entries: the highest).
    async fn counters(&self) -> ServerCounters {
        let mut counters = ServerCounters::default();
        for member in self.members.servers() {
            counters.add_metrics(&metrics(member.port()).await);
            let ticks = ProcessCpu::of(member.pid()).map_or(0, |cpu| cpu.own);
            counters.cpu += Duration::from_secs_f64(ticks as f64 / self.ticks);
        }
        counters
    }

    /// How many etcd keys start with `prefix`.
    async fn keys_under(&self, prefix: &str) -> i64 {
        let options = GetOptions::new()
            .with_range(layout::range_end(prefix))
            .with_count_only();
        self.probe
            .clone()
            .get(prefix, Some(options))
            .await
            .expect("count keys")
            .count()
    }
}

/// An `etcd-client` client of `endpoint`. Panics if it cannot connect.
async fn connect(endpoint: &str, options: ConnectOptions) -> Client {
    let options = options.with_connect_timeout(PROBE_TIMEOUT);
    Client::connect([endpoint], Some(options))
        .await
        .unwrap_or_else(|err| panic!("connect to etcd at {endpoint}: {err}"))
}

/// The text a member serves at `/metrics` on its client port (HTTP/1.0, one connection).
async fn metrics(port: u16) -> String {
    let read = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
    };
    let response = match tokio::time::timeout(PROBE_TIMEOUT, read).await {
        Ok(Ok(response)) => response,
        Ok(Err(err)) => panic!("read etcd's /metrics on port {port}: {err}"),
        Err(_) => panic!("read etcd's /metrics on port {port}: no answer in {PROBE_TIMEOUT:?}"),
    };
    match response.split_once("\r\n\r\n") {
        Some((status, body)) if status.contains(" 200 ") => body.to_owned(),
        _ => panic!("etcd's /metrics on port {port} answered {response:.200}"),
    }
}

/// The value of label `name` in a sample's labels (`a="x",b="y"`).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let rest = &labels[start..];
    Some(&rest[..rest.find('"')?])
}

/// What the members have done so far, from `/metrics` and `/proc`.
#[derive(Default, Clone)]
struct ServerCounters {
    /// Unary gRPC calls handled, by method.
    calls: BTreeMap<String, f64>,
    /// Keep-alive messages received on `LeaseKeepAlive` streams.
    keep_alives: f64,
    /// `LeaseKeepAlive` streams opened.
    keep_alive_streams: f64,
    /// Leases renewed (by the leader).
    leases_renewed: f64,
    /// Entries the cluster committed: the highest index any member has seen committed.
    raft_committed: f64,
    leader_changes: f64,
    cpu: Duration,
}

impl ServerCounters {
    /// Adds one member's `/metrics` text.
    fn add_metrics(&mut self, text: &str) {
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let Some((sample, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match sample.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (sample, ""),
            };
            let method = label(labels, "grpc_method");
            match name {
                "grpc_server_handled_total" if label(labels, "grpc_type") == Some("unary") => {
                    if let Some(method) = method {
                        *self.calls.entry(method.to_owned()).or_default() += value;
                    }
                }
                "grpc_server_msg_received_total" if method == Some("LeaseKeepAlive") => {
                    self.keep_alives += value;
                }
                "grpc_server_started_total" if method == Some("LeaseKeepAlive") => {
                    self.keep_alive_streams += value;
                }
                "etcd_debugging_lease_renewed_total" => self.leases_renewed += value,
                "etcd_server_proposals_committed_total" => {
                    self.raft_committed = self.raft_committed.max(value);
                }
                "etcd_server_leader_changes_seen_total" => self.leader_changes += value,
                _ => {}
            }
        }
    }

    /// What was done since the `earlier` reading.
    fn since(&self, earlier: &Self) -> Self {
        let calls = self
            .calls
            .iter()
            .map(|(method, calls)| {
                let before = earlier.calls.get(method).copied().unwrap_or(0.0);
                (method.clone(), calls - before)
            })
            .filter(|(_, calls)| *calls > 0.0)
            .collect();
        Self {
            calls,
            keep_alives: self.keep_alives - earlier.keep_alives,
            keep_alive_streams: self.keep_alive_streams - earlier.keep_alive_streams,
            leases_renewed: self.leases_renewed - earlier.leases_renewed,
            raft_committed: self.raft_committed - earlier.raft_committed,
            leader_changes: self.leader_changes - earlier.leader_changes,
            cpu: self.cpu.saturating_sub(earlier.cpu),
        }
    }

    /// Every unary call (a float sum of nothing would be -0).
    fn requests(&self) -> f64 {
        self.calls.values().fold(0.0, |sum, calls| sum + calls)
    }
}

/// `LeaseGrant` as `lease_grant`.
fn snake_case(method: &str) -> String {
    let mut snake = String::new();
    for (i, c) in method.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            snake.push('_');
        }
        snake.push(c.to_ascii_lowercase());
    }
    snake
}

/// The raw floor: distlock's requests by hand on one client.
struct Raw {
    client: Client,
    round_trips: AtomicU64,
}

/// A raw grant: its key, as created, and its lease.
struct RawHeld {
    lock: String,
    path: String,
    create_revision: i64,
    lease: i64,
}

/// A lease granted by the raw floor: its id, and the TTL etcd gave it.
#[derive(Clone, Copy)]
struct RawLease {
    id: i64,
    granted: i64,
}

impl Raw {
    async fn connect(endpoint: &str) -> Self {
        // distlock asks for a leader with every request.
        let options = ConnectOptions::new().with_require_leader(true);
        Raw {
            client: connect(endpoint, options).await,
            round_trips: AtomicU64::new(0),
        }
    }

    /// The read of `lock`'s directory in one transaction: its revision, and the grants' keys
    /// with their create revisions.
    async fn read(&self, lock: &str) -> (i64, Vec<(String, i64)>) {
        let directory = layout::directory(lock);
        let end = layout::range_end(&directory);
        let txn = Txn::new().and_then([TxnOp::get(
            directory,
            Some(GetOptions::new().with_range(end)),
        )]);
        let response = self.client.clone().txn(txn).await.expect("raw read");
        let revision = response.header().map_or(0, |header| header.revision());
        let holders = layout::holders(lock);
        let mut grants = Vec::new();
        for op in response.op_responses() {
            let TxnOpResponse::Get(range) = op else {
                continue;
            };
            for kv in range.kvs() {
                let key = String::from_utf8_lossy(kv.key());
                if key.starts_with(&holders) {
                    grants.push((key.into_owned(), kv.create_revision()));
                }
            }
        }
        (revision, grants)
    }

    async fn grant(&self) -> RawLease {
        let granted = self
            .client
            .clone()
            .lease_grant(LEASE_SECS, None)
            .await
            .expect("raw lease grant");
        RawLease {
            id: granted.id(),
            granted: granted.ttl(),
        }
    }

    /// Revokes `lease` in the background, as distlock does.
    fn revoke(&self, lease: i64) {
        let mut client = self.client.clone();
        tokio::spawn(async move {
            let _ = client.lease_revoke(lease).await;
        });
    }

    /// The grants' keys (with their create revisions) in the answer to a get of `lock`'s
    /// directory.
    fn grants_in(lock: &str, range: &etcd_client::GetResponse) -> Vec<(String, i64)> {
        let holders = layout::holders(lock);
        range
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.create_revision(),
                )
            })
            .filter(|(key, _)| key.starts_with(&holders))
            .collect()
    }

    /// One try: the grant, or `None` if the key is held. `first`: a first try, which skips the
    /// read as distlock's does (`FirstTry::Blind`): the lease granted, then a transaction that
    /// creates the grant's key if the directory is empty, else gets it.
    async fn try_acquire(&self, lock: &str, owner: &str, first: bool) -> Option<RawHeld> {
        let mut lease: Option<RawLease> = None;
        // The directory's revision as read, `None` for a blind attempt (as if empty at 0).
        let mut read: Option<i64> = None;
        if !first {
            let (revision, grants) = self.read(lock).await;
            self.round_trips.fetch_add(1, Ordering::Relaxed);
            if !grants.is_empty() {
                return None;
            }
            read = Some(revision);
        }
        loop {
            let granted = match lease {
                Some(lease) => lease,
                None => {
                    let granted = self.grant().await;
                    self.round_trips.fetch_add(1, Ordering::Relaxed);
                    lease = Some(granted);
                    granted
                }
            };
            // A writer's grant: created only where no key is, the bookkeeping unchanged (here:
            // still absent), and no grant of any side created since the read (blind: none).
            let path = layout::writer_key(lock, owner);
            let holders = layout::holders(lock);
            let holders_end = layout::range_end(&holders);
            let directory = layout::directory(lock);
            let directory_end = layout::range_end(&directory);
            let mut compares = vec![
                Compare::create_revision(path.clone(), CompareOp::Equal, 0),
                Compare::mod_revision(layout::state_key(lock), CompareOp::Equal, 0),
                Compare::create_revision(holders, CompareOp::Less, read.unwrap_or(0) + 1)
                    .with_range(holders_end),
            ];
            if read.is_none() {
                // Blind: no key at all in the directory.
                compares.push(
                    Compare::create_revision(directory.clone(), CompareOp::Less, 1)
                        .with_range(directory_end.clone()),
                );
            }
            let mut txn = Txn::new().when(compares).and_then([TxnOp::put(
                path.clone(),
                granted.granted.to_string(),
                Some(PutOptions::new().with_lease(granted.id)),
            )]);
            if read.is_none() {
                txn = txn.or_else([TxnOp::get(
                    directory.clone(),
                    Some(GetOptions::new().with_range(directory_end.clone())),
                )]);
            }
            let response = self.client.clone().txn(txn).await.expect("raw write");
            self.round_trips.fetch_add(1, Ordering::Relaxed);
            if response.succeeded() {
                return Some(RawHeld {
                    lock: lock.to_owned(),
                    path,
                    create_revision: response.header().map_or(0, |header| header.revision()),
                    lease: granted.id,
                });
            }
            // Held, or written since: what the blind attempt brought back, else a read.
            let (revision, grants) = match (read, response.op_responses().into_iter().next()) {
                (None, Some(TxnOpResponse::Get(range))) => (
                    response.header().map_or(0, |header| header.revision()),
                    Self::grants_in(lock, &range),
                ),
                _ => {
                    let read = self.read(lock).await;
                    self.round_trips.fetch_add(1, Ordering::Relaxed);
                    read
                }
            };
            if !grants.is_empty() {
                self.revoke(granted.id);
                return None;
            }
            read = Some(revision);
        }
    }

    /// Gives the grant back as distlock gives back a writer's grant of a lock that keeps no
    /// bookkeeping: one transaction that deletes its key if the bookkeeping is still absent
    /// and the key still on the grant's lease, then the lease's revoke in the background.
    async fn release(&self, held: RawHeld) {
        let txn = Txn::new()
            .when([
                Compare::create_revision(layout::state_key(&held.lock), CompareOp::Equal, 0),
                Compare::lease(held.path.clone(), CompareOp::Equal, held.lease),
            ])
            .and_then([TxnOp::delete(held.path.clone(), None)]);
        let response = self.client.clone().txn(txn).await.expect("raw release");
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        assert!(
            response.succeeded(),
            "raw: {} (created at {}) changed hands",
            held.lock,
            held.create_revision
        );
        self.revoke(held.lease);
    }
}

/// etcd's lock service: a lease, `Lock` on it, `Unlock`.
struct V3Lock {
    client: Client,
    round_trips: AtomicU64,
}

impl V3Lock {
    async fn connect(endpoint: &str) -> Self {
        V3Lock {
            client: connect(endpoint, ConnectOptions::new()).await,
            round_trips: AtomicU64::new(0),
        }
    }
}

/// A library under test.
#[derive(Clone)]
enum Lib {
    Distlock(distlock::Client),
    Raw(Arc<Raw>),
    V3Lock(Arc<V3Lock>),
}

enum Held {
    Distlock(distlock::LockGuard),
    Raw(RawHeld),
    V3Lock { key: Vec<u8>, lease: i64 },
}

impl Lib {
    const NAMES: [&'static str; 3] = ["raw", "distlock", "v3lock"];

    fn name(&self) -> &'static str {
        match self {
            Lib::Distlock(_) => "distlock",
            Lib::Raw(_) => "raw",
            Lib::V3Lock(_) => "v3lock",
        }
    }

    /// Round trips sent so far, where the library counts them.
    fn round_trips(&self) -> Option<u64> {
        match self {
            Lib::Distlock(_) => None,
            Lib::Raw(raw) => Some(raw.round_trips.load(Ordering::Relaxed)),
            Lib::V3Lock(v3lock) => Some(v3lock.round_trips.load(Ordering::Relaxed)),
        }
    }

    /// Takes `key`'s lock, waiting as long as it takes.
    async fn acquire(&self, key: &str) -> Held {
        match self {
            Lib::Distlock(client) => Held::Distlock(
                client
                    .lock(key)
                    .lease(LEASE)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await
                    .expect("distlock acquire"),
            ),
            Lib::Raw(raw) => {
                // `LockKey::new`'s lock key, under the raw floor's prefix.
                let lock = format!("raw:{{{key}}}");
                let owner = uuid::Uuid::new_v4().simple().to_string();
                let mut first = true;
                loop {
                    if let Some(held) = raw.try_acquire(&lock, &owner, first).await {
                        break Held::Raw(held);
                    }
                    first = false;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            Lib::V3Lock(v3lock) => {
                let mut client = v3lock.client.clone();
                let lease = client
                    .lease_grant(LEASE_SECS, None)
                    .await
                    .expect("v3lock lease grant")
                    .id();
                let options = LockOptions::new().with_lease(lease);
                let locked = client
                    .lock(format!("v3lock/{key}"), Some(options))
                    .await
                    .expect("v3lock lock");
                v3lock.round_trips.fetch_add(2, Ordering::Relaxed);
                Held::V3Lock {
                    key: locked.key().to_vec(),
                    lease,
                }
            }
        }
    }

    async fn release(&self, held: Held) {
        match (self, held) {
            (Lib::Distlock(_), Held::Distlock(guard)) => {
                assert!(guard.release().await.expect("distlock release"));
            }
            (Lib::Raw(raw), Held::Raw(held)) => raw.release(held).await,
            (Lib::V3Lock(v3lock), Held::V3Lock { key, lease }) => {
                let mut client = v3lock.client.clone();
                client.unlock(key).await.expect("v3lock unlock");
                v3lock.round_trips.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let _ = client.lease_revoke(lease).await;
                });
            }
            _ => unreachable!("a lock of another library"),
        }
    }
}

/// One row of figures.
type Row = rounds::Row<String>;

/// (deployment, workload, library).
type Key = (Deployment, &'static str, &'static str);

impl Measured for Key {
    fn deployment(&self) -> &str {
        self.0.name()
    }

    fn workload(&self) -> &str {
        self.1
    }

    fn library(&self) -> &str {
        self.2
    }

    fn with_library(&self, library: &'static str) -> Self {
        (self.0, self.1, library)
    }

    fn label(&self) -> String {
        format!("{:<7} {} {:<8}", self.0.name(), self.1, self.2)
    }
}

/// One row per round, in round order.
type Results = rounds::Results<Key, String>;

/// A stretch of a workload under measurement: its wall time, this process's CPU time, the
/// members' counters and the round trips the library counted. The members are read outside
/// the clock.
struct Window {
    servers: ServerCounters,
    client_cpu: Duration,
    round_trips: Option<u64>,
    started: Instant,
}

impl Window {
    async fn open(deployed: &Deployed, lib: Option<&Lib>) -> Self {
        let servers = deployed.counters().await;
        Self {
            servers,
            client_cpu: process_cpu(),
            round_trips: lib.and_then(Lib::round_trips),
            started: Instant::now(),
        }
    }

    /// What the stretch took: its wall time, client CPU, the members' counters since it
    /// opened, the library's round trips.
    async fn close(self, deployed: &Deployed, lib: Option<&Lib>) -> Took {
        let elapsed = self.started.elapsed();
        let client_cpu = process_cpu() - self.client_cpu;
        let round_trips = lib.and_then(Lib::round_trips);
        let servers = deployed.counters().await.since(&self.servers);
        Took {
            elapsed,
            client_cpu,
            servers,
            round_trips: self
                .round_trips
                .zip(round_trips)
                .map(|(before, after)| after - before),
        }
    }
}

/// What a [`Window`] took.
struct Took {
    elapsed: Duration,
    client_cpu: Duration,
    servers: ServerCounters,
    round_trips: Option<u64>,
}

impl Took {
    /// The figures per `units` (cycles or grants, named by `unit`).
    fn per(&self, units: f64, unit: &str) -> Row {
        let mut row = Row::from([
            (
                format!("{unit}s_per_s"),
                units / self.elapsed.as_secs_f64().max(1e-9),
            ),
            (
                format!("client_cpu_us_per_{unit}"),
                self.client_cpu.as_secs_f64() * 1e6 / units,
            ),
            (
                format!("server_cpu_us_per_{unit}"),
                self.servers.cpu.as_secs_f64() * 1e6 / units,
            ),
            (
                format!("server_requests_per_{unit}"),
                self.servers.requests() / units,
            ),
            (
                format!("raft_writes_per_{unit}"),
                self.servers.raft_committed / units,
            ),
        ]);
        for (method, calls) in &self.servers.calls {
            row.insert(
                format!("rpc_{}_per_{unit}", snake_case(method)),
                calls / units,
            );
        }
        if let Some(round_trips) = self.round_trips {
            row.insert(
                format!("round_trips_per_{unit}"),
                round_trips as f64 / units,
            );
        }
        row
    }
}

async fn w1(lib: &Lib, deployed: &Deployed, cycles: usize) -> Row {
    let tag = format!("{}:{}", lib.name(), fastrand::u64(..));
    let mut samples = Vec::with_capacity(cycles);
    let window = Window::open(deployed, Some(lib)).await;
    for i in 0..cycles {
        let key = format!("w1:{tag}:{i}");
        let started = Instant::now();
        let held = lib.acquire(&key).await;
        lib.release(held).await;
        samples.push(started.elapsed());
    }
    let took = window.close(deployed, Some(lib)).await;
    let mut row = took.per(cycles as f64, "cycle");
    row.insert("p50_ms".into(), pct(&mut samples, 0.5));
    row.insert("p99_ms".into(), pct(&mut samples, 0.99));
    row
}

async fn w2(lib: &Lib, deployed: &Deployed, cycles: usize) -> Row {
    let tag = format!("{}:{}", lib.name(), fastrand::u64(..));
    let window = Window::open(deployed, Some(lib)).await;
    let tasks: Vec<_> = (0..W2_TASKS)
        .map(|task| {
            let (lib, tag) = (lib.clone(), tag.clone());
            tokio::spawn(async move {
                for i in 0..cycles {
                    let held = lib.acquire(&format!("w2:{tag}:{task}:{i}")).await;
                    lib.release(held).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("W2 task");
    }
    let took = window.close(deployed, Some(lib)).await;
    took.per((W2_TASKS * cycles) as f64, "cycle")
}

/// What W3's workers share.
#[derive(Default)]
struct Handoffs {
    /// (worker, when) of the last release.
    last_release: Option<(usize, Instant)>,
    /// A release to the next grant by another worker.
    handoffs: Vec<Duration>,
    /// Every grant after the first: since the last release, by anyone.
    since_release: Vec<Duration>,
}

async fn w3(lib: &Lib, deployed: &Deployed, grants: u64) -> Row {
    let key = format!("w3:{}:{}", lib.name(), fastrand::u64(..));
    let granted = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicU64::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let shared = Arc::new(Mutex::new(Handoffs::default()));
    let window = Window::open(deployed, Some(lib)).await;
    let workers: Vec<_> = (0..W3_WORKERS)
        .map(|worker| {
            let (lib, key, shared) = (lib.clone(), key.clone(), shared.clone());
            let (granted, inside, overlaps) = (granted.clone(), inside.clone(), overlaps.clone());
            tokio::spawn(async move {
                loop {
                    let held = lib.acquire(&key).await;
                    let now = Instant::now();
                    if granted.fetch_add(1, Ordering::SeqCst) >= grants {
                        lib.release(held).await;
                        break;
                    }
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    {
                        let mut shared = shared.lock().expect("handoffs");
                        if let Some((previous, at)) = shared.last_release {
                            shared.since_release.push(now - at);
                            if previous != worker {
                                shared.handoffs.push(now - at);
                            }
                        }
                    }
                    inside.fetch_sub(1, Ordering::SeqCst);
                    lib.release(held).await;
                    shared.lock().expect("handoffs").last_release = Some((worker, Instant::now()));
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("W3 worker");
    }
    // The extra grants the workers took to learn that the count was reached are not counted
    // in the rate's numerator but their time is: at most one each, at the end.
    let took = window.close(deployed, Some(lib)).await;
    let mut row = took.per(grants as f64, "grant");
    let mut shared = shared.lock().expect("handoffs");
    let within = shared
        .since_release
        .iter()
        .filter(|since| **since <= Duration::from_millis(5))
        .count();
    let after_a_release = shared.since_release.len().max(1);
    row.insert("handoff_p50_ms".into(), pct(&mut shared.handoffs, 0.5));
    row.insert("handoff_p99_ms".into(), pct(&mut shared.handoffs, 0.99));
    row.insert("grants_within_5ms".into(), within as f64);
    row.insert(
        "grants_within_5ms_share".into(),
        within as f64 / after_a_release as f64,
    );
    row.insert("overlaps".into(), overlaps.load(Ordering::SeqCst) as f64);
    row
}

/// The watchdog's rounds in W4's hold: one every third of the lease.
fn w4_rounds() -> f64 {
    (W4_HOLD.as_millis() / (W4_LEASE / 3).as_millis()) as f64
}

/// W4: [`W4_LOCKS`] locks held [`W4_HOLD`] with a [`W4_LEASE`] lease, renewed by `client`'s
/// watchdog.
async fn w4(client: &distlock::Client, deployed: &Deployed) -> Row {
    let run = fastrand::u64(..);
    let mut guards = Vec::with_capacity(W4_LOCKS);
    for i in 0..W4_LOCKS {
        guards.push(
            client
                .lock(format!("w4:{run}:{i}"))
                .lease(W4_LEASE)
                .acquire()
                .await
                .expect("W4 acquire"),
        );
    }
    // Every lease's first renewal, which opens its keep-alive stream, before the hold.
    tokio::time::sleep(W4_LEASE).await;
    let window = Window::open(deployed, None).await;
    tokio::time::sleep(W4_HOLD).await;
    let took = window.close(deployed, None).await;
    let lost = guards.iter().filter(|guard| !guard.is_held()).count();
    // Every grant's key, under the escaped start of the run's lock keys.
    let keys = deployed
        .keys_under(&layout::escape(&format!("distlock:{{w4:{run}:")))
        .await;
    for guard in guards {
        guard.release().await.expect("W4 release");
    }
    let servers = &took.servers;
    let per_lease_per_round = servers.keep_alives / (W4_LOCKS as f64 * w4_rounds());
    Row::from([
        ("locks_lost".into(), lost as f64),
        ("keys_missing".into(), (W4_LOCKS as i64 - keys) as f64),
        ("keep_alives".into(), servers.keep_alives),
        (
            "keep_alives_per_lease_per_round".into(),
            per_lease_per_round,
        ),
        (
            "keep_alive_streams_opened".into(),
            servers.keep_alive_streams,
        ),
        ("leases_renewed".into(), servers.leases_renewed),
        ("server_requests".into(), servers.requests()),
        ("raft_writes".into(), servers.raft_committed),
        ("server_cpu_us".into(), servers.cpu.as_secs_f64() * 1e6),
        ("client_cpu_us".into(), took.client_cpu.as_secs_f64() * 1e6),
    ])
}

/// `metric=value` pairs of a row.
fn shown_row(row: &Row) -> String {
    row.iter()
        .map(|(metric, value)| format!("{metric}={value:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}

const WORKLOADS: [&str; 4] = ["W1", "W2", "W3", "W4"];

/// The libraries each one's figures are divided by, round by round.
const BASELINES: [&str; 2] = ["raw", "v3lock"];

/// The figures compared round by round: each workload's main ones.
fn main_metrics(workload: &str) -> &'static [&'static str] {
    match workload {
        "W1" => &["cycles_per_s", "p50_ms"],
        "W2" => &["cycles_per_s"],
        "W3" => &["grants_per_s", "handoff_p50_ms"],
        _ => &[],
    }
}

/// The selected libraries of a deployment, connected and warmed up (connections, distlock's
/// watch, a grant's every request once).
async fn libraries(deployed: &Deployed) -> Vec<Lib> {
    let endpoint = &deployed.endpoints[0];
    let mut libs = Vec::new();
    for name in Lib::NAMES {
        if !selected("BENCH_LIBS", name, true) {
            continue;
        }
        let lib = match name {
            "distlock" => Lib::Distlock(
                distlock::Client::new(
                    distlock::Config::etcd(&deployed.endpoints).expect("endpoints"),
                )
                .expect("distlock client"),
            ),
            "raw" => Lib::Raw(Arc::new(Raw::connect(endpoint).await)),
            _ => Lib::V3Lock(Arc::new(V3Lock::connect(endpoint).await)),
        };
        join_all((0..W3_WORKERS).map(|slot| {
            let lib = &lib;
            async move {
                let held = lib.acquire(&format!("warm-up:{slot}")).await;
                lib.release(held).await;
            }
        }))
        .await;
        libs.push(lib);
    }
    libs
}

/// Runs the selected workloads `runs` rounds on one deployment, then prints the gRPC calls
/// its members handled, by method.
async fn bench(deployed: &Deployed, runs: usize, scale: f64, results: &mut Results) {
    let deployment = deployed.deployment;
    let libs = libraries(deployed).await;
    let start = deployed.counters().await;
    for round in 0..runs {
        for workload in WORKLOADS {
            if !selected("BENCH_WORKLOADS", workload, true) {
                continue;
            }
            for lib in rounds::rotated(&libs, round) {
                let row = match (workload, lib) {
                    ("W1", _) => w1(lib, deployed, scaled(2000, scale)).await,
                    ("W2", _) => w2(lib, deployed, scaled(200, scale)).await,
                    ("W3", _) => w3(lib, deployed, scaled(1000, scale) as u64).await,
                    ("W4", Lib::Distlock(client)) => w4(client, deployed).await,
                    _ => continue,
                };
                eprintln!(
                    "round {round} {:<7} {workload} {:<8} {}",
                    deployment.name(),
                    lib.name(),
                    shown_row(&row)
                );
                results
                    .entry((deployment, workload, lib.name()))
                    .or_default()
                    .push(row);
            }
        }
    }
    let whole = deployed.counters().await.since(&start);
    eprintln!(
        "\n{}: gRPC calls handled by method (every member, the whole run):",
        deployment.name()
    );
    for (method, calls) in &whole.calls {
        eprintln!("  {calls:>10} {method}");
    }
    if whole.leader_changes > 0.0 {
        println!(
            "warning: {} changed leaders during the run ({} changes seen by the members): the \
             libraries' member may have been a follower for a while",
            deployment.name(),
            whole.leader_changes
        );
    }
}

fn main() {
    // First, while this process has one thread.
    let pinning = pinning::pin("etcd");
    run(pinning);
}

/// The bench, on the runtime a plain `#[tokio::main]` service gets.
#[tokio::main]
async fn run(pinning: String) {
    let runs = rounds::runs();
    let scale = rounds::scale();
    let header = Header::new(Some("etcd"))
        .text("date", header::date())
        .text("commit", header::commit())
        .count("nproc", pinning::online_cpus())
        .text("cpu", header::cpu_model())
        .text(
            "etcd",
            header::known(header::command_line("etcd", &["--version"])),
        )
        .text("pinning", pinning)
        .count("rounds", runs)
        .text("scale", scale.to_string());
    header.print();

    let mut results = Results::new();
    for deployment in Deployment::ALL {
        if !selected("BENCH_DEPLOYMENTS", deployment.name(), true) {
            continue;
        }
        // Each deployment's members are stopped (dropped) before the next one starts.
        let deployed = Deployed::start(deployment).await;
        bench(&deployed, runs, scale, &mut results).await;
    }

    let medians = rounds::medians(&results);
    rounds::print_medians(&medians, runs, "raw");
    rounds::print_round_ratios(&results, &BASELINES, main_metrics);
    print_targets(&medians);
    rounds::write_jsonl(&header, &results, &medians, runs, &BASELINES, main_metrics);
}

/// The targets, from the medians, per deployment.
fn print_targets(medians: &BTreeMap<Key, Row>) {
    let get = |deployment, workload, lib, metric: &str| {
        medians
            .get(&(deployment, workload, lib))
            .and_then(|row| row.get(metric))
            .copied()
    };
    let shown = |value: Option<f64>| value.map_or("-".to_owned(), |v| format!("{v:.2}"));
    println!("\ntargets (issue 39, item 7)");
    for deployment in Deployment::ALL {
        if !medians.keys().any(|key| key.0 == deployment) {
            continue;
        }
        let name = deployment.name();
        let at = |workload, lib, metric: &str| get(deployment, workload, lib, metric);
        let ran = |workload| {
            medians
                .keys()
                .any(|key| key.0 == deployment && key.1 == workload)
        };
        let ratio = match (at("W1", "distlock", "p50_ms"), at("W1", "v3lock", "p50_ms")) {
            (Some(distlock), Some(v3lock)) if v3lock > 0.0 => Some(distlock / v3lock),
            _ => None,
        };
        let w1 = ran("W1");
        if w1 {
            println!(
                "  {name}: uncontended cycle (W1 p50) distlock {} ms, v3lock {} ms: {}x the \
                 lock service's (target at most 1.2; per round: W1's p50_ms vs v3lock above); \
                 raw {} ms",
                shown(at("W1", "distlock", "p50_ms")),
                shown(at("W1", "v3lock", "p50_ms")),
                shown(ratio),
                shown(at("W1", "raw", "p50_ms")),
            );
        }
        if ran("W3") {
            println!(
                "  {name}: handoff woken by the watch: distlock's W3 grants within 5 ms of the \
                 previous release {} (share {}), handoff p50 {} ms (raw {}, v3lock {}); overlaps {} \
                 (must be 0)",
                shown(at("W3", "distlock", "grants_within_5ms")),
                shown(at("W3", "distlock", "grants_within_5ms_share")),
                shown(at("W3", "distlock", "handoff_p50_ms")),
                shown(at("W3", "raw", "handoff_p50_ms")),
                shown(at("W3", "v3lock", "handoff_p50_ms")),
                shown(at("W3", "distlock", "overlaps")),
            );
        }
        if ran("W4") {
            println!(
                "  {name}: W4 renewals: keep-alives per lease per round {} (target 1; {} rounds), \
                 keep-alive streams opened in the hold {}, locks lost {} and keys missing {} (all \
                 three must be 0)",
                shown(at("W4", "distlock", "keep_alives_per_lease_per_round")),
                w4_rounds(),
                shown(at("W4", "distlock", "keep_alive_streams_opened")),
                shown(at("W4", "distlock", "locks_lost")),
                shown(at("W4", "distlock", "keys_missing")),
            );
        }
        if !w1 {
            continue;
        }
        println!(
            "  {name}: Raft writes per W1 cycle: distlock {}, raw {}, v3lock {}; gRPC requests: \
             distlock {}, raw {}, v3lock {}",
            shown(at("W1", "distlock", "raft_writes_per_cycle")),
            shown(at("W1", "raw", "raft_writes_per_cycle")),
            shown(at("W1", "v3lock", "raft_writes_per_cycle")),
            shown(at("W1", "distlock", "server_requests_per_cycle")),
            shown(at("W1", "raw", "server_requests_per_cycle")),
            shown(at("W1", "v3lock", "server_requests_per_cycle")),
        );
        // The raw floor is a floor only if it sends what distlock sends.
        let methods = |lib| -> Vec<(String, f64)> {
            medians
                .get(&(deployment, "W1", lib))
                .map(|row| {
                    row.iter()
                        .filter(|(metric, _)| metric.starts_with("rpc_"))
                        .map(|(metric, calls)| (metric.clone(), (calls * 100.0).round() / 100.0))
                        .collect()
                })
                .unwrap_or_default()
        };
        let (raw, distlock) = (methods("raw"), methods("distlock"));
        if !raw.is_empty() && !distlock.is_empty() {
            let listed = |calls: &[(String, f64)]| {
                let calls: Vec<String> = calls
                    .iter()
                    .map(|(metric, calls)| format!("{metric} {calls}"))
                    .collect();
                calls.join(", ")
            };
            if raw == distlock {
                println!(
                    "  {name}: the raw floor sends the requests distlock sends ({})",
                    listed(&raw)
                );
            } else {
                println!(
                    "  {name}: the raw floor's requests differ from distlock's: raw {}; distlock \
                     {} — update `layout` or `Raw` in benches/etcd.rs from \
                     lock-runtime/src/store/etcd/",
                    listed(&raw),
                    listed(&distlock)
                );
            }
        }
    }
}
