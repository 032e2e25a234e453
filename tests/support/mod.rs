//! Test support: real `redis-server` processes on free loopback ports.
//!
//! Each server runs under a tiny shell watcher that kills it when the test process goes away
//! (its stdin pipe closes), so even a test binary killed mid-run leaves no server behind.
//! Readiness is the server's own "Ready to accept connections" log line, not a sleep.
//! Deployments built from these servers live next door: `cluster` (3+3 Redis Cluster),
//! `sentinel` (primary, replicas, sentinels) and `masters` (independent masters); `proxy`
//! and `monitor` inject and observe faults between a client and one server, `silent` is a
//! server that takes connections and never answers; `stores` is the list of stores the
//! conformance suites run on; `capture` keeps what distlock logs, for the tests of its spans
//! and events; `panics` counts the panics of the library and the `redis` crate. `postgres`
//! starts PostgreSQL servers the same way (`initdb` and `postgres`, run as the `postgres`
//! system user when the tests run as root), with streaming standbys to promote, and
//! `pgbouncer` puts PgBouncer in front of one, for the Postgres store, under the watcher of
//! `process`, which also holds the faults (signals) and what `/proc` says of a process. `etcd`
//! starts etcd members and three-member clusters under that watcher, for the etcd store.
#![allow(dead_code)] // each test binary uses its own part of the support

pub mod acl;
pub mod capture;
pub mod cluster;
pub mod etcd;
pub mod masters;
pub mod monitor;
pub mod panics;
pub mod pgbouncer;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod sentinel;
pub mod silent;
pub mod stores;
pub mod tls;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const INSTALL_HINT: &str = "redis-server was not found on PATH. The tests start their own Redis \
    servers and need it installed: `sudo apt-get install -y redis-server` (Debian/Ubuntu) or \
    `brew install redis` (macOS).";

const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The shell watcher: starts redis-server, reports its pid, kills it when stdin closes or a
/// line arrives, and reports its exit. With `DISTLOCK_SERVER_CPUS` set (e.g. `0`), the server
/// runs pinned to those CPUs (`taskset`), so a benchmark can keep it off the client's CPU.
/// (A background job's stdin is /dev/null in a non-interactive shell, hence fd 3.)
const WATCHER: &str = r#"
exec 3<&0
${DISTLOCK_SERVER_CPUS:+taskset -c "$DISTLOCK_SERVER_CPUS"} redis-server "$@" &
pid=$!
echo "support: pid $pid"
( read -r _ <&3 ; kill -9 "$pid" 2>/dev/null ) &
wait "$pid"
echo "support: exited $?"
"#;

/// A running `redis-server` that keeps nothing on disk, like the usual cache setup.
pub struct RedisServer {
    port: u16,
    /// The whole `redis-server` command line after the program name, kept for `restart`.
    args: Vec<String>,
    process: Option<Process>,
}

struct Process {
    watcher: Child,
    stdin: ChildStdin,
    pid: u32,
    /// (In a mutex so a server can live in a `static`.)
    exited: std::sync::Mutex<mpsc::Receiver<()>>,
    /// The RDB file this launch may write (a replica stores what it syncs there); removed
    /// when the server is killed.
    rdb: std::path::PathBuf,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it accepts connections.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments (e.g. `--requirepass`).
    pub fn start_with(extra: &[&str]) -> Self {
        require_redis_server();
        for _ in 0..5 {
            let port = free_port();
            if let Ok(server) = Self::launch(port, server_args(port, extra)) {
                return server;
            }
        }
        panic!("could not start redis-server on a free port after 5 tries");
    }

    /// Runs `redis-server ARGS` (the whole command line, e.g. a config file and `--sentinel`)
    /// under the watcher and waits until it listens on `port`. An error usually means the port
    /// was taken in the meantime; the caller picks another one.
    pub fn launch(port: u16, args: Vec<String>) -> Result<Self, String> {
        if DEFAULT_PORTS.contains(&port) {
            return Err(format!(
                "port {port} is a Redis default: a server a developer runs there is never a \
                 test's (pick one with free_port)"
            ));
        }
        let process = Process::spawn(port, &args)?;
        Ok(Self {
            port,
            args,
            process: Some(process),
        })
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL; it keeps nothing) and waits until it has exited.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Whether the server process is running (not stopped or killed).
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        let mut last_error = String::new();
        // The port was ours a moment ago; give a racing process a few tries' worth of time.
        for _ in 0..20 {
            match Process::spawn(self.port, &self.args) {
                Ok(process) => {
                    self.process = Some(process);
                    return;
                }
                Err(err) => last_error = err,
            }
        }
        panic!(
            "could not restart redis-server on port {}: {last_error}",
            self.port
        );
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the server process.
    pub fn signal(&self, signal: &str) {
        let pid = self.process.as_ref().expect("server is not running").pid;
        let status = Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// Like [`restart`](Self::restart), with a new command line from here on (e.g. to come
    /// back as a replica of another server).
    pub fn restart_with_args(&mut self, args: Vec<String>) {
        self.stop();
        self.args = args;
        self.restart();
    }

    /// A synchronous connection for inspecting the server from a test.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("valid url")
            .get_connection()
            .expect("connect to the test redis-server")
    }

    /// What the server says it is (`ROLE`), or `None` if it does not answer.
    pub fn role(&self) -> Option<Role> {
        role_of(self.port)
    }

    /// How many readers hold the lock `name` (default prefix): while readers hold a lock its
    /// key is their sorted set, a string while a writer holds it.
    pub fn readers(&self, name: &str) -> i64 {
        let key = format!("distlock:{{{name}}}");
        let mut redis = self.connection();
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query(&mut redis)
            .expect("TYPE");
        if kind != "zset" {
            return 0;
        }
        redis::cmd("ZCARD")
            .arg(&key)
            .query(&mut redis)
            .expect("ZCARD")
    }

    /// Script calls (`EVALSHA` and `EVAL`) the server has run, from `INFO commandstats`.
    pub fn script_calls(&self) -> u64 {
        self.command_calls(&["evalsha", "eval"])
    }

    /// Calls of the `commands` (lower case, as `INFO commandstats` names them) the server has
    /// run, added up.
    pub fn command_calls(&self, commands: &[&str]) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.connection())
            .expect("INFO commandstats");
        commands
            .iter()
            .filter_map(|command| info_field(&info, &format!("cmdstat_{command}")))
            .map(|stats| {
                stats
                    .split(',')
                    .find_map(|stat| stat.strip_prefix("calls="))
                    .and_then(|calls| calls.parse::<u64>().ok())
                    .expect("calls=")
            })
            .sum()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The command line of a plain server on `port`: loopback only, nothing kept on disk,
/// replicas synced at once, then `extra`.
pub fn server_args(port: u16, extra: &[&str]) -> Vec<String> {
    let dir = std::env::temp_dir();
    let mut args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        // A replica's first sync would otherwise wait 5 s for more replicas to join it.
        "--repl-diskless-sync-delay",
        "0",
        "--dir",
        &dir.to_string_lossy(),
        "--daemonize",
        "no",
        "--loglevel",
        "notice",
    ]
    .iter()
    .map(|arg| arg.to_string())
    .collect();
    args.extend(extra.iter().map(|arg| arg.to_string()));
    args
}

impl Process {
    fn spawn(port: u16, args: &[String]) -> Result<Self, String> {
        // Every launch gets an RDB file name of its own, given last so it wins: a replica
        // writes the data it syncs to its RDB file, and a server started later with the same
        // file would load it and not start empty.
        static LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let rdb_name = format!(
            "distlock-{}-{}.rdb",
            std::process::id(),
            LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let dir = args
            .iter()
            .rposition(|arg| arg == "--dir")
            .and_then(|at| args.get(at + 1))
            .map_or_else(std::env::temp_dir, std::path::PathBuf::from);
        let rdb = dir.join(&rdb_name);
        let mut watcher = Command::new("sh")
            .args(["-c", WATCHER, "redis-watcher"])
            .args(args)
            .args(["--dbfilename", &rdb_name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| format!("spawn sh: {err}"))?;
        let stdin = watcher.stdin.take().expect("piped stdin");
        let stdout = watcher.stdout.take().expect("piped stdout");

        let (events, received) = mpsc::channel::<String>();
        let (exited_tx, exited) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("support: exited") {
                    let _ = exited_tx.send(());
                }
                let _ = events.send(line);
            }
        });

        let mut pid = None;
        let mut log = Vec::new();
        loop {
            let line = match received.recv_timeout(START_TIMEOUT) {
                Ok(line) => line,
                Err(_) => {
                    let _ = watcher.kill();
                    return Err(format!(
                        "redis-server on port {port} did not become ready in {START_TIMEOUT:?}: {}",
                        log.join("\n")
                    ));
                }
            };
            if let Some(found) = line.strip_prefix("support: pid ") {
                pid = found.trim().parse().ok();
            } else if line.starts_with("support: exited") {
                let _ = watcher.wait();
                return Err(format!(
                    "redis-server on port {port} exited at start: {}",
                    log.join("\n")
                ));
            } else if line.contains("Ready to accept connections")
                // A sentinel says neither; it names itself once it listens.
                || line.contains("Sentinel ID is")
            {
                let pid = pid.ok_or("watcher did not report the pid")?;
                return Ok(Self {
                    watcher,
                    stdin,
                    pid,
                    exited: exited.into(),
                    rdb,
                });
            }
            log.push(line);
        }
    }

    fn kill(&mut self) {
        // Thaw it first in case a test froze it, then have the watcher SIGKILL it.
        let _ = Command::new("kill")
            .args(["-CONT", &self.pid.to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.stdin.write_all(b"stop\n");
        let _ = self.stdin.flush();
        if let Ok(exited) = self.exited.lock() {
            let _ = exited.recv_timeout(START_TIMEOUT);
        }
        let _ = self.watcher.wait();
        let _ = std::fs::remove_file(&self.rdb);
    }
}

/// Panics with the install hint unless `redis-server` runs.
pub fn require_redis_server() {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(found, "{INSTALL_HINT}");
}

/// A loopback port nobody listened on a moment ago.
///
/// Never the same port twice in one test process: a server of a finished test and a server of
/// a later one must not share an address, or what the library remembers per server (the
/// eviction check, done once per `host:port`) and what a test captured about the first would
/// be taken for the second's.
pub fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .expect("find a free loopback port");
        if claim_port(port) {
            return port;
        }
    }
}

/// Redis's and Sentinel's default ports (6379, 26379). The README promises that the tests
/// never use a server already running there: [`claim_port`] never hands them out, so neither
/// [`free_port`] nor the proxy ever takes them, and [`RedisServer::launch`] refuses them.
pub const DEFAULT_PORTS: [u16; 2] = [6379, 26379];

/// Marks `port` as taken for the rest of the process, so [`free_port`] never hands it out;
/// false if it was taken already, or is one of the [`DEFAULT_PORTS`]. For listeners a test
/// binds itself that clients connect to as to a server (the proxy): the library remembers
/// their address as a server's.
pub fn claim_port(port: u16) -> bool {
    if DEFAULT_PORTS.contains(&port) {
        return false;
    }
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(port)
}

/// Polls `check` every 20 ms until it returns `Ok`, for readiness of external processes that
/// offer nothing to wait on. Panics after `timeout` with `what` and the last reason given.
pub fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let mut poll = Poll::new(what, timeout);
    loop {
        if let Some(value) = poll.check(&mut check) {
            return value;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`wait_until`] for async tests: polls `check` every 10 ms without blocking the runtime
/// (the event awaited may come from a task on the same runtime), panicking with `what` and
/// the last reason after `timeout`.
pub async fn wait_until_async<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let mut poll = Poll::new(what, timeout);
    loop {
        if let Some(value) = poll.check(&mut check) {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The deadline of one bounded poll, shared by [`wait_until`] and [`wait_until_async`].
struct Poll<'a> {
    what: &'a str,
    timeout: Duration,
    deadline: std::time::Instant,
}

impl<'a> Poll<'a> {
    fn new(what: &'a str, timeout: Duration) -> Self {
        Self {
            what,
            timeout,
            deadline: std::time::Instant::now() + timeout,
        }
    }

    /// One look: the value once `check` gives it, `None` to look again; panics past the
    /// deadline.
    fn check<T>(&mut self, check: &mut impl FnMut() -> Result<T, String>) -> Option<T> {
        match check() {
            Ok(value) => Some(value),
            Err(reason) if std::time::Instant::now() >= self.deadline => panic!(
                "timed out after {:?} waiting for {}: {reason}",
                self.timeout, self.what
            ),
            Err(_) => None,
        }
    }
}

/// A fresh directory under the system temp dir for one deployment's config files, named
/// `distlock-KIND-PID-N`. Directories left by test processes that no longer run (a `static`
/// deployment is never dropped) are removed on the way.
pub fn scratch_dir(kind: &str) -> std::path::PathBuf {
    scratch_dir_in(&std::env::temp_dir(), kind)
}

/// A [`scratch_dir`] in memory (`/dev/shm`, where the machine has one): for a server's data
/// that the tests restart but never need across a machine crash, so that its `fsync`s cost
/// nothing (etcd syncs its log at every write, as PostgreSQL would without `fsync = off`).
pub fn memory_scratch_dir(kind: &str) -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        scratch_dir_in(shm, kind)
    } else {
        scratch_dir(kind)
    }
}

fn scratch_dir_in(temp: &std::path::Path, kind: &str) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let prefix = format!("distlock-{kind}-");
    if let Ok(entries) = std::fs::read_dir(temp) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.split('-').next())
            else {
                continue;
            };
            if !std::path::Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = temp.join(format!("{prefix}{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch dir for config files");
    dir
}

/// A synchronous connection to `redis://127.0.0.1:PORT`, or why not.
pub fn connect(port: u16) -> Result<redis::Connection, String> {
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}")).map_err(|e| e.to_string())?;
    client
        .get_connection_with_timeout(Duration::from_secs(2))
        .map_err(|err| format!("connect to port {port}: {err}"))
}

/// Runs `cmd` on a fresh connection to `port`; the error says which port.
pub fn query_port<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Result<T, String> {
    cmd.query(&mut connect(port)?)
        .map_err(|err| format!("port {port}: {err}"))
}

/// The `key:value` lines of an `INFO`-style reply, e.g. `info_field(&reply, "cluster_state")`.
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.trim_end()
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}

/// What a server says it is (`ROLE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Takes writes (in a cluster: serves slots, or could).
    Primary,
    /// Replicates the primary on `primary_port`.
    Replica {
        /// The port of the primary it follows.
        primary_port: u16,
    },
}

/// What the server on `port` says it is, or `None` if it does not answer.
pub fn role_of(port: u16) -> Option<Role> {
    let reply: Vec<redis::Value> = query_port(port, &redis::cmd("ROLE")).ok()?;
    let kind: String = redis::from_redis_value_ref(reply.first()?).ok()?;
    match kind.as_str() {
        "master" => Some(Role::Primary),
        "slave" => Some(Role::Replica {
            primary_port: redis::from_redis_value_ref(reply.get(2)?).ok()?,
        }),
        _ => None,
    }
}
