//! distlock beside the raw Redis floor and the `rslock` crate, in one run, on one
//! `redis-server` started for the purpose.
//!
//!     cargo bench --bench locks                 # 3 alternating runs; medians reported
//!     BENCH_RUNS=5 cargo bench --bench locks
//!     BENCH_LIBS=raw,distlock BENCH_WORKLOADS=W2 cargo bench --bench locks   # a subset
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
//! "Requests" are counted by the server (`INFO commandstats`, the commands each library sends
//! at top level), so every library is measured the same way. Prints a table; appends JSON lines to
//! `target/bench.jsonl`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use support::RedisServer;

const LEASE: Duration = Duration::from_secs(10);

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

/// The floor: `SET NX PX` and a compare-and-delete script over one multiplexed connection.
#[derive(Clone)]
struct Raw {
    connection: MultiplexedConnection,
    release: Arc<redis::Script>,
    extend: Arc<redis::Script>,
    poll: Duration,
}

impl Raw {
    async fn try_acquire(&self, key: &str, token: &str, lease: Duration) -> bool {
        let mut connection = self.connection.clone();
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
            (Lib::Raw(raw), Held::Raw(key, token)) => {
                let mut connection = raw.connection.clone();
                let _: i64 = raw
                    .release
                    .key(key)
                    .arg(token)
                    .invoke_async(&mut connection)
                    .await
                    .expect("raw release");
            }
            (Lib::Rslock(manager, _), Held::Rslock(lock)) => manager.unlock(&lock).await,
            _ => unreachable!("a guard of another library"),
        }
    }
}

/// Requests a library sent, counted by the server: the calls of the commands it sends at top
/// level (`INFO commandstats` also counts the commands scripts run inside, which are not
/// requests). distlock sends only scripts and pub/sub; raw and rslock also send `SET`.
fn requests(server: &RedisServer, lib: &Lib) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .expect("INFO");
    let top_level: &[&str] = match lib {
        Lib::Distlock(_) => &["evalsha", "eval", "script", "subscribe", "unsubscribe"],
        _ => &["set", "evalsha", "eval", "script"],
    };
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split("calls=").nth(1)?.split(',').next()?;
            top_level
                .contains(&name)
                .then(|| calls.parse::<u64>().ok())?
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

async fn w3(lib: &Lib, server: &RedisServer, store: &MultiplexedConnection) -> Row {
    const GRANTS: u64 = 2000;
    let key = format!("w3:{}:{}", lib.name(), fastrand::u64(..));
    let counter = format!("{key}:counter");
    let granted = Arc::new(AtomicU64::new(0));
    // (worker, released at) of the last release, to measure handoffs.
    let last_release: Arc<Mutex<Option<(usize, Instant)>>> = Arc::new(Mutex::new(None));
    let handoffs = Arc::new(Mutex::new(Vec::new()));
    let before = requests(server, lib);
    let started = Instant::now();
    let workers: Vec<_> = (0..8)
        .map(|worker| {
            let (lib, key, counter) = (lib.clone(), key.clone(), counter.clone());
            let (granted, last_release, handoffs) =
                (granted.clone(), last_release.clone(), handoffs.clone());
            let mut store = store.clone();
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
    let requests = requests(server, lib) - before - work;
    let final_value: Option<u64> = redis::cmd("GET")
        .arg(&counter)
        .query(&mut server.connection())
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

async fn w4(lib: &Lib, server: &RedisServer) -> Row {
    let lease = Duration::from_secs(2);
    let hold = Duration::from_secs(10);
    let tag = format!("{}:{}", lib.name(), fastrand::u64(..));
    let mut held = Vec::new();
    for i in 0..1000 {
        held.push(lib.acquire(&format!("w4:{tag}:{i}"), lease).await);
    }
    let before = requests(server, lib);
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
                    (Lib::Raw(raw), Held::Raw(key, token)) => {
                        let mut connection = raw.connection.clone();
                        let _: i64 = raw
                            .extend
                            .key(key)
                            .arg(token)
                            .arg(lease.as_millis() as u64)
                            .invoke_async(&mut connection)
                            .await
                            .unwrap_or(0);
                    }
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
    let requests = requests(server, lib) - before;
    for renewer in renewers {
        watched.push(renewer.await.expect("renewer"));
    }
    // A lock is lost if its key no longer holds its owner's value.
    let mut lost = 0;
    for h in &watched {
        let still = match h {
            Held::Distlock(guard) => guard.is_held(),
            Held::Raw(key, token) => {
                let value: Option<String> = redis::cmd("GET")
                    .arg(key)
                    .query(&mut server.connection())
                    .expect("GET");
                value.as_deref() == Some(token.as_str())
            }
            Held::Rslock(lock) => {
                let value: Option<Vec<u8>> = redis::cmd("GET")
                    .arg(&*lock.resource)
                    .query(&mut server.connection())
                    .expect("GET");
                value.as_deref() == Some(lock.val.as_slice())
            }
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

async fn libraries(server: &RedisServer) -> Vec<Lib> {
    let client = redis::Client::open(server.url()).expect("url");
    let raw = Raw {
        connection: client
            .get_multiplexed_async_connection()
            .await
            .expect("connect"),
        release: Arc::new(redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        )),
        extend: Arc::new(redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0",
        )),
        poll: Duration::from_millis(1),
    };
    let distlock = distlock::Client::new(distlock::Config::from_url(&server.url()).expect("url"))
        .expect("client");
    let rslock_default = rslock::LockManager::new(vec![server.url()]);
    let mut rslock_5ms = rslock::LockManager::new(vec![server.url()]);
    rslock_5ms.set_retry(3, Duration::from_millis(5));
    vec![
        Lib::Raw(raw),
        Lib::Distlock(distlock),
        Lib::Rslock(Arc::new(rslock_default), "rslock"),
        Lib::Rslock(Arc::new(rslock_5ms), "rslock-5ms"),
    ]
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    values[values.len() / 2]
}

fn main() {
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut results: BTreeMap<(String, String), Vec<Row>> = BTreeMap::new();
    runtime.block_on(async {
        let libs = libraries(&server).await;
        let store = redis::Client::open(server.url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("store");
        // Warm every library up once (connections, script caches).
        for lib in &libs {
            let held = lib.acquire("warm-up", LEASE).await;
            lib.release(held).await;
        }
        let only = |var: &str, name: &str| {
            std::env::var(var).map_or(true, |list| list.split(',').any(|item| item == name))
        };
        for run in 0..runs {
            // Alternate the order between runs so no library always goes first.
            let mut order: Vec<&Lib> = libs.iter().collect();
            order.rotate_left(run % libs.len());
            for workload in ["W1", "W2", "W3", "W4", "W5"] {
                if !only("BENCH_WORKLOADS", workload) {
                    continue;
                }
                for lib in order.iter().filter(|lib| only("BENCH_LIBS", &lib.name())) {
                    let row = match workload {
                        "W1" if lib.name() != "rslock-5ms" => w1(lib).await,
                        "W2" if lib.name() != "rslock-5ms" => w2(lib).await,
                        "W3" => w3(lib, &server, &store).await,
                        "W4" if lib.name() != "rslock-5ms" => w4(lib, &server).await,
                        "W5" => match lib {
                            Lib::Distlock(client) => w5(client).await,
                            _ => continue,
                        },
                        _ => continue,
                    };
                    eprintln!("run {run} {workload} {:<11} {row:?}", lib.name());
                    results
                        .entry((workload.to_owned(), lib.name()))
                        .or_default()
                        .push(row);
                }
            }
        }
    });

    // The server's side of the cost: time per call of each command (scripts include the
    // commands they run).
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .expect("INFO");
    eprintln!("\nserver time per call:");
    for line in stats.lines().filter(|l| l.starts_with("cmdstat_")) {
        eprintln!("  {line}");
    }

    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench.jsonl");
    let mut jsonl = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open target/bench.jsonl");
    let mut medians: BTreeMap<(String, String), Row> = BTreeMap::new();
    for ((workload, lib), rows) in &results {
        let mut row = Row::new();
        for metric in rows[0].keys() {
            let mut values: Vec<f64> = rows.iter().map(|r| r[metric]).collect();
            row.insert(metric, median(&mut values));
        }
        medians.insert((workload.clone(), lib.clone()), row);
    }
    println!("\nmedians of {runs} alternating runs (ratio to the raw floor in brackets)\n");
    for ((workload, lib), row) in &medians {
        let floor = medians.get(&(workload.clone(), "raw".to_owned()));
        let cells: Vec<String> = row
            .iter()
            .map(|(metric, value)| match floor.and_then(|f| f.get(metric)) {
                Some(base) if *base != 0.0 && lib != "raw" => {
                    format!("{metric}={value:.3} [{:.2}x]", value / base)
                }
                _ => format!("{metric}={value:.3}"),
            })
            .collect();
        println!("{workload} {lib:<11} {}", cells.join("  "));
        let fields: Vec<String> = row
            .iter()
            .map(|(k, v)| format!("\"{k}\": {v:.4}"))
            .collect();
        let _ = writeln!(
            jsonl,
            "{{\"workload\": \"{workload}\", \"library\": \"{lib}\", \"runs\": {runs}, {}}}",
            fields.join(", ")
        );
    }
}
