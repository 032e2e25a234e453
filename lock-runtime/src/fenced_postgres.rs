//! Fenced writes on PostgreSQL, public as `distlock::fenced::postgres` (declared by
//! `fenced.rs`, so that it reads beside the Redis guard; its layer is the clients', since it
//! takes a [`LockGuard`]). Two helpers on `tokio-postgres`: [`begin`] opens a transaction on the
//! application's own client to the database that keeps the locks, which first takes the key's
//! turn in shared mode for the transaction's length — the store takes it exclusively for every
//! change of the key — and then confirms that the guard's grant still holds the lock: every
//! write in it commits while the lock is held, or not at all. [`update`] is the fence column
//! for data in another database: a conditional `UPDATE` that refuses a lower token, as the
//! SQLite pattern of `fenced.rs` does. Neighbours: the store's statements and row layout that
//! the check reads (`store/postgres/statements.rs`, `store/key_state.rs`); the guard, which names the
//! grant (`guard.rs`); [`FencedWrite`], the outcome shared with the Redis guard.
//! `docs/fenced-writes.md` ("PostgreSQL: the write and the lock in one transaction") is the
//! user's page.
//!
//! ```no_run
//! use distlock::fenced::postgres::{self, FencedError};
//!
//! # async fn sell(locks: distlock::Client, db: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! // `db` is connected to the database `Config::postgres` names: the one that keeps the locks.
//! let guard = locks.lock("order:42").acquire().await?;
//! // … a long pause here may let the lease run out and the next holder write …
//! let transaction = match postgres::begin(&guard, db).await {
//!     Ok(transaction) => transaction,
//!     Err(FencedError::NotHolder { highest, .. }) => {
//!         return Err(format!("lost the lock (tokens up to {highest:?} handed out since)").into());
//!     }
//!     Err(err) => return Err(err.into()),
//! };
//! transaction
//!     .execute("UPDATE orders SET status = 'paid' WHERE id = $1", &[&42_i64])
//!     .await?;
//! transaction.commit().await?; // the lock was held until here, whatever its lease did
//! guard.release().await?;
//! # Ok(()) }
//! ```

use futures_util::future::join3;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, GenericClient, IsolationLevel, Transaction};

use crate::fenced::FencedWrite;
use crate::guard::LockGuard;
use crate::kind::Kind;
use crate::protocol::FencingToken;
use crate::store::postgres::{holders, shared_turns};

/// The column [`update`] keeps the highest token in unless
/// [`FencedUpdate::fence_column`] names another.
pub const DEFAULT_FENCE_COLUMN: &str = "fence";

/// Why a fenced transaction or a fenced update did not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FencedError {
    /// The guard's grant no longer holds the lock, on the database's clock: its lease ran out,
    /// it was released or force-unlocked, or another grant holds the lock now. Nothing ran:
    /// the transaction was rolled back. Whatever the work was, it no longer has the lock —
    /// take it again (a new grant, a new token) before writing.
    #[error(
        "the lock `{key}` is no longer held by this grant ({}): nothing was written; take \
         the lock again before writing",
        if *held_by_another { "another grant holds it now" } else { "nobody holds it now" }
    )]
    NotHolder {
        /// The key (as requested, without the prefix) whose grant was found gone: for a
        /// [`lock_all`](crate::lock_all) grant, the first such key.
        key: String,
        /// Whether another grant holds the key now (else nobody does).
        held_by_another: bool,
        /// The highest fencing token the store had handed out at the check (the last value
        /// of its `tokens` sequence): at least the token of whoever holds the lock now, so a
        /// fence raised to it refuses every grant before. `None` when none was ever handed
        /// out.
        highest: Option<FencingToken>,
    },

    /// The guard's lock is kept in another store than PostgreSQL, so no transaction of a
    /// PostgreSQL client can hold it. Nothing ran.
    #[error(
        "the lock `{key}` is kept in {store}, not in PostgreSQL: a fenced transaction holds \
         the lock in the database that keeps it. For data elsewhere, give the writes the \
         guard's fencing token: `distlock::fenced` (Redis) or `fenced::postgres::update` (a \
         fence column)"
    )]
    NotPostgres {
        /// The guard's key (its first, for a [`lock_all`](crate::lock_all) grant).
        key: String,
        /// The store the guard's client keeps its locks in.
        store: &'static str,
    },

    /// The client's database has no `<schema>.locks` table (or sequence): it is not the
    /// database that keeps the locks, or the locks live in another schema. Nothing ran.
    #[error(
        "the database of this PostgreSQL client has no `{schema}.locks` (or `{schema}.tokens`): \
         a fenced transaction runs on a client connected to the database that keeps the \
         locks, the one the lock client's `Config::postgres` URL names ({source})"
    )]
    NotTheLockDatabase {
        /// The schema of the lock client's objects (`Config::postgres_schema`).
        schema: String,
        /// What PostgreSQL said.
        #[source]
        source: tokio_postgres::Error,
    },

    /// A token above `i64::MAX`, which no `bigint` column holds (tokens of PostgreSQL and
    /// Redis grants stay far below it). Nothing ran.
    #[error("the fencing token {token} is above i64::MAX: a `bigint` fence cannot hold it")]
    TokenOutOfRange {
        /// The token.
        token: FencingToken,
    },

    /// PostgreSQL failed: the connection, a refusal (a missing privilege, a read-only
    /// server), or the statements given to [`update`]. A transaction that was open is rolled
    /// back.
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] tokio_postgres::Error),
}

/// Opens a transaction on `client` in which the lock of `guard` is held: it takes the key's
/// turn in shared mode for the transaction's length, then confirms that the guard's grant is
/// still the holder. Every write made in the returned transaction then commits while the lock
/// is held — or, rolled back, not at all. Otherwise it rolls back and returns
/// [`FencedError::NotHolder`], and nothing runs.
///
/// `client` must be connected to the database that keeps the locks (the one the lock client's
/// [`Config::postgres`](crate::Config::postgres) URL names) — the application's own
/// connection, not one of distlock's. A `deadpool-postgres` object lends its client:
/// `begin(&guard, &mut **object)`.
///
/// ## Behavior
///
/// - **What is held.** The store takes a key's turn (a transaction-level advisory lock on
///   `hashtext('<schema>'), hashtext(<lock key>)`) exclusively for every change of the key;
///   this transaction takes it shared. So while it is open, no try, renewal, release, expiry
///   judgement or forced unlock of the key commits: they wait. An expiry that falls during the
///   transaction takes effect after it — the next holder is granted only once it commits or
///   rolls back. Fenced transactions of one key do not wait for each other.
/// - **What is checked**, after the turn is held, on the database's clock: the key's row has
///   this grant's owner as the writer (or among the readers, or the permit holders, for a
///   read grant or a semaphore permit), with a lease ending after `clock_timestamp()`. A
///   [`lock_all`](crate::lock_all) guard is checked on every key, their turns taken in the
///   store's order. A grant taken with `fencing(false)` is checked all the same (the check
///   reads the owner, not the token).
/// - **Keep it short.** The store's operations on the key wait for the transaction, and give
///   up after the client's response timeout (`Config::response_timeout`, 1 s by default):
///   among them this client's renewal round, which renews all of its leases in one
///   transaction. A transaction open longer makes the next holder's try fail and retry, and
///   can cost the holder its leases.
/// - **A frozen holder holds the key for a bounded time.** The transaction sets
///   `idle_in_transaction_session_timeout` (locally, never above a value the session already
///   had) to twice the response timeout, as the store's own sessions have it: a holder that
///   stops between two statements for longer has its session ended by the server, its
///   transaction rolled back, and the key's turn given back. (The client is then closed:
///   make a new one, as a pool does.)
/// - **Isolation: READ COMMITTED**, whatever the session's default: the check must see what
///   was committed before the turn was granted, which a snapshot taken when the transaction
///   began — REPEATABLE READ and SERIALIZABLE take theirs at the first statement, the one
///   that waits for the turn — would not.
/// - **Cost:** two round trips (`START TRANSACTION`, then the turn and the check sent
///   together); the statements are not prepared, so nothing is left on the client.
/// - **Cancellation:** dropping the future (a `tokio::time::timeout` around it) rolls back
///   whatever it began, as tokio-postgres does for a dropped transaction.
/// - **Privileges:** the role needs `SELECT` on `<schema>.locks` and `<schema>.tokens`
///   (advisory locks need none).
///
/// # Errors
///
/// [`FencedError::NotHolder`] as above; [`FencedError::NotPostgres`] for a guard of a client
/// on another store; [`FencedError::NotTheLockDatabase`] for a client on a database without
/// the store's objects; [`FencedError::Postgres`] when PostgreSQL fails.
///
/// ```no_run
/// # async fn example(guard: &distlock::LockGuard, db: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let transaction = distlock::fenced::postgres::begin(guard, db).await?;
/// transaction
///     .execute("INSERT INTO ledger (account, amount) VALUES ($1, $2)", &[&7_i64, &-30_i64])
///     .await?;
/// transaction.commit().await?;
/// # Ok(()) }
/// ```
pub async fn begin<'a>(
    guard: &LockGuard,
    client: &'a mut Client,
) -> Result<Transaction<'a>, FencedError> {
    let store = guard.store();
    let Some(postgres) = store.postgres() else {
        return Err(FencedError::NotPostgres {
            key: guard.key().to_owned(),
            store: store.described(),
        });
    };
    let schema = postgres.schema();
    let held: Vec<_> = guard.held().collect();
    let names: Vec<&str> = held.iter().map(|(key, _, _)| key.lock.as_str()).collect();
    let owners: Vec<&str> = held.iter().map(|(_, owner, _)| *owner).collect();
    let parts: Vec<&str> = held.iter().map(|(_, _, kind)| part(*kind)).collect();
    let idle = i64::try_from((postgres.response_timeout() * 2).as_millis())
        .unwrap_or(i64::MAX)
        .max(1);

    let transaction = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?;
    // Sent together, run in order: the turn is held before the check takes its snapshot.
    let (bounded, turns, check) = join3(
        transaction.query_typed(IDLE_BOUND, &[(&idle, Type::INT8)]),
        transaction.query_typed(&shared_turns(schema), &[(&names, Type::TEXT_ARRAY)]),
        transaction.query_typed(
            &holders(schema),
            &[
                (&names, Type::TEXT_ARRAY),
                (&owners, Type::TEXT_ARRAY),
                (&parts, Type::TEXT_ARRAY),
            ],
        ),
    )
    .await;
    // On an error the transaction is dropped: tokio-postgres rolls it back.
    let rows = bounded
        .and(turns)
        .and(check)
        .map_err(|err| database_error(schema, err))?;
    for row in &rows {
        let name: &str = row.get(0);
        if row.get::<_, bool>(1) {
            continue;
        }
        let key = held
            .iter()
            .find(|(key, _, _)| key.lock == name)
            .map_or(name, |(key, _, _)| key.name.as_str())
            .to_owned();
        let highest = row
            .get::<_, Option<i64>>(3)
            .and_then(|token| u64::try_from(token).ok())
            .map(FencingToken);
        let refusal = FencedError::NotHolder {
            key,
            held_by_another: row.get(2),
            highest,
        };
        // Gives the turn back now; a failed roll-back ends with the connection anyway.
        let _ = transaction.rollback().await;
        return Err(refusal);
    }
    Ok(transaction)
}

/// Sets `idle_in_transaction_session_timeout` for the transaction to `$1` milliseconds, or
/// keeps the session's when it is already tighter.
const IDLE_BOUND: &str = "SELECT set_config('idle_in_transaction_session_timeout', \
     (SELECT CASE WHEN setting::bigint BETWEEN 1 AND $1 THEN setting ELSE $1::text END \
      FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'), true)";

/// How the store's row names what a grant of `kind` holds (`store/key_state.rs`).
fn part(kind: Kind) -> &'static str {
    match kind {
        Kind::Write => "w",
        Kind::Read => "r",
        Kind::Semaphore(_) => "p",
    }
}

/// A failure of the lock database, naming the likely cause when the store's objects are not
/// there.
fn database_error(schema: &str, err: tokio_postgres::Error) -> FencedError {
    use tokio_postgres::error::SqlState;
    match err.code() {
        Some(code)
            if *code == SqlState::UNDEFINED_TABLE || *code == SqlState::INVALID_SCHEMA_NAME =>
        {
            FencedError::NotTheLockDatabase {
                schema: schema.to_owned(),
                source: err,
            }
        }
        _ => FencedError::Postgres(err),
    }
}

/// Starts a [`FencedUpdate`] of `table`: an `UPDATE` that writes a row only if `token` is at
/// least the highest token that wrote it, kept in the row's fence column
/// ([`DEFAULT_FENCE_COLUMN`], a `bigint NOT NULL DEFAULT 0` column of the table).
///
/// For data in another database than the locks (or any database, whichever store keeps the
/// locks); in the database that keeps them, [`begin`] holds the lock itself.
///
/// ```no_run
/// # async fn example(db: &tokio_postgres::Client, token: distlock::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
/// use distlock::fenced::{self, FencedWrite};
///
/// // Once: ALTER TABLE stock ADD COLUMN fence bigint NOT NULL DEFAULT 0;
/// let outcome = fenced::postgres::update("stock", token)
///     .set("quantity = quantity - $1")
///     .filter("sku = $2")
///     .execute(db, &[&3_i64, &"apples"])
///     .await?;
/// match outcome {
///     FencedWrite::Applied(0) => eprintln!("no such row"),
///     FencedWrite::Applied(_) => {}
///     FencedWrite::Stale { highest } => eprintln!("lost the lock: token {highest} wrote since"),
/// }
/// # Ok(()) }
/// ```
pub fn update(table: &str, token: FencingToken) -> FencedUpdate {
    FencedUpdate {
        table: table.to_owned(),
        token,
        set: None,
        filter: None,
        fence_column: DEFAULT_FENCE_COLUMN.to_owned(),
    }
}

/// A fenced `UPDATE`, made by [`update`]: `UPDATE <table> SET <set>, <fence> = <token> WHERE
/// (<filter>) AND <fence> <= <token>`, one statement, so the row lock makes check and write
/// atomic.
///
/// The table, the column, [`set`](Self::set) and [`filter`](Self::filter) are SQL text,
/// written into the statement as given: write them in the code, never build them from input.
/// Values go in the parameters, `$1`, `$2`, … as in any tokio-postgres statement; the token
/// is bound after them.
///
/// ## Behavior
///
/// - **Which tokens pass:** a token at least the row's fence. Equal passes (one grant writes
///   as often as it likes); lower is [`FencedWrite::Stale`] with the row's fence, and the row
///   is left as it was. A `NULL` fence counts as 0.
/// - **One row per update:** the filter picks the row the fence belongs to (by its key). With
///   several rows, each is checked against its own fence and written if it passes; the
///   outcome is `Stale` only when none was written and one was refused.
/// - **No row:** [`FencedWrite::Applied`]`(0)`, as for any `UPDATE` that matches nothing.
/// - **No [`set`](Self::set):** only the fence is raised to the token, which makes every
///   lower token stale from then on — what to do with the token a forced unlock returns
///   ([`Client::force_unlock`](crate::Client::force_unlock)).
/// - **Inside a transaction:** pass a [`Transaction`]; the update is part of it. At
///   REPEATABLE READ or SERIALIZABLE, a row whose fence another transaction raised meanwhile
///   fails with PostgreSQL's serialization error, to be retried as such.
/// - **Cost:** one statement, prepared by tokio-postgres as it does for any `&str` (two round
///   trips). An update that writes nothing and sees no higher fence runs once more: the row
///   is missing, or its fence was raised while the statement waited for it (which its
///   snapshot does not show, and the second run does).
#[derive(Debug, Clone)]
#[must_use = "a fenced update does nothing until `execute`"]
pub struct FencedUpdate {
    table: String,
    token: FencingToken,
    set: Option<String>,
    filter: Option<String>,
    fence_column: String,
}

impl FencedUpdate {
    /// What to write, as in `UPDATE … SET`: `"quantity = $1, note = $2"`. The fence column is
    /// set beside it. Defaults to nothing: only the fence is raised.
    pub fn set(mut self, assignments: &str) -> Self {
        self.set = Some(assignments.to_owned());
        self
    }

    /// Which row, as in `UPDATE … WHERE`: `"sku = $3"`. Defaults to every row of the table.
    pub fn filter(mut self, condition: &str) -> Self {
        self.filter = Some(condition.to_owned());
        self
    }

    /// The column that keeps the highest token (a `bigint`). Defaults to
    /// [`DEFAULT_FENCE_COLUMN`].
    pub fn fence_column(mut self, column: &str) -> Self {
        column.clone_into(&mut self.fence_column);
        self
    }

    /// Runs the update on `client` (a [`Client`] or a [`Transaction`]) with `params` for the
    /// `$n` of [`set`](Self::set) and [`filter`](Self::filter): the rows written, or
    /// [`FencedWrite::Stale`] with the fence that refused the token.
    ///
    /// # Errors
    ///
    /// [`FencedError::Postgres`] for PostgreSQL's errors (the statement, the connection),
    /// [`FencedError::TokenOutOfRange`] for a token no `bigint` holds.
    pub async fn execute<C>(
        &self,
        client: &C,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<FencedWrite<u64>, FencedError>
    where
        C: GenericClient + Sync,
    {
        let token = self
            .token
            .as_i64()
            .map_err(|_| FencedError::TokenOutOfRange { token: self.token })?;
        let mut bound = params.to_vec();
        bound.push(&token);
        let statement = self.statement(bound.len());
        // A row refused because another statement raised its fence while this one waited for
        // it reads, in this statement's snapshot, as no row: once again tells the two apart.
        for _ in 0..2 {
            let row = client.query_one(statement.as_str(), &bound).await?;
            let written: i64 = row.get(0);
            if written > 0 {
                return Ok(FencedWrite::Applied(u64::try_from(written).unwrap_or(0)));
            }
            if let Some(highest) = row.get::<_, Option<i64>>(1) {
                let highest = u64::try_from(highest).unwrap_or(0);
                return Ok(FencedWrite::Stale {
                    highest: FencingToken(highest),
                });
            }
        }
        Ok(FencedWrite::Applied(0))
    }

    /// The statement, with the token as parameter `$token`: the rows written, and the highest
    /// fence above the token among the rows the filter picks (null: none).
    fn statement(&self, token: usize) -> String {
        let Self {
            table,
            fence_column: fence,
            ..
        } = self;
        let token = format!("${token}::bigint");
        let set = match &self.set {
            Some(set) => format!("{set}, {fence} = {token}"),
            None => format!("{fence} = {token}"),
        };
        let filter = self.filter.as_deref().unwrap_or("true");
        format!(
            "WITH written AS ( \
                 UPDATE {table} SET {set} \
                 WHERE ({filter}) AND coalesce({fence}, 0) <= {token} RETURNING 1 \
             ) \
             SELECT (SELECT count(*) FROM written), \
                    (SELECT max({fence})::bigint FROM {table} \
                     WHERE ({filter}) AND {fence} > {token})"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_update_sets_the_fence_beside_the_columns_and_checks_it_in_its_where() {
        let sql = update("stock", FencingToken(7))
            .set("quantity = $1")
            .filter("sku = $2")
            .statement(3);
        assert!(
            sql.contains("UPDATE stock SET quantity = $1, fence = $3::bigint"),
            "{sql}"
        );
        assert!(
            sql.contains("WHERE (sku = $2) AND coalesce(fence, 0) <= $3::bigint"),
            "{sql}"
        );
        let raise = update("stock", FencingToken(7))
            .fence_column("token")
            .statement(1);
        assert!(
            raise.contains("SET token = $1::bigint WHERE (true)"),
            "{raise}"
        );
    }
}
