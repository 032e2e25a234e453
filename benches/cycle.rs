//! The uncontended lock cycle as a user's service runs it (issue 26): a plain
//! `#[tokio::main]` binary, which on one CPU is a multi-thread runtime with one worker — the
//! shape of a small service container — against one `redis-server`. Libraries take turns
//! within each round (the order rotated every round), and each figure is also given as a ratio
//! to rslock's and raw's figure of the same round, whose median the tables report.
//!
//! ```sh
//! cargo bench --bench cycle --no-run          # build first: the run below has one CPU
//! DISTLOCK_SERVER_CPUS=0 taskset -c 1 cargo bench --bench cycle
//! BENCH_RUNS=5 BENCH_LIBS=raw,distlock-nofence BENCH_WORKLOADS=W2 DISTLOCK_SERVER_CPUS=0 taskset -c 1 cargo bench --bench cycle
//! ```
//!
//! `DISTLOCK_SERVER_CPUS=0` starts the server on CPU 0 (`tests/support`), `taskset -c 1` keeps
//! this process on CPU 1: `#[tokio::main]` then makes one worker, as it would in a container
//! limited to one CPU. Workloads (those of `locks.rs`):
//! - W1: one task, 5,000 acquire+release cycles on fresh keys: cycles/s, cycle p50.
//! - W2: 64 tasks sharing one client, 500 cycles each on their own keys: cycles/s.
//!
//! For each, per cycle: this process's CPU time (all threads), and the allocations and bytes
//! allocated (a counting global allocator, every thread: distlock's I/O thread and watchdog
//! included) — the client-side budget that BENCHMARKS.md breaks down. Libraries: `raw` (`SET
//! NX PX` and a compare-and-delete script on one multiplexed connection), `distlock` (fencing
//! tokens and the watchdog, the defaults), `distlock-nofence` (`fencing(false)`), `rslock`.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "support/process_cpu.rs"]
mod process_cpu;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use process_cpu::process_cpu;

/// Counts every allocation of the process (and its bytes), then lets the system allocate.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED_BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to `System` unchanged; the counters are only added to.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        ALLOCATED_BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        ALLOCATED_BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const LEASE: Duration = Duration::from_secs(10);
const W1_CYCLES: usize = 5_000;
const W2_TASKS: usize = 64;
const W2_CYCLES: usize = 500;

#[derive(Clone)]
enum Lib {
    Raw(redis::aio::MultiplexedConnection, Arc<redis::Script>),
    Distlock(distlock::Client, bool),
    Rslock(Arc<rslock::LockManager>),
}

enum Held {
    Raw(String, String),
    Distlock(distlock::LockGuard),
    Rslock(rslock::Lock),
}

impl Lib {
    async fn acquire(&self, key: &str) -> Held {
        match self {
            Lib::Raw(connection, _) => {
                let token = uuid::Uuid::new_v4().simple().to_string();
                let set: Option<String> = redis::cmd("SET")
                    .arg(key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(LEASE.as_millis() as u64)
                    .query_async(&mut connection.clone())
                    .await
                    .expect("raw SET");
                assert!(set.is_some(), "fresh keys are free");
                Held::Raw(key.to_owned(), token)
            }
            Lib::Distlock(client, fencing) => Held::Distlock(
                client
                    .lock(key)
                    .lease(LEASE)
                    .fencing(*fencing)
                    .acquire()
                    .await
                    .expect("distlock acquire"),
            ),
            Lib::Rslock(manager) => Held::Rslock(
                manager
                    .lock(key.as_bytes(), LEASE)
                    .await
                    .expect("fresh keys are free"),
            ),
        }
    }

    async fn release(&self, held: Held) {
        match (self, held) {
            (Lib::Raw(connection, script), Held::Raw(key, token)) => {
                let released: i64 = script
                    .key(key)
                    .arg(token)
                    .invoke_async(&mut connection.clone())
                    .await
                    .expect("raw release");
                assert_eq!(released, 1);
            }
            (Lib::Distlock(..), Held::Distlock(guard)) => {
                assert!(guard.release().await.expect("distlock release"));
            }
            (Lib::Rslock(manager), Held::Rslock(lock)) => manager.unlock(&lock).await,
            _ => unreachable!("a lock of another library"),
        }
    }
}

/// One measurement: cycles, wall time, client CPU and allocations over it.
struct Measured {
    cycles: usize,
    wall: Duration,
    cpu: Duration,
    allocations: u64,
    bytes: u64,
    p50: Option<Duration>,
}

impl Measured {
    fn per_second(&self) -> f64 {
        self.cycles as f64 / self.wall.as_secs_f64()
    }
    fn cpu_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.cycles as f64
    }
    fn allocations(&self) -> f64 {
        self.allocations as f64 / self.cycles as f64
    }
    fn bytes(&self) -> f64 {
        self.bytes as f64 / self.cycles as f64
    }
}

async fn measure<F: std::future::Future<Output = Option<Duration>>>(
    cycles: usize,
    run: F,
) -> Measured {
    let (cpu, allocations, bytes) = (
        process_cpu(),
        ALLOCATIONS.load(Ordering::Relaxed),
        ALLOCATED_BYTES.load(Ordering::Relaxed),
    );
    let started = Instant::now();
    let p50 = run.await;
    Measured {
        cycles,
        wall: started.elapsed(),
        cpu: process_cpu() - cpu,
        allocations: ALLOCATIONS.load(Ordering::Relaxed) - allocations,
        bytes: ALLOCATED_BYTES.load(Ordering::Relaxed) - bytes,
        p50,
    }
}

async fn w1(lib: &Lib, round: usize) -> Measured {
    measure(W1_CYCLES, async {
        let mut latencies = Vec::with_capacity(W1_CYCLES);
        for i in 0..W1_CYCLES {
            let key = format!("w1:{round}:{i}");
            let started = Instant::now();
            let held = lib.acquire(&key).await;
            lib.release(held).await;
            latencies.push(started.elapsed());
        }
        latencies.sort();
        Some(latencies[latencies.len() / 2])
    })
    .await
}

async fn w2(lib: &Lib, round: usize) -> Measured {
    measure(W2_TASKS * W2_CYCLES, async {
        let tasks: Vec<_> = (0..W2_TASKS)
            .map(|task| {
                let lib = lib.clone();
                tokio::spawn(async move {
                    for i in 0..W2_CYCLES {
                        let held = lib.acquire(&format!("w2:{round}:{task}:{i}")).await;
                        lib.release(held).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("W2 task");
        }
        None
    })
    .await
}

/// The libraries `BENCH_LIBS` names (default: all four), in order.
async fn libraries(url: &str) -> Vec<(&'static str, Lib)> {
    let wanted = std::env::var("BENCH_LIBS")
        .unwrap_or_else(|_| "raw,distlock,distlock-nofence,rslock".to_owned());
    let client = redis::Client::open(url).expect("url");
    let mut libs = Vec::new();
    for name in wanted.split(',').map(str::trim) {
        let lib = match name {
            "raw" => Lib::Raw(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect"),
                Arc::new(redis::Script::new(
                    "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                     return redis.call('DEL', KEYS[1]) else return 0 end",
                )),
            ),
            "distlock" | "distlock-nofence" => Lib::Distlock(
                distlock::Client::new(distlock::Config::from_url(url).expect("url"))
                    .expect("client"),
                name == "distlock",
            ),
            "rslock" => Lib::Rslock(Arc::new(rslock::LockManager::new(vec![url.to_owned()]))),
            other => panic!("unknown library {other} in BENCH_LIBS"),
        };
        let name: &'static str = match name {
            "raw" => "raw",
            "distlock" => "distlock",
            "distlock-nofence" => "distlock-nofence",
            _ => "rslock",
        };
        libs.push((name, lib));
    }
    libs
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

#[tokio::main]
async fn main() {
    support::require_redis_server();
    let rounds: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|runs| runs.parse().ok())
        .unwrap_or(3);
    let server = support::RedisServer::start();
    let libs = libraries(&server.url()).await;
    let workers = std::thread::available_parallelism().map_or(1, usize::from);
    eprintln!(
        "cycle bench: {workers} CPU(s) for this process (tokio workers), server on CPU(s) {}, \
         {rounds} rounds, commit {}",
        std::env::var("DISTLOCK_SERVER_CPUS").unwrap_or_else(|_| "any".to_owned()),
        std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            .unwrap_or_default(),
    );
    let workloads = std::env::var("BENCH_WORKLOADS").unwrap_or_else(|_| "W1,W2".to_owned());
    // (workload, library) -> per-round measurements
    let mut results: BTreeMap<(&str, &str), Vec<Measured>> = BTreeMap::new();
    for round in 0..rounds {
        for offset in 0..libs.len() {
            let (name, lib) = &libs[(round + offset) % libs.len()];
            if workloads.contains("W1") {
                let one = w1(lib, round).await;
                eprintln!(
                "round {round} W1 {name:17} {:>8.0} cycles/s  p50 {:>6.1} µs  cpu {:>5.1} µs  {:>5.1} allocs  {:>6.0} B",
                one.per_second(),
                one.p50.unwrap_or_default().as_secs_f64() * 1e6,
                one.cpu_us(),
                one.allocations(),
                one.bytes()
            );
                results.entry(("W1", name)).or_default().push(one);
            }
            if !workloads.contains("W2") {
                continue;
            }
            let two = w2(lib, round).await;
            eprintln!(
                "round {round} W2 {name:17} {:>8.0} cycles/s                cpu {:>5.1} µs  {:>5.1} allocs  {:>6.0} B",
                two.per_second(),
                two.cpu_us(),
                two.allocations(),
                two.bytes()
            );
            results.entry(("W2", name)).or_default().push(two);
        }
    }
    println!("\n| workload | library | cycles/s | vs rslock | vs raw | p50 | client CPU/cycle | allocations/cycle | bytes/cycle |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for workload in ["W1", "W2"] {
        for (name, _) in &libs {
            let Some(runs) = results.get(&(workload, *name)) else {
                continue;
            };
            let ratio_to = |other: &str| {
                let Some(others) = results.get(&(workload, other)) else {
                    return "".to_owned();
                };
                let mut ratios: Vec<f64> = runs
                    .iter()
                    .zip(others)
                    .map(|(mine, theirs)| mine.per_second() / theirs.per_second())
                    .collect();
                format!("{:.2}×", median(&mut ratios))
            };
            let column = |f: &dyn Fn(&Measured) -> f64| {
                let mut values: Vec<f64> = runs.iter().map(f).collect();
                median(&mut values)
            };
            let p50 = if workload == "W1" {
                format!(
                    "{:.0} µs",
                    column(&|m| m.p50.unwrap_or_default().as_secs_f64() * 1e6)
                )
            } else {
                String::new()
            };
            println!(
                "| {workload} | {name} | {:.0} | {} | {} | {p50} | {:.1} µs | {:.1} | {:.0} |",
                column(&Measured::per_second),
                ratio_to("rslock"),
                ratio_to("raw"),
                column(&Measured::cpu_us),
                column(&Measured::allocations),
                column(&Measured::bytes),
            );
        }
    }
}
