//! Client CPU per request of the request shapes a grant can take, through the redis crate
//! alone (no lock library): a single `SET … NX PX … GET` (the efficiency mode's first try), the
//! same `SET` and `TIME` as a plain pipeline and as a `MULTI`/`EXEC` transaction, a script
//! call, and the two as one small script (`first-try-script`, distlock's fenced first try
//! since issue 26); client and server CPU per request. 64 tasks share one multiplexed connection, as in W2;
//! the shapes alternate, 3 rounds. Pinned like `locks.rs` (server on CPU 0, this process on
//! CPU 1) unless `BENCH_PIN=0`.
//!
//!     cargo bench --bench client_costs

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "support/process_cpu.rs"]
mod process_cpu;

use std::time::Instant;

use support::RedisServer;

const TASKS: usize = 64;
const PER_TASK: usize = 500;
const SHAPES: [&str; 5] = [
    "set",
    "pipeline",
    "transaction",
    "script",
    "first-try-script",
];

/// The fenced first try as one small script (issue 26): `SET … NX PX … GET` and `TIME` in one
/// atomic call, `{1, token}` when granted, `{0, -2}` when held.
const FIRST_TRY_SCRIPT: &str =
    "local ok, held = pcall(redis.call, 'SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET') \
    if not ok or (held and held ~= ARGV[1]) then return {0, -2} end \
    local now = redis.call('TIME') return {1, now[1] * 1000000 + now[2]}";

/// CPU time of this process (all threads), in microseconds.
fn process_cpu_us() -> f64 {
    process_cpu::process_cpu().as_secs_f64() * 1e6
}

fn pin() {
    if std::env::var("BENCH_PIN").as_deref() == Ok("0") {
        return;
    }
    if std::env::var_os("DISTLOCK_SERVER_CPUS").is_none() {
        std::env::set_var("DISTLOCK_SERVER_CPUS", "0");
    }
    let status = std::process::Command::new("taskset")
        .args(["-p", "-c", "1", &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("taskset (util-linux) is needed to pin; or set BENCH_PIN=0");
    assert!(
        status.success(),
        "taskset failed; set BENCH_PIN=0 to run unpinned"
    );
}

async fn one(shape: &str, connection: &mut redis::aio::MultiplexedConnection, key: &str) {
    let script = redis::Script::new(
        "if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end return 1",
    );
    let mut set = redis::cmd("SET");
    set.arg(key)
        .arg("owner")
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .arg("GET");
    let first_try = redis::Script::new(FIRST_TRY_SCRIPT);
    let reply: redis::RedisResult<redis::Value> = match shape {
        "first-try-script" => {
            first_try
                .key(key)
                .arg("owner")
                .arg(10_000)
                .invoke_async(connection)
                .await
        }
        "set" => set.query_async(connection).await,
        "pipeline" | "transaction" => {
            let mut pipeline = redis::pipe();
            if shape == "transaction" {
                pipeline.atomic();
            }
            pipeline.add_command(set).cmd("TIME");
            pipeline.query_async(connection).await
        }
        _ => {
            script
                .key(key)
                .arg("owner")
                .arg(10_000)
                .invoke_async(connection)
                .await
        }
    };
    reply.expect("request");
}

/// The server's CPU time so far (`INFO cpu`: user + system), in microseconds.
async fn server_cpu_us(connection: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(connection)
        .await
        .expect("INFO cpu");
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    (field("used_cpu_sys") + field("used_cpu_user")) * 1e6
}

fn main() {
    pin();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let server = RedisServer::start();
        let client = redis::Client::open(server.url()).expect("url");
        let connection = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        for round in 0..3 {
            for shape in SHAPES {
                let cpu = process_cpu_us();
                let server_cpu = server_cpu_us(&mut connection.clone()).await;
                let started = Instant::now();
                let tasks: Vec<_> = (0..TASKS)
                    .map(|task| {
                        let mut connection = connection.clone();
                        tokio::spawn(async move {
                            for i in 0..PER_TASK {
                                one(shape, &mut connection, &format!("{round}:{shape}:{task}:{i}"))
                                    .await;
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.expect("task");
                }
                let requests = (TASKS * PER_TASK) as f64;
                let elapsed = started.elapsed();
                let client = (process_cpu_us() - cpu) / requests;
                let server = (server_cpu_us(&mut connection.clone()).await - server_cpu) / requests;
                println!(
                    "round {round}  {shape:<16} {:>8.0} requests/s  client CPU {client:5.2} µs, server CPU {server:5.2} µs per request",
                    requests / elapsed.as_secs_f64(),
                );
            }
        }
    });
}
