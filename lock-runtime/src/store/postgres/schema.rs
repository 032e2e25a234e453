//! The PostgreSQL store's own objects, in a schema of the library's own (`distlock` unless
//! `Config::postgres_schema` says otherwise): the `locks` table (one row per key in use: its
//! state as `jsonb`, a version every write changes, when it may be swept), the `tokens`
//! sequence (fencing tokens and row versions) and the `written_all` function (a statement that
//! finds a key changed since it was read aborts, `statements.rs`). [`ddl`] is the whole of it,
//! which `distlock schema` prints for teams that run their own migrations; [`ensure`] creates
//! what is missing (once per store, serialised by an advisory lock so that many processes
//! starting at once do not trip over each other), or only checks, and refuses a table of the
//! same name with another shape. Neighbours: `postgres.rs` ensures the schema before its first
//! statement; `connections.rs` runs these.

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::connections::pg_error;
use crate::config::PostgresOptions;
use crate::error::{BackendErrorKind, LockError};

/// The advisory lock key serialising schema creation across processes (`distlock` in ASCII).
const CREATE_LOCK: i64 = 0x0064_6973_746c_6f63;

/// The SQL of the PostgreSQL store's objects in `schema` (idempotent: it creates what is
/// missing), for teams that run their own migrations (`distlock schema` prints it; then
/// `Config::postgres_create_schema(false)`).
pub fn postgres_schema_sql(schema: &str) -> String {
    format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.locks (
    name       text PRIMARY KEY,
    version    bigint NOT NULL,
    state      jsonb NOT NULL,
    expires_at timestamptz
);
CREATE INDEX IF NOT EXISTS locks_expires_at ON {schema}.locks (expires_at);
CREATE SEQUENCE IF NOT EXISTS {schema}.tokens;
CREATE OR REPLACE FUNCTION {schema}.written_all(written bigint, expected bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF written <> expected THEN
        RAISE EXCEPTION 'distlock: a key changed since it was read' USING ERRCODE = 'DL001';
    END IF;
    RETURN written;
END
$$;
"
    )
}

/// The columns `locks` must have, in order, with their types.
const COLUMNS: [(&str, &str); 4] = [
    ("name", "text"),
    ("version", "bigint"),
    ("state", "jsonb"),
    ("expires_at", "timestamp with time zone"),
];

/// Checks that the store's objects are there and are the store's (the table's columns, the
/// sequence, the function); when something is missing and `options.create`, creates what is
/// missing first (a table of another shape is never changed). The check alone takes no lock
/// on the table, so clients starting while others work do not hold them up.
pub(crate) async fn ensure(client: &Client, options: &PostgresOptions) -> Result<(), LockError> {
    let schema = &options.schema;
    match check(client, schema).await {
        Err(Missing::Object(_)) if options.create => {}
        Err(Missing::Object(err) | Missing::Other(err)) => return Err(err),
        Ok(()) => return Ok(()),
    }
    let create = format!(
        "BEGIN; SELECT pg_advisory_xact_lock({CREATE_LOCK}); {} COMMIT;",
        postgres_schema_sql(schema)
    );
    if let Err(err) = client.batch_execute(&create).await {
        // Leave the connection usable whatever failed.
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(schema_error(schema, &err));
    }
    check(client, schema)
        .await
        .map_err(|(Missing::Object(err) | Missing::Other(err))| err)
}

/// Why the check failed: something is missing (which creating would mend), or anything else.
enum Missing {
    Object(LockError),
    Other(LockError),
}

/// Reads the store's objects from the catalogs, which every role may read: a role that lacks
/// a privilege on them still sees them as they are (`information_schema` would hide them), so
/// it is neither told they are missing nor sent to create them — its first statement says
/// which privilege it lacks (`connections::store_error`).
async fn check(client: &Client, schema: &str) -> Result<(), Missing> {
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) \
             FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = 'locks' AND c.relkind IN ('r', 'p') \
                 AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&schema],
        )
        .await
        .map_err(|err| Missing::Other(schema_error(schema, &err)))?;
    let found: Vec<(String, String)> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    if found.is_empty() {
        return Err(Missing::Object(LockError::Config(format!(
            "the PostgreSQL schema `{schema}` has no `locks` table: create the store's objects \
             by running their DDL (`distlock schema` prints it, \
             `distlock::postgres_schema_sql(\"{schema}\")` returns it), or let the client \
             create them (`Config::postgres_create_schema(true)`, the default) with a role \
             that may"
        ))));
    }
    let expected: Vec<(String, String)> = COLUMNS
        .iter()
        .map(|(name, kind)| ((*name).to_owned(), (*kind).to_owned()))
        .collect();
    if found != expected {
        let shape = |columns: &[(String, String)]| {
            columns
                .iter()
                .map(|(name, kind)| format!("{name} {kind}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(Missing::Other(LockError::Config(format!(
            "the table `{schema}.locks` is not distlock's: it has ({}) where distlock's has \
             ({}); it was left untouched. Give distlock a schema of its own \
             (`Config::postgres_schema`)",
            shape(&found),
            shape(&expected)
        ))));
    }
    let objects = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
                     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                     WHERE n.nspname = $1 AND c.relname = 'tokens' AND c.relkind = 'S'), \
                 EXISTS (SELECT 1 FROM pg_catalog.pg_proc p \
                     JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
                     WHERE n.nspname = $1 AND p.proname = 'written_all' \
                         AND p.proargtypes = '20 20'::pg_catalog.oidvector)",
            &[&schema],
        )
        .await
        .map_err(|err| Missing::Other(schema_error(schema, &err)))?;
    let (sequence, function): (bool, bool) = (objects.get(0), objects.get(1));
    if !sequence || !function {
        return Err(Missing::Object(LockError::Config(format!(
            "the PostgreSQL schema `{schema}` lacks {}: create the store's objects by running \
             their DDL (`distlock schema` prints it, `distlock::postgres_schema_sql(\"{schema}\")` \
             returns it)",
            if sequence {
                "the function `written_all`"
            } else {
                "the sequence `tokens`"
            }
        ))));
    }
    Ok(())
}

/// A failure to check or create the store's objects, in the server's own words: a role that
/// may not create them, a read-only server (a hot standby: `Unavailable`, as for any
/// statement), a pooler in transaction mode (as for any statement), anything else.
fn schema_error(schema: &str, err: &tokio_postgres::Error) -> LockError {
    let code = err.code();
    if code == Some(&SqlState::READ_ONLY_SQL_TRANSACTION)
        || err
            .as_db_error()
            .is_some_and(super::connections::is_pooled_statement)
    {
        return super::connections::store_error("set up the PostgreSQL schema", err).into();
    }
    let said = err.as_db_error().map_or_else(
        || err.to_string(),
        |db| format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
    );
    let message = if code == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        format!(
            "the role may not create distlock's objects in schema `{schema}` ({said}): run \
             their DDL (`distlock schema`) as a role that may and set \
             `Config::postgres_create_schema(false)`, or grant CREATE on the database \
             (docs/postgres.md, \"Role\")"
        )
    } else {
        format!("setting up distlock's schema `{schema}` failed: {said}")
    };
    pg_error(
        "set up the PostgreSQL schema",
        BackendErrorKind::Server,
        message,
    )
    .into()
}
