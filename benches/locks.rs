//! distlock beside the raw Redis floor and the `rslock` crate, in one run, on servers started
//! for the purpose.
//!
//!     cargo bench --bench locks                 # 5 alternating rounds, pinned; medians reported
//!     BENCH_RUNS=9 cargo bench --bench locks
//!     BENCH_LIBS=raw,distlock BENCH_WORKLOADS=W2 cargo bench --bench locks   # a subset
//!     BENCH_DEPLOYMENTS=single,cluster,redlock cargo bench --bench locks     # deployments
//!     BENCH_PIN=0 cargo bench --bench locks     # no pinning
//!
//! Pinning (issue 10): unless `BENCH_PIN=0`, the servers run on CPU 0 and this process on CPU 1,
//! so client and servers never take turns on one core. Before any thread starts, the bench sets
//! `DISTLOCK_SERVER_CPUS` (read by `tests/support`, which starts each `redis-server` under
//! `taskset -c`) to `0` unless it is set already, and pins itself with `taskset -p -c` to
//! `BENCH_CLIENT_CPUS` (default `1`); its threads inherit that, and the tokio runtime has one
//! worker per client CPU. A machine with a single CPU is not pinned. The old way,
//! `DISTLOCK_SERVER_CPUS=0 taskset -c 1 cargo bench --bench locks`, gives the same placement.
//!
//! Rounds (`BENCH_RUNS`, default 5): each round runs every selected workload with every library,
//! one library after the other, the order rotated by one each round so that no library always
//! goes first. Reported:
//! - the median over the rounds of every metric, with its ratio to raw's median in brackets;
//! - per-round ratios: each workload's main figures (W1 cycles/s and p50, W2 cycles/s, W3
//!   grants/s, W4 requests and server commands), round by round, divided by raw's and by
//!   rslock's figure of the same round and deployment, with the median of those ratios. A
//!   ratio within one round cancels what drifts between rounds (the machine's other work).
//!
//! Deployments (`BENCH_DEPLOYMENTS`, default `single`), one after the other, each on its own
//! servers (stopped before the next one starts):
//! - single: one `redis-server`; raw, distlock, rslock, rslock-5ms; W1–W5.
//! - cluster: a 3-primary/3-replica Redis Cluster; raw (through a cluster-aware connection) and
//!   distlock (`Config::cluster`); rslock has no cluster support. W1–W4.
//! - redlock: 3 independent masters; raw (`SET NX PX` on the 3 at once, held on a majority),
//!   distlock (`Config::redlock`), rslock and rslock-5ms (`LockManager` over the same 3). W1–W4.
//!
//! Workloads (issue 5):
//! - W1: one task, 5,000 acquire+release cycles on fresh keys: cycle latency p50/p99, cycles/s.
//! - W2: 64 tasks sharing one client, 500 cycles each on their own keys: cycles/s.
//! - W3: 8 workers on one key, 2,000 grants, a non-atomic GET/SET increment inside, 1 ms outside
//!   the lock after each release: grants/s, handoff latency (a release to the next grant by
//!   another worker) p50/p99, requests per grant, lost updates.
//! - W4: 1,000 locks held for 10 s with a 2 s lease: locks lost, requests sent.
//! - W5 (read/write locks, distlock only — the other libraries have none): 64 tasks sharing
//!   one client, 300 cycles each, 90 % reads and 10 % writes on 16 keys chosen at random, each
//!   held for a yield: cycles/s, and acquire latency p50/p99 of reads and of writes.
//! - W6 (semaphores, issue 12, distlock only, every deployment): a semaphore of 8 permits on
//!   one key, 32 tasks sharing one client, 100 cycles each, each permit held for 1 ms:
//!   grants/s, acquire latency p50/p99, the most holders seen inside at once (never above 8),
//!   server commands per grant; and `W6-solo`: one task, 2,000 acquire+release cycles of a
//!   semaphore on fresh keys, the same figures as W1.
//! - W7 (multi-key locks, issue 12, distlock only, every deployment): `W7-solo`, one task,
//!   2,000 `lock_all` of two fresh keys (on Cluster, in two slots), the same figures as W1;
//!   and W7, transfers: 64 tasks sharing one client, 100 cycles each, `lock_all` of two of 32
//!   accounts chosen at random (either order), held for a yield: cycles/s, acquire latency
//!   p50/p99, and overlaps seen (an account held twice at once: must be 0).
//! - W8 (fair locks, issue 12, distlock only, every deployment): W3's shape without the
//!   increment — 8 workers on one key, 2,000 grants, 1 ms outside the lock after each release
//!   — taken with `.fair()` (`W8`) and without (`W8-unfair`): grants/s, handoff latency p50/p99,
//!   each acquire's wait p50/p99/max (what fairness is for: no waiter waits much longer than the
//!   others), server commands per grant.
//!
//! Costs, read before and after each (library, workload) measurement (on W4, around the hold):
//! - `client_cpu_us_per_cycle` (W1, W2; `client_cpu_us` in all on W4, around the hold): this
//!   process's CPU time, user + system, all threads (`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`,
//!   to the nanosecond).
//! - `server_cpu_us_per_cycle` (W1, W2; `_per_grant` on W3; `server_cpu_us` in all on W4):
//!   `used_cpu_sys` + `used_cpu_user` of `INFO cpu`, summed over the servers that take writes
//!   (the one server, the cluster's primaries, every master; replicas are left out).
//! - `server_commands_per_cycle` (W1, W2; `_per_grant` on W3; `server_commands` on W4): every
//!   command call those servers count in `INFO commandstats` (top level and run inside
//!   scripts), less the `INFO` calls that take the readings. W3's include the GET and SET of
//!   the increment.
//! - "Requests" (W3, W4): the calls of the commands each library sends at top level, from the
//!   same readings, so every library is measured the same way.
//!
//! Output: a header (CPUs, CPU model, `redis-server` version, commit, date, pinning), a line per
//! measurement on stderr, the table of medians, the per-round tables. JSON lines are appended
//! to `target/bench.jsonl`: the header as `{"header": {...}}`, then one line per (deployment,
//! workload, library) with the medians and the medians of the per-round ratios
//! (`<metric>_vs_raw`, `<metric>_vs_rslock`). The pinning, the header, the rounds' medians and
//! ratios, their tables and JSON lines are `benches/support/`'s, shared with `postgres.rs`
//! and `etcd.rs`.

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
use bench_support::process_cpu::process_cpu;
use bench_support::rounds::{self, pct, selected, Measured};
use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use support::cluster::RedisCluster;
use support::masters::start_masters;
use support::RedisServer;

const LEASE: Duration = Duration::from_secs(10);

/// Where the locks live.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Deployment {
    Single,
    Cluster,
    Redlock,
}

impl Deployment {
    const ALL: [Deployment; 3] = [Deployment::Single, Deployment::Cluster, Deployment::Redlock];

    fn name(self) -> &'static str {
        match self {
            Deployment::Single => "single",
            Deployment::Cluster => "cluster",
            Deployment::Redlock => "redlock",
        }
    }
}

/// The servers of one deployment, started for it and stopped when dropped.
enum Servers {
    /// One `redis-server`.
    Single(RedisServer),
    /// A 3-primary/3-replica Redis Cluster.
    Cluster(RedisCluster),
    /// Independent masters, for Redlock.
    Masters(Vec<RedisServer>),
}

impl Servers {
    /// The servers that take the locks' writes, whose `INFO` counts the requests and the
    /// servers' work: the one server, the cluster's primaries (replicas only replay them),
    /// every master.
    fn writable(&self) -> Vec<&RedisServer> {
        match self {
            Servers::Single(server) => vec![server],
            Servers::Cluster(cluster) => cluster
                .primaries()
                .into_iter()
                .map(|index| cluster.node(index))
                .collect(),
            Servers::Masters(masters) => masters.iter().collect(),
        }
    }
}

/// A deployment, running: its servers, a connection to each server a lock must be won on (a
/// majority of them; on a cluster, one cluster-aware connection that routes by key), a
/// connection of its own for the data the workloads keep beside the locks (W3's counter): to the
/// one server, the cluster, the first master; and a connection to each writable server for
/// reading its counters, opened once so that no connection setup falls into a measurement.
struct Deployed {
    deployment: Deployment,
    servers: Servers,
    connections: Vec<Conn>,
    store: Conn,
    probes: Vec<Mutex<redis::Connection>>,
}

impl Deployed {
    /// Everything that differs between deployments is set up here.
    async fn start(deployment: Deployment) -> Self {
        let servers = match deployment {
            Deployment::Single => Servers::Single(RedisServer::start()),
            Deployment::Cluster => Servers::Cluster(RedisCluster::start()),
            Deployment::Redlock => Servers::Masters(start_masters(3)),
        };
        let connections = Self::connect(&servers).await;
        let store = Self::connect(&servers).await.swap_remove(0);
        let probes = servers
            .writable()
            .into_iter()
            .map(|server| Mutex::new(server.connection()))
            .collect();
        Self {
            deployment,
            servers,
            connections,
            store,
            probes,
        }
    }

    async fn connect(servers: &Servers) -> Vec<Conn> {
        match servers {
            Servers::Single(server) => vec![Conn::node(server).await],
            Servers::Cluster(cluster) => {
                let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("urls");
                vec![Conn::Cluster(
                    client.get_async_connection().await.expect("connect"),
                )]
            }
            Servers::Masters(masters) => join_all(masters.iter().map(Conn::node)).await,
        }
    }

    /// The URLs distlock and rslock are given.
    fn urls(&self) -> Vec<String> {
        match &self.servers {
            Servers::Single(server) => vec![server.url()],
            Servers::Cluster(cluster) => cluster.urls(),
            Servers::Masters(masters) => masters.iter().map(RedisServer::url).collect(),
        }
    }

    fn distlock_config(&self) -> distlock::Config {
        match self.deployment {
            Deployment::Single => distlock::Config::from_url(&self.urls()[0]),
            Deployment::Cluster => distlock::Config::cluster(self.urls()),
            Deployment::Redlock => distlock::Config::redlock(self.urls()),
        }
        .expect("urls")
    }

    /// See [`Servers::writable`].
    fn writable(&self) -> Vec<&RedisServer> {
        self.servers.writable()
    }

    /// How many of `connections` a lock must be held on.
    fn quorum(&self) -> usize {
        self.connections.len() / 2 + 1
    }

    /// Whether `key` holds `value` on a majority of the servers.
    async fn holds(&self, key: &[u8], value: &[u8]) -> bool {
        let values = join_all(self.connections.iter().map(|connection| async move {
            let mut connection = connection.clone();
            let value: Option<Vec<u8>> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut connection)
                .await
                .expect("GET");
            value
        }))
        .await;
        values
            .iter()
            .filter(|v| v.as_deref() == Some(value))
            .count()
            >= self.quorum()
    }

    fn store(&self) -> Conn {
        self.store.clone()
    }
}

/// A connection to one server or to a cluster.
#[derive(Clone)]
enum Conn {
    Node(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn node(server: &RedisServer) -> Self {
        let client = redis::Client::open(server.url()).expect("url");
        Conn::Node(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("connect"),
        )
    }
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Node(connection) => connection.req_packed_command(cmd),
            Conn::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Node(connection) => connection.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(connection) => connection.get_db(),
            Conn::Cluster(connection) => connection.get_db(),
        }
    }
}

/// A library under test.
#[derive(Clone)]
enum Lib {
    /// A distlock client, the name it is reported under, and whether its locks take a fencing
    /// token: "distlock" (with, the default) and "distlock-nofence" (the efficiency mode,
    /// `LockRequest::fencing(false)`).
    Distlock(distlock::Client, &'static str, bool),
    Raw(Raw),
    Rslock(Arc<rslock::LockManager>, &'static str),
}

enum Held {
    Distlock(distlock::LockGuard),
    Raw(String, String),
    Rslock(rslock::Lock),
}

/// The floor: `SET NX PX` and a compare-and-delete script, over one multiplexed connection per
/// server (or one cluster connection). On several servers (Redlock) each step goes to all of
/// them at once, and a lock is held when a majority set it (else it is undone where it was).
#[derive(Clone)]
struct Raw {
    connections: Vec<Conn>,
    release: Arc<redis::Script>,
    extend: Arc<redis::Script>,
    poll: Duration,
}

impl Raw {
    async fn try_acquire(&self, key: &str, token: &str, lease: Duration) -> bool {
        let set = join_all(self.connections.iter().map(|connection| async move {
            let mut connection = connection.clone();
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(lease.as_millis() as u64)
                .query_async(&mut connection)
                .await
                .expect("raw SET");
            set.is_some()
        }))
        .await;
        let won = set.iter().filter(|&&set| set).count();
        if won > self.connections.len() / 2 {
            return true;
        }
        if won > 0 {
            let undo = self.connections.iter().zip(&set).filter(|(_, &set)| set);
            join_all(
                undo.map(|(connection, _)| self.call(&self.release, connection, key, token, None)),
            )
            .await;
        }
        false
    }

    async fn release(&self, key: &str, token: &str) {
        let released = join_all(
            self.connections
                .iter()
                .map(|connection| self.call(&self.release, connection, key, token, None)),
        )
        .await;
        for result in released {
            result.expect("raw release");
        }
    }

    /// Errors count as not extended, like a lock that was lost.
    async fn extend(&self, key: &str, token: &str, lease: Duration) {
        join_all(
            self.connections
                .iter()
                .map(|connection| self.call(&self.extend, connection, key, token, Some(lease))),
        )
        .await;
    }

    /// One of the scripts on one server.
    async fn call(
        &self,
        script: &redis::Script,
        connection: &Conn,
        key: &str,
        token: &str,
        lease: Option<Duration>,
    ) -> redis::RedisResult<i64> {
        let mut connection = connection.clone();
        let mut invocation = script.key(key);
        invocation.arg(token);
        if let Some(lease) = lease {
            invocation.arg(lease.as_millis() as u64);
        }
        invocation.invoke_async(&mut connection).await
    }
}

impl Lib {
    fn name(&self) -> String {
        match self {
            Lib::Distlock(_, name, _) => (*name).into(),
            Lib::Raw(_) => "raw".into(),
            Lib::Rslock(_, name) => (*name).into(),
        }
    }

    async fn acquire(&self, key: &str, lease: Duration) -> Held {
        match self {
            Lib::Distlock(client, _, fencing) => {
                let request = client
                    .lock(key)
                    .lease(lease)
                    .wait(Duration::from_secs(60))
                    .fencing(*fencing);
                Held::Distlock(request.acquire().await.expect("distlock acquire"))
            }
            Lib::Raw(raw) => {
                let token = uuid::Uuid::new_v4().simple().to_string();
                while !raw.try_acquire(key, &token, lease).await {
                    tokio::time::sleep(raw.poll).await;
                }
                Held::Raw(key.to_owned(), token)
            }
            Lib::Rslock(manager, _) => loop {
                if let Ok(lock) = manager.lock(key.as_bytes(), lease).await {
                    break Held::Rslock(lock);
                }
            },
        }
    }

    async fn release(&self, held: Held) {
        match (self, held) {
            (Lib::Distlock(..), Held::Distlock(guard)) => {
                guard.release().await.expect("distlock release");
            }
            (Lib::Raw(raw), Held::Raw(key, token)) => raw.release(&key, &token).await,
            (Lib::Rslock(manager, _), Held::Rslock(lock)) => manager.unlock(&lock).await,
            _ => unreachable!("a guard of another library"),
        }
    }
}

/// The commands a library sends at top level, whose calls are its requests (`INFO
/// commandstats` also counts the commands scripts run inside, which are not requests). distlock
/// sends only scripts and pub/sub; raw and rslock also send `SET`.
fn top_level(lib: &Lib) -> &'static [&'static str] {
    match lib {
        Lib::Distlock(..) => &[
            "evalsha",
            "eval",
            "script",
            "subscribe",
            "unsubscribe",
            "ssubscribe",
            "sunsubscribe",
        ],
        _ => &["set", "evalsha", "eval", "script"],
    }
}

/// What the servers that take writes have done so far, summed over them: their CPU time and
/// the calls of each command, top level and inside scripts (`INFO cpu`, `INFO commandstats`).
#[derive(Default)]
struct ServerCounters {
    cpu: Duration,
    calls: BTreeMap<String, u64>,
}

impl ServerCounters {
    fn read(deployed: &Deployed) -> Self {
        let mut total = Self::default();
        for probe in &deployed.probes {
            let mut connection = probe.lock().expect("probe");
            let mut info = |section: &str| -> String {
                redis::cmd("INFO")
                    .arg(section)
                    .query(&mut *connection)
                    .expect("INFO")
            };
            total.cpu += server_cpu(&info("cpu"));
            for (name, calls) in command_calls(&info("commandstats")) {
                *total.calls.entry(name).or_default() += calls;
            }
        }
        total
    }

    /// What was done since the `earlier` reading.
    fn since(&self, earlier: &Self) -> Self {
        let calls = self
            .calls
            .iter()
            .map(|(name, calls)| {
                let before = earlier.calls.get(name).copied().unwrap_or(0);
                (name.clone(), calls.saturating_sub(before))
            })
            .collect();
        Self {
            cpu: self.cpu.saturating_sub(earlier.cpu),
            calls,
        }
    }

    /// The calls of the commands `names`.
    fn calls_of(&self, names: &[&str]) -> u64 {
        names.iter().filter_map(|name| self.calls.get(*name)).sum()
    }

    /// Every command call but the `INFO`s that took the readings.
    fn commands(&self) -> u64 {
        let info = self.calls.get("info").copied().unwrap_or(0);
        self.calls.values().sum::<u64>() - info
    }
}

/// `used_cpu_sys` + `used_cpu_user` of an `INFO cpu` reply (seconds, to the microsecond).
fn server_cpu(info: &str) -> Duration {
    let seconds = |field| {
        support::info_field(info, field)
            .and_then(|value| value.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {field} in INFO cpu"))
    };
    Duration::from_secs_f64(seconds("used_cpu_sys") + seconds("used_cpu_user"))
}

/// (command, calls) of each `cmdstat_<command>:calls=N,...` line of an `INFO commandstats` reply.
fn command_calls(info: &str) -> impl Iterator<Item = (String, u64)> + '_ {
    info.lines().filter_map(|line| {
        let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
        let calls = stats.split("calls=").nth(1)?.split(',').next()?;
        Some((name.to_owned(), calls.parse().ok()?))
    })
}

/// A stretch of a workload under measurement: its wall time, this process's CPU time and the
/// writable servers' counters. The servers are read outside the clocks: before they start,
/// after they stop.
struct Window {
    servers: ServerCounters,
    client_cpu: Duration,
    started: Instant,
}

impl Window {
    fn open(deployed: &Deployed) -> Self {
        let servers = ServerCounters::read(deployed);
        Self {
            servers,
            client_cpu: process_cpu(),
            started: Instant::now(),
        }
    }

    fn close(self, deployed: &Deployed) -> Cost {
        let elapsed = self.started.elapsed();
        let client_cpu = process_cpu() - self.client_cpu;
        Cost {
            elapsed,
            client_cpu,
            servers: ServerCounters::read(deployed).since(&self.servers),
        }
    }
}

/// What a [`Window`] took.
struct Cost {
    elapsed: Duration,
    client_cpu: Duration,
    servers: ServerCounters,
}

impl Cost {
    /// The requests `lib` sent: the calls of its top-level commands.
    fn requests(&self, lib: &Lib) -> u64 {
        self.servers.calls_of(top_level(lib))
    }

    fn server_cpu_us(&self) -> f64 {
        self.servers.cpu.as_secs_f64() * 1e6
    }

    /// W1's and W2's figures per acquire+release cycle: cycles/s and the costs.
    fn per_cycle(&self, cycles: f64) -> [(&'static str, f64); 4] {
        [
            ("cycles_per_s", cycles / self.elapsed.as_secs_f64()),
            (
                "client_cpu_us_per_cycle",
                self.client_cpu.as_secs_f64() * 1e6 / cycles,
            ),
            ("server_cpu_us_per_cycle", self.server_cpu_us() / cycles),
            (
                "server_commands_per_cycle",
                self.servers.commands() as f64 / cycles,
            ),
        ]
    }
}

type Row = BTreeMap<&'static str, f64>;

async fn w1(lib: &Lib, deployed: &Deployed) -> Row {
    const CYCLES: usize = 5000;
    let tag = lib.name();
    let mut samples = Vec::with_capacity(CYCLES);
    let window = Window::open(deployed);
    for i in 0..CYCLES {
        let key = format!("w1:{tag}:{i}:{}", fastrand::u64(..));
        let t = Instant::now();
        let held = lib.acquire(&key, LEASE).await;
        lib.release(held).await;
        samples.push(t.elapsed());
    }
    let cost = window.close(deployed);
    let mut row = Row::from([
        ("p50_ms", pct(&mut samples, 0.5)),
        ("p99_ms", pct(&mut samples, 0.99)),
    ]);
    row.extend(cost.per_cycle(CYCLES as f64));
    row
}

async fn w2(lib: &Lib, deployed: &Deployed) -> Row {
    const TASKS: usize = 64;
    const CYCLES: usize = 500;
    let window = Window::open(deployed);
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let lib = lib.clone();
            tokio::spawn(async move {
                let tag = lib.name();
                for i in 0..CYCLES {
                    let key = format!("w2:{tag}:{t}:{i}:{}", fastrand::u64(..));
                    let held = lib.acquire(&key, LEASE).await;
                    lib.release(held).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("w2 task");
    }
    let cost = window.close(deployed);
    Row::from(cost.per_cycle((TASKS * CYCLES) as f64))
}

async fn w3(lib: &Lib, deployed: &Deployed) -> Row {
    const GRANTS: u64 = 2000;
    let key = format!("w3:{}:{}", lib.name(), fastrand::u64(..));
    let counter = format!("{key}:counter");
    let granted = Arc::new(AtomicU64::new(0));
    // (worker, released at) of the last release, to measure handoffs.
    let last_release: Arc<Mutex<Option<(usize, Instant)>>> = Arc::new(Mutex::new(None));
    let handoffs = Arc::new(Mutex::new(Vec::new()));
    let window = Window::open(deployed);
    let workers: Vec<_> = (0..8)
        .map(|worker| {
            let (lib, key, counter) = (lib.clone(), key.clone(), counter.clone());
            let (granted, last_release, handoffs) =
                (granted.clone(), last_release.clone(), handoffs.clone());
            let mut store = deployed.store();
            tokio::spawn(async move {
                loop {
                    let held = lib.acquire(&key, LEASE).await;
                    let now = Instant::now();
                    if granted.fetch_add(1, Ordering::SeqCst) >= GRANTS {
                        lib.release(held).await;
                        break;
                    }
                    if let Some((previous, at)) = *last_release.lock().unwrap() {
                        if previous != worker {
                            handoffs.lock().unwrap().push(now - at);
                        }
                    }
                    let value: Option<u64> = redis::cmd("GET")
                        .arg(&counter)
                        .query_async(&mut store)
                        .await
                        .expect("GET");
                    let () = redis::cmd("SET")
                        .arg(&counter)
                        .arg(value.unwrap_or(0) + 1)
                        .query_async(&mut store)
                        .await
                        .expect("SET");
                    lib.release(held).await;
                    *last_release.lock().unwrap() = Some((worker, Instant::now()));
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("w3 worker");
    }
    let cost = window.close(deployed);
    // The increment's SET is the work, not the lock's request.
    let work = if matches!(lib, Lib::Distlock(..)) {
        0
    } else {
        GRANTS
    };
    let requests = cost.requests(lib) - work;
    let final_value: Option<u64> = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut deployed.store())
        .await
        .expect("GET");
    let mut handoffs = handoffs.lock().unwrap().clone();
    Row::from([
        ("grants_per_s", GRANTS as f64 / cost.elapsed.as_secs_f64()),
        ("handoff_p50_ms", pct(&mut handoffs, 0.5)),
        ("handoff_p99_ms", pct(&mut handoffs, 0.99)),
        ("requests_per_grant", requests as f64 / GRANTS as f64),
        (
            "server_cpu_us_per_grant",
            cost.server_cpu_us() / GRANTS as f64,
        ),
        (
            "server_commands_per_grant",
            cost.servers.commands() as f64 / GRANTS as f64,
        ),
        ("lost_updates", (GRANTS - final_value.unwrap_or(0)) as f64),
    ])
}

async fn w4(lib: &Lib, deployed: &Deployed) -> Row {
    let lease = Duration::from_secs(2);
    let hold = Duration::from_secs(10);
    let tag = format!("{}:{}", lib.name(), fastrand::u64(..));
    let mut held = Vec::new();
    for i in 0..1000 {
        held.push(lib.acquire(&format!("w4:{tag}:{i}"), lease).await);
    }
    let window = Window::open(deployed);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Libraries without a watchdog renew each lock themselves, once per third of the lease:
    // a task per lock owns it while the locks are held and hands it back at the end.
    let mut renewers = Vec::new();
    let mut watched = Vec::new();
    for h in held {
        if matches!(h, Held::Distlock(_)) {
            watched.push(h);
            continue;
        }
        let (lib, stop) = (lib.clone(), stop.clone());
        renewers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(lease / 3).await;
                match (&lib, &h) {
                    (Lib::Raw(raw), Held::Raw(key, token)) => raw.extend(key, token, lease).await,
                    (Lib::Rslock(manager, _), Held::Rslock(lock)) => {
                        let _ = manager.extend(lock, lease).await;
                    }
                    _ => {}
                }
            }
            h
        }));
    }
    tokio::time::sleep(hold).await;
    stop.store(true, Ordering::Relaxed);
    let cost = window.close(deployed);
    let requests = cost.requests(lib);
    for renewer in renewers {
        watched.push(renewer.await.expect("renewer"));
    }
    // A lock is lost if its key no longer holds its owner's value (on a majority of servers).
    let mut lost = 0;
    for h in &watched {
        let still = match h {
            Held::Distlock(guard) => guard.is_held(),
            Held::Raw(key, token) => deployed.holds(key.as_bytes(), token.as_bytes()).await,
            Held::Rslock(lock) => deployed.holds(&lock.resource, &lock.val).await,
        };
        if !still {
            lost += 1;
        }
    }
    for h in watched {
        lib.release(h).await;
    }
    let per_lock_per_period = 1000 * (hold.as_millis() / (lease / 3).as_millis()) as u64;
    Row::from([
        ("locks_lost", lost as f64),
        ("requests", requests as f64),
        (
            "fraction_of_per_lock_renewal",
            requests as f64 / per_lock_per_period as f64,
        ),
        ("server_commands", cost.servers.commands() as f64),
        ("server_cpu_us", cost.server_cpu_us()),
        ("client_cpu_us", cost.client_cpu.as_secs_f64() * 1e6),
    ])
}

async fn w5(client: &distlock::Client) -> Row {
    const TASKS: usize = 64;
    const CYCLES: usize = 300;
    let run = fastrand::u64(..);
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let (mut reads, mut writes) = (Vec::new(), Vec::new());
                for _ in 0..CYCLES {
                    let key = format!("w5:{run}:{}", fastrand::u8(..16));
                    let read = fastrand::u8(..10) < 9;
                    let request = if read {
                        client.read_lock(key)
                    } else {
                        client.write_lock(key)
                    };
                    let t = Instant::now();
                    let guard = request
                        .lease(LEASE)
                        .wait(Duration::from_secs(60))
                        .acquire()
                        .await
                        .expect("w5 acquire");
                    if read { &mut reads } else { &mut writes }.push(t.elapsed());
                    tokio::task::yield_now().await;
                    guard.release().await.expect("w5 release");
                }
                (reads, writes)
            })
        })
        .collect();
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    for task in tasks {
        let (r, w) = task.await.expect("w5 task");
        reads.extend(r);
        writes.extend(w);
    }
    Row::from([
        (
            "cycles_per_s",
            (TASKS * CYCLES) as f64 / started.elapsed().as_secs_f64(),
        ),
        ("read_p50_ms", pct(&mut reads, 0.5)),
        ("read_p99_ms", pct(&mut reads, 0.99)),
        ("write_p50_ms", pct(&mut writes, 0.5)),
        ("write_p99_ms", pct(&mut writes, 0.99)),
    ])
}

/// W6: a semaphore of 8 permits on one key, 32 tasks sharing `client`, 100 cycles each.
async fn w6(client: &distlock::Client, deployed: &Deployed) -> Row {
    const TASKS: usize = 32;
    const CYCLES: usize = 100;
    const PERMITS: u32 = 8;
    let key = format!("w6:{}", fastrand::u64(..));
    let inside = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let window = Window::open(deployed);
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (client, key) = (client.clone(), key.clone());
            let (inside, most) = (inside.clone(), most.clone());
            tokio::spawn(async move {
                let mut samples = Vec::with_capacity(CYCLES);
                for _ in 0..CYCLES {
                    let t = Instant::now();
                    let guard = client
                        .semaphore(key.clone(), PERMITS)
                        .lease(LEASE)
                        .wait(Duration::from_secs(60))
                        .acquire()
                        .await
                        .expect("w6 acquire");
                    samples.push(t.elapsed());
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("w6 release");
                }
                samples
            })
        })
        .collect();
    let mut samples = Vec::new();
    for task in tasks {
        samples.extend(task.await.expect("w6 task"));
    }
    let cost = window.close(deployed);
    let grants = (TASKS * CYCLES) as f64;
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= u64::from(PERMITS),
        "{most} holders of {PERMITS} permits"
    );
    Row::from([
        ("grants_per_s", grants / cost.elapsed.as_secs_f64()),
        ("acquire_p50_ms", pct(&mut samples, 0.5)),
        ("acquire_p99_ms", pct(&mut samples, 0.99)),
        ("most_inside", most as f64),
        (
            "client_cpu_us_per_grant",
            cost.client_cpu.as_secs_f64() * 1e6 / grants,
        ),
        ("server_cpu_us_per_grant", cost.server_cpu_us() / grants),
        (
            "server_commands_per_grant",
            cost.servers.commands() as f64 / grants,
        ),
    ])
}

/// W8: 8 workers on one key taking `client`'s lock, fair or not, 2,000 grants in all.
async fn w8(client: &distlock::Client, deployed: &Deployed, fair: bool) -> Row {
    const GRANTS: u64 = 2000;
    let key = format!("w8:{fair}:{}", fastrand::u64(..));
    let granted = Arc::new(AtomicU64::new(0));
    // (worker, released at) of the last release, to measure handoffs.
    let last_release: Arc<Mutex<Option<(usize, Instant)>>> = Arc::new(Mutex::new(None));
    let handoffs = Arc::new(Mutex::new(Vec::new()));
    let waits = Arc::new(Mutex::new(Vec::new()));
    let window = Window::open(deployed);
    let workers: Vec<_> = (0..8)
        .map(|worker| {
            let (client, key) = (client.clone(), key.clone());
            let (granted, last_release, handoffs, waits) = (
                granted.clone(),
                last_release.clone(),
                handoffs.clone(),
                waits.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let asked = Instant::now();
                    let mut request = client.lock(key.clone()).lease(LEASE);
                    if fair {
                        request = request.fair();
                    }
                    let guard = request
                        .wait(Duration::from_secs(60))
                        .acquire()
                        .await
                        .expect("w8 acquire");
                    let now = Instant::now();
                    if granted.fetch_add(1, Ordering::SeqCst) >= GRANTS {
                        guard.release().await.expect("w8 release");
                        break;
                    }
                    waits.lock().unwrap().push(now - asked);
                    if let Some((previous, at)) = *last_release.lock().unwrap() {
                        if previous != worker {
                            handoffs.lock().unwrap().push(now - at);
                        }
                    }
                    guard.release().await.expect("w8 release");
                    *last_release.lock().unwrap() = Some((worker, Instant::now()));
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("w8 worker");
    }
    let cost = window.close(deployed);
    let mut handoffs = handoffs.lock().unwrap().clone();
    let mut waits = waits.lock().unwrap().clone();
    Row::from([
        ("grants_per_s", GRANTS as f64 / cost.elapsed.as_secs_f64()),
        ("handoff_p50_ms", pct(&mut handoffs, 0.5)),
        ("handoff_p99_ms", pct(&mut handoffs, 0.99)),
        ("wait_p50_ms", pct(&mut waits, 0.5)),
        ("wait_p99_ms", pct(&mut waits, 0.99)),
        ("wait_max_ms", pct(&mut waits, 1.0)),
        (
            "server_commands_per_grant",
            cost.servers.commands() as f64 / GRANTS as f64,
        ),
    ])
}

/// W1's measurement of one task's acquire+release cycles, for a request made by `request`
/// from the cycle's number (W6-solo: a semaphore; W7-solo: two keys).
async fn solo(deployed: &Deployed, request: impl Fn(usize) -> distlock::LockRequest) -> Row {
    const CYCLES: usize = 2000;
    let mut samples = Vec::with_capacity(CYCLES);
    let window = Window::open(deployed);
    for i in 0..CYCLES {
        let t = Instant::now();
        let guard = request(i)
            .lease(LEASE)
            .acquire()
            .await
            .expect("solo acquire");
        guard.release().await.expect("solo release");
        samples.push(t.elapsed());
    }
    let cost = window.close(deployed);
    let mut row = Row::from([
        ("p50_ms", pct(&mut samples, 0.5)),
        ("p99_ms", pct(&mut samples, 0.99)),
    ]);
    row.extend(cost.per_cycle(CYCLES as f64));
    row
}

/// Two keys of one request in different Cluster slots (the names differ in their hash tags
/// anyway; on Cluster, retried until the slots differ).
fn two_keys(prefix: &str) -> [String; 2] {
    loop {
        let run = fastrand::u64(..);
        let keys = [format!("{prefix}:{run}:a"), format!("{prefix}:{run}:b")];
        let slot = |k: &str| redis::cluster_routing::Slot::for_key(format!("{{{k}}}"));
        if slot(&keys[0]) != slot(&keys[1]) {
            return keys;
        }
    }
}

/// W7: transfers between 32 accounts, 64 tasks sharing `client`, 100 cycles each.
async fn w7(client: &distlock::Client, deployed: &Deployed) -> Row {
    const TASKS: usize = 64;
    const CYCLES: usize = 100;
    const ACCOUNTS: usize = 32;
    let run = fastrand::u64(..);
    let held: Arc<Vec<AtomicU64>> = Arc::new((0..ACCOUNTS).map(|_| AtomicU64::new(0)).collect());
    let overlaps = Arc::new(AtomicU64::new(0));
    let window = Window::open(deployed);
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let client = client.clone();
            let (held, overlaps) = (held.clone(), overlaps.clone());
            tokio::spawn(async move {
                let mut samples = Vec::with_capacity(CYCLES);
                for _ in 0..CYCLES {
                    let from = fastrand::usize(..ACCOUNTS);
                    let to = (from + 1 + fastrand::usize(..ACCOUNTS - 1)) % ACCOUNTS;
                    let t = Instant::now();
                    let guard = client
                        .lock_all([format!("w7:{run}:{from}"), format!("w7:{run}:{to}")])
                        .lease(LEASE)
                        .wait(Duration::from_secs(60))
                        .acquire()
                        .await
                        .expect("w7 acquire");
                    samples.push(t.elapsed());
                    for account in [from, to] {
                        if held[account].fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    tokio::task::yield_now().await;
                    for account in [from, to] {
                        held[account].fetch_sub(1, Ordering::SeqCst);
                    }
                    guard.release().await.expect("w7 release");
                }
                samples
            })
        })
        .collect();
    let mut samples = Vec::new();
    for task in tasks {
        samples.extend(task.await.expect("w7 task"));
    }
    let cost = window.close(deployed);
    let cycles = (TASKS * CYCLES) as f64;
    let mut row = Row::from([
        ("acquire_p50_ms", pct(&mut samples, 0.5)),
        ("acquire_p99_ms", pct(&mut samples, 0.99)),
        ("overlaps", overlaps.load(Ordering::SeqCst) as f64),
    ]);
    row.extend(cost.per_cycle(cycles));
    row
}

/// The libraries of a deployment: the raw floor and distlock everywhere, rslock (with its
/// default retry delay and with 5 ms) where it runs, on one server or on Redlock's masters.
async fn libraries(deployed: &Deployed) -> Vec<Lib> {
    let raw = Raw {
        connections: deployed.connections.clone(),
        release: Arc::new(redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        )),
        extend: Arc::new(redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0",
        )),
        poll: Duration::from_millis(1),
    };
    // A client each, as two services would have.
    let client = || distlock::Client::new(deployed.distlock_config()).expect("client");
    let mut libs = vec![
        Lib::Raw(raw),
        Lib::Distlock(client(), "distlock", true),
        Lib::Distlock(client(), "distlock-nofence", false),
    ];
    if deployed.deployment != Deployment::Cluster {
        let rslock_default = rslock::LockManager::new(deployed.urls());
        let mut rslock_5ms = rslock::LockManager::new(deployed.urls());
        rslock_5ms.set_retry(3, Duration::from_millis(5));
        libs.push(Lib::Rslock(Arc::new(rslock_default), "rslock"));
        libs.push(Lib::Rslock(Arc::new(rslock_5ms), "rslock-5ms"));
    }
    libs
}

/// (deployment, workload, library).
type Key = (Deployment, String, String);

impl Measured for Key {
    fn deployment(&self) -> &str {
        self.0.name()
    }

    fn workload(&self) -> &str {
        &self.1
    }

    fn library(&self) -> &str {
        &self.2
    }

    fn with_library(&self, library: &'static str) -> Self {
        (self.0, self.1.clone(), library.to_owned())
    }

    fn label(&self) -> String {
        format!("{:<7} {} {:<11}", self.0.name(), self.1, self.2)
    }
}

/// One row per round, in round order (every library runs every workload once a round).
type Results = rounds::Results<Key, &'static str>;

/// Runs the selected workloads `runs` rounds on one deployment, then prints its servers' time
/// per call of each command (scripts include the commands they run).
async fn bench(deployed: &Deployed, runs: usize, results: &mut Results) {
    let deployment = deployed.deployment;
    let libs = libraries(deployed).await;
    // Warm every library up once (connections, script caches).
    for lib in &libs {
        let held = lib.acquire("warm-up", LEASE).await;
        lib.release(held).await;
    }
    for round in 0..runs {
        // Alternate the order between rounds so no library always goes first.
        let order = rounds::rotated(&libs, round);
        for workload in [
            "W1",
            "W2",
            "W3",
            "W4",
            "W5",
            "W6-solo",
            "W6",
            "W7-solo",
            "W7",
            "W8",
            "W8-unfair",
        ] {
            if !selected("BENCH_WORKLOADS", workload, true) {
                continue;
            }
            for lib in order
                .iter()
                .filter(|lib| selected("BENCH_LIBS", &lib.name(), true))
            {
                let row = match workload {
                    "W1" if lib.name() != "rslock-5ms" => w1(lib, deployed).await,
                    "W2" if lib.name() != "rslock-5ms" => w2(lib, deployed).await,
                    // The efficiency mode's targets are W1 and W2.
                    "W3" if lib.name() != "distlock-nofence" => w3(lib, deployed).await,
                    "W4" if !matches!(lib.name().as_str(), "rslock-5ms" | "distlock-nofence") => {
                        w4(lib, deployed).await
                    }
                    // W5: the default (fenced) client only.
                    "W5" => match lib {
                        Lib::Distlock(client, _, true) if deployment == Deployment::Single => {
                            w5(client).await
                        }
                        _ => continue,
                    },
                    // W6 and W7: the default (fenced) client only, every deployment.
                    "W6-solo" | "W6" | "W7-solo" | "W7" => match lib {
                        Lib::Distlock(client, _, true) => match workload {
                            "W6-solo" => {
                                solo(deployed, |i| {
                                    client.semaphore(format!("w6s:{i}:{}", fastrand::u64(..)), 8)
                                })
                                .await
                            }
                            "W6" => w6(client, deployed).await,
                            "W7-solo" => solo(deployed, |_| client.lock_all(two_keys("w7s"))).await,
                            _ => w7(client, deployed).await,
                        },
                        _ => continue,
                    },
                    // W8: fair and unfair, the default (fenced) client only, every deployment.
                    "W8" | "W8-unfair" => match lib {
                        Lib::Distlock(client, _, true) => {
                            w8(client, deployed, workload == "W8").await
                        }
                        _ => continue,
                    },
                    _ => continue,
                };
                eprintln!(
                    "round {round} {:<7} {workload} {:<11} {row:?}",
                    deployment.name(),
                    lib.name()
                );
                results
                    .entry((deployment, workload.to_owned(), lib.name()))
                    .or_default()
                    .push(row);
            }
        }
    }

    eprintln!("\n{} server time per call:", deployment.name());
    for server in deployed.writable() {
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut server.connection())
            .expect("INFO");
        eprintln!(" port {}:", server.port());
        for line in stats.lines().filter(|l| l.starts_with("cmdstat_")) {
            eprintln!("  {line}");
        }
    }
}

/// Gives this process a temp dir of its own, before any thread starts. The test support runs
/// every server with `--dir` at the temp dir, and a server loads the `dump.rdb` it finds there:
/// one a replica of another process left in a shared `/tmp` would fill a fresh server with keys
/// (and a cluster node with keys cannot join a cluster).
fn private_temp_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("distlock-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a temp dir");
    std::env::set_var("TMPDIR", &dir);
    dir
}

/// The libraries each one's figures are divided by, round by round.
const BASELINES: [&str; 2] = ["raw", "rslock"];

/// The figures compared round by round: each workload's main ones.
fn main_metrics(workload: &str) -> &'static [&'static str] {
    match workload {
        "W1" => &["cycles_per_s", "p50_ms"],
        "W2" => &["cycles_per_s"],
        "W3" => &["grants_per_s"],
        "W4" => &["requests", "server_commands"],
        _ => &[],
    }
}

fn main() {
    // First, while this process has one thread.
    let pinning = pinning::pin("servers");
    let temp_dir = private_temp_dir();
    let runs = rounds::runs();
    let header = Header::new(None)
        .text("date", header::date())
        .text("commit", header::commit())
        .count("nproc", pinning::online_cpus())
        .text("cpu", header::cpu_model())
        .text(
            "redis_server",
            header::known(header::command_line("redis-server", &["--version"])),
        )
        .text("pinning", pinning)
        .count("rounds", runs);
    header.print();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut results = Results::new();
    for deployment in Deployment::ALL {
        if !selected(
            "BENCH_DEPLOYMENTS",
            deployment.name(),
            deployment == Deployment::Single,
        ) {
            continue;
        }
        // Each deployment's servers are stopped (dropped) before the next one starts.
        runtime.block_on(async {
            let deployed = Deployed::start(deployment).await;
            bench(&deployed, runs, &mut results).await;
        });
    }
    let _ = std::fs::remove_dir_all(temp_dir);

    let medians = rounds::medians(&results);
    rounds::print_medians(&medians, runs, "raw");
    rounds::print_round_ratios(&results, &BASELINES, main_metrics);
    rounds::write_jsonl(&header, &results, &medians, runs, &BASELINES, main_metrics);
}
