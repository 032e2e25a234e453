//! PgBouncer for tests of the PostgreSQL store through a pooler: a `pgbouncer` on a free
//! loopback port in front of one [`PostgresServer`], in the pool mode a test names
//! ([`PoolMode`]), its configuration, user list and log in a [`scratch_dir`], run as the
//! `postgres` system user when the tests run as root (PgBouncer refuses root, as `postgres`
//! does). It runs under the watcher of [`process`](super::process), which kills it when the
//! test process goes away; it is ready at its own "process up" log line, and drop shuts it
//! down at once (SIGTERM: PgBouncer's SIGINT would wait for every client to leave).
//! Neighbours: `postgres.rs` starts the server behind it and lends it how to run a program as
//! the server's user.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use super::postgres::{as_server_user, server_user, PostgresServer};
use super::process::{find_on_path, watcher_command, Launching, Watched};
use super::{free_port, scratch_dir};

const INSTALL_HINT: &str = "`pgbouncer` was found neither on PATH nor at /usr/sbin/pgbouncer \
    (where Debian puts it). The tests of the PostgreSQL store through a pooler start their own \
    PgBouncer and need it installed: `sudo apt-get install -y pgbouncer` (Debian/Ubuntu) or \
    `brew install pgbouncer` (macOS).";

/// PgBouncer's default port: a pooler a developer runs there is never a test's.
const DEFAULT_PORT: u16 = 6432;

/// How long a start may take on a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What PgBouncer logs once it listens.
const READY: &str = "process up: PgBouncer";

/// When PgBouncer hands a client's server connection back to its pool (`pool_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// When the client disconnects: one backend per client connection, as without a pooler.
    Session,
    /// After each transaction: a client's next transaction may run on another backend.
    Transaction,
}

impl PoolMode {
    fn setting(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }
}

/// A running PgBouncer on `127.0.0.1` in front of one server, every database of which it
/// serves under its own name, user `postgres` (and any other the server trusts) without a
/// password. Drop shuts it down and removes its directory.
pub struct PgBouncer {
    port: u16,
    /// The scratch directory, owned by PgBouncer's user: `pgbouncer.ini`, `users.txt`,
    /// `pgbouncer.log`.
    dir: PathBuf,
    process: Option<Watched>,
}

impl PgBouncer {
    /// PgBouncer in front of `server` in `mode`, with `ignore_startup_parameters = options`:
    /// PgBouncer refuses the `options` startup parameter, which the store sends
    /// (`idle_in_transaction_session_timeout`), unless told to ignore it (docs/postgres.md).
    pub fn start(server: &PostgresServer, mode: PoolMode) -> Self {
        Self::start_with(server, mode, &[("ignore_startup_parameters", "options")])
    }

    /// PgBouncer in front of `server` in `mode`, with `settings` (name, value as
    /// `pgbouncer.ini` spells them) after the tests' own, so that they override them; no
    /// setting keeps PgBouncer's defaults. Waits until it listens.
    pub fn start_with(server: &PostgresServer, mode: PoolMode, settings: &[(&str, &str)]) -> Self {
        let dir = scratch_dir("pgbouncer");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .expect("make the pgbouncer scratch dir private");
        if let Some(user) = server_user() {
            std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.gid))
                .expect("give the pgbouncer scratch dir to the postgres user");
        }
        // `trust` still wants the user in the list; any password will do.
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").expect("write users.txt");
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            if port == DEFAULT_PORT {
                continue;
            }
            write_config(&dir, server.port(), port, mode, settings);
            let mut command = watcher_command(as_server_user("sh"), "pgbouncer-watcher");
            command
                .arg(binary())
                .arg(dir.join("pgbouncer.ini"))
                .current_dir(&dir);
            let what = format!("pgbouncer on port {port}");
            let started = Launching::spawn(command, &what)
                .and_then(|launching| launching.wait_ready(READY, START_TIMEOUT));
            match started {
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
        panic!("could not start pgbouncer on a free port after 5 tries: {last_error}");
    }

    /// The port PgBouncer listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`: the server's `postgres` database
    /// through PgBouncer.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// What PgBouncer has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(process) = self.process.take() {
            // Never a panic here (a test may be unwinding); one that does not exit is killed.
            let _ = process.shut_down("TERM", START_TIMEOUT);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes `dir/pgbouncer.ini`: every database of the server on `server_port`, served on
/// `127.0.0.1:port` alone (no Unix socket), trust authentication for the users of
/// `users.txt`, `mode`, its log in `dir`; then `settings`.
fn write_config(
    dir: &std::path::Path,
    server_port: u16,
    port: u16,
    mode: PoolMode,
    settings: &[(&str, &str)],
) {
    let dir_name = dir.display();
    let mut ini = format!(
        "; tests/support/pgbouncer.rs\n\
         [databases]\n\
         * = host=127.0.0.1 port={server_port}\n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {port}\n\
         unix_socket_dir =\n\
         auth_type = trust\n\
         auth_file = {dir_name}/users.txt\n\
         pool_mode = {mode}\n\
         logfile = {dir_name}/pgbouncer.log\n\
         pidfile =\n\
         max_client_conn = 200\n\
         default_pool_size = 20\n",
        mode = mode.setting(),
    );
    for (name, value) in settings {
        ini.push_str(&format!("{name} = {value}\n"));
    }
    std::fs::write(dir.join("pgbouncer.ini"), ini).expect("write pgbouncer.ini");
}

/// The `pgbouncer` on PATH, else Debian's `/usr/sbin/pgbouncer` (not on a user's PATH).
/// Panics with the install hint.
fn binary() -> &'static PathBuf {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND.get_or_init(|| {
        std::env::var_os("PATH")
            .and_then(|path| find_on_path("pgbouncer", &path))
            .or_else(|| Some(PathBuf::from("/usr/sbin/pgbouncer")).filter(|found| found.is_file()))
            .unwrap_or_else(|| panic!("{INSTALL_HINT}"))
    })
}
