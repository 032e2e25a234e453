//! One operation's transaction, run by a task of its own on the client's I/O runtime
//! ([`Transaction::open`]): it checks a connection out, takes the keys' turns and reads their
//! rows in one round trip, hands the rows to the operation ([`Loaded`]), and then either
//! writes back what the operation's twin changed and commits in a second round trip
//! ([`Transaction::write`]), or commits at once ([`Transaction::finish`]). The operation's own
//! future is the caller's: should it stop being polled (a frozen or cancelled request) between
//! the two round trips, the task rolls back after [`NEXT_STEP_WITHIN`] — the keys' turns are
//! never held by a future nobody polls. Neighbours: `postgres.rs` runs the twins between the
//! two round trips; `connections.rs` lends the connection and settles failures;
//! `statements.rs` is what is sent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Object;
use serde_json::Value;
use tokio::runtime::Handle;
use tokio::sync::{oneshot, OnceCell};

use super::connections::{pg_error, Cleanup, Connections, Failure};
use super::{schema, statements};
use crate::config::PostgresOptions;
use crate::error::{BackendErrorKind, LockError};
use crate::store::key_state::Timeline;
use crate::store::turns::Turn;

/// How long the task waits for the operation's next step once the rows are handed over (a
/// twin takes microseconds): past it, it rolls back, and a late write reads again.
pub(crate) const NEXT_STEP_WITHIN: Duration = Duration::from_millis(100);

/// Writes between two sweeps of rows that ran out.
const SWEEP_EVERY: u64 = 1024;

/// What every transaction of one client shares.
pub(crate) struct Shared {
    pub(crate) connections: Connections,
    pub(crate) options: PostgresOptions,
    turns_sql: String,
    read_sql: String,
    write_sql: String,
    renew_sql: String,
    /// Set once the schema is there (created or checked).
    ready: OnceCell<()>,
    writes: AtomicU64,
    io: Handle,
}

impl Shared {
    pub(crate) fn new(connections: Connections, options: PostgresOptions, io: Handle) -> Self {
        Self {
            turns_sql: statements::turns(&options.schema),
            read_sql: statements::read(&options.schema),
            write_sql: statements::write(&options.schema, &options.schema),
            renew_sql: statements::renew(&options.schema),
            connections,
            options,
            ready: OnceCell::new(),
            writes: AtomicU64::new(0),
            io,
        }
    }

    /// A connection of the pool, once the schema is there, and its backend's process id.
    pub(crate) async fn checkout(&self, cut: Option<Instant>) -> Result<(Object, i32), LockError> {
        let connection = self.connections.checkout(cut).await?;
        self.ready
            .get_or_try_init(|| schema::ensure(&connection, &self.options))
            .await?;
        let pid = self.connections.pid(&connection).await?;
        Ok((connection, pid))
    }
}

/// The database's clock and highest token as a read found them, and each key's row.
pub(crate) struct Loaded {
    pub(crate) time: Timeline,
    pub(crate) last_token: u64,
    /// Each key's version (0: no row) and state.
    pub(crate) rows: HashMap<String, (i64, Option<Value>)>,
}

/// The rows a transaction writes back, as the write statement's parameters.
#[derive(Default)]
pub(crate) struct Write {
    pub(crate) names: Vec<String>,
    pub(crate) versions: Vec<i64>,
    pub(crate) states: Vec<Option<Value>>,
    pub(crate) expires: Vec<Option<i64>>,
    pub(crate) notes: Vec<String>,
    pub(crate) tokens: i32,
}

/// What the operation asks of its transaction once it has the rows.
enum Step {
    /// Write these rows, commit, and say what came of it (the tokens taken).
    Write(Write, oneshot::Sender<Result<Vec<u64>, Failure>>),
    /// Nothing to write: commit.
    Finish,
}

/// An open transaction holding its keys' turns, with the rows it read.
pub(crate) struct Transaction {
    pub(crate) loaded: Loaded,
    step: oneshot::Sender<Step>,
}

impl Transaction {
    /// Opens a transaction on `names` (lock keys) and reads their rows.
    /// The transaction's task keeps `turn` (this client's turn on the keys) until it has
    /// ended, also after a failure it reported: the next operation of this client on them
    /// waits for the roll-back or the terminated backend.
    pub(crate) async fn open(
        shared: &Arc<Shared>,
        operation: &'static str,
        names: &[&str],
        cut: Option<Instant>,
        turn: Turn,
    ) -> Result<Transaction, Failure> {
        let (rows_to, rows) = oneshot::channel();
        let (step, next) = oneshot::channel();
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let task = shared.clone();
        shared.io.spawn(async move {
            task.run(operation, names, cut, rows_to, next).await;
            drop(turn);
        });
        let loaded = rows.await.map_err(|_| gone(operation))??;
        Ok(Transaction { loaded, step })
    }

    /// Writes back `write` and commits: the tokens taken.
    pub(crate) async fn write(
        self,
        operation: &'static str,
        write: Write,
    ) -> Result<Vec<u64>, Failure> {
        let (reply, answer) = oneshot::channel();
        if self.step.send(Step::Write(write, reply)).is_err() {
            // Rolled back for want of the step: as a key that changed, read again.
            return Err(Failure::Changed);
        }
        answer.await.map_err(|_| gone(operation))?
    }

    /// Ends the transaction (nothing to write): the caller does not wait for the commit.
    pub(crate) fn finish(self) {
        let _ = self.step.send(Step::Finish);
    }
}

fn gone(operation: &'static str) -> Failure {
    Failure::Error(
        pg_error(
            operation,
            BackendErrorKind::Connection,
            "the client's I/O runtime ended the PostgreSQL transaction (the client is shutting \
             down)",
        )
        .into(),
    )
}

impl Shared {
    /// The transaction's task: both round trips, and the roll-back when the operation's next
    /// step does not come.
    async fn run(
        self: Arc<Self>,
        operation: &'static str,
        names: Vec<String>,
        cut: Option<Instant>,
        rows_to: oneshot::Sender<Result<Loaded, Failure>>,
        next: oneshot::Receiver<Step>,
    ) {
        let (object, pid) = match self.checkout(cut).await {
            Ok(checked_out) => checked_out,
            Err(err) => {
                let _ = rows_to.send(Err(Failure::Error(err)));
                return;
            }
        };
        let mut connection = Some(object);
        let (loaded, cleanup) = self.load(&mut connection, operation, &names, cut).await;
        let failed = loaded.is_err();
        // Reported first: the clean-up (a roll-back, a terminated backend) goes on behind
        // the request, which fails at its budget.
        if rows_to.send(loaded).is_err() || failed {
            let cleanup = if failed { cleanup } else { Cleanup::RollBack };
            self.connections
                .clean_up(&mut connection, pid, cleanup)
                .await;
            return;
        }
        match tokio::time::timeout(NEXT_STEP_WITHIN, next).await {
            Ok(Ok(Step::Write(write, reply))) => {
                let (written, cleanup) = self.write(&mut connection, operation, &write, cut).await;
                let _ = reply.send(written);
                self.connections
                    .clean_up(&mut connection, pid, cleanup)
                    .await;
            }
            Ok(Ok(Step::Finish)) => {
                if let Some(object) = connection.as_ref() {
                    let committed = object.batch_execute("COMMIT");
                    if !matches!(
                        tokio::time::timeout(self.connections.response_timeout(), committed).await,
                        Ok(Ok(()))
                    ) {
                        self.connections
                            .clean_up(&mut connection, pid, Cleanup::Terminate)
                            .await;
                    }
                }
            }
            // Dropped, or not polled in time: nothing was written.
            Ok(Err(_)) | Err(_) => {
                self.connections
                    .clean_up(&mut connection, pid, Cleanup::RollBack)
                    .await;
            }
        }
    }

    /// Takes the turns of `names` and reads their rows with the database's clock, in one
    /// round trip: `BEGIN`, the turns (transaction-level advisory locks, in one order, waiting
    /// at most what is left of the budget), the read.
    async fn load(
        &self,
        connection: &mut Option<Object>,
        operation: &'static str,
        names: &[String],
        cut: Option<Instant>,
    ) -> (Result<Loaded, Failure>, Cleanup) {
        let Some(object) = connection.as_ref() else {
            return (Err(lent()), Cleanup::Nothing);
        };
        let budget = self.connections.budget(cut);
        // The server refuses the turn a little before the client's own timer would fire, so
        // that a turn that does not come is a clean refusal (the transaction rolled back), not
        // a statement without an answer (its backend terminated).
        let turn_wait = budget.saturating_sub((budget / 10).min(Duration::from_millis(20)));
        let begin = format!(
            "BEGIN; SET LOCAL lock_timeout = '{}ms'",
            turn_wait.as_millis().max(1)
        );
        let statements = async {
            let (turns, read) = futures_util::future::join(
                object.prepare_cached(&self.turns_sql),
                object.prepare_cached(&self.read_sql),
            )
            .await;
            let (turns, read) = (turns?, read?);
            let (begun, taken, rows) = futures_util::future::join3(
                object.batch_execute(&begin),
                object.query(&turns, &[&names]),
                object.query(&read, &[&names]),
            )
            .await;
            begun?;
            taken?;
            rows
        };
        let outcome = tokio::time::timeout(budget, statements).await;
        let rows = match self.connections.settle(operation, budget, outcome) {
            (Ok(rows), _) => rows,
            (Err(failure), cleanup) => return (Err(failure), cleanup),
        };
        let now = Instant::now();
        let Some(first) = rows.first() else {
            let failure = Failure::Error(
                pg_error(
                    operation,
                    BackendErrorKind::Server,
                    "PostgreSQL answered the read with no row",
                )
                .into(),
            );
            return (Err(failure), Cleanup::RollBack);
        };
        let db_micros: i64 = first.get(0);
        let last: i64 = first.get(1);
        let mut loaded = Loaded {
            time: Timeline { db_micros, now },
            last_token: u64::try_from(last).unwrap_or(0),
            rows: names.iter().map(|name| (name.clone(), (0, None))).collect(),
        };
        for row in &rows {
            if let Some(name) = row.get::<_, Option<String>>(2) {
                let version: i64 = row.get(3);
                let state: Value = row.get(4);
                loaded.rows.insert(name, (version, Some(state)));
            }
        }
        (Ok(loaded), Cleanup::Nothing)
    }

    /// Writes back what changed and commits, in one round trip.
    async fn write(
        &self,
        connection: &mut Option<Object>,
        operation: &'static str,
        write: &Write,
        cut: Option<Instant>,
    ) -> (Result<Vec<u64>, Failure>, Cleanup) {
        let Some(object) = connection.as_ref() else {
            return (Err(lent()), Cleanup::Nothing);
        };
        let budget = self.connections.budget(cut);
        let statements = async {
            let statement = object.prepare_cached(&self.write_sql).await?;
            let (rows, committed) = futures_util::future::join(
                object.query(
                    &statement,
                    &[
                        &write.names,
                        &write.versions,
                        &write.states,
                        &write.expires,
                        &write.notes,
                        &write.tokens,
                    ],
                ),
                object.batch_execute("COMMIT"),
            )
            .await;
            let rows = rows?;
            committed?;
            Ok(rows)
        };
        let outcome = tokio::time::timeout(budget, statements).await;
        let rows = match self.connections.settle(operation, budget, outcome) {
            (Ok(rows), _) => rows,
            (Err(failure), cleanup) => return (Err(failure), cleanup),
        };
        if self.writes.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            self.sweep();
        }
        let tokens: Vec<i64> = rows.first().map(|row| row.get(1)).unwrap_or_default();
        let tokens = tokens
            .into_iter()
            .map(|token| u64::try_from(token).unwrap_or(0))
            .collect();
        (Ok(tokens), Cleanup::Nothing)
    }

    /// Deletes rows that ran out, in the background.
    fn sweep(&self) {
        let sql = statements::sweep(&self.options.schema);
        let pool = self.connections.pool();
        let timeout = self.connections.response_timeout();
        self.io.spawn(async move {
            if let Ok(connection) = pool.get().await {
                let _ = tokio::time::timeout(timeout, connection.batch_execute(&sql)).await;
            }
        });
    }
}

impl Shared {
    /// Renews leases in one statement (`statements::renew`) per round of distinct keys, the
    /// rounds sent together: `renewals` are (name, owner, side, lease in microseconds); the
    /// positions renewed.
    pub(crate) async fn renew(
        self: &Arc<Self>,
        renewals: &[(String, String, &'static str, i64)],
    ) -> Result<Vec<bool>, LockError> {
        // Rounds in which each key appears once.
        let mut rounds: Vec<Vec<usize>> = Vec::new();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, (name, ..)) in renewals.iter().enumerate() {
            let round = seen.entry(name.as_str()).or_insert(0);
            if rounds.len() <= *round {
                rounds.push(Vec::new());
            }
            rounds[*round].push(i);
            *round += 1;
        }
        let (object, pid) = self.checkout(None).await?;
        let mut connection = Some(object);
        let budget = self.connections.budget(None);
        let object = connection.as_ref().ok_or_else(|| LockError::from(lent()))?;
        let statements = async {
            let statement = object.prepare_cached(&self.renew_sql).await?;
            let sent = rounds.iter().map(|round| {
                let names: Vec<&str> = round.iter().map(|&i| renewals[i].0.as_str()).collect();
                let owners: Vec<&str> = round.iter().map(|&i| renewals[i].1.as_str()).collect();
                let sides: Vec<&str> = round.iter().map(|&i| renewals[i].2).collect();
                let leases: Vec<i64> = round.iter().map(|&i| renewals[i].3).collect();
                let statement = &statement;
                async move {
                    object
                        .query(statement, &[&names, &owners, &sides, &leases])
                        .await
                }
            });
            futures_util::future::try_join_all(sent).await
        };
        let outcome = tokio::time::timeout(budget, statements).await;
        let (answers, cleanup) = self.connections.settle("renew", budget, outcome);
        if cleanup != Cleanup::Nothing {
            // Behind the renewal's answer: the watchdog learns of the failure at once.
            let shared = self.clone();
            self.io.spawn(async move {
                shared
                    .connections
                    .clean_up(&mut connection, pid, cleanup)
                    .await;
            });
        }
        let answers = answers.map_err(LockError::from)?;
        let mut renewed = vec![false; renewals.len()];
        for (round, rows) in rounds.iter().zip(answers) {
            for row in rows {
                let n: i64 = row.get(0);
                if let Some(&i) = usize::try_from(n - 1).ok().and_then(|n| round.get(n)) {
                    renewed[i] = true;
                }
            }
        }
        Ok(renewed)
    }
}

/// A connection used after it was given up: a bug, reported rather than a panic.
fn lent() -> Failure {
    Failure::Error(
        pg_error(
            "acquire",
            BackendErrorKind::Server,
            "a PostgreSQL connection was used after it was given up",
        )
        .into(),
    )
}

impl From<Failure> for LockError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Error(err) => err,
            Failure::TurnNotGiven => pg_error(
                "wait for the key's turn",
                BackendErrorKind::Timeout,
                "another operation on the key (a renewal, a release, a clean-up, a fenced \
                 transaction) held its turn for all the time left",
            )
            .advice(
                "the key was busy for the whole response timeout (or the request's wait): \
                 look for a long fenced transaction on it (`pg_stat_activity`), or raise the \
                 response timeout",
            )
            .into(),
            Failure::Changed => pg_error(
                "acquire",
                BackendErrorKind::Server,
                "a key changed between a read and its write",
            )
            .into(),
        }
    }
}
