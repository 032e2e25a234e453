//! distlock beside the raw Redis floor and the `rslock` crate, in one run, on servers started
//! for the purpose.
//!
//!     cargo bench --bench locks                 # 3 alternating runs; medians reported
//!     BENCH_RUNS=5 cargo bench --bench locks
//!     BENCH_LIBS=raw,distlock BENCH_WORKLOADS=W2 cargo bench --bench locks   # a subset
//!     BENCH_DEPLOYMENTS=single,cluster,redlock cargo bench --bench locks     # deployments
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
//! - W1: one task, 5,000 acquire+release cycles on fresh keys: cycle latency p50/p99.
//! - W2: 64 tasks sharing one client, 500 cycles each on their own keys: cycles/s.
//! - W3: 8 workers on one key, 2,000 grants, a non-atomic GET/SET increment inside, 1 ms outside
//!   the lock after each release: grants/s, handoff latency (a release to the next grant by
//!   another worker) p50/p99, requests per grant, lost updates.
//! - W4: 1,000 locks held for 10 s with a 2 s lease: locks lost, requests sent.
//! - W5 (read/write locks, distlock only — the other libraries have none): 64 tasks sharing
//!   one client, 300 cycles each, 90 % reads and 10 % writes on 16 keys chosen at random, each
//!   held for a yield: cycles/s, and acquire latency p50/p99 of reads and of writes.
//!
//! "Requests" are counted by the servers (`INFO commandstats`, the commands each library sends
//! at top level, summed over the servers that take writes: the cluster's primaries, every
//! master), so every library is measured the same way. Prints a table; appends JSON lines to
//! `target/bench.jsonl`. `DISTLOCK_SERVER_CPUS` (see `tests/support`) pins the servers.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// A deployment, running: its servers, a connection to each server a lock must be won on (a
/// majority of them; on a cluster, one cluster-aware connection that routes by key), and a
/// connection of its own for the data the workloads keep beside the locks (W3's counter): to the
/// one server, the cluster, the first master.
struct Deployed {
    deployment: Deployment,
    servers: Servers,
    connections: Vec<Conn>,
    store: Conn,
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
        Self {
            deployment,
            servers,
            connections,
            store,
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

    /// The servers that take the locks' writes, whose `INFO commandstats` count the requests:
    /// the one server, the cluster's primaries (replicas only replay them), every master.
    fn writable(&self) -> Vec<&RedisServer> {
        match &self.servers {
            Servers::Single(server) => vec![server],
            Servers::Cluster(cluster) => cluster
                .primaries()
                .into_iter()
                .map(|index| cluster.node(index))
                .collect(),
            Servers::Masters(masters) => masters.iter().collect(),
        }
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
    Distlock(distlock::Client),
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
            Lib::Distlock(_) => "distlock".into(),
            Lib::Raw(_) => "raw".into(),
            Lib::Rslock(_, name) => (*name).into(),
        }
    }

    async fn acquire(&self, key: &str, lease: Duration) -> Held {
        match self {
            Lib::Distlock(client) => Held::Distlock(
                client
                    .lock(key)
                    .lease(lease)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await
                    .expect("distlock acquire"),
            ),
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
            (Lib::Distlock(_), Held::Distlock(guard)) => {
                guard.release().await.expect("distlock release");
            }
            (Lib::Raw(raw), Held::Raw(key, token)) => raw.release(&key, &token).await,
            (Lib::Rslock(manager, _), Held::Rslock(lock)) => manager.unlock(&lock).await,
            _ => unreachable!("a guard of another library"),
        }
    }
}

/// Requests a library sent, counted by the servers that take writes: the calls of the commands
/// it sends at top level (`INFO commandstats` also counts the commands scripts run inside,
/// which are not requests). distlock sends only scripts and pub/sub; raw and rslock also send
/// `SET`.
fn requests(deployed: &Deployed, lib: &Lib) -> u64 {
    let top_level: &[&str] = match lib {
        Lib::Distlock(_) => &[
            "evalsha",
            "eval",
            "script",
            "subscribe",
            "unsubscribe",
            "ssubscribe",
            "sunsubscribe",
        ],
        _ => &["set", "evalsha", "eval", "script"],
    };
    deployed
        .writable()
        .into_iter()
        .map(|server| {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut server.connection())
                .expect("INFO");
            info.lines()
                .filter_map(|line| {
                    let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                    let calls = stats.split("calls=").nth(1)?.split(',').next()?;
                    top_level
                        .contains(&name)
                        .then(|| calls.parse::<u64>().ok())?
                })
                .sum::<u64>()
        })
        .sum()
}

fn pct(samples: &mut [Duration], q: f64) -> f64 {
    samples.sort();
    samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3
}

type Row = BTreeMap<&'static str, f64>;

/// CPU time this process has used (user + system), from `/proc/self/stat`.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime is the 12th, stime the 13th.
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| -> u64 { fields.get(i).and_then(|f| f.parse().ok()).unwrap_or(0) };
    let ticks = field(11) + field(12);
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

async fn w1(lib: &Lib) -> Row {
    let tag = lib.name();
    let mut samples = Vec::with_capacity(5000);
    let cpu = process_cpu();
    let started = Instant::now();
    for i in 0..5000 {
        let key = format!("w1:{tag}:{i}:{}", fastrand::u64(..));
        let t = Instant::now();
        let held = lib.acquire(&key, LEASE).await;
        lib.release(held).await;
        samples.push(t.elapsed());
    }
    let cycles_per_s = 5000.0 / started.elapsed().as_secs_f64();
    Row::from([
        ("p50_ms", pct(&mut samples, 0.5)),
        ("p99_ms", pct(&mut samples, 0.99)),
        ("cycles_per_s", cycles_per_s),
        (
            "client_cpu_us_per_cycle",
            (process_cpu() - cpu).as_secs_f64() * 1e6 / 5000.0,
        ),
    ])
}

async fn w2(lib: &Lib) -> Row {
    let cpu = process_cpu();
    let started = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let lib = lib.clone();
            tokio::spawn(async move {
                let tag = lib.name();
                for i in 0..500 {
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
    Row::from([
        (
            "cycles_per_s",
            64.0 * 500.0 / started.elapsed().as_secs_f64(),
        ),
        (
            "client_cpu_us_per_cycle",
            (process_cpu() - cpu).as_secs_f64() * 1e6 / (64.0 * 500.0),
        ),
    ])
}

async fn w3(lib: &Lib, deployed: &Deployed) -> Row {
    const GRANTS: u64 = 2000;
    let key = format!("w3:{}:{}", lib.name(), fastrand::u64(..));
    let counter = format!("{key}:counter");
    let granted = Arc::new(AtomicU64::new(0));
    // (worker, released at) of the last release, to measure handoffs.
    let last_release: Arc<Mutex<Option<(usize, Instant)>>> = Arc::new(Mutex::new(None));
    let handoffs = Arc::new(Mutex::new(Vec::new()));
    let before = requests(deployed, lib);
    let started = Instant::now();
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
    let elapsed = started.elapsed();
    // The increment's SET is the work, not the lock's request.
    let work = if matches!(lib, Lib::Distlock(_)) {
        0
    } else {
        GRANTS
    };
    let requests = requests(deployed, lib) - before - work;
    let final_value: Option<u64> = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut deployed.store())
        .await
        .expect("GET");
    let mut handoffs = handoffs.lock().unwrap().clone();
    Row::from([
        ("grants_per_s", GRANTS as f64 / elapsed.as_secs_f64()),
        ("handoff_p50_ms", pct(&mut handoffs, 0.5)),
        ("handoff_p99_ms", pct(&mut handoffs, 0.99)),
        ("requests_per_grant", requests as f64 / GRANTS as f64),
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
    let before = requests(deployed, lib);
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
    let requests = requests(deployed, lib) - before;
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
    let distlock = distlock::Client::new(deployed.distlock_config()).expect("client");
    let mut libs = vec![Lib::Raw(raw), Lib::Distlock(distlock)];
    if deployed.deployment != Deployment::Cluster {
        let rslock_default = rslock::LockManager::new(deployed.urls());
        let mut rslock_5ms = rslock::LockManager::new(deployed.urls());
        rslock_5ms.set_retry(3, Duration::from_millis(5));
        libs.push(Lib::Rslock(Arc::new(rslock_default), "rslock"));
        libs.push(Lib::Rslock(Arc::new(rslock_5ms), "rslock-5ms"));
    }
    libs
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    values[values.len() / 2]
}

/// Whether `name` is in the comma-separated list `var`, or `var` is unset (then `default`).
fn selected(var: &str, name: &str, default: bool) -> bool {
    std::env::var(var).map_or(default, |list| list.split(',').any(|item| item == name))
}

/// (deployment, workload, library) -> one row per run.
type Results = BTreeMap<(Deployment, String, String), Vec<Row>>;

/// Runs the selected workloads `runs` times on one deployment, then prints its servers' time
/// per call of each command (scripts include the commands they run).
async fn bench(deployed: &Deployed, runs: usize, results: &mut Results) {
    let deployment = deployed.deployment;
    let libs = libraries(deployed).await;
    // Warm every library up once (connections, script caches).
    for lib in &libs {
        let held = lib.acquire("warm-up", LEASE).await;
        lib.release(held).await;
    }
    for run in 0..runs {
        // Alternate the order between runs so no library always goes first.
        let mut order: Vec<&Lib> = libs.iter().collect();
        order.rotate_left(run % libs.len());
        for workload in ["W1", "W2", "W3", "W4", "W5"] {
            if !selected("BENCH_WORKLOADS", workload, true) {
                continue;
            }
            for lib in order
                .iter()
                .filter(|lib| selected("BENCH_LIBS", &lib.name(), true))
            {
                let row = match workload {
                    "W1" if lib.name() != "rslock-5ms" => w1(lib).await,
                    "W2" if lib.name() != "rslock-5ms" => w2(lib).await,
                    "W3" => w3(lib, deployed).await,
                    "W4" if lib.name() != "rslock-5ms" => w4(lib, deployed).await,
                    "W5" => match lib {
                        Lib::Distlock(client) if deployment == Deployment::Single => {
                            w5(client).await
                        }
                        _ => continue,
                    },
                    _ => continue,
                };
                eprintln!(
                    "run {run} {:<7} {workload} {:<11} {row:?}",
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

fn main() {
    let temp_dir = private_temp_dir();
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
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

    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench.jsonl");
    let _ = std::fs::create_dir_all(path.parent().expect("a parent"));
    let mut jsonl = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open target/bench.jsonl");
    let mut medians: BTreeMap<(Deployment, String, String), Row> = BTreeMap::new();
    for (key, rows) in &results {
        let mut row = Row::new();
        for metric in rows[0].keys() {
            let mut values: Vec<f64> = rows.iter().map(|r| r[metric]).collect();
            row.insert(metric, median(&mut values));
        }
        medians.insert(key.clone(), row);
    }
    println!("\nmedians of {runs} alternating runs (ratio to the raw floor in brackets)\n");
    for ((deployment, workload, lib), row) in &medians {
        let floor = medians.get(&(*deployment, workload.clone(), "raw".to_owned()));
        let cells: Vec<String> = row
            .iter()
            .map(|(metric, value)| match floor.and_then(|f| f.get(metric)) {
                Some(base) if *base != 0.0 && lib != "raw" => {
                    format!("{metric}={value:.3} [{:.2}x]", value / base)
                }
                _ => format!("{metric}={value:.3}"),
            })
            .collect();
        let deployment = deployment.name();
        println!("{deployment:<7} {workload} {lib:<11} {}", cells.join("  "));
        let fields: Vec<String> = row
            .iter()
            .map(|(k, v)| format!("\"{k}\": {v:.4}"))
            .collect();
        let _ = writeln!(
            jsonl,
            "{{\"deployment\": \"{deployment}\", \"workload\": \"{workload}\", \"library\": \"{lib}\", \"runs\": {runs}, {}}}",
            fields.join(", ")
        );
    }
}
