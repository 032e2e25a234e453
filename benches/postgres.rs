//! distlock on PostgreSQL beside the raw floor (the statements distlock sends, sent by hand)
//! and plain `pg_advisory_lock`, in one run, on a server started for the purpose (issue 38,
//! item 8). Its sibling for Redis is `locks.rs`, whose conventions it keeps; what they share
//! (with `etcd.rs`) is `benches/support/`'s.
//!
//!     cargo bench --bench postgres --features postgres      # 5 alternating rounds, pinned
//!     BENCH_RUNS=9 cargo bench --bench postgres --features postgres
//!     BENCH_LIBS=raw,distlock BENCH_WORKLOADS=W1,W3 cargo bench --bench postgres --features postgres
//!     BENCH_RUNS=1 BENCH_SCALE=0.1 cargo bench --bench postgres --features postgres   # a smoke run
//!     BENCH_PIN=0 cargo bench --bench postgres --features postgres                   # no pinning
//!
//! Pinning, as in `locks.rs`: unless `BENCH_PIN=0` (or the machine has one CPU), the bench
//! sets `DISTLOCK_SERVER_CPUS=0` (unless set; `tests/support/postgres.rs` starts `postgres`
//! under `taskset -c` with it, and every backend inherits it) and pins itself with `taskset -p
//! -c` to `BENCH_CLIENT_CPUS` (default `1`) before any thread starts; its threads inherit that.
//!
//! The shape a user runs: [`run`] is a `#[tokio::main]` function, so the runtime is the one a
//! plain `#[tokio::main]` service gets — on the one client CPU a multi-thread runtime with one
//! worker, the workloads' loops on the calling thread — `cycle.rs`' shape for Redis. W1 here is
//! that measurement; no separate binary is needed.
//!
//! Rounds (`BENCH_RUNS`, default 5): each round runs every selected workload with every
//! selected library, the libraries' order rotated by one each round. Reported: the median over
//! the rounds of every metric (ratio to raw's median in brackets), and each workload's main
//! figures round by round divided by raw's and by advisory's of the same round, with the
//! median of those ratios (a ratio within one round cancels what drifts between rounds).
//!
//! Libraries (`BENCH_LIBS`, default all three), each in a database of its own on the one
//! server (`bench_distlock`, `bench_raw`, `bench_advisory`), so that the server's counters of a
//! database are one library's:
//! - `distlock`: `Config::postgres(url)` with its defaults (fencing tokens from the sequence,
//!   the watchdog, wake-ups by `NOTIFY`). Its cycle takes 4 round trips by design (not counted
//!   here: the client does not expose them): acquire = `BEGIN; SET LOCAL lock_timeout`, the
//!   key's turn (`pg_advisory_xact_lock(hashtext(schema), hashtext(key))`) and the read of its
//!   row, pipelined; then the write statement and `COMMIT`, pipelined; release the same
//!   (`lock-runtime/src/store/postgres/transaction.rs`).
//! - `raw`: the floor — those statements (their text copied from
//!   `lock-runtime/src/store/postgres/statements.rs`, see [`sql`]) sent by hand with
//!   tokio-postgres on 4 connections (distlock's pool size), each transaction on one, the
//!   row's new state computed by hand (the writer set; cleared, the row deleted and the release
//!   announced). On W3 a try that finds the key held commits and tries again 1 ms later, as
//!   `locks.rs`' raw floor polls.
//! - `advisory`: `SELECT pg_advisory_lock($1)` / `SELECT pg_advisory_unlock($1)` on a
//!   connection per task, the key an FNV-1a hash of its name (what madelson's DistributedLock
//!   does): no lease, no token; a waiter blocks in the server. 2 round trips per cycle.
//!
//! Workloads (`BENCH_WORKLOADS`, default all; `BENCH_SCALE`, default 1, scales W1–W3's counts):
//! - W1: one task, 2,000 acquire+release cycles on fresh keys: cycles/s, cycle p50/p99.
//! - W2: 64 tasks sharing one client, 200 cycles each on their own keys: cycles/s.
//! - W3: 8 workers on one key, 1,000 grants, 1 ms outside the lock after each release:
//!   grants/s, handoff latency (a release to the next grant by another worker) p50/p99, the
//!   grants that came within 5 ms of the previous release (`grants_within_5ms`, and its share:
//!   distlock's waiters are woken by `NOTIFY`; its backoff's steps are random up to 5, 10, 20 …
//!   200 ms, so past a waiter's first retries a backoff lands within 5 ms of a release only by
//!   chance), overlaps seen (two holders at once: must be 0).
//! - W4 (distlock only): 1,000 locks held 10 s with a 2 s lease, renewed by the watchdog
//!   (every third of the lease): the renewal statements (`statements::renew`'s calls in
//!   `pg_stat_statements`) per round (a round renews every lock once: rounds = leases renewed /
//!   1,000; target 1), locks lost (must be 0).
//!
//! Costs per cycle (per grant on W3), from readings before and after each measurement:
//! - `round_trips`: raw and advisory count them as they send (a pipelined batch is one).
//! - `server_statements`: `pg_stat_statements`' calls in the library's database (top-level
//!   statements, utility ones included: `BEGIN`, `SET`, `COMMIT` count one each). The bench's
//!   own readings run in the `postgres` database, so none of them is counted.
//! - `transactions`: `xact_commit + xact_rollback` of the library's database in
//!   `pg_stat_database`. A backend reports those at most once a second, and the rest up to
//!   10 s after it goes idle (PostgreSQL 15's `PGSTAT_IDLE_INTERVAL`), so a measurement's
//!   closing reading is taken [`SETTLE`] after it ended, nothing having run in its database
//!   since: the other libraries run meanwhile, in theirs. Not for advisory, whose transactions
//!   the server does not report while its sessions last ([`reports_transactions`]): 2 per
//!   cycle by construction.
//! - `client_cpu_us`: this process's CPU time, all threads; `server_cpu_us`: every server
//!   process's (user + system from `/proc`, ended backends included through the postmaster's
//!   `cutime`), in clock ticks (10 ms).
//!
//! Output: a header (date, commit, CPUs, CPU model, PostgreSQL version, pinning, rounds, and
//! whether the raw floor sent only statements distlock sent too, by `pg_stat_statements`'
//! texts after the warm-up: a check that [`sql`] still matches `statements.rs`), a
//! line per measurement on stderr (and one with its database counters once read), each
//! database's costliest statements, the medians, the per-round ratios, the targets; the
//! header and a line per (workload, library) appended to `target/bench.jsonl` (deployment
//! `postgres`).

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
use bench_support::rounds::{self, median, pct, scaled, Measured};
use futures_util::future::{join, join3, join_all};
use serde_json::{json, Value};
use support::postgres::PostgresServer;
use tokio_postgres::{Client, NoTls, Statement};

/// The lease of W1–W3's locks.
const LEASE: Duration = Duration::from_secs(10);

/// distlock's schema (the default), also the raw floor's.
const SCHEMA: &str = "distlock";

/// How long after a measurement its database's transactions are read (see the module doc).
const SETTLE: Duration = Duration::from_secs(12);

/// Connections of the raw floor, as many as distlock's pool (`connections.rs`, `POOL_SIZE`).
const RAW_CONNECTIONS: usize = 4;

/// W2's tasks: also the advisory library's connections (one per task).
const W2_TASKS: usize = 64;

/// W3's workers.
const W3_WORKERS: usize = 8;

/// The statements distlock's PostgreSQL store sends, copied from
/// `lock-runtime/src/store/postgres/statements.rs` (`pub(crate)` there) with the schema
/// `distlock` written in: keep them in step with that file. `BEGIN` is `transaction.rs`'
/// (its `lock_timeout` is what is left of the operation's budget, at most the response timeout
/// of 1 s: here always 1 s).
mod sql {
    /// `transaction.rs`' first statements of an operation (at the default response timeout
    /// of 1 s, the server gives up the turn 20 ms before the client would).
    pub const BEGIN: &str = "BEGIN; SET LOCAL lock_timeout = '980ms'";

    /// `statements::turns`.
    pub const TURNS: &str = "SELECT count(pg_advisory_xact_lock(hashtext('distlock'), h)) \
         FROM (SELECT DISTINCT hashtext(n) AS h FROM unnest($1::text[]) AS n ORDER BY 1) AS keys";

    /// `statements::read`.
    pub const READ: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, \
                (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM distlock.tokens), \
                l.name, l.version, l.state \
         FROM (SELECT 1) AS one LEFT JOIN distlock.locks l ON l.name = ANY($1::text[])";

    /// `statements::write`, on the channel `distlock` (the schema's name).
    pub const WRITE: &str = "WITH input AS ( \
             SELECT * FROM unnest($1::text[], $2::int8[], $3::jsonb[], $4::int8[]) \
                 AS i(name, version, state, expires) \
         ), locked AS ( \
             SELECT l.name FROM distlock.locks l WHERE l.name = ANY($1::text[]) \
             ORDER BY l.name FOR UPDATE \
         ), updated AS ( \
             UPDATE distlock.locks l SET version = nextval('distlock.tokens'), state = i.state, \
                 expires_at = to_timestamp(i.expires / 1000000.0) \
             FROM input i JOIN locked k ON k.name = i.name \
             WHERE l.name = i.name AND i.version <> 0 AND i.state IS NOT NULL \
                 AND l.version = i.version \
             RETURNING 1 \
         ), deleted AS ( \
             DELETE FROM distlock.locks l USING input i JOIN locked k ON k.name = i.name \
             WHERE l.name = i.name AND i.version <> 0 AND i.state IS NULL \
                 AND l.version = i.version \
             RETURNING 1 \
         ), inserted AS ( \
             INSERT INTO distlock.locks (name, version, state, expires_at) \
             SELECT i.name, nextval('distlock.tokens'), i.state, \
                 to_timestamp(i.expires / 1000000.0) \
             FROM input i WHERE i.version = 0 AND i.state IS NOT NULL \
             ON CONFLICT (name) DO NOTHING \
             RETURNING 1 \
         ), written AS ( \
             SELECT distlock.written_all( \
                 (SELECT count(*) FROM updated) + (SELECT count(*) FROM deleted) \
                     + (SELECT count(*) FROM inserted), \
                 cardinality($1::text[])) AS n \
         ), notified AS ( \
             SELECT count(pg_notify('distlock', note)) AS n \
             FROM written, unnest($5::text[]) AS note \
         ) \
         SELECT notified.n, ARRAY( \
             SELECT t FROM (SELECT nextval('distlock.tokens') AS t \
                 FROM written, generate_series(1, $6::int)) AS taken ORDER BY t) \
         FROM notified";
}

/// A connection of one of the bench's libraries, its task spawned on the current runtime.
async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|err| panic!("connect to {url}: {err}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// The raw floor: distlock's statements by hand on [`RAW_CONNECTIONS`] connections, each lent
/// to one transaction at a time.
struct Raw {
    idle: Mutex<Vec<RawConnection>>,
    available: tokio::sync::Semaphore,
    round_trips: AtomicU64,
}

struct RawConnection {
    client: Client,
    turns: Statement,
    read: Statement,
    write: Statement,
}

/// A connection lent to one transaction; back in the pool when dropped.
struct Lent<'a> {
    raw: &'a Raw,
    connection: Option<RawConnection>,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl std::ops::Deref for Lent<'_> {
    type Target = RawConnection;
    fn deref(&self) -> &RawConnection {
        self.connection.as_ref().expect("lent")
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            self.raw.idle.lock().expect("raw pool").push(connection);
        }
    }
}

/// A key's row as an operation's first round trip read it.
struct RawRow {
    /// The database's clock, microseconds since the epoch.
    now_us: i64,
    /// 0: no row.
    version: i64,
    state: Option<Value>,
}

impl RawRow {
    /// The writer and the end of its lease, if the row has one.
    fn writer(&self) -> Option<(&str, i64)> {
        let writer = self.state.as_ref()?.get("w")?;
        Some((writer.get(0)?.as_str()?, writer.get(1)?.as_i64()?))
    }
}

impl Raw {
    /// Connects, makes the schema (distlock's DDL) and prepares the statements.
    async fn connect(url: &str) -> Self {
        let setup = connect(url).await;
        setup
            .batch_execute(&distlock::postgres_schema_sql(SCHEMA))
            .await
            .expect("raw: make the schema");
        let connections = join_all((0..RAW_CONNECTIONS).map(|_| async {
            let client = connect(url).await;
            let (turns, read, write) = join3(
                client.prepare(sql::TURNS),
                client.prepare(sql::READ),
                client.prepare(sql::WRITE),
            )
            .await;
            RawConnection {
                turns: turns.expect("prepare the turns"),
                read: read.expect("prepare the read"),
                write: write.expect("prepare the write"),
                client,
            }
        }))
        .await;
        Raw {
            idle: Mutex::new(connections),
            available: tokio::sync::Semaphore::new(RAW_CONNECTIONS),
            round_trips: AtomicU64::new(0),
        }
    }

    async fn lend(&self) -> Lent<'_> {
        let permit = self.available.acquire().await.expect("raw pool open");
        let connection = self.idle.lock().expect("raw pool").pop();
        Lent {
            raw: self,
            connection,
            _permit: permit,
        }
    }

    /// An operation's first round trip: `BEGIN; SET LOCAL lock_timeout`, the key's turn, the
    /// read of its row, pipelined.
    async fn begin(&self, connection: &RawConnection, name: &str) -> RawRow {
        let names = [name];
        let (begun, turn, rows) = join3(
            connection.client.batch_execute(sql::BEGIN),
            connection.client.query(&connection.turns, &[&&names[..]]),
            connection.client.query(&connection.read, &[&&names[..]]),
        )
        .await;
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        begun.expect("raw BEGIN");
        turn.expect("raw turn");
        let rows = rows.expect("raw read");
        let row = rows.first().expect("the read answers a row");
        RawRow {
            now_us: row.get(0),
            version: row.get::<_, Option<i64>>(3).unwrap_or(0),
            state: row.get(4),
        }
    }

    /// An operation's second round trip: the write statement and `COMMIT`, pipelined, with
    /// the row's new state made by hand as distlock's twin would (`rows.rs`' layout): the
    /// tokens taken.
    async fn write(
        &self,
        connection: &RawConnection,
        name: &str,
        version: i64,
        change: Change<'_>,
    ) -> Vec<i64> {
        let (state, expires, notes, tokens) = match change {
            // A grant: the writer and its lease's end; the row may be swept after it; one
            // fencing token; nothing to announce.
            Change::Grant { owner, until } => (
                Some(json!({ "w": [owner, until] })),
                Some(until),
                Vec::new(),
                1i32,
            ),
            // A release: the row deleted, and a holder's leaving announced on the key's
            // channel (`<payload> <channel>`, the payload empty).
            Change::Release => (None, None, vec![format!(" {name}:released")], 0),
        };
        let (names, versions, states, expires) = ([name], [version], [state], [expires]);
        let (rows, committed) = join(
            connection.client.query(
                &connection.write,
                &[
                    &&names[..],
                    &&versions[..],
                    &&states[..],
                    &&expires[..],
                    &notes,
                    &tokens,
                ],
            ),
            connection.client.batch_execute("COMMIT"),
        )
        .await;
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let rows = rows.expect("raw write");
        committed.expect("raw COMMIT");
        rows.first().map(|row| row.get(1)).unwrap_or_default()
    }

    /// One try: the fencing token if granted; `None` (committed, nothing written) if held.
    async fn try_acquire(&self, name: &str, owner: &str, lease: Duration) -> Option<i64> {
        let connection = self.lend().await;
        let row = self.begin(&connection, name).await;
        if row.writer().is_some_and(|(_, until)| until > row.now_us) {
            connection
                .client
                .batch_execute("COMMIT")
                .await
                .expect("raw COMMIT");
            self.round_trips.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let until = row.now_us + i64::try_from(lease.as_micros()).expect("a lease in µs");
        let tokens = self
            .write(
                &connection,
                name,
                row.version,
                Change::Grant { owner, until },
            )
            .await;
        tokens.first().copied()
    }

    /// Gives the lock back.
    async fn release(&self, name: &str, owner: &str) {
        let connection = self.lend().await;
        let row = self.begin(&connection, name).await;
        assert_eq!(
            row.writer().map(|(writer, _)| writer),
            Some(owner),
            "raw: {name} was not its owner's at release"
        );
        self.write(&connection, name, row.version, Change::Release)
            .await;
    }
}

/// What a raw operation writes.
enum Change<'a> {
    /// The writer set: `owner` until `until` (µs on the database's clock).
    Grant { owner: &'a str, until: i64 },
    /// The writer cleared, the row deleted.
    Release,
}

/// Plain advisory locks: a connection per task.
struct Advisory {
    connections: Vec<AdvisoryConnection>,
    round_trips: AtomicU64,
}

struct AdvisoryConnection {
    client: Client,
    lock: Statement,
    unlock: Statement,
}

impl Advisory {
    async fn connect(url: &str) -> Self {
        let connections = join_all((0..W2_TASKS).map(|_| async {
            let client = connect(url).await;
            let (lock, unlock) = join(
                client.prepare("SELECT pg_advisory_lock($1)"),
                client.prepare("SELECT pg_advisory_unlock($1)"),
            )
            .await;
            AdvisoryConnection {
                lock: lock.expect("prepare the lock"),
                unlock: unlock.expect("prepare the unlock"),
                client,
            }
        }))
        .await;
        Advisory {
            connections,
            round_trips: AtomicU64::new(0),
        }
    }
}

/// The 64-bit FNV-1a hash of a key's name: the advisory lock's key.
fn advisory_key(name: &str) -> i64 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    hash as i64
}

/// A library under test.
#[derive(Clone)]
enum Lib {
    Distlock(distlock::Client),
    Raw(Arc<Raw>),
    Advisory(Arc<Advisory>),
}

enum Held {
    Distlock(distlock::LockGuard),
    Raw { name: String, owner: String },
    Advisory { key: i64, slot: usize },
}

impl Lib {
    const NAMES: [&'static str; 3] = ["raw", "distlock", "advisory"];

    fn name(&self) -> &'static str {
        match self {
            Lib::Distlock(_) => "distlock",
            Lib::Raw(_) => "raw",
            Lib::Advisory(_) => "advisory",
        }
    }

    /// Round trips sent so far, where the library counts them.
    fn round_trips(&self) -> Option<u64> {
        match self {
            Lib::Distlock(_) => None,
            Lib::Raw(raw) => Some(raw.round_trips.load(Ordering::Relaxed)),
            Lib::Advisory(advisory) => Some(advisory.round_trips.load(Ordering::Relaxed)),
        }
    }

    /// Takes `key`'s lock, waiting as long as it takes; `slot` is the task's number (the
    /// advisory library's connection).
    async fn acquire(&self, key: &str, slot: usize) -> Held {
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
                // `LockKey::new`'s lock key, with the default prefix.
                let name = format!("distlock:{{{key}}}");
                let owner = uuid::Uuid::new_v4().simple().to_string();
                while raw.try_acquire(&name, &owner, LEASE).await.is_none() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Held::Raw { name, owner }
            }
            Lib::Advisory(advisory) => {
                let connection = &advisory.connections[slot];
                let key = advisory_key(key);
                connection
                    .client
                    .execute(&connection.lock, &[&key])
                    .await
                    .expect("pg_advisory_lock");
                advisory.round_trips.fetch_add(1, Ordering::Relaxed);
                Held::Advisory { key, slot }
            }
        }
    }

    async fn release(&self, held: Held) {
        match (self, held) {
            (Lib::Distlock(_), Held::Distlock(guard)) => {
                assert!(guard.release().await.expect("distlock release"));
            }
            (Lib::Raw(raw), Held::Raw { name, owner }) => raw.release(&name, &owner).await,
            (Lib::Advisory(advisory), Held::Advisory { key, slot }) => {
                let connection = &advisory.connections[slot];
                let row = connection
                    .client
                    .query_one(&connection.unlock, &[&key])
                    .await
                    .expect("pg_advisory_unlock");
                advisory.round_trips.fetch_add(1, Ordering::Relaxed);
                assert!(
                    row.get::<_, bool>(0),
                    "pg_advisory_unlock of a lock not held"
                );
            }
            _ => unreachable!("a lock of another library"),
        }
    }
}

/// The database a library's locks live in.
fn database_of(lib: &str) -> String {
    format!("bench_{lib}")
}

/// A server's database counters, read from the `postgres` database.
#[derive(Clone, Copy)]
struct DbCounters {
    /// `pg_stat_statements`' calls in the database.
    statements: i64,
    /// `pg_stat_database`'s `xact_commit + xact_rollback`.
    transactions: i64,
    /// `pg_stat_statements_info.dealloc`: entries evicted (server-wide) would make the
    /// statements short.
    evictions: i64,
}

/// The renewal statement's figures in a database, and every statement's.
struct RenewalCounters {
    calls: i64,
    rows: i64,
    statements: i64,
}

/// The bench's own connection for the server's counters, to the `postgres` database.
struct Probe {
    client: Client,
    server: PostgresServer,
    /// Clock ticks per second (`getconf CLK_TCK`).
    ticks: f64,
}

impl Probe {
    async fn counters(&self, database: &str) -> DbCounters {
        let row = self
            .client
            .query_one(
                "SELECT (SELECT coalesce(sum(s.calls), 0)::int8 FROM pg_stat_statements s \
                     JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1), \
                 (SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database \
                     WHERE datname = $1), \
                 (SELECT dealloc FROM pg_stat_statements_info)",
                &[&database],
            )
            .await
            .expect("read the server's counters");
        DbCounters {
            statements: row.get(0),
            transactions: row.get(1),
            evictions: row.get(2),
        }
    }

    async fn renewals(&self, database: &str) -> RenewalCounters {
        let row = self
            .client
            .query_one(
                "SELECT coalesce(sum(s.calls) FILTER (WHERE s.query LIKE '%renewed AS%'), 0)::int8, \
                     coalesce(sum(s.rows) FILTER (WHERE s.query LIKE '%renewed AS%'), 0)::int8, \
                     coalesce(sum(s.calls), 0)::int8 \
                 FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
                 WHERE d.datname = $1",
                &[&database],
            )
            .await
            .expect("read the renewals");
        RenewalCounters {
            calls: row.get(0),
            rows: row.get(1),
            statements: row.get(2),
        }
    }

    /// The statements `floor` (a database) ran that `library` (another) did not, by
    /// `pg_stat_statements`' texts (the same text normalizes the same way), its schema's DDL
    /// aside: empty when the raw floor sends distlock's statements.
    async fn statements_missing(&self, floor: &str, library: &str) -> Vec<String> {
        let rows = self
            .client
            .query(
                "SELECT s.query FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
                     WHERE d.datname = $1 AND s.query NOT LIKE 'CREATE %' \
                 EXCEPT \
                 SELECT s.query FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
                     WHERE d.datname = $2",
                &[&floor, &library],
            )
            .await
            .expect("compare the statements");
        rows.iter().map(|row| row.get(0)).collect()
    }

    /// The statements that took the server's time in `database`, the most first: calls, time
    /// per call, the statement's start (on stderr, as `locks.rs` prints Redis' per-command
    /// times).
    async fn print_statements(&self, database: &str) {
        let rows = self
            .client
            .query(
                "SELECT s.calls, s.total_exec_time, s.mean_exec_time, \
                     left(regexp_replace(s.query, '\\s+', ' ', 'g'), 90) \
                 FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
                 WHERE d.datname = $1 ORDER BY s.total_exec_time DESC LIMIT 8",
                &[&database],
            )
            .await
            .expect("read the statements' times");
        eprintln!("\n{database}: server time per statement (pg_stat_statements, whole run):");
        for row in rows {
            let (calls, total, mean, query): (i64, f64, f64, String) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            eprintln!(
                "  {calls:>8} calls {total:>10.1} ms {:>8.1} µs/call  {query}",
                mean * 1e3
            );
        }
    }

    /// The server's CPU time so far: user + system of each of its processes, and of the
    /// postmaster's ended children (`cutime`, `cstime`).
    fn server_cpu(&self) -> Duration {
        let processes = self.server.processes();
        let mut ticks = 0u64;
        for (i, pid) in processes.iter().enumerate() {
            let Some(cpu) = ProcessCpu::of(*pid) else {
                continue;
            };
            ticks += cpu.own + if i == 0 { cpu.children } else { 0 };
        }
        Duration::from_secs_f64(ticks as f64 / self.ticks)
    }
}

/// One row of figures.
type Row = BTreeMap<String, f64>;

/// (workload, library).
type Key = (&'static str, &'static str);

impl Measured for Key {
    fn deployment(&self) -> &str {
        "postgres"
    }

    fn workload(&self) -> &str {
        self.0
    }

    fn library(&self) -> &str {
        self.1
    }

    fn with_library(&self, library: &'static str) -> Self {
        (self.0, library)
    }

    fn label(&self) -> String {
        format!("{} {:<9}", self.0, self.1)
    }
}

/// One row per round, in round order.
type Results = rounds::Results<Key, String>;

/// A stretch of a workload under measurement: its wall time, this process's and the server's
/// CPU time, the round trips the library counted. The server is read outside the clock.
struct Window {
    server_cpu: Duration,
    client_cpu: Duration,
    round_trips: Option<u64>,
    started: Instant,
}

impl Window {
    fn open(probe: &Probe, lib: Option<&Lib>) -> Self {
        let server_cpu = probe.server_cpu();
        Self {
            server_cpu,
            client_cpu: process_cpu(),
            round_trips: lib.and_then(Lib::round_trips),
            started: Instant::now(),
        }
    }

    /// The figures per `units` (cycles or grants, named by `unit`).
    fn close(self, probe: &Probe, lib: Option<&Lib>, units: f64, unit: &str) -> Row {
        let elapsed = self.started.elapsed();
        let client_cpu = process_cpu() - self.client_cpu;
        let round_trips = lib.and_then(Lib::round_trips);
        let server_cpu = probe.server_cpu().saturating_sub(self.server_cpu);
        let mut row = Row::from([
            (
                format!("{unit}s_per_s"),
                units / elapsed.as_secs_f64().max(1e-9),
            ),
            (
                format!("client_cpu_us_per_{unit}"),
                client_cpu.as_secs_f64() * 1e6 / units,
            ),
            (
                format!("server_cpu_us_per_{unit}"),
                server_cpu.as_secs_f64() * 1e6 / units,
            ),
        ]);
        if let (Some(before), Some(after)) = (self.round_trips, round_trips) {
            row.insert(
                format!("round_trips_per_{unit}"),
                (after - before) as f64 / units,
            );
        }
        row
    }
}

async fn w1(lib: &Lib, probe: &Probe, cycles: usize) -> Row {
    let tag = format!("{}:{}", lib.name(), fastrand::u64(..));
    let mut samples = Vec::with_capacity(cycles);
    let window = Window::open(probe, Some(lib));
    for i in 0..cycles {
        let key = format!("w1:{tag}:{i}");
        let started = Instant::now();
        let held = lib.acquire(&key, 0).await;
        lib.release(held).await;
        samples.push(started.elapsed());
    }
    let mut row = window.close(probe, Some(lib), cycles as f64, "cycle");
    row.insert("p50_ms".into(), pct(&mut samples, 0.5));
    row.insert("p99_ms".into(), pct(&mut samples, 0.99));
    row
}

async fn w2(lib: &Lib, probe: &Probe, cycles: usize) -> Row {
    let tag = format!("{}:{}", lib.name(), fastrand::u64(..));
    let window = Window::open(probe, Some(lib));
    let tasks: Vec<_> = (0..W2_TASKS)
        .map(|task| {
            let (lib, tag) = (lib.clone(), tag.clone());
            tokio::spawn(async move {
                for i in 0..cycles {
                    let held = lib.acquire(&format!("w2:{tag}:{task}:{i}"), task).await;
                    lib.release(held).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("W2 task");
    }
    window.close(probe, Some(lib), (W2_TASKS * cycles) as f64, "cycle")
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

async fn w3(lib: &Lib, probe: &Probe, grants: u64) -> Row {
    let key = format!("w3:{}:{}", lib.name(), fastrand::u64(..));
    let granted = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicU64::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let shared = Arc::new(Mutex::new(Handoffs::default()));
    let window = Window::open(probe, Some(lib));
    let workers: Vec<_> = (0..W3_WORKERS)
        .map(|worker| {
            let (lib, key, shared) = (lib.clone(), key.clone(), shared.clone());
            let (granted, inside, overlaps) = (granted.clone(), inside.clone(), overlaps.clone());
            tokio::spawn(async move {
                loop {
                    let held = lib.acquire(&key, worker).await;
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
    let mut row = window.close(probe, Some(lib), grants as f64, "grant");
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

/// W4: 1,000 locks held 10 s with a 2 s lease, renewed by `client`'s watchdog.
async fn w4(client: &distlock::Client, probe: &Probe, database: &str) -> Row {
    const LOCKS: usize = 1000;
    let lease = Duration::from_secs(2);
    let hold = Duration::from_secs(10);
    let run = fastrand::u64(..);
    let mut guards = Vec::with_capacity(LOCKS);
    for i in 0..LOCKS {
        guards.push(
            client
                .lock(format!("w4:{run}:{i}"))
                .lease(lease)
                .acquire()
                .await
                .expect("W4 acquire"),
        );
    }
    let before = probe.renewals(database).await;
    let window = Window::open(probe, None);
    tokio::time::sleep(hold).await;
    let costs = window.close(probe, None, 1.0, "hold");
    let after = probe.renewals(database).await;
    let lost = guards.iter().filter(|guard| !guard.is_held()).count();
    for guard in guards {
        guard.release().await.expect("W4 release");
    }
    let statements = (after.calls - before.calls) as f64;
    let renewed = (after.rows - before.rows) as f64;
    let rounds = renewed / LOCKS as f64;
    Row::from([
        ("locks_lost".into(), lost as f64),
        ("renewal_statements".into(), statements),
        ("leases_renewed".into(), renewed),
        ("renewal_rounds".into(), rounds),
        (
            "renewal_statements_per_round".into(),
            if rounds > 0.0 {
                statements / rounds
            } else {
                0.0
            },
        ),
        (
            "server_statements".into(),
            (after.statements - before.statements) as f64,
        ),
        ("server_cpu_us".into(), costs["server_cpu_us_per_hold"]),
        ("client_cpu_us".into(), costs["client_cpu_us_per_hold"]),
    ])
}

/// A library's database: when it last saw work, and the measurement whose transactions are
/// still to be read there.
struct Database {
    name: String,
    quiet_from: Instant,
    pending: Option<Pending>,
}

/// A measurement whose database counters are read once its backends have reported.
struct Pending {
    key: Key,
    index: usize,
    open: DbCounters,
    units: f64,
    unit: &'static str,
    /// Whether the server reports the library's transactions (see [`reports_transactions`]).
    transactions: bool,
}

/// Whether `pg_stat_database` shows a library's transactions while its sessions last. On
/// PostgreSQL 15 a backend hands its transaction counts over only with other pending
/// statistics (`pgstat_report_stat` returns early when no table, function or WAL statistics
/// are pending) or when it ends; an advisory lock touches no table, so the advisory library's
/// transactions (by construction one per statement: 2 per cycle) do not show.
fn reports_transactions(lib: &str) -> bool {
    lib != "advisory"
}

impl Database {
    /// Waits until the database has been quiet for [`SETTLE`], reads its counters, completes
    /// the pending measurement with them, and returns them (the next measurement's opening
    /// reading: nothing runs there in between).
    async fn settle(&mut self, probe: &Probe, results: &mut Results) -> DbCounters {
        tokio::time::sleep_until((self.quiet_from + SETTLE).into()).await;
        let now = probe.counters(&self.name).await;
        if let Some(pending) = self.pending.take() {
            let unit = pending.unit;
            let statements = (now.statements - pending.open.statements) as f64 / pending.units;
            let transactions =
                (now.transactions - pending.open.transactions) as f64 / pending.units;
            let row = &mut results.get_mut(&pending.key).expect("a measured key")[pending.index];
            row.insert(format!("server_statements_per_{unit}"), statements);
            if pending.transactions {
                row.insert(format!("transactions_per_{unit}"), transactions);
            }
            if now.evictions != pending.open.evictions {
                eprintln!(
                    "warning: pg_stat_statements evicted entries during {} {}: its statements \
                     per {unit} are short (raise pg_stat_statements.max)",
                    pending.key.0, pending.key.1
                );
                row.insert("statements_evicted".into(), 1.0);
            }
            eprintln!(
                "round {} {} {:<9} statements/{unit} {statements:.2}  transactions/{unit} \
                 {transactions:.2}",
                pending.index, pending.key.0, pending.key.1
            );
        }
        now
    }
}

const WORKLOADS: [&str; 4] = ["W1", "W2", "W3", "W4"];

fn main() {
    // First, while this process has one thread.
    let pinning = pinning::pin("server");
    run(pinning);
}

/// The bench, on the runtime a plain `#[tokio::main]` service gets.
#[tokio::main]
async fn run(pinning: String) {
    let runs = rounds::runs();
    let scale = rounds::scale();
    let server = PostgresServer::start_with(&[
        ("shared_preload_libraries", "'pg_stat_statements'"),
        // Each distinct `SET LOCAL lock_timeout` text is an entry of its own.
        ("pg_stat_statements.max", "10000"),
        ("pg_stat_statements.track", "top"),
        ("pg_stat_statements.track_utility", "on"),
    ]);
    let port = server.port();
    let url_of = |database: &str| format!("postgres://postgres@127.0.0.1:{port}/{database}");
    let probe_client = connect(&url_of("postgres")).await;
    probe_client
        .batch_execute("CREATE EXTENSION pg_stat_statements")
        .await
        .expect("CREATE EXTENSION pg_stat_statements");
    let names: Vec<&'static str> = Lib::NAMES
        .into_iter()
        .filter(|name| rounds::selected("BENCH_LIBS", name, true))
        .collect();
    for name in &names {
        probe_client
            .batch_execute(&format!("CREATE DATABASE {}", database_of(name)))
            .await
            .expect("CREATE DATABASE");
    }
    let version: String = probe_client
        .query_one("SHOW server_version", &[])
        .await
        .expect("the server's version")
        .get(0);
    let ticks = clock_ticks();
    let probe = Probe {
        client: probe_client,
        server,
        ticks,
    };

    let header = Header::new(Some("postgres"))
        .text("date", header::date())
        .text("commit", header::commit())
        .text("nproc", pinning::online_cpus().to_string())
        .text("cpu", header::cpu_model())
        .text("postgres", version)
        .text("pinning", pinning)
        .text("rounds", runs.to_string())
        .text("scale", scale.to_string());
    header.print();

    let mut libs = Vec::new();
    for name in &names {
        let url = url_of(&database_of(name));
        libs.push(match *name {
            "distlock" => Lib::Distlock(
                distlock::Client::new(distlock::Config::postgres(&url).expect("url"))
                    .expect("distlock client"),
            ),
            "raw" => Lib::Raw(Arc::new(Raw::connect(&url).await)),
            _ => Lib::Advisory(Arc::new(Advisory::connect(&url).await)),
        });
    }
    let mut databases: BTreeMap<&'static str, Database> = BTreeMap::new();
    for lib in &libs {
        // Warm up: the schema, a full pool (W3's workers at once), prepared statements.
        join_all((0..W3_WORKERS).map(|slot| async move {
            let held = lib.acquire(&format!("warm-up:{slot}"), slot).await;
            lib.release(held).await;
        }))
        .await;
        databases.insert(
            lib.name(),
            Database {
                name: database_of(lib.name()),
                quiet_from: Instant::now(),
                pending: None,
            },
        );
    }

    if names.contains(&"raw") && names.contains(&"distlock") {
        let missing = probe
            .statements_missing(&database_of("raw"), &database_of("distlock"))
            .await;
        if missing.is_empty() {
            println!("raw floor    sends distlock's statements (pg_stat_statements' texts)");
        } else {
            println!(
                "raw floor    sends statements distlock did not: update the `sql` module of \
                 benches/postgres.rs from lock-runtime/src/store/postgres/statements.rs"
            );
            for query in missing {
                println!("             {query}");
            }
        }
    }

    let mut results = Results::new();
    for round in 0..runs {
        // Alternate the order between rounds so no library always goes first.
        let mut order: Vec<&Lib> = libs.iter().collect();
        order.rotate_left(round % libs.len().max(1));
        for workload in WORKLOADS {
            if !rounds::selected("BENCH_WORKLOADS", workload, true) {
                continue;
            }
            for lib in &order {
                let distlock = match lib {
                    Lib::Distlock(client) => Some(client),
                    _ => None,
                };
                if workload == "W4" && distlock.is_none() {
                    continue;
                }
                let name = lib.name();
                let database = databases.get_mut(name).expect("a database per library");
                let open = database.settle(&probe, &mut results).await;
                let (row, units, unit) = match workload {
                    "W1" => {
                        let cycles = scaled(2000, scale);
                        (w1(lib, &probe, cycles).await, cycles, "cycle")
                    }
                    "W2" => {
                        let cycles = scaled(200, scale);
                        (w2(lib, &probe, cycles).await, W2_TASKS * cycles, "cycle")
                    }
                    "W3" => {
                        let grants = scaled(1000, scale);
                        (w3(lib, &probe, grants as u64).await, grants, "grant")
                    }
                    _ => {
                        let client = distlock.expect("W4 is distlock's");
                        (w4(client, &probe, &database.name).await, 0, "")
                    }
                };
                database.quiet_from = Instant::now();
                eprintln!("round {round} {workload} {name:<9} {}", shown_row(&row));
                let rows = results.entry((workload, name)).or_default();
                rows.push(row);
                if units > 0 {
                    database.pending = Some(Pending {
                        key: (workload, name),
                        index: rows.len() - 1,
                        open,
                        units: units as f64,
                        unit,
                        transactions: reports_transactions(name),
                    });
                }
            }
        }
    }
    for database in databases.values_mut() {
        database.settle(&probe, &mut results).await;
    }

    for database in databases.values() {
        probe.print_statements(&database.name).await;
    }

    let medians = rounds::medians(&results);
    rounds::print_medians(&medians, runs, "raw");
    print_round_ratios(&results);
    print_targets(&medians);
    rounds::write_jsonl(&header, &results, &medians, runs, &BASELINES, main_metrics);
}

/// `metric=value` pairs of a row.
fn shown_row(row: &Row) -> String {
    row.iter()
        .map(|(metric, value)| format!("{metric}={value:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The libraries each one's figures are divided by, round by round.
const BASELINES: [&str; 2] = ["raw", "advisory"];

/// The figures compared round by round: each workload's main ones.
fn main_metrics(workload: &str) -> &'static [&'static str] {
    match workload {
        "W1" => &["cycles_per_s", "p50_ms"],
        "W2" => &["cycles_per_s"],
        "W3" => &["grants_per_s", "handoff_p50_ms"],
        _ => &[],
    }
}

fn print_round_ratios(results: &Results) {
    println!("\nper round: each library's figure, then its ratio to raw's and advisory's of the same round");
    for workload in WORKLOADS {
        for metric in main_metrics(workload) {
            println!("\n{workload} {metric}");
            for (key, rows) in results.range((workload, "")..(workload, "\u{10ffff}")) {
                let values: Vec<String> = rows
                    .iter()
                    .map(|row| row.get(*metric).map_or("-".into(), |v| format!("{v:.3}")))
                    .collect();
                let mut line = format!("  {:<9} {}", key.1, values.join(" "));
                for baseline in BASELINES {
                    let Some(ratios) = rounds::round_ratios(results, key, baseline, metric) else {
                        continue;
                    };
                    let mut ratios: Vec<f64> = ratios.into_iter().flatten().collect();
                    if ratios.is_empty() {
                        continue;
                    }
                    let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
                    line += &format!(
                        " | vs {baseline}: {} (median {:.2})",
                        shown.join(" "),
                        median(&mut ratios)
                    );
                }
                println!("{line}");
            }
        }
    }
}

/// The targets, from the medians.
fn print_targets(medians: &BTreeMap<Key, Row>) {
    let get = |workload: &'static str, lib: &'static str, metric: &str| {
        medians
            .get(&(workload, lib))
            .and_then(|row| row.get(metric))
            .copied()
    };
    let shown = |value: Option<f64>| value.map_or("-".to_owned(), |v| format!("{v:.2}"));
    println!("\ntargets (issue 38, item 8)");
    println!(
        "  round trips per W1 cycle: distlock 4 by design (acquire 2, release 2); raw {} and \
         advisory {} counted; the fenced cycle at most one more than the floor's",
        shown(get("W1", "raw", "round_trips_per_cycle")),
        shown(get("W1", "advisory", "round_trips_per_cycle")),
    );
    println!(
        "  server statements per W1 cycle: distlock {}, raw {} (the same statements: equal when \
         distlock sends nothing more), advisory {}; transactions: distlock {}, raw {}, advisory 2 by \
         construction (not reported by PostgreSQL 15 while its sessions last)",
        shown(get("W1", "distlock", "server_statements_per_cycle")),
        shown(get("W1", "raw", "server_statements_per_cycle")),
        shown(get("W1", "advisory", "server_statements_per_cycle")),
        shown(get("W1", "distlock", "transactions_per_cycle")),
        shown(get("W1", "raw", "transactions_per_cycle")),
    );
    println!(
        "  handoff woken by NOTIFY: distlock's W3 grants within 5 ms of the previous release {} \
         (share {}), handoff p50 {} ms (raw {}, advisory {})",
        shown(get("W3", "distlock", "grants_within_5ms")),
        shown(get("W3", "distlock", "grants_within_5ms_share")),
        shown(get("W3", "distlock", "handoff_p50_ms")),
        shown(get("W3", "raw", "handoff_p50_ms")),
        shown(get("W3", "advisory", "handoff_p50_ms")),
    );
    println!(
        "  W4: renewal statements per round {} (target 1), locks lost {} (must be 0)",
        shown(get("W4", "distlock", "renewal_statements_per_round")),
        shown(get("W4", "distlock", "locks_lost")),
    );
}
