//! Real PostgreSQL servers for tests, for the Postgres store (issue 38): each one an `initdb`
//! data directory in a [`scratch_dir`] and a `postgres` on a free loopback port, run as the
//! unprivileged `postgres` system user when the tests run as root (the server refuses root).
//! As for every server of [`process`](super::process), a shell watcher kills the server, and
//! every process it forked, when the test process goes away (its stdin pipe closes), and
//! readiness is the server's own "database system is ready to accept connections" log line.
//! The faults a store test needs are here: a fast shutdown, a restart on the same data and
//! port, a SIGKILLed server (restarted, it recovers) and a frozen one (SIGSTOP of every
//! process). [`PostgresServer::start_tls`] starts one with `ssl = on`, taking clients over
//! TLS alone or not ([`TlsAccess`]). [`PostgresServer::start_standby`] makes a streaming
//! standby of a server (`pg_basebackup -R`), asynchronous or synchronous ([`Replication`]),
//! and [`PostgresServer::promote`] fails over to it. [`shared_postgres`] lets one test binary
//! start a single server. `pgbouncer.rs` puts PgBouncer in front of one.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::process::{
    children_of, is_gone, signal, stop_all, stopped, watcher_command, Launching, StartError,
    Watched, GONE_TIMEOUT,
};
use super::tls::Certificates;
use super::{free_port, scratch_dir, wait_until};

const INSTALL_HINT: &str = "PostgreSQL's `initdb` and `postgres` were found neither on PATH nor \
    under /usr/lib/postgresql/*/bin. The tests start their own PostgreSQL servers and need them \
    installed: `sudo apt-get install -y postgresql` (Debian/Ubuntu) or \
    `brew install postgresql@15` (macOS).";

/// PostgreSQL's default port: a server a developer runs there is never a test's.
const DEFAULT_PORT: u16 = 5432;

/// How long a start (with crash recovery after a [`kill`](PostgresServer::kill)) or a fast
/// shutdown may take on a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What the server logs once it takes connections, after a start or a crash recovery: "…
/// connections", or "… read-only connections" for a standby.
const READY: &str = "database system is ready to accept";

/// The settings the tests need, appended to `postgresql.conf` (the port is given on the
/// command line, so a start that finds it taken can try another). Speed over durability
/// against a machine crash (`fsync`, `full_page_writes`), which no test makes; but commits stay
/// synchronous: with `synchronous_commit = off` a commit reported done may still be in the
/// server's shared memory, and a [`kill`](PostgresServer::kill) lost the last ones (a table
/// created just before). With `fsync` off, a synchronous commit costs one `write`: about 5%
/// in pgbench.
const SETTINGS: &str = "
# tests/support/postgres.rs
listen_addresses = '127.0.0.1'
fsync = off
synchronous_commit = on
full_page_writes = off
max_connections = 200
";

/// One server per test binary, started on first use. It dies with the test process (the
/// watcher); its directory is swept by the next run's [`scratch_dir`]. It cannot be stopped,
/// killed or restarted (those need `&mut`), and no test should freeze it: a test that needs a
/// fault starts its own.
pub fn shared_postgres() -> &'static PostgresServer {
    static SHARED: OnceLock<PostgresServer> = OnceLock::new();
    SHARED.get_or_init(PostgresServer::start)
}

/// A running PostgreSQL server on `127.0.0.1`, superuser `postgres` with trust
/// authentication, database `postgres`. Drop shuts it down and removes its directory.
pub struct PostgresServer {
    port: u16,
    /// The scratch directory, owned by the server's user: `data/` and the Unix socket.
    dir: PathBuf,
    process: Option<Watched>,
}

impl PostgresServer {
    /// Makes a data directory (`initdb`), starts the server on a free loopback port and waits
    /// until it accepts connections.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`start`](Self::start), with `settings` (name, value as `postgresql.conf` spells it,
    /// e.g. `("shared_preload_libraries", "'pg_stat_statements'")`) written after the tests'
    /// own, so that they override them (`benches/postgres.rs` loads `pg_stat_statements`).
    pub fn start_with(settings: &[(&str, &str)]) -> Self {
        Self::start_configured(settings, PLAIN_HBA, None)
    }

    /// A server with `ssl = on` and `certificates`' server certificate (for `localhost` and
    /// `127.0.0.1`; the files in its data directory, owned by the server's user, the key
    /// mode 0600), its CA as `ssl_ca_file` for client certificates, taking clients as
    /// `access` says. The support's own [`connect`](Self::connect) speaks plaintext;
    /// [`psql`](Self::psql) (libpq's `prefer`) speaks TLS where the server offers it.
    pub fn start_tls(certificates: &Certificates, access: TlsAccess) -> Self {
        let hba = match access {
            TlsAccess::TlsOrPlain => PLAIN_HBA,
            TlsAccess::TlsOnly => {
                "# tests/support/postgres.rs: loopback TCP over TLS only, no password.\n\
                 hostssl all all 127.0.0.1/32 trust\n"
            }
            TlsAccess::ClientCertificate => {
                "# tests/support/postgres.rs: loopback TCP over TLS with a client certificate \
                 the CA signed.\n\
                 hostssl all all 127.0.0.1/32 trust clientcert=verify-ca\n"
            }
        };
        let settings = [
            ("ssl", "on"),
            ("ssl_cert_file", "'server.pem'"),
            ("ssl_key_file", "'server.key'"),
            ("ssl_ca_file", "'ca.pem'"),
        ];
        Self::start_configured(&settings, hba, Some(certificates))
    }

    /// A server with the tests' settings, then `settings`, `hba` as its `pg_hba.conf` and,
    /// with `certificates`, their server files in its data directory.
    fn start_configured(
        settings: &[(&str, &str)],
        hba: &str,
        certificates: Option<&Certificates>,
    ) -> Self {
        let dir = scratch_dir("postgres");
        init_data_dir(&dir, settings, hba);
        if let Some(certificates) = certificates {
            let data = dir.join("data");
            for file in certificates.write_server_files(&data) {
                if let Some(user) = server_user() {
                    std::os::unix::fs::chown(&file, Some(user.uid), Some(user.gid))
                        .expect("give a TLS file to the postgres user");
                }
            }
        }
        Self::spawn_on_free_port(dir)
    }

    /// Starts the server of the data directory `dir/data` on a free loopback port and waits
    /// until it accepts connections.
    fn spawn_on_free_port(dir: PathBuf) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            if port == DEFAULT_PORT {
                continue;
            }
            match spawn(&dir, port) {
                Ok(process) => {
                    return Self {
                        port,
                        dir,
                        process: Some(process),
                    }
                }
                // Most likely the port was taken in the meantime: another one.
                Err(err) => last_error = err.to_string(),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        panic!("could not start postgres on a free port after 5 tries: {last_error}");
    }

    /// A streaming standby of this server on a free loopback port: a base backup
    /// (`pg_basebackup -R`, which writes `primary_conninfo` and `standby.signal`) in a scratch
    /// directory of its own, started read-only (a hot standby). Returns once it streams from
    /// this server; with [`Replication::Synchronous`], once this server has it as its
    /// synchronous standby (`synchronous_standby_names`, set by `ALTER SYSTEM` and a reload),
    /// so that every commit from then on returns only after the standby has flushed it.
    pub fn start_standby(&self, replication: Replication) -> PostgresServer {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let name = format!(
            "distlock_standby_{}",
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let dir = scratch_dir("postgres");
        give_to_server_user(&dir);
        let data = dir.join("data");
        let source = format!(
            "host=127.0.0.1 port={} user=postgres application_name={name}",
            self.port
        );
        let output = as_server_user(binaries().bin.join("pg_basebackup"))
            .args(["-d", &source, "-D"])
            .arg(&data)
            // A checkpoint at once, not spread; no fsync of what nothing must survive.
            .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"])
            .env("PGCONNECT_TIMEOUT", "10")
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .expect("run pg_basebackup");
        assert!(
            output.status.success(),
            "pg_basebackup of postgres on port {} failed:\n{}{}",
            self.port,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        // The primary's postgresql.conf came along; the socket goes in the standby's own
        // directory.
        append_conf(
            &data,
            &format!("unix_socket_directories = '{}'\n", quoted(&dir)),
        );
        let standby = Self::spawn_on_free_port(dir);
        let wanted = match replication {
            Replication::Asynchronous => "async",
            Replication::Synchronous => {
                self.psql(&format!(
                    "ALTER SYSTEM SET synchronous_standby_names = '\"{name}\"'"
                ));
                self.psql("SELECT pg_reload_conf()");
                "sync"
            }
        };
        wait_until(
            &format!("the standby on port {} to stream {wanted}", standby.port),
            START_TIMEOUT,
            || {
                let state = self.psql(&format!(
                    "SELECT state || ' ' || sync_state FROM pg_stat_replication \
                     WHERE application_name = '{name}'"
                ));
                if state == format!("streaming {wanted}") {
                    Ok(())
                } else {
                    Err(format!("pg_stat_replication says {state:?}"))
                }
            },
        );
        standby
    }

    /// Promotes this standby (`pg_promote`, waiting for it) and checks that it is out of
    /// recovery: it takes writes.
    pub fn promote(&self) {
        let promoted = self.psql("SELECT pg_promote(true, 30)");
        assert_eq!(promoted, "t", "postgres on port {}: pg_promote", self.port);
        let in_recovery = self.psql("SELECT pg_is_in_recovery()");
        assert_eq!(
            in_recovery, "f",
            "postgres on port {} is still a standby after pg_promote",
            self.port
        );
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The postmaster's pid. Panics if the server is not running.
    pub fn pid(&self) -> u32 {
        self.running().pid()
    }

    /// Every process of the server: the postmaster first, then the processes it forked
    /// (backends, checkpointer, WAL writer, ...), as they are now.
    pub fn processes(&self) -> Vec<u32> {
        let pid = self.pid();
        let mut all = vec![pid];
        all.extend(children_of(pid));
        all
    }

    /// Shuts the server down the fast way (SIGINT: open transactions roll back, sessions
    /// end) and waits until it has exited.
    pub fn stop(&mut self) {
        if let Some(process) = self.process.take() {
            if let Err(err) = process.shut_down("INT", START_TIMEOUT) {
                panic!("postgres on port {}: {err}", self.port);
            }
        }
    }

    /// Starts the server again on the same data directory and port, and waits until it
    /// accepts connections; a running server is stopped first. After [`kill`](Self::kill)
    /// this is a crash recovery, which the wait includes.
    pub fn restart(&mut self) {
        self.stop();
        let mut last_error = String::new();
        // The port was ours a moment ago; give a racing process a few tries' worth of time.
        for _ in 0..20 {
            match spawn(&self.dir, self.port) {
                Ok(process) => {
                    self.process = Some(process);
                    return;
                }
                Err(err) => last_error = err.to_string(),
            }
        }
        panic!(
            "could not restart postgres on port {}: {last_error}",
            self.port
        );
    }

    /// An unclean crash: SIGKILL of the postmaster and every process it forked, all at once
    /// (the postmaster stopped first, so it neither forks nor reacts to a child's death in
    /// between). Waits until all are gone; [`restart`](Self::restart) then recovers.
    pub fn kill(&mut self) {
        if let Some(process) = self.process.take() {
            if let Err(err) = process.kill(START_TIMEOUT) {
                panic!("postgres on port {}: {err}", self.port);
            }
        }
    }

    /// Freezes the server: SIGSTOP of the postmaster, then of every process it forked (each
    /// backend, so open sessions stall too). Returns once all are stopped. Connections are
    /// still accepted by the kernel and wait in the listen queue.
    pub fn freeze(&self) {
        let processes = stop_all(self.pid())
            .unwrap_or_else(|err| panic!("freeze postgres on port {}: {err}", self.port));
        let children = &processes[1..];
        // A child may exit meanwhile (a session ending); the others are still stopped.
        let _ = signal("STOP", children);
        for &child in children {
            wait_until("a server process to stop", GONE_TIMEOUT, || {
                if is_gone(child) {
                    Ok(())
                } else {
                    stopped(child)
                }
            });
        }
    }

    /// Thaws a frozen server (SIGCONT of every process, the postmaster last).
    pub fn thaw(&self) {
        let pid = self.pid();
        let _ = signal("CONT", &children_of(pid));
        signal("CONT", &[pid]).unwrap_or_else(|err| panic!("{err}"));
    }

    /// A connection for inspecting the server from an async test; the connection task is
    /// spawned on the current runtime.
    pub async fn connect(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|err| {
                panic!("connect to the test postgres on port {}: {err}", self.port)
            });
        tokio::spawn(async move {
            // It ends with an error when a test stops or kills the server: nothing to report.
            let _ = connection.await;
        });
        client
    }

    /// Runs `sql` (one or more statements) with `psql` and returns what it prints: the rows
    /// of the last statement, one a line, columns separated by `|`, without headers. Panics
    /// with psql's message if a statement fails. For synchronous test code.
    pub fn psql(&self, sql: &str) -> String {
        let port = self.port.to_string();
        let output = Command::new(&binaries().psql)
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
            .args(["-p", &port, "-U", "postgres", "-d", "postgres", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "10")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|err| panic!("run {}: {err}", binaries().psql.display()));
        assert!(
            output.status.success(),
            "psql on port {}: {sql}: {}",
            self.port,
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        stdout.strip_suffix('\n').unwrap_or(&stdout).to_string()
    }

    fn running(&self) -> &Watched {
        self.process
            .as_ref()
            .unwrap_or_else(|| panic!("postgres on port {} is not running", self.port))
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(process) = self.process.take() {
            // Never a panic here (a test may be unwinding); a server that does not shut down
            // has been killed.
            let _ = process.shut_down("INT", START_TIMEOUT);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `postgres` on `dir/data` and `port` under the watcher, as the server's user, and
/// waits for its ready line. An error usually means the port was taken.
fn spawn(dir: &Path, port: u16) -> Result<Watched, StartError> {
    let mut command = watcher_command(as_server_user("sh"), "postgres-watcher");
    command
        .arg(binaries().bin.join("postgres"))
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-p", &port.to_string()])
        .current_dir(dir);
    Launching::spawn(command, &format!("postgres on port {port}"))?.wait_ready(READY, START_TIMEOUT)
}

/// The `pg_hba.conf` of a server without TLS: loopback TCP, no password, and replication
/// connections for a [standby](PostgresServer::start_standby).
const PLAIN_HBA: &str = "# tests/support/postgres.rs: loopback TCP only, no password.\n\
    host all all 127.0.0.1/32 trust\n\
    host replication all 127.0.0.1/32 trust\n";

/// How a [standby](PostgresServer::start_standby) follows its primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// A commit on the primary returns before the standby has it: a failover can lose it.
    Asynchronous,
    /// The primary's synchronous standby: a commit returns once the standby has flushed it.
    Synchronous,
}

/// Whom a [`PostgresServer::start_tls`] server takes (its `pg_hba.conf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsAccess {
    /// Clients over TLS or not (`host`).
    TlsOrPlain,
    /// Clients over TLS alone (`hostssl`): a plaintext one is refused.
    TlsOnly,
    /// Clients over TLS that show a certificate the CA signed (`hostssl …
    /// clientcert=verify-ca`).
    ClientCertificate,
}

/// Runs `initdb` for `dir/data` as the server's user (giving it `dir` first), then writes the
/// tests' settings, then `extra` ones, and `hba` as its `pg_hba.conf` (127.0.0.1 alone).
fn init_data_dir(dir: &Path, extra: &[(&str, &str)], hba: &str) {
    give_to_server_user(dir);
    let data = dir.join("data");
    let output = as_server_user(binaries().bin.join("initdb"))
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
        // No fsync of the new files: nothing here must survive a machine crash.
        .args(["--no-sync", "--no-instructions"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run initdb");
    assert!(
        output.status.success(),
        "initdb {} failed (the postgres user must be able to reach the temp dir {}):\n{}{}",
        data.display(),
        std::env::temp_dir().display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // Written over initdb's files, which keep their owner.
    let mut conf = format!("{SETTINGS}unix_socket_directories = '{}'\n", quoted(dir));
    for (name, value) in extra {
        conf.push_str(&format!("{name} = {value}\n"));
    }
    append_conf(&data, &conf);
    std::fs::write(data.join("pg_hba.conf"), hba).expect("write pg_hba.conf");
}

/// `path` as a single-quoted PostgreSQL setting's value (its quotes doubled).
fn quoted(path: &std::path::Path) -> String {
    path.to_string_lossy().replace('\'', "''")
}

/// Appends `lines` to the `postgresql.conf` of the data directory `data` (written over
/// initdb's or pg_basebackup's file, which keeps its owner).
fn append_conf(data: &std::path::Path, lines: &str) {
    let mut conf = std::fs::OpenOptions::new()
        .append(true)
        .open(data.join("postgresql.conf"))
        .unwrap_or_else(|err| panic!("open {}/postgresql.conf: {err}", data.display()));
    conf.write_all(lines.as_bytes())
        .unwrap_or_else(|err| panic!("write {}/postgresql.conf: {err}", data.display()));
}

/// Makes `dir` private to the server's user (the server refuses a data directory others can
/// read).
fn give_to_server_user(dir: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .expect("make the postgres scratch dir private");
    if let Some(user) = server_user() {
        std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid))
            .expect("give the postgres scratch dir to the postgres user");
    }
}

/// Where `initdb`, `postgres` and `psql` are.
struct Binaries {
    /// The directory of `initdb` and `postgres`.
    bin: PathBuf,
    psql: PathBuf,
}

/// The PostgreSQL binaries: the directory of the `initdb` on PATH, else the newest
/// `/usr/lib/postgresql/N/bin` (Debian puts neither on PATH). Panics with the install hint.
fn binaries() -> &'static Binaries {
    static FOUND: OnceLock<Binaries> = OnceLock::new();
    FOUND.get_or_init(|| {
        let on_path = std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join("initdb"))
            .find(|initdb| initdb.is_file())
            .and_then(|initdb| std::fs::canonicalize(initdb).ok())
            .and_then(|initdb| initdb.parent().map(Path::to_path_buf));
        let bin = on_path
            .or_else(newest_debian_bin)
            .filter(|bin| bin.join("initdb").is_file() && bin.join("postgres").is_file())
            .unwrap_or_else(|| panic!("{INSTALL_HINT}"));
        let psql = Some(bin.join("psql"))
            .filter(|psql| psql.is_file())
            .unwrap_or_else(|| PathBuf::from("psql"));
        Binaries { bin, psql }
    })
}

/// `/usr/lib/postgresql/N/bin` with the highest `N`.
fn newest_debian_bin() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").is_file())
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin)
}

/// The unprivileged user the server (and PgBouncer, `pgbouncer.rs`) runs as when the tests
/// run as root.
pub(super) struct ServerUser {
    pub(super) uid: u32,
    pub(super) gid: u32,
}

/// `Some(postgres)` when the tests run as root, `None` when the server runs as the current
/// user. Panics if root finds no `postgres` user.
pub(super) fn server_user() -> Option<&'static ServerUser> {
    static USER: OnceLock<Option<ServerUser>> = OnceLock::new();
    USER.get_or_init(|| {
        let root = std::fs::metadata("/proc/self").is_ok_and(|me| me.uid() == 0);
        if !root {
            return None;
        }
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let user = passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            match fields.as_slice() {
                ["postgres", _, uid, gid, ..] => Some(ServerUser {
                    uid: uid.parse().ok()?,
                    gid: gid.parse().ok()?,
                }),
                _ => None,
            }
        });
        Some(user.unwrap_or_else(|| {
            panic!(
                "the tests run as root, and PostgreSQL refuses root: they run it as the \
                 `postgres` system user, which is missing. Installing PostgreSQL creates it: \
                 `sudo apt-get install -y postgresql`."
            )
        }))
    })
    .as_ref()
}

/// `program` as a command run by the server's user: through `runuser` when root.
pub(super) fn as_server_user(program: impl AsRef<std::ffi::OsStr>) -> Command {
    if server_user().is_some() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}
