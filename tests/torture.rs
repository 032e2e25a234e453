//! The torture suite: real OS processes against real `redis-server` processes, with crashes
//! (SIGKILL), pauses (SIGSTOP) and a Redis restart, checked against a store that logs every
//! committed write with the value it read and the fencing token it held. The read/write mode
//! (scenarios 7 and 8) also records who is inside, and counts every reader–writer or
//! writer–writer overlap. Scenarios 9 and 10 run on other deployments: Redlock over five
//! masters with minorities down and one majority loss, and a Redis Cluster failed over again
//! and again. The semaphore mode (scenario 11) records who is inside a semaphore's three
//! permits, counts every entry that found three inside already, and checks that the permits
//! of the processes killed last come back within their lease.
//!
//!     cargo test --test torture                       # small: a minute at most, run in CI
//!     cargo test --release --test torture -- --full   # the figures in RELIABILITY.md
//!
//! A custom harness (`harness = false`): the binary orchestrates, and re-executes itself with
//! `DISTLOCK_TORTURE_ROLE` set to play a worker or a holder process. Figures are printed as a
//! table and appended as JSON lines to `target/torture.jsonl`.

mod support;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use distlock::{distributed_lock, Client, Config, LockError};
use support::RedisServer;

const ROLE_ENV: &str = "DISTLOCK_TORTURE_ROLE";

/// Commits a write to the protected store: `SET value = read + 1` and log `read token worker`.
/// With `fenced = 1` it refuses a token below the last accepted one (Kleppmann's fenced
/// store; one grant may write several times) and counts the refusal instead.
///
/// KEYS: value, log, last accepted token, refused counter. ARGV: read, token, worker, fenced.
/// Returns 1 when committed, 0 when refused.
const COMMIT: &str = r#"
local last = tonumber(redis.call('GET', KEYS[3]) or '0')
local token = tonumber(ARGV[2])
if ARGV[4] == '1' and token < last then
  redis.call('INCR', KEYS[4])
  return 0
end
redis.call('SET', KEYS[1], tonumber(ARGV[1]) + 1)
if token > last then redis.call('SET', KEYS[3], ARGV[2]) end
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])
return 1
"#;

/// Records that a worker entered the read/write-protected section, and whether that broke
/// exclusion: a writer entering while anyone is inside, or a reader entering while a writer is.
/// Readers entering while other readers are inside are counted too (sharing must happen).
///
/// KEYS: readers set, writers set, overlaps counter, shared-reads counter, violation log.
/// ARGV: side (`r` or `w`), worker.
const ENTER: &str = r#"
local readers = redis.call('SCARD', KEYS[1])
local writers = redis.call('SCARD', KEYS[2])
if ARGV[1] == 'w' then
  if readers + writers > 0 then
    redis.call('INCR', KEYS[3])
    redis.call('RPUSH', KEYS[5], 'writer ' .. ARGV[2] .. ' entered with ' .. readers .. ' readers, ' .. writers .. ' writers')
  end
  redis.call('SADD', KEYS[2], ARGV[2])
else
  if writers > 0 then
    redis.call('INCR', KEYS[3])
    redis.call('RPUSH', KEYS[5], 'reader ' .. ARGV[2] .. ' entered with ' .. writers .. ' writers')
  end
  if readers > 0 then redis.call('INCR', KEYS[4]) end
  redis.call('SADD', KEYS[1], ARGV[2])
end
return 1
"#;

/// Records that a worker entered the section a semaphore of `ARGV[2]` permits protects: an
/// entry that finds as many inside already is a violation; one that finds one fewer fills the
/// permits (which must happen).
///
/// KEYS: inside set, violations counter, full-entries counter, entries counter, violation log.
/// ARGV: worker, permits.
const ENTER_PERMIT: &str = r#"
local inside = redis.call('SCARD', KEYS[1])
local permits = tonumber(ARGV[2])
if inside >= permits then
  redis.call('INCR', KEYS[2])
  redis.call('RPUSH', KEYS[5], ARGV[1] .. ' entered with ' .. inside .. ' inside')
elseif inside == permits - 1 then
  redis.call('INCR', KEYS[3])
end
redis.call('INCR', KEYS[4])
redis.call('SADD', KEYS[1], ARGV[1])
return 1
"#;

/// The semaphore of scenario 11 and its number of permits.
const SEMAPHORE_KEY: &str = "torture-semaphore";
const SEMAPHORE_PERMITS: u32 = 3;

// ---- the protected store (client side, used by workers) ---------------------------------

#[derive(Debug)]
enum WorkError {
    Lock(LockError),
    Store(String),
}

impl From<LockError> for WorkError {
    fn from(err: LockError) -> Self {
        WorkError::Lock(err)
    }
}

struct Store {
    connection: redis::aio::MultiplexedConnection,
    commit: redis::Script,
    enter: redis::Script,
    worker: String,
}

impl Store {
    async fn connect(url: &str, worker: &str) -> Store {
        let client = redis::Client::open(url).expect("store url");
        Store {
            connection: client
                .get_multiplexed_async_connection()
                .await
                .expect("connect to the store"),
            commit: redis::Script::new(COMMIT),
            enter: redis::Script::new(ENTER),
            worker: worker.to_owned(),
        }
    }

    async fn read(&self) -> Result<i64, WorkError> {
        let mut connection = self.connection.clone();
        redis::cmd("GET")
            .arg("value")
            .query_async::<Option<i64>>(&mut connection)
            .await
            .map(|v| v.unwrap_or(0))
            .map_err(|e| WorkError::Store(e.to_string()))
    }

    async fn commit(&self, read: i64, token: u64, fenced: bool) -> Result<bool, WorkError> {
        let mut connection = self.connection.clone();
        self.commit
            .key("value")
            .key("log")
            .key("last-token")
            .key("refused")
            .arg(read)
            .arg(token)
            .arg(&self.worker)
            .arg(if fenced { "1" } else { "0" })
            .invoke_async::<i64>(&mut connection)
            .await
            .map(|committed| committed == 1)
            .map_err(|e| WorkError::Store(e.to_string()))
    }

    /// Records this worker inside the read/write section on `side` (`"r"` or `"w"`).
    async fn enter(&self, side: &str) -> Result<(), WorkError> {
        let mut connection = self.connection.clone();
        self.enter
            .key("inside:readers")
            .key("inside:writers")
            .key("overlaps")
            .key("shared-reads")
            .key("violations")
            .arg(side)
            .arg(&self.worker)
            .invoke_async::<i64>(&mut connection)
            .await
            .map(drop)
            .map_err(|e| WorkError::Store(e.to_string()))
    }

    /// Records this worker inside the semaphore's section.
    async fn enter_permit(&self) -> Result<(), WorkError> {
        let mut connection = self.connection.clone();
        redis::Script::new(ENTER_PERMIT)
            .key("inside:permits")
            .key("permit-overlaps")
            .key("full-entries")
            .key("permit-entries")
            .key("violations")
            .arg(&self.worker)
            .arg(SEMAPHORE_PERMITS)
            .invoke_async::<i64>(&mut connection)
            .await
            .map(drop)
            .map_err(|e| WorkError::Store(e.to_string()))
    }

    /// Records this worker gone from the semaphore's section.
    async fn leave_permit(&self) -> Result<(), WorkError> {
        let mut connection = self.connection.clone();
        redis::cmd("SREM")
            .arg("inside:permits")
            .arg(&self.worker)
            .query_async::<()>(&mut connection)
            .await
            .map_err(|e| WorkError::Store(e.to_string()))
    }

    /// Records this worker gone from the read/write section.
    async fn leave(&self) -> Result<(), WorkError> {
        let mut connection = self.connection.clone();
        redis::pipe()
            .cmd("SREM")
            .arg("inside:readers")
            .arg(&self.worker)
            .cmd("SREM")
            .arg("inside:writers")
            .arg(&self.worker)
            .query_async::<()>(&mut connection)
            .await
            .map_err(|e| WorkError::Store(e.to_string()))
    }
}

// ---- worker and holder processes ----------------------------------------------------------

/// One read-modify-write under the lock: read, pause (the non-atomic gap), commit.
#[distributed_lock(key = "torture", wait = "10s")]
async fn increment(store: &Store, gap: Duration) -> Result<(), WorkError> {
    let token = distlock::current()
        .expect("held")
        .fencing_token()
        .expect("fenced")
        .get();
    let read = store.read().await?;
    tokio::time::sleep(gap).await;
    store.commit(read, token, false).await?;
    Ok(())
}

/// Writes to the fenced store every 20 ms for as long as the lease holds (the exclusive lock,
/// which is the write side of `read_while_held`'s).
#[distributed_lock(key = "torture", wait = "10s")]
async fn write_while_held(store: &Store) -> Result<(), WorkError> {
    let token = distlock::current()
        .expect("held")
        .fencing_token()
        .expect("fenced")
        .get();
    say(&format!("acquired {token}"));
    loop {
        let read = store.read().await?;
        store.commit(read, token, true).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A write under the read/write lock: enter, read-modify-write with a gap, leave.
#[distributed_lock(key = "torture-rw", mode = "write", wait = "10s")]
async fn rw_write(store: &Store, gap: Duration) -> Result<(), WorkError> {
    let token = distlock::current()
        .expect("held")
        .fencing_token()
        .expect("fenced")
        .get();
    store.enter("w").await?;
    let read = store.read().await?;
    tokio::time::sleep(gap).await;
    store.commit(read, token, false).await?;
    store.leave().await
}

/// A read under the read/write lock: enter, stay for `gap`, leave.
#[distributed_lock(key = "torture-rw", mode = "read", wait = "10s")]
async fn rw_read(store: &Store, gap: Duration) -> Result<(), WorkError> {
    store.enter("r").await?;
    tokio::time::sleep(gap).await;
    store.leave().await
}

/// Reads the store every 20 ms for as long as the read side of `write_while_held`'s lock holds.
#[distributed_lock(key = "torture", mode = "read", wait = "10s")]
async fn read_while_held(store: &Store) -> Result<(), WorkError> {
    let token = distlock::current()
        .expect("held")
        .fencing_token()
        .expect("fenced")
        .get();
    say(&format!("acquired {token}"));
    loop {
        store.read().await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One of the semaphore's permits: enter, stay for `gap`, leave, release.
async fn use_a_permit(store: &Store, gap: Duration) -> Result<(), WorkError> {
    let permit = distlock::semaphore(SEMAPHORE_KEY, SEMAPHORE_PERMITS)
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    store.enter_permit().await?;
    tokio::time::sleep(gap).await;
    store.leave_permit().await?;
    if !permit.is_held() {
        return Err(LockError::LeaseLost {
            key: SEMAPHORE_KEY.to_owned(),
        }
        .into());
    }
    permit.release().await?;
    Ok(())
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Entry of a child process: `ROLE lock_url store_url worker_id lease_ms`.
fn child(role: &str) {
    std::panic::set_hook(Box::new(|info| say(&format!("PANIC {info}"))));
    let args: Vec<String> = std::env::args().collect();
    let (lock_url, store_url, worker, lease_ms) = (&args[1], &args[2], &args[3], &args[4]);
    let lease = Duration::from_millis(lease_ms.parse().expect("lease"));
    let config = lock_config(lock_url)
        .default_lease(lease)
        .backoff(Duration::from_millis(1), Duration::from_millis(50))
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300));
    distlock::init(config).expect("init");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let store = Store::connect(store_url, worker).await;
        match role {
            "worker" => loop {
                report(increment(&store, Duration::from_millis(2)).await).await;
            },
            "holder" => {
                let result = write_while_held(&store).await;
                say(&format!("returned {result:?}"));
            }
            // Nine reads for every write, each inside for 1–4 ms.
            "rw-worker" => loop {
                let gap = Duration::from_millis(fastrand::u64(1..=4));
                let result = if fastrand::u8(..10) < 9 {
                    rw_read(&store, gap).await
                } else {
                    rw_write(&store, gap).await
                };
                report(result).await;
            },
            "sem-worker" => loop {
                let gap = Duration::from_millis(fastrand::u64(1..=4));
                report(use_a_permit(&store, gap).await).await;
            },
            "read-holder" => {
                let result = read_while_held(&store).await;
                say(&format!("returned {result:?}"));
            }
            other => panic!("unknown role {other}"),
        }
    });
}

/// The lock deployment a worker uses: `redlock=URL,URL,…`, `cluster=URL,…` (with
/// `cluster-guarded=` the failover guard waits for one replica), or one server's URL.
fn lock_config(spec: &str) -> Config {
    let urls = |list: &str| list.split(',').map(str::to_owned).collect::<Vec<_>>();
    if let Some(list) = spec.strip_prefix("redlock=") {
        Config::redlock(urls(list))
            .expect("redlock urls")
            .node_timeout(Duration::from_millis(100))
    } else if let Some(list) = spec.strip_prefix("cluster-guarded=") {
        Config::cluster(urls(list))
            .expect("cluster urls")
            .replicas(1, Duration::from_millis(100))
    } else if let Some(list) = spec.strip_prefix("cluster=") {
        Config::cluster(urls(list)).expect("cluster urls")
    } else {
        Config::from_url(spec).expect("lock url")
    }
}

/// Tells the orchestrator about a worker's failed call; pauses a little after a lock error.
async fn report(result: Result<(), WorkError>) {
    match result {
        Ok(()) => {}
        Err(WorkError::Lock(err)) => {
            say(&format!("error {}", error_kind(&err)));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(WorkError::Store(err)) => say(&format!("store-error {err}")),
    }
}

fn error_kind(err: &LockError) -> String {
    match err {
        LockError::Backend(e) => format!("Backend({:?})", e.kind()),
        LockError::Timeout { .. } => "Timeout".into(),
        LockError::LeaseLost { .. } => "LeaseLost".into(),
        LockError::QuorumUnavailable { .. } => "QuorumUnavailable".into(),
        other => format!("{other:?}"),
    }
}

/// A child process and its stdout lines.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(role: &str, lock_url: &str, store_url: &str, id: usize, lease: Duration) -> Proc {
        let mut child = Command::new(std::env::current_exe().expect("own path"))
            .env(ROLE_ENV, role)
            .args([
                lock_url,
                store_url,
                &format!("w{id}"),
                &lease.as_millis().to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a child process");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc { child, lines }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for a line starting with `prefix`; returns the rest.
    fn expect_line(&self, prefix: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with("PANIC") => panic!("child panicked: {line}"),
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_owned();
                    }
                }
                Err(_) => panic!("no `{prefix}` line from the child within {within:?}"),
            }
        }
    }

    fn drain(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---- checks on the store's log ------------------------------------------------------------

struct LogCheck {
    commits: usize,
    duplicate_reads: usize,
    token_regressions: usize,
}

fn check_log(store: &RedisServer) -> LogCheck {
    let log = log_entries(store);
    let mut reads = HashSet::new();
    let mut duplicate_reads = 0;
    let mut token_regressions = 0;
    let mut last_token = 0u64;
    for entry in &log {
        let mut parts = entry.split(' ');
        let read: i64 = parts.next().and_then(|p| p.parse().ok()).expect("read");
        let token: u64 = parts.next().and_then(|p| p.parse().ok()).expect("token");
        if !reads.insert(read) {
            duplicate_reads += 1;
        }
        if token <= last_token {
            token_regressions += 1;
        }
        last_token = token;
    }
    LogCheck {
        commits: log.len(),
        duplicate_reads,
        token_regressions,
    }
}

impl LogCheck {
    /// No two committed writes read the same value, and tokens only grew.
    fn assert_sound(&self) {
        assert_eq!(
            self.duplicate_reads, 0,
            "two committed writes read the same value"
        );
        assert_eq!(
            self.token_regressions, 0,
            "a committed write had a smaller token"
        );
    }
}

/// The store's log of committed writes: `read token worker` each, in commit order.
fn log_entries(store: &RedisServer) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg("log")
        .arg(0)
        .arg(-1)
        .query(&mut store.connection())
        .expect("read the log")
}

/// A counter in the store, 0 when it was never set.
fn counter(store: &RedisServer, key: &str) -> i64 {
    let value: Option<i64> = redis::cmd("GET")
        .arg(key)
        .query(&mut store.connection())
        .expect("read a counter");
    value.unwrap_or(0)
}

/// Waits until the store's log holds more than `after` commits: locking works (again).
fn wait_for_commit_after(store: &RedisServer, after: usize, within: Duration, what: &str) {
    support::wait_until(what, within, || {
        let commits = check_log(store).commits;
        (commits > after)
            .then_some(())
            .ok_or(format!("{commits} commits"))
    });
}

/// Stops the workers and reads what they printed: how many panicked, and the kinds of error
/// they reported, sorted, each once.
fn stop_workers(workers: Vec<Proc>) -> (usize, Vec<String>) {
    let lines: Vec<String> = workers.iter().flat_map(|w| w.drain()).collect();
    drop(workers);
    let panics = lines.iter().filter(|l| l.starts_with("PANIC")).count();
    let mut errors: Vec<String> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("error "))
        .map(str::to_owned)
        .collect();
    errors.sort();
    errors.dedup();
    (panics, errors)
}

// ---- scenarios ------------------------------------------------------------------------------

struct Size {
    full: bool,
}

impl Size {
    fn pick<T>(&self, small: T, full: T) -> T {
        if self.full {
            full
        } else {
            small
        }
    }
}

fn record(scenario: &str, fields: &[(&str, String)]) {
    let line = fields
        .iter()
        .map(|(k, v)| format!("\"{k}\": {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    let json = format!("{{\"scenario\": \"{scenario}\", {line}}}");
    println!("  {json}");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/torture.jsonl");
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(file, "{json}");
    }
}

fn percentiles(samples: &mut [Duration]) -> String {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    format!(
        "{{\"n\": {}, \"min_ms\": {:.1}, \"p50_ms\": {:.1}, \"p90_ms\": {:.1}, \"max_ms\": {:.1}}}",
        samples.len(),
        samples[0].as_secs_f64() * 1e3,
        at(0.5).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3
    )
}

/// Runs `role` in eight worker processes for `run_for` while a chaos loop SIGKILLs one at random
/// every 100–300 ms, hands the killed worker's name to `forget`, and respawns it. Returns the
/// number of kills and the lines the last workers printed.
fn run_with_crashes(
    role: &str,
    lock: &RedisServer,
    store: &RedisServer,
    lease: Duration,
    run_for: Duration,
    mut forget: impl FnMut(&str),
) -> (usize, Vec<String>) {
    let spawn = |id: usize| (id, Proc::spawn(role, &lock.url(), &store.url(), id, lease));
    let mut workers: Vec<(usize, Proc)> = (0..8).map(spawn).collect();
    let started = Instant::now();
    let mut kills = 0;
    let mut next_id = workers.len();
    while started.elapsed() < run_for {
        std::thread::sleep(Duration::from_millis(100 + fastrand::u64(0..200)));
        let victim = fastrand::usize(0..workers.len());
        workers[victim].1.kill();
        forget(&format!("w{}", workers[victim].0));
        kills += 1;
        workers[victim] = spawn(next_id);
        next_id += 1;
    }
    let lines = workers.iter().flat_map(|(_, w)| w.drain()).collect();
    (kills, lines)
}

/// Scenario 1: eight workers do read-modify-writes under the lock while a chaos loop SIGKILLs one at
/// random every ~200 ms and respawns it.
fn mutual_exclusion_with_crashes(size: &Size) {
    let lock = RedisServer::start();
    let store = RedisServer::start();
    let lease = Duration::from_millis(500);
    let run_for = size.pick(Duration::from_secs(6), Duration::from_secs(120));
    let (kills, lines) = run_with_crashes("worker", &lock, &store, lease, run_for, |_| {});
    let panics = lines.iter().filter(|l| l.starts_with("PANIC")).count();
    let check = check_log(&store);
    record(
        "mutual_exclusion_with_crashes",
        &[
            ("seconds", run_for.as_secs().to_string()),
            ("committed_writes", check.commits.to_string()),
            ("kills", kills.to_string()),
            ("duplicate_reads", check.duplicate_reads.to_string()),
            ("token_regressions", check.token_regressions.to_string()),
            ("panics", panics.to_string()),
        ],
    );
    assert!(
        check.commits > 50,
        "too few commits to mean anything: {}",
        check.commits
    );
    check.assert_sound();
    assert_eq!(panics, 0);
}

/// Scenario 2: time from the SIGKILL of a holder to the next grant.
fn liveness_after_a_crash(size: &Size, runtime: &tokio::runtime::Runtime) {
    let lock = RedisServer::start();
    let store = RedisServer::start();
    let lease = Duration::from_millis(1000);
    let rounds = size.pick(5, 40);
    let client = Client::new(Config::from_url(&lock.url()).expect("url")).expect("client");
    let mut samples = Vec::new();
    for round in 0..rounds {
        let holder = Proc::spawn("holder", &lock.url(), &store.url(), round, lease);
        holder.expect_line("acquired", Duration::from_secs(10));
        // Kill at a random point of the renewal cycle.
        std::thread::sleep(Duration::from_millis(fastrand::u64(0..1000)));
        let mut holder = holder;
        let killed = Instant::now();
        holder.kill();
        let guard = runtime
            .block_on(client.lock("torture").wait(lease * 5).acquire())
            .expect("the lock is free again after the crash");
        samples.push(killed.elapsed());
        runtime.block_on(guard.release()).expect("release");
    }
    let worst = *samples.iter().max().expect("samples");
    record(
        "liveness_after_a_crash",
        &[
            ("lease_ms", lease.as_millis().to_string()),
            ("kill_to_next_grant", percentiles(&mut samples)),
        ],
    );
    assert!(
        worst <= lease + Duration::from_millis(300),
        "a crashed holder's lock stayed taken for {worst:?} (lease {lease:?})"
    );
}

/// Scenario 3: a holder paused (SIGSTOP) for three leases, another process takes the lock and writes;
/// then the holder resumes. The fenced store must refuse every stale write.
fn fencing_under_pauses(size: &Size, runtime: &tokio::runtime::Runtime) {
    let lock = RedisServer::start();
    let store = RedisServer::start();
    let lease = Duration::from_millis(500);
    let rounds = size.pick(3, 20);
    let client = Client::new(Config::from_url(&lock.url()).expect("url")).expect("client");
    let rival_store = runtime.block_on(Store::connect(&store.url(), "rival"));
    let (mut stale_attempted, mut stale_accepted) = (0i64, 0usize);
    let mut returned = Vec::new();
    for round in 0..rounds {
        let () = redis::cmd("FLUSHALL")
            .query(&mut store.connection())
            .expect("flush");
        let holder = Proc::spawn("holder", &lock.url(), &store.url(), round, lease);
        let held: u64 = holder
            .expect_line("acquired", Duration::from_secs(10))
            .parse()
            .expect("token");
        std::thread::sleep(Duration::from_millis(100));
        holder.signal("STOP");
        std::thread::sleep(lease * 3);
        let rival = runtime
            .block_on(client.lock("torture").wait(lease * 4).acquire())
            .expect("the rival takes the lock while the holder is paused");
        let rival_token = rival.fencing_token().expect("fenced").get();
        assert!(rival_token > held, "{rival_token} after {held}");
        let committed = runtime
            .block_on(async {
                let read = rival_store.read().await?;
                rival_store.commit(read, rival_token, true).await
            })
            .expect("rival write");
        assert!(
            committed,
            "the fenced store refused the rival's fresh token"
        );
        holder.signal("CONT");
        let result = holder.expect_line("returned", Duration::from_secs(10));
        returned.push(result);
        // Writes the store accepted from the paused holder after the rival's write.
        let log = log_entries(&store);
        let rival_at = log
            .iter()
            .position(|l| l.ends_with(" rival"))
            .expect("rival entry");
        stale_accepted += log[rival_at..]
            .iter()
            .filter(|l| l.contains(&format!(" {held} ")))
            .count();
        stale_attempted += counter(&store, "refused");
        runtime.block_on(rival.release()).expect("release");
    }
    let lease_lost = returned.iter().filter(|r| r.contains("LeaseLost")).count();
    record(
        "fencing_under_pauses",
        &[
            ("rounds", rounds.to_string()),
            ("stale_writes_attempted", stale_attempted.to_string()),
            ("stale_writes_accepted", stale_accepted.to_string()),
            ("paused_fn_returned_lease_lost", lease_lost.to_string()),
        ],
    );
    assert_eq!(stale_accepted, 0, "the store accepted a stale write");
    assert_eq!(
        lease_lost, rounds,
        "every paused holder's fn must return LeaseLost: {returned:?}"
    );
}

/// Scenario 4: Redis (the lock server) is stopped for ~1.5 s mid-run and started again on its port.
fn redis_restarted_mid_run(size: &Size) {
    let mut lock = RedisServer::start();
    let store = RedisServer::start();
    // Shorter than the outage: a holder cut off by the restart loses its lease before the
    // restarted (empty) server can grant the lock to anyone else.
    let lease = Duration::from_millis(500);
    let workers: Vec<Proc> = (0..8)
        .map(|id| Proc::spawn("worker", &lock.url(), &store.url(), id, lease))
        .collect();
    let before = size.pick(Duration::from_secs(2), Duration::from_secs(20));
    std::thread::sleep(before);
    lock.stop();
    std::thread::sleep(Duration::from_millis(1500));
    let commits_at_restart = check_log(&store).commits;
    lock.restart();
    let restarted = Instant::now();
    wait_for_commit_after(
        &store,
        commits_at_restart,
        Duration::from_secs(15),
        "locks to work again after the restart",
    );
    let recovered = restarted.elapsed();
    std::thread::sleep(size.pick(Duration::from_secs(2), Duration::from_secs(20)));
    let (panics, errors) = stop_workers(workers);
    let check = check_log(&store);
    record(
        "redis_restarted_mid_run",
        &[
            ("committed_writes", check.commits.to_string()),
            ("duplicate_reads", check.duplicate_reads.to_string()),
            ("token_regressions", check.token_regressions.to_string()),
            ("panics", panics.to_string()),
            ("error_kinds_seen", format!("{errors:?}")),
            (
                "ms_until_locks_work_again",
                recovered.as_millis().to_string(),
            ),
        ],
    );
    assert_eq!(panics, 0);
    check.assert_sound();
    assert!(
        errors
            .iter()
            .all(|e| e.starts_with("Backend") || e == "Timeout"),
        "unexpected error kinds: {errors:?}"
    );
}

/// Scenario 7: eight processes take the read/write lock of one key, nine reads for every write,
/// and record themselves inside the section in the store, which counts every overlap a
/// read/write lock forbids (a writer with anyone, a reader with a writer). A chaos loop SIGKILLs
/// a random worker every ~200 ms, removes it from the store's record (it is gone, and its
/// lease still keeps everyone else out) and respawns it.
fn read_write_exclusion_with_crashes(size: &Size) {
    let lock = RedisServer::start();
    let store = RedisServer::start();
    let lease = Duration::from_millis(500);
    let run_for = size.pick(Duration::from_secs(6), Duration::from_secs(120));
    let (kills, lines) = run_with_crashes("rw-worker", &lock, &store, lease, run_for, |worker| {
        let () = redis::pipe()
            .cmd("SREM")
            .arg("inside:readers")
            .arg(worker)
            .cmd("SREM")
            .arg("inside:writers")
            .arg(worker)
            .query(&mut store.connection())
            .expect("forget the killed worker");
    });
    let panics = lines.iter().filter(|l| l.starts_with("PANIC")).count();
    let check = check_log(&store);
    let overlaps = counter(&store, "overlaps");
    let shared_reads = counter(&store, "shared-reads");
    let violations: Vec<String> = redis::cmd("LRANGE")
        .arg("violations")
        .arg(0)
        .arg(9)
        .query(&mut store.connection())
        .expect("violations");
    record(
        "read_write_exclusion_with_crashes",
        &[
            ("seconds", run_for.as_secs().to_string()),
            ("committed_writes", check.commits.to_string()),
            ("reads_that_shared", shared_reads.to_string()),
            ("kills", kills.to_string()),
            ("forbidden_overlaps", overlaps.to_string()),
            ("duplicate_reads", check.duplicate_reads.to_string()),
            ("token_regressions", check.token_regressions.to_string()),
            ("panics", panics.to_string()),
        ],
    );
    assert_eq!(
        overlaps, 0,
        "a reader and a writer, or two writers, were inside together: {violations:?}"
    );
    assert!(
        check.commits > 20,
        "too few writes to mean anything: {}",
        check.commits
    );
    assert!(
        shared_reads > 20,
        "readers hardly ever shared the lock: {shared_reads}"
    );
    check.assert_sound();
    assert_eq!(panics, 0);
}

/// Scenario 8: a read or a write holder process (lease 500 ms) is SIGSTOPped for three leases;
/// a rival first takes the read lock (a paused reader must not keep readers out, and a read
/// token sorts between the write tokens around it), then the write lock (a paused holder of either side must
/// not keep a writer out past its lease), writes to the fenced store and releases; then the
/// holder resumes. The store must refuse every stale write, and every paused fn must return
/// `LeaseLost`.
fn read_write_fencing_under_pauses(size: &Size, runtime: &tokio::runtime::Runtime) {
    let lock = RedisServer::start();
    let store = RedisServer::start();
    let lease = Duration::from_millis(500);
    let rounds = size.pick(4, 20);
    let client = Client::new(Config::from_url(&lock.url()).expect("url")).expect("client");
    let rival_store = runtime.block_on(Store::connect(&store.url(), "rival"));
    let mut stale_accepted = 0usize;
    let mut stale_attempted = 0i64;
    let mut returned = Vec::new();
    // Every write token is above every token before it; a read token is at least the last
    // write token (the latest write token, or the clock once the counter has lapsed).
    let mut last_write_token = 0u64;
    let mut last_token = 0u64;
    for round in 0..rounds {
        let () = redis::cmd("FLUSHALL")
            .query(&mut store.connection())
            .expect("flush");
        let side = if round % 2 == 0 { "write" } else { "read" };
        let holder = Proc::spawn(
            if side == "write" {
                "holder"
            } else {
                "read-holder"
            },
            &lock.url(),
            &store.url(),
            round,
            lease,
        );
        let held: u64 = holder
            .expect_line("acquired", Duration::from_secs(10))
            .parse()
            .expect("token");
        if side == "write" {
            assert!(held > last_token, "{held} after {last_token}");
            last_write_token = held;
        } else {
            assert!(
                held >= last_write_token,
                "a read token {held} below the last write token {last_write_token}"
            );
        }
        last_token = last_token.max(held);
        std::thread::sleep(Duration::from_millis(100));
        holder.signal("STOP");
        std::thread::sleep(lease * 3);
        runtime.block_on(async {
            let reader = client
                .read_lock("torture")
                .wait(lease * 4)
                .acquire()
                .await
                .expect("a rival reader gets in while the holder is paused");
            let read = reader.fencing_token().expect("fenced").get();
            assert!(
                read >= last_write_token,
                "a read token {read} below the last write token {last_write_token}"
            );
            last_token = last_token.max(read);
            reader.release().await.expect("release the read");
            let writer = client
                .write_lock("torture")
                .wait(lease * 4)
                .acquire()
                .await
                .expect("a rival writer gets in while the holder is paused");
            let token = writer.fencing_token().expect("fenced").get();
            assert!(token > last_token, "{token} after {last_token}");
            last_write_token = token;
            last_token = token;
            let read = rival_store.read().await.expect("read");
            let committed = rival_store.commit(read, token, true).await.expect("write");
            assert!(
                committed,
                "the fenced store refused the rival's fresh token"
            );
            writer.release().await.expect("release the write");
        });
        holder.signal("CONT");
        returned.push(holder.expect_line("returned", Duration::from_secs(10)));
        let log = log_entries(&store);
        let rival_at = log
            .iter()
            .position(|l| l.ends_with(" rival"))
            .expect("rival entry");
        stale_accepted += log[rival_at + 1..].len();
        stale_attempted += counter(&store, "refused");
    }
    let lease_lost = returned.iter().filter(|r| r.contains("LeaseLost")).count();
    record(
        "read_write_fencing_under_pauses",
        &[
            ("rounds", rounds.to_string()),
            ("stale_writes_attempted", stale_attempted.to_string()),
            ("stale_writes_accepted", stale_accepted.to_string()),
            ("paused_fn_returned_lease_lost", lease_lost.to_string()),
        ],
    );
    assert_eq!(stale_accepted, 0, "the store accepted a stale write");
    assert_eq!(
        lease_lost, rounds,
        "every paused holder's fn must return LeaseLost: {returned:?}"
    );
}

static ABORT_STARTED: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);

/// Holds a hard 300 ms lease and would work for 5 s: the lease is lost at its deadline.
#[distributed_lock(key = "abort-latency", lease = "300ms", watchdog = false, wait = "5s")]
async fn work_past_a_hard_lease() -> Result<(), LockError> {
    *ABORT_STARTED.lock().unwrap() = Some(Instant::now());
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(())
}

/// Scenario 6: time from the lease's loss (its local deadline: grant + lease − drift) to the cancelled
/// fn returning `LeaseLost`.
fn abort_latency(size: &Size, runtime: &tokio::runtime::Runtime) {
    let lock = RedisServer::start();
    distlock::init(Config::from_url(&lock.url()).expect("url")).expect("init");
    let lease = Duration::from_millis(300);
    let drift = lease / 100 + Duration::from_millis(2);
    let mut samples = Vec::new();
    for _ in 0..size.pick(10, 100) {
        let result = runtime.block_on(work_past_a_hard_lease());
        let returned = Instant::now();
        assert!(
            matches!(result, Err(LockError::LeaseLost { .. })),
            "{result:?}"
        );
        let started = ABORT_STARTED.lock().unwrap().take().expect("body ran");
        let lost_at = started + lease - drift;
        samples.push(returned.saturating_duration_since(lost_at));
    }
    let worst = *samples.iter().max().expect("samples");
    record(
        "abort_latency",
        &[("loss_to_fn_return", percentiles(&mut samples))],
    );
    assert!(worst < Duration::from_millis(200), "abort took {worst:?}");
}

/// Scenario 9: eight workers do read-modify-writes under a Redlock lock over five masters. A
/// chaos loop keeps a random minority (one or two masters) down, changing it every ~0.8 s, and
/// once takes a majority (three) down for two seconds. A master comes back only after being
/// down longer than the lease (the delayed restart Redlock asks for), empty. Checks: the log is
/// sound, nothing commits while no majority is up (past the lease of grants taken before), the
/// workers only see clean errors, and locking resumes once a majority is back.
fn redlock_with_minority_kills_and_a_majority_loss(size: &Size) {
    let mut masters = support::masters::start_masters(5);
    let store = RedisServer::start();
    let lease = Duration::from_millis(500);
    let spec = format!(
        "redlock={}",
        masters
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    );
    let workers: Vec<Proc> = (0..8)
        .map(|id| Proc::spawn("worker", &spec, &store.url(), id, lease))
        .collect();
    let run_for = size.pick(Duration::from_secs(6), Duration::from_secs(60));
    let started = Instant::now();
    let mut minority_changes = 0;
    let mut majority_loss = None;
    while started.elapsed() < run_for {
        for master in masters.iter_mut().filter(|m| !m.is_running()) {
            master.restart();
        }
        let mut order: Vec<usize> = (0..masters.len()).collect();
        fastrand::shuffle(&mut order);
        let halfway = majority_loss.is_none() && started.elapsed() >= run_for / 2;
        let down = if halfway { 3 } else { fastrand::usize(1..=2) };
        for &victim in order.iter().take(down) {
            masters[victim].stop();
        }
        if halfway {
            // Grants taken just before the loss may still commit within their lease.
            std::thread::sleep(lease + Duration::from_millis(200));
            let commits_at = check_log(&store).commits;
            std::thread::sleep(Duration::from_millis(1300));
            majority_loss = Some(check_log(&store).commits - commits_at);
        } else {
            minority_changes += 1;
            std::thread::sleep(Duration::from_millis(800));
        }
    }
    for master in masters.iter_mut().filter(|m| !m.is_running()) {
        master.restart();
    }
    wait_for_commit_after(
        &store,
        check_log(&store).commits,
        Duration::from_secs(10),
        "locking to resume once a majority is back",
    );
    let (panics, errors) = stop_workers(workers);
    let commits_without_majority = majority_loss.expect("the run reached its halfway point");
    let check = check_log(&store);
    record(
        "redlock_with_minority_kills_and_a_majority_loss",
        &[
            ("seconds", run_for.as_secs().to_string()),
            ("masters", "5".to_owned()),
            ("committed_writes", check.commits.to_string()),
            ("minority_changes", minority_changes.to_string()),
            (
                "commits_without_a_majority",
                commits_without_majority.to_string(),
            ),
            ("duplicate_reads", check.duplicate_reads.to_string()),
            ("token_regressions", check.token_regressions.to_string()),
            ("panics", panics.to_string()),
            ("error_kinds_seen", format!("{errors:?}")),
        ],
    );
    assert_eq!(panics, 0);
    check.assert_sound();
    assert!(check.commits > 50, "too few commits: {}", check.commits);
    assert_eq!(
        commits_without_majority, 0,
        "a grant without a quorum let a worker commit"
    );
    assert!(
        errors.iter().all(
            |e| matches!(e.as_str(), "QuorumUnavailable" | "Timeout" | "LeaseLost")
                || e.starts_with("Backend")
        ),
        "unexpected error kinds: {errors:?}"
    );
}

/// Scenario 10: eight workers do read-modify-writes under a lock on a 3+3 Redis Cluster with
/// the failover guard (one replica), while the primary of the lock's slot is failed over again
/// and again: by `CLUSTER FAILOVER`, and every third time by SIGKILL, its replica taking over
/// (the killed node then rejoins as a replica). Checks: the log is sound, locking resumes after
/// each failover, and the workers only see clean errors.
fn cluster_with_failovers(size: &Size) {
    let mut cluster = support::cluster::RedisCluster::start();
    let store = RedisServer::start();
    let lease = Duration::from_millis(1000);
    let spec = format!("cluster-guarded={}", cluster.urls().join(","));
    let workers: Vec<Proc> = (0..8)
        .map(|id| Proc::spawn("worker", &spec, &store.url(), id, lease))
        .collect();
    let failovers = size.pick(3, 12);
    let mut recoveries = Vec::new();
    let mut kills = 0;
    for round in 0..failovers {
        std::thread::sleep(Duration::from_millis(700));
        let primary = cluster.primary_for_key("distlock:{torture}");
        let at = Instant::now();
        if round % 3 == 2 {
            cluster.kill(primary);
            cluster.wait_until_replica_promoted(primary);
            cluster.restart(primary);
            kills += 1;
        } else {
            cluster.failover(primary);
        }
        wait_for_commit_after(
            &store,
            check_log(&store).commits,
            Duration::from_secs(30),
            &format!("locking to resume after failover {round}"),
        );
        recoveries.push(at.elapsed());
    }
    let (panics, errors) = stop_workers(workers);
    let check = check_log(&store);
    record(
        "cluster_with_failovers",
        &[
            ("failovers", failovers.to_string()),
            ("of_them_sigkill", kills.to_string()),
            ("committed_writes", check.commits.to_string()),
            ("duplicate_reads", check.duplicate_reads.to_string()),
            ("token_regressions", check.token_regressions.to_string()),
            ("panics", panics.to_string()),
            ("error_kinds_seen", format!("{errors:?}")),
            ("failover_to_next_commit", percentiles(&mut recoveries)),
        ],
    );
    assert_eq!(panics, 0);
    check.assert_sound();
    assert!(
        errors
            .iter()
            .all(|e| e.starts_with("Backend") || e == "Timeout" || e == "LeaseLost"),
        "unexpected error kinds: {errors:?}"
    );
}

/// Scenario 11 (semaphore mode): eight processes take one of a semaphore's three permits
/// again and again and record themselves inside the section in the store, which counts every
/// entry that finds three inside already. A chaos loop SIGKILLs a random worker every ~200 ms,
/// removes it from the store's record (it is gone; its permit stays taken until its lease
/// ends) and respawns it. At the end every worker is killed, and this process must get all
/// three permits within a lease (and a margin) of the kill: the crashed holders' permits come
/// back.
fn semaphore_capacity_with_crashes(size: &Size, runtime: &tokio::runtime::Runtime) {
    let lock = RedisServer::start();
    let store = RedisServer::start();
    let lease = Duration::from_millis(500);
    let run_for = size.pick(Duration::from_secs(6), Duration::from_secs(120));
    let (kills, lines) = run_with_crashes("sem-worker", &lock, &store, lease, run_for, |worker| {
        let () = redis::cmd("SREM")
            .arg("inside:permits")
            .arg(worker)
            .query(&mut store.connection())
            .expect("forget the killed worker");
    });
    // Every worker was killed as `run_with_crashes` returned, some holding permits.
    let killed_at = Instant::now();
    let client = Client::new(Config::from_url(&lock.url()).expect("url")).expect("client");
    let permits: Vec<_> = runtime.block_on(async {
        let mut permits = Vec::new();
        for _ in 0..SEMAPHORE_PERMITS {
            permits.push(
                client
                    .semaphore(SEMAPHORE_KEY, SEMAPHORE_PERMITS)
                    .wait(lease * 6)
                    .acquire()
                    .await
                    .expect("the killed workers' permits come back"),
            );
        }
        permits
    });
    let all_back = killed_at.elapsed();
    let panics = lines.iter().filter(|l| l.starts_with("PANIC")).count();
    let overlaps = counter(&store, "permit-overlaps");
    let full_entries = counter(&store, "full-entries");
    let entries = counter(&store, "permit-entries");
    let violations: Vec<String> = redis::cmd("LRANGE")
        .arg("violations")
        .arg(0)
        .arg(9)
        .query(&mut store.connection())
        .expect("violations");
    record(
        "semaphore_capacity_with_crashes",
        &[
            ("seconds", run_for.as_secs().to_string()),
            ("permits", SEMAPHORE_PERMITS.to_string()),
            ("entries", entries.to_string()),
            ("entries_that_filled_the_permits", full_entries.to_string()),
            ("kills", kills.to_string()),
            ("entries_over_capacity", overlaps.to_string()),
            (
                "ms_until_every_permit_is_back",
                all_back.as_millis().to_string(),
            ),
            ("panics", panics.to_string()),
        ],
    );
    assert_eq!(
        overlaps, 0,
        "more holders than permits were inside together: {violations:?}"
    );
    assert!(entries > 50, "too few entries to mean anything: {entries}");
    assert!(
        full_entries > 10,
        "the permits were hardly ever all taken: {full_entries}"
    );
    assert!(
        all_back <= lease + Duration::from_millis(500),
        "the killed workers' permits came back {all_back:?} after the kill (lease {lease:?})"
    );
    assert_eq!(panics, 0);
    for permit in permits {
        assert!(runtime.block_on(permit.release()).expect("release"));
    }
}

/// A scenario to run, by name.
/// The scenarios that bound a time: run alone, after the others.
const TIMED: [&str; 3] = [
    "liveness_after_a_crash",
    "abort_latency",
    "semaphore_capacity_with_crashes",
];

/// How many of the other scenarios run at once in the small run.
const UNTIMED_LANES: usize = 2;

type Scenario<'a> = Box<dyn Fn() + Send + Sync + 'a>;

fn main() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        child(&role);
        return;
    }
    let size = Size {
        full: std::env::args().any(|a| a == "--full"),
    };
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let scenarios: Vec<(&str, Scenario)> = vec![
        (
            "mutual_exclusion_with_crashes",
            Box::new(|| mutual_exclusion_with_crashes(&size)),
        ),
        (
            "liveness_after_a_crash",
            Box::new(|| liveness_after_a_crash(&size, &runtime)),
        ),
        (
            "fencing_under_pauses",
            Box::new(|| fencing_under_pauses(&size, &runtime)),
        ),
        (
            "redis_restarted_mid_run",
            Box::new(|| redis_restarted_mid_run(&size)),
        ),
        ("abort_latency", Box::new(|| abort_latency(&size, &runtime))),
        (
            "read_write_exclusion_with_crashes",
            Box::new(|| read_write_exclusion_with_crashes(&size)),
        ),
        (
            "read_write_fencing_under_pauses",
            Box::new(|| read_write_fencing_under_pauses(&size, &runtime)),
        ),
        (
            "redlock_with_minority_kills_and_a_majority_loss",
            Box::new(|| redlock_with_minority_kills_and_a_majority_loss(&size)),
        ),
        (
            "cluster_with_failovers",
            Box::new(|| cluster_with_failovers(&size)),
        ),
        (
            "semaphore_capacity_with_crashes",
            Box::new(|| semaphore_capacity_with_crashes(&size, &runtime)),
        ),
    ];
    let scenarios: Vec<(&str, Scenario)> = scenarios
        .into_iter()
        .filter(|(name, _)| filter.as_deref().is_none_or(|f| name.contains(f)))
        .collect();
    // The small run (CI's) runs the scenarios that check no time two at a time, each on
    // servers of its own, then those that bound a time (a crashed holder's lock freed within
    // its lease, an abort's latency, permits back within their lease) one by one, alone; the
    // full run (the figures in RELIABILITY.md) runs every one alone.
    let (timed, untimed): (Vec<_>, Vec<_>) = scenarios
        .into_iter()
        .partition(|(name, _)| size.full || TIMED.contains(name));
    let run = |name: &str, scenario: &Scenario| -> bool {
        println!("test {name} ...");
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(scenario)).is_ok();
        println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
        ok
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let untimed_failed: usize = std::thread::scope(|scope| {
        let lanes: Vec<_> = (0..UNTIMED_LANES)
            .map(|_| {
                scope.spawn(|| {
                    let mut failed = 0;
                    loop {
                        let at = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let Some((name, scenario)) = untimed.get(at) else {
                            return failed;
                        };
                        failed += usize::from(!run(name, scenario));
                    }
                })
            })
            .collect();
        lanes.into_iter().map(|lane| lane.join().unwrap_or(1)).sum()
    });
    let timed_failed = timed
        .iter()
        .filter(|(name, scenario)| !run(name, scenario))
        .count();
    let failed = untimed_failed + timed_failed;
    let passed = untimed.len() + timed.len() - failed;
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out\n"
    );
    if failed > 0 {
        std::process::exit(101);
    }
}
