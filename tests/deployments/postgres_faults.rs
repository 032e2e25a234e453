//! The PostgreSQL store's semantics and faults against real servers (issue 38, item 3, and
//! the PostgreSQL pitfalls of `../shared/research-stores.md`, Part 3, that apply to a lease table):
//! leases on the database's clock, fencing tokens from a sequence that survive restarts and
//! crashes, grants that survive them, wake-ups by `NOTIFY` with the backoff as the fallback,
//! ambiguous and held-up tries that leave no grant behind, backends terminated under a holder,
//! a read-only server, data that is not the store's, a least-privilege role, a late renewal,
//! cancelled tries and an abandoned holder. What the store does is seen from outside: the
//! rows of `<schema>.locks` and the server's `pg_stat_activity` and `pg_locks`, read over a
//! connection of the test's own. Tests that restart, kill or stop the server (or one of its
//! backends) start their own ([`PostgresServer`]); the others share the binary's
//! ([`shared_postgres`]), each with keys, an application name (to find its backends), and
//! where it changes objects a schema, database or role of its own. Neighbours:
//! `postgres_server.rs` checks the test support's server itself; the conformance suite
//! (`tests/conformance`, `postgres_store`) runs every kind's rules on it.

use std::future::Future;
use std::time::Duration;

use crate::support::postgres::{shared_postgres, PostgresServer};
use distlock::{BackendErrorKind, Client, Config, LockError, LockGuard};
use tokio::time::{sleep, timeout, Instant};

/// The default schema, and the key prefix: a key `k` is the row `distlock:{k}`.
const SCHEMA: &str = "distlock";

/// A superuser's URL for `database` on `server`, its sessions named `app` (how a test finds
/// its client's backends in `pg_stat_activity`).
fn url_of(server: &PostgresServer, database: &str, app: &str) -> String {
    url_as(server, "postgres", database, app)
}

/// [`url_of`] for `user` (trust authentication on 127.0.0.1: no password).
fn url_as(server: &PostgresServer, user: &str, database: &str, app: &str) -> String {
    format!(
        "postgres://{user}@127.0.0.1:{}/{database}?application_name={app}",
        server.port()
    )
}

/// The config of a client at `url`, with timeouts short enough for a fault to show in
/// seconds.
fn config(url: &str) -> Config {
    Config::postgres(url)
        .expect("a PostgreSQL URL")
        .response_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
}

pub(crate) fn client(config: Config) -> Client {
    Client::new(config).expect("a valid config")
}

/// A connection of the test's own to `url`, its task on the current runtime.
pub(crate) async fn connect(url: &str) -> tokio_postgres::Client {
    let (db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|err| panic!("connect to {url}: {err}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    db
}

/// The row name of key `key` (the default prefix).
pub(crate) fn row_of(key: &str) -> String {
    format!("distlock:{{{key}}}")
}

/// Polls `check` every 10 ms until it gives a value; panics after `within` with `what` and
/// the last reason.
pub(crate) async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + within;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(reason) if Instant::now() >= deadline => {
                panic!("timed out after {within:?} waiting for {what}: {reason}")
            }
            Err(_) => sleep(Duration::from_millis(10)).await,
        }
    }
}

/// The database's clock, in microseconds since the epoch, as the store reads it.
async fn db_micros(db: &tokio_postgres::Client) -> i64 {
    db.query_one(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
        &[],
    )
    .await
    .expect("read the database's clock")
    .get(0)
}

/// The writer of key `key` in `schema`'s table and the end of its lease (microseconds on the
/// database's clock), if the row has one.
async fn writer(db: &tokio_postgres::Client, schema: &str, key: &str) -> Option<(String, i64)> {
    let sql = format!(
        "SELECT state->'w'->>0, (state->'w'->>1)::bigint FROM {schema}.locks WHERE name = $1"
    );
    let row = db
        .query_opt(&sql, &[&row_of(key)])
        .await
        .expect("read a lock's row")?;
    Some((
        row.get::<_, Option<String>>(0)?,
        row.get::<_, Option<i64>>(1)?,
    ))
}

/// The backends whose application name is `app`.
async fn backends(db: &tokio_postgres::Client, app: &str) -> Vec<i32> {
    db.query(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
        &[&app],
    )
    .await
    .expect("read pg_stat_activity")
    .iter()
    .map(|row| row.get(0))
    .collect()
}

/// The backends of `app` waiting for a heavyweight lock of kind `event` (`advisory`: a key's
/// turn; `transactionid`: a row another transaction locked).
async fn waiting(db: &tokio_postgres::Client, app: &str, event: &str) -> Vec<i32> {
    db.query(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
         AND wait_event_type = 'Lock' AND wait_event = $2",
        &[&app, &event],
    )
    .await
    .expect("read pg_stat_activity")
    .iter()
    .map(|row| row.get(0))
    .collect()
}

/// Waits until a backend of `app` waits for a lock of kind `event`, and returns it.
async fn first_waiting(db: &tokio_postgres::Client, app: &str, event: &str) -> i32 {
    eventually(
        &format!("a backend of {app} to wait for an {event} lock"),
        Duration::from_secs(10),
        || async move {
            waiting(db, app, event)
                .await
                .first()
                .copied()
                .ok_or_else(|| "none waits".to_owned())
        },
    )
    .await
}

/// Terminates the backends `pids`, waiting for each to end.
async fn terminate(db: &tokio_postgres::Client, pids: &[i32]) {
    for pid in pids {
        db.execute("SELECT pg_terminate_backend($1, 5000)", &[pid])
            .await
            .expect("pg_terminate_backend");
    }
}

/// Takes key `key`'s turn in `schema` on `db` as the store does, in a transaction the caller
/// ends (`COMMIT`), and its row: every operation on the key, a renewal too, waits meanwhile.
/// (Watch the server from
/// another connection: inside a transaction `pg_stat_activity` is a snapshot.)
async fn take_turn(db: &tokio_postgres::Client, schema: &str, key: &str) {
    // Bounded: a turn the store left held (a session lock) fails the test, not hangs it.
    db.batch_execute("BEGIN; SET LOCAL lock_timeout = '10s'")
        .await
        .expect("BEGIN");
    db.execute(
        "SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))",
        &[&schema, &row_of(key)],
    )
    .await
    .expect("take the key's turn");
    // And its row, which a renewal (one statement, no turn) waits for.
    db.execute(
        &format!("SELECT 1 FROM {schema}.locks WHERE name = $1 FOR UPDATE"),
        &[&row_of(key)],
    )
    .await
    .expect("lock the key's row");
}

/// Advisory locks held by backends of `app` (the store's turns are transaction locks: none
/// outlives its transaction).
async fn advisory_locks(db: &tokio_postgres::Client, app: &str) -> i64 {
    db.query_one(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND a.application_name = $1",
        &[&app],
    )
    .await
    .expect("read pg_locks")
    .get(0)
}

/// Records every committed state of a row of `schema.locks` in `schema.audit` (a trigger of
/// the test's own: a write rolled back leaves nothing there).
async fn audit(db: &tokio_postgres::Client, schema: &str) {
    db.batch_execute(&format!(
        "CREATE TABLE {schema}.audit (name text, state jsonb);
         CREATE FUNCTION {schema}.audit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO {schema}.audit VALUES (NEW.name, NEW.state); RETURN NEW; END $$;
         CREATE TRIGGER audit AFTER INSERT OR UPDATE ON {schema}.locks
             FOR EACH ROW EXECUTE FUNCTION {schema}.audit();"
    ))
    .await
    .expect("create the audit trigger");
}

/// How many committed states of key `key`'s row had a writer.
async fn audited_writers(db: &tokio_postgres::Client, schema: &str, key: &str) -> i64 {
    db.query_one(
        &format!("SELECT count(*) FROM {schema}.audit WHERE name = $1 AND state ? 'w'"),
        &[&row_of(key)],
    )
    .await
    .expect("read the audit")
    .get(0)
}

/// A row for key `key` with no holder (an empty state), so that a try's write is an
/// `UPDATE` of it, which a row lock can hold up.
async fn empty_row(db: &tokio_postgres::Client, schema: &str, key: &str) {
    db.execute(
        &format!(
            "INSERT INTO {schema}.locks (name, version, state) \
             VALUES ($1, nextval('{schema}.tokens'), '{{}}')"
        ),
        &[&row_of(key)],
    )
    .await
    .expect("insert an empty row");
}

/// `LockError::Backend`'s kind and message, or a panic naming what came instead.
fn backend_error<T: std::fmt::Debug>(
    outcome: Result<T, LockError>,
    what: &str,
) -> (BackendErrorKind, String) {
    match outcome {
        Err(LockError::Backend(err)) => (err.kind(), err.to_string()),
        other => panic!("{what}: expected a store error, got {other:?}"),
    }
}

/// Runs `request` again while it fails with a store error, for at most 10 s: the first
/// request after a server restart or crash may find a pooled connection broken.
async fn soon<T, F, Fut>(what: &str, mut request: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, LockError>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match request().await {
            Ok(value) => return value,
            Err(err @ LockError::Backend(_)) if Instant::now() < deadline => {
                eprintln!("{what}, while the server comes back: {err}");
                sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("{what}: {err}"),
        }
    }
}

// --- Leases on the database's clock -------------------------------------------------------

/// A grant's lease, and a renewal's, end `lease` after the database's clock at the statement
/// that read the key (`clock_timestamp()`): the row says so, between the database's clock
/// before the request and after it.
#[tokio::test]
async fn a_grant_and_a_renewal_run_on_the_databases_clock() {
    let server = shared_postgres();
    let app = "pgf_db_clock";
    let client = client(config(&url_of(server, "postgres", app)));
    let db = &connect(&server.url()).await;
    let key = "pgf:db-clock";
    let lease = Duration::from_secs(3);
    let lease_us = 3_000_000;

    let before = db_micros(db).await;
    let guard = client
        .lock(key)
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");
    let after = db_micros(db).await;
    let (_, until) = writer(db, SCHEMA, key).await.expect("a writer in the row");
    let granted_at = until - lease_us;
    assert!(
        (before..=after).contains(&granted_at),
        "the lease ends {lease:?} after {granted_at} µs, which is not the database's clock \
         during the request ({before}..={after} µs)"
    );
    let expires_at: i64 = db
        .query_one(
            "SELECT (extract(epoch FROM expires_at) * 1000000)::bigint FROM distlock.locks \
             WHERE name = $1",
            &[&row_of(key)],
        )
        .await
        .expect("read expires_at")
        .get(0);
    assert!(
        (expires_at - until).abs() <= 1_000,
        "expires_at {expires_at} µs, lease until {until} µs"
    );

    // The watchdog's renewal, a third of the lease on: the same clock.
    let (renewed_until, seen_at) = eventually("a renewal", Duration::from_secs(5), || async move {
        let renewed = writer(db, SCHEMA, key).await;
        let now = db_micros(db).await;
        match renewed {
            Some((_, later)) if later != until => Ok((later, now)),
            _ => Err("not renewed yet".to_owned()),
        }
    })
    .await;
    let renewed_at = renewed_until - lease_us;
    assert!(
        renewed_at > granted_at && renewed_at <= seen_at,
        "renewed to end {lease:?} after {renewed_at} µs: not the database's clock between the \
         grant ({granted_at} µs) and now ({seen_at} µs)"
    );
    assert!(guard.release().await.expect("release"));
}

/// Pitfall 7 (ShedLock#3577): a lease computed from `now()` starts when the transaction
/// began. The store's transaction begins, then waits for the key's turn (held here by hand
/// for a second): the grant's lease still starts when its read ran, after the turn came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_starts_when_the_keys_turn_comes_not_when_its_transaction_began() {
    let server = shared_postgres();
    let app = "pgf_stale_transaction";
    let client =
        client(config(&url_of(server, "postgres", app)).response_timeout(Duration::from_secs(5)));
    let db = &connect(&server.url()).await;
    let blocker = &connect(&server.url()).await;
    let key = "pgf:stale-transaction";
    let lease_us = 10_000_000;
    client.inspect(key).await.expect("the schema is there");

    take_turn(blocker, SCHEMA, key).await;
    let acquiring = tokio::spawn({
        let request = client
            .lock(key)
            .lease(Duration::from_secs(10))
            .wait(Duration::from_secs(10));
        async move { request.acquire().await }
    });
    let pid = first_waiting(db, app, "advisory").await;
    let began: Option<i64> = db
        .query_one(
            "SELECT (extract(epoch FROM xact_start) * 1000000)::bigint FROM pg_stat_activity \
             WHERE pid = $1",
            &[&pid],
        )
        .await
        .expect("read xact_start")
        .get(0);
    // The point of the test: the waiting transaction grows old.
    sleep(Duration::from_secs(1)).await;
    let turn_given = db_micros(blocker).await;
    blocker
        .batch_execute("COMMIT")
        .await
        .expect("give the turn back");

    let guard = acquiring.await.expect("the task").expect("acquire");
    let after = db_micros(db).await;
    let (_, until) = writer(db, SCHEMA, key).await.expect("a writer in the row");
    let granted_at = until - lease_us;
    assert!(
        granted_at >= turn_given && granted_at <= after,
        "the lease starts at {granted_at} µs: not after the turn came ({turn_given} µs) — the \
         transaction began at {began:?} µs"
    );
    assert!(guard.release().await.expect("release"));
}

// --- Fencing tokens from a sequence -------------------------------------------------------

/// Tokens are `nextval` of the schema's sequence: set far below any clock (Redis' tokens are
/// its clock in microseconds, ~1.7e15), they are small numbers just above it, strictly
/// increasing across holders and clients, across a restart and across a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_come_from_a_sequence_across_holders_restarts_and_a_crash() {
    let mut server = PostgresServer::start();
    let (a, b) = (
        client(config(&url_of(&server, "postgres", "pgf_tokens_a"))),
        client(config(&url_of(&server, "postgres", "pgf_tokens_b"))),
    );
    let key = "pgf:tokens";
    a.inspect(key).await.expect("the schema is there");
    const FLOOR: u64 = 5_000;
    server.psql(&format!("SELECT setval('distlock.tokens', {FLOOR})"));

    let mut tokens = Vec::new();
    for round in 0..6 {
        let holder = if round % 2 == 0 { &a } else { &b };
        let guard = token_of(
            &mut tokens,
            holder.lock(key).acquire().await.expect("acquire"),
        );
        assert!(guard.release().await.expect("release"));
    }

    server.restart();
    for holder in [&a, &b] {
        let guard = soon("acquire after a restart", || holder.lock(key).acquire()).await;
        let guard = token_of(&mut tokens, guard);
        assert!(guard.release().await.expect("release"));
    }

    server.kill();
    server.restart();
    for holder in [&b, &a] {
        let guard = soon("acquire after a crash", || holder.lock(key).acquire()).await;
        let guard = token_of(&mut tokens, guard);
        assert!(guard.release().await.expect("release"));
    }

    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens not strictly increasing: {tokens:?}"
    );
    assert!(
        tokens
            .iter()
            .all(|&token| token > FLOOR && token < FLOOR + 1_000),
        "tokens are not the sequence's, just above {FLOOR}: {tokens:?}"
    );
}

/// Notes `guard`'s token in `tokens`, and hands the guard back.
fn token_of(tokens: &mut Vec<u64>, guard: LockGuard) -> LockGuard {
    tokens.push(guard.fencing_token().expect("fenced").get());
    guard
}

// --- Grants survive a restart and a crash -------------------------------------------------

/// The table is logged: a holder's grant (10 s lease) is there after a restart and after a
/// crash, with its lease (renewed, never shortened); another client finds it held, and
/// free once the holder releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_survives_a_restart_and_a_crash_with_its_lease() {
    let mut server = PostgresServer::start();
    let holder = client(config(&url_of(&server, "postgres", "pgf_survives_holder")));
    let other = client(config(&url_of(&server, "postgres", "pgf_survives_other")));
    let key = "pgf:survives";
    let guard = holder
        .lock(key)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire");
    let until_of = |server: &PostgresServer| -> i64 {
        let until = server.psql(&format!(
            "SELECT (state->'w'->>1)::bigint FROM distlock.locks WHERE name = '{}'",
            row_of(key)
        ));
        until
            .parse()
            .unwrap_or_else(|_| panic!("no grant in the row: {until:?}"))
    };
    let mut until = until_of(&server);

    for crash in [false, true] {
        if crash {
            server.kill();
        }
        server.restart();
        let after = until_of(&server);
        assert!(
            after >= until,
            "the lease was shortened from {until} to {after} µs"
        );
        until = after;
        let busy = soon("try after the server came back", || {
            other.lock(key).try_acquire()
        })
        .await;
        assert!(
            busy.is_none(),
            "another client got the lock after a restart"
        );
        assert!(guard.is_held(), "the holder lost its lock to a restart");
    }

    // Its renewals go on, on new connections.
    let server = &server;
    let renewed = eventually(
        "a renewal after the crash",
        Duration::from_secs(10),
        || async move {
            let now = until_of(server);
            if now > until {
                Ok(now)
            } else {
                Err(format!("still {now}"))
            }
        },
    )
    .await;
    assert!(renewed > until);
    assert!(guard.is_held());
    assert!(guard.release().await.expect("release"));
    let free = other.lock(key).try_acquire().await.expect("try");
    assert!(free.is_some(), "the lock stayed held after its release");
}

// --- Wake-ups by NOTIFY -------------------------------------------------------------------

/// The backend of `app`'s `LISTEN` session, once it listens.
pub(crate) async fn listening(db: &tokio_postgres::Client, app: &str) -> Result<i32, String> {
    db.query(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
         AND query LIKE 'LISTEN%' AND state = 'idle'",
        &[&app],
    )
    .await
    .expect("read pg_stat_activity")
    .first()
    .map(|row| row.get(0))
    .ok_or_else(|| "no LISTEN session".to_owned())
}

/// One handoff of `key` from `holder` to a waiter of `waiter`'s, released once the waiter
/// has been refused: how long the waiter took to get the lock after the release began.
async fn handoff(
    holder: &Client,
    waiter: &Client,
    db: &tokio_postgres::Client,
    key: &'static str,
) -> Duration {
    let guard = holder
        .lock(key)
        .acquire()
        .await
        .expect("the holder's acquire");
    let waiting = tokio::spawn({
        let request = waiter.lock(key).wait(Duration::from_secs(20));
        async move {
            let guard = request.acquire().await.expect("the waiter's acquire");
            (guard, Instant::now())
        }
    });
    // Its first try was refused: a waiting writer's mark is in the row.
    eventually(
        "the waiter's refused try",
        Duration::from_secs(10),
        || async move {
            let marked = db
                .query_opt(
                    "SELECT 1 FROM distlock.locks WHERE name = $1 AND state ? 'ww'",
                    &[&row_of(key)],
                )
                .await
                .expect("read the row");
            marked.map(drop).ok_or_else(|| "no mark yet".to_owned())
        },
    )
    .await;
    // From the mark's commit to the waiter's registration for wake-ups: its reply's way back,
    // nothing to watch from here.
    sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    assert!(guard.release().await.expect("release"));
    let (guard, granted) = waiting.await.expect("the waiter's task");
    assert!(guard.release().await.expect("the waiter's release"));
    granted - released
}

/// Pitfall 9. A waiter whose backoff steps are up to 5 s gets the lock within a few hundred
/// milliseconds of each release: woken by `NOTIFY`, not by its backoff (three handoffs in a
/// row; a waiter left to its backoff is that quick about one time in ten). With its client's
/// `LISTEN` session terminated (and its role barred from connecting, so that the listener
/// cannot come back before the release), it still gets the lock, within its backoff step;
/// once the role may connect again the listener is back, and a release wakes at once again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_by_notify_and_the_backoff_covers_a_lost_listener() {
    let server = shared_postgres();
    let role = "pgf_wake";
    server.psql(&format!("CREATE ROLE {role} LOGIN SUPERUSER"));
    let app = "pgf_wake_waiter";
    let backoff = Duration::from_secs(5);
    let waiter = client(config(&url_as(server, role, "postgres", app)).backoff(backoff, backoff));
    let holder = client(config(&url_of(server, "postgres", "pgf_wake_holder")));
    let db = &connect(&server.url()).await;
    let key = "pgf:wake";

    // The listener starts with the first wait.
    let guard = holder.lock(key).acquire().await.expect("acquire");
    let first = tokio::spawn({
        let request = waiter.lock(key).wait(Duration::from_secs(20));
        async move { request.acquire().await }
    });
    let listener = eventually(
        "the waiter's LISTEN session",
        Duration::from_secs(10),
        || listening(db, app),
    )
    .await;
    sleep(Duration::from_millis(50)).await;
    assert!(guard.release().await.expect("release"));
    let woken = timeout(Duration::from_secs(1), first)
        .await
        .expect("the first waiter is woken")
        .expect("its task")
        .expect("its acquire");
    assert!(woken.release().await.expect("release"));
    for round in 0..3 {
        let took = handoff(&holder, &waiter, db, key).await;
        assert!(
            took < Duration::from_millis(500),
            "handoff {round} took {took:?}: not woken"
        );
    }

    // The listener's session ends, and cannot come back for now.
    server.psql(&format!("ALTER ROLE {role} NOLOGIN"));
    terminate(db, &[listener]).await;
    let took = handoff(&holder, &waiter, db, key).await;
    eprintln!("with no listener, the handoff took {took:?} (backoff steps up to {backoff:?})");
    assert!(
        took <= backoff + Duration::from_secs(1),
        "with no listener, the waiter took {took:?}, more than its backoff step"
    );

    server.psql(&format!("ALTER ROLE {role} LOGIN"));
    eventually(
        "the listener back",
        Duration::from_secs(10),
        || async move {
            match listening(db, app).await {
                Ok(pid) if pid != listener => Ok(()),
                Ok(_) => Err("the old session".to_owned()),
                Err(err) => Err(err),
            }
        },
    )
    .await;
    for round in 0..3 {
        let took = handoff(&holder, &waiter, db, key).await;
        assert!(
            took < Duration::from_millis(500),
            "handoff {round} after the listener came back took {took:?}: not woken"
        );
    }
}

// --- Ambiguous and held-up tries ----------------------------------------------------------

/// A try whose backend is terminated while its statements run — waiting for the key's turn,
/// or with its write held up by a row lock — fails (within the response timeout), and no
/// grant of it is ever committed: the key is free, and the next try gets it. (Every backend of
/// the store's client is terminated, its listener's too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_whose_backend_is_terminated_mid_statement_leaves_no_grant() {
    let server = shared_postgres();
    let schema = "pgf_terminated";
    let app = "pgf_terminated";
    let response = Duration::from_secs(2);
    let store = client(
        config(&url_of(server, "postgres", app))
            .postgres_schema(schema)
            .response_timeout(response),
    );
    let other =
        client(config(&url_of(server, "postgres", "pgf_terminated_other")).postgres_schema(schema));
    let db = &connect(&server.url()).await;
    let blocker = &connect(&server.url()).await;
    store
        .inspect("pgf:setup")
        .await
        .expect("the schema is there");
    audit(db, schema).await;

    for (key, held_at) in [
        ("pgf:terminated-turn", "advisory"),
        ("pgf:terminated-write", "transactionid"),
    ] {
        if held_at == "advisory" {
            take_turn(blocker, schema, key).await;
        } else {
            empty_row(db, schema, key).await;
            blocker.batch_execute("BEGIN").await.expect("BEGIN");
            blocker
                .execute(
                    &format!("SELECT 1 FROM {schema}.locks WHERE name = $1 FOR UPDATE"),
                    &[&row_of(key)],
                )
                .await
                .expect("lock the row");
        }
        let started = Instant::now();
        let trying = tokio::spawn({
            let request = store.lock(key).lease(Duration::from_secs(30));
            async move { request.try_acquire().await }
        });
        first_waiting(db, app, held_at).await;
        terminate(db, &backends(db, app).await).await;
        let outcome = timeout(Duration::from_secs(10), trying)
            .await
            .expect("the try returns")
            .expect("its task");
        let took = started.elapsed();
        let (kind, message) = backend_error(outcome, "a try whose backend was terminated");
        eprintln!("a try terminated while waiting for {held_at}: {kind:?} in {took:?}: {message}");
        assert!(
            took < response + Duration::from_secs(1),
            "the try took {took:?}"
        );
        blocker.batch_execute("ROLLBACK").await.expect("ROLLBACK");

        let state = store.inspect(key).await.expect("inspect");
        assert!(
            state.holders.is_empty(),
            "a grant held by nobody: {state:?}"
        );
        assert_eq!(
            audited_writers(db, schema, key).await,
            0,
            "a grant was committed"
        );
        let next = other.lock(key).try_acquire().await.expect("the next try");
        assert!(
            next.is_some(),
            "the key is not free after the terminated try"
        );
        assert!(next.unwrap().release().await.expect("release"));
    }
}

/// A try held up past its error cannot commit later. Twice: (1) its write is slow (a
/// trigger of the test's sleeps in it): the try times out, and the store terminates the
/// backend before reporting it, so the write and the `COMMIT` already in the backend's socket
/// never complete; (2) its write waits for a row lock and its backend is stopped there
/// (SIGSTOP), so the termination cannot end it: the try reports its timeout all the same,
/// and when the row lock goes and the backend runs again it ends instead of committing. No
/// state with a writer is ever committed (an audit trigger sees every commit), and the key is
/// free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_held_up_past_its_error_cannot_land_after_it() {
    let server = PostgresServer::start();
    let app = "pgf_held_up";
    let response = Duration::from_secs(1);
    let store = client(config(&url_of(&server, "postgres", app)).response_timeout(response));
    let db = &connect(&server.url()).await;
    let blocker = &connect(&server.url()).await;
    let (slow, stopped) = ("pgf:held-up-slow", "pgf:held-up-stopped");
    store.inspect(slow).await.expect("the schema is there");
    audit(db, SCHEMA).await;
    db.batch_execute(&format!(
        "CREATE FUNCTION distlock.slow() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.name = '{}' AND NEW.state ? 'w' THEN PERFORM pg_sleep(3); END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER slow BEFORE INSERT OR UPDATE ON distlock.locks
             FOR EACH ROW EXECUTE FUNCTION distlock.slow();",
        row_of(slow)
    ))
    .await
    .expect("make writes of one key slow");
    // (1) A slow write.
    let started = Instant::now();
    let outcome = store
        .lock(slow)
        .lease(Duration::from_secs(30))
        .try_acquire()
        .await;
    let took = started.elapsed();
    let (kind, message) = backend_error(outcome, "a try whose write is slow");
    eprintln!("a try whose write is slow: {kind:?} in {took:?}: {message}");
    assert_eq!(kind, BackendErrorKind::Timeout, "{message}");
    assert!(
        took < response + Duration::from_secs(1),
        "the try took {took:?}"
    );
    settled(db, &store, app, slow).await;

    // (2) A backend stopped while its write waits for a row lock.
    empty_row(db, SCHEMA, stopped).await;
    blocker.batch_execute("BEGIN").await.expect("BEGIN");
    blocker
        .execute(
            "SELECT 1 FROM distlock.locks WHERE name = $1 FOR UPDATE",
            &[&row_of(stopped)],
        )
        .await
        .expect("lock the row");
    let started = Instant::now();
    let trying = tokio::spawn({
        let request = store.lock(stopped).lease(Duration::from_secs(30));
        async move { request.try_acquire().await }
    });
    let pid = first_waiting(db, app, "transactionid").await;
    signal("STOP", pid);
    let outcome = timeout(Duration::from_secs(10), trying)
        .await
        .expect("the try returns")
        .expect("its task");
    let took = started.elapsed();
    let (kind, message) = backend_error(outcome, "a try held up");
    eprintln!("a try whose backend is stopped: {kind:?} in {took:?}: {message}");
    assert_eq!(kind, BackendErrorKind::Timeout, "{message}");
    // The response timeout, then the termination's wait (as long again) before the error.
    assert!(
        took < 2 * response + Duration::from_secs(1),
        "the try took {took:?}"
    );
    blocker.batch_execute("ROLLBACK").await.expect("ROLLBACK");
    signal("CONT", pid);
    settled(db, &store, app, stopped).await;
    let next = store
        .lock(stopped)
        .try_acquire()
        .await
        .expect("the next try");
    assert!(next.is_some(), "the key is not free");
}

/// Waits until the held-up try's backend has ended (and with it the clean-up's wait for the
/// key's turn), then checks that no grant of `key` was ever committed and none is held.
async fn settled(db: &tokio_postgres::Client, store: &Client, app: &str, key: &str) {
    eventually(
        "the held-up try's backend to end",
        Duration::from_secs(10),
        || async move {
            let busy: i64 = db
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
                     AND state <> 'idle'",
                    &[&app],
                )
                .await
                .expect("read pg_stat_activity")
                .get(0);
            if busy == 0 {
                Ok(())
            } else {
                Err(format!("{busy} sessions busy"))
            }
        },
    )
    .await;
    assert_eq!(
        audited_writers(db, SCHEMA, key).await,
        0,
        "the held-up try on {key} committed its grant after its error"
    );
    let state = store.inspect(key).await.expect("inspect");
    assert!(
        state.holders.is_empty(),
        "a grant held by nobody: {state:?}"
    );
}

/// Sends `signal` to the server process `pid`.
fn signal(signal: &str, pid: i32) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

// --- A holder's backends terminated -------------------------------------------------------

/// The end of the writer's lease of each of `keys`.
async fn untils(db: &tokio_postgres::Client, keys: &[&str]) -> Vec<i64> {
    let mut untils = Vec::new();
    for key in keys {
        untils.push(writer(db, SCHEMA, key).await.expect("a writer").1);
    }
    untils
}

/// Pitfall 2 (wolverine#2602): a holder's connections end under it. A renewal of two locks
/// (one statement) is held up at a key's row and its backend terminated, then every backend
/// of the holder's client, again and again: the renewals go on on new connections, the
/// holder keeps both locks, and nobody else gets either meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_keeps_its_locks_when_its_backends_are_terminated_mid_renewal() {
    let server = shared_postgres();
    let app = "pgf_renewal_holder";
    let holder = client(config(&url_of(server, "postgres", app)));
    let other = client(config(&url_of(server, "postgres", "pgf_renewal_other")));
    let db = &connect(&server.url()).await;
    let blocker = &connect(&server.url()).await;
    let keys = ["pgf:renewal-1", "pgf:renewal-2"];
    let lease = Duration::from_secs(3);
    let first = holder
        .lock(keys[0])
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");
    let second = holder
        .lock(keys[1])
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");
    let before = &untils(db, &keys).await;

    take_turn(blocker, SCHEMA, keys[0]).await;
    // A renewal takes no turn: it waits for the row.
    let renewing = first_waiting(db, app, "transactionid").await;
    terminate(db, &[renewing]).await;
    blocker.batch_execute("COMMIT").await.expect("COMMIT");
    eventually(
        "both renewed after the termination",
        Duration::from_secs(5),
        || async move {
            let now = untils(db, &keys).await;
            if now.iter().zip(before).all(|(now, before)| now > before) {
                Ok(())
            } else {
                Err(format!("{now:?}, before {before:?}"))
            }
        },
    )
    .await;

    let until = Instant::now() + 2 * lease;
    while Instant::now() < until {
        terminate(db, &backends(db, app).await).await;
        for key in keys {
            let stolen = other
                .lock(key)
                .try_acquire()
                .await
                .expect("the other's try");
            assert!(
                stolen.is_none(),
                "{key} granted to another while its holder holds it"
            );
        }
        assert!(
            first.is_held() && second.is_held(),
            "the holder lost a lock"
        );
        sleep(Duration::from_millis(200)).await;
    }
    assert!(first.release().await.expect("release"));
    assert!(second.release().await.expect("release"));
}

// --- A read-only server -------------------------------------------------------------------

/// A server that turned read-only (a hot standby after a failover, as far as a client can
/// tell): a try is a clear error naming it, of kind `Unavailable`, within the wait — not a
/// hang, not a timeout — and locks work again once it takes writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_a_clear_error_within_the_wait() {
    let server = PostgresServer::start();
    let store = client(config(&url_of(&server, "postgres", "pgf_read_only")));
    let key = "pgf:read-only";
    store.inspect(key).await.expect("the schema is there");
    server.psql("CREATE DATABASE pgf_never_set_up");
    server.psql("ALTER SYSTEM SET default_transaction_read_only = on");
    server.psql("SELECT pg_reload_conf()");

    let started = Instant::now();
    let (kind, message) = backend_error(store.lock(key).try_acquire().await, "a try");
    assert_eq!(kind, BackendErrorKind::Unavailable, "{message}");
    assert!(message.contains("read-only"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    let wait = Duration::from_secs(2);
    let started = Instant::now();
    let outcome = store.lock(key).wait(wait).acquire().await;
    let took = started.elapsed();
    let (kind, message) = backend_error(outcome, "an acquire");
    assert_eq!(kind, BackendErrorKind::Unavailable, "{message}");
    assert!(message.contains("read-only"), "{message}");
    assert!(
        took <= wait + Duration::from_millis(500),
        "the acquire took {took:?}"
    );

    // A fresh client, too (its schema check reads only); and one whose database has no
    // schema yet, which it cannot create there.
    let fresh = client(config(&url_of(&server, "postgres", "pgf_read_only_fresh")));
    let (kind, message) =
        backend_error(fresh.lock(key).try_acquire().await, "a fresh client's try");
    assert_eq!(kind, BackendErrorKind::Unavailable, "{message}");
    let unset = client(config(&url_of(
        &server,
        "pgf_never_set_up",
        "pgf_read_only_unset",
    )));
    let (kind, message) = backend_error(
        unset.lock(key).try_acquire().await,
        "a try where the schema is missing",
    );
    eprintln!("a read-only server without the schema: {message}");
    assert_eq!(kind, BackendErrorKind::Unavailable, "{message}");
    assert!(message.contains("read-only"), "{message}");

    let db = &connect(&server.url()).await;
    db.batch_execute("SET default_transaction_read_only = off")
        .await
        .expect("SET");
    db.batch_execute("ALTER SYSTEM RESET default_transaction_read_only")
        .await
        .expect("ALTER SYSTEM");
    db.batch_execute("SELECT pg_reload_conf()")
        .await
        .expect("reload");
    let guard = soon("acquire once the server takes writes", || {
        store.lock(key).acquire()
    })
    .await;
    assert!(guard.release().await.expect("release"));
}

// --- Its own data only --------------------------------------------------------------------

/// Makes database `name` on the shared server, for a test that changes its objects.
fn database(name: &str) -> &'static PostgresServer {
    let server = shared_postgres();
    server.psql(&format!("CREATE DATABASE {name}"));
    server
}

/// A table `distlock.locks` of another shape: the first request is a `LockError::Config`
/// naming the table, and nothing of it (nor of the schema) is changed.
#[tokio::test]
async fn a_table_of_another_shape_is_refused_and_left_untouched() {
    let name = "pgf_foreign_table";
    let server = database(name);
    let db = &connect(&url_of(server, name, "pgf_test")).await;
    db.batch_execute(
        "CREATE SCHEMA distlock;
         CREATE TABLE distlock.locks (id serial PRIMARY KEY, note text);
         INSERT INTO distlock.locks (note) VALUES ('theirs');",
    )
    .await
    .expect("make a table of another shape");

    let store = client(config(&url_of(server, name, "pgf_foreign_table")));
    for outcome in [
        store.lock("pgf:foreign").try_acquire().await.map(drop),
        store.inspect("pgf:foreign").await.map(drop),
    ] {
        match outcome {
            Err(LockError::Config(message)) => {
                assert!(message.contains("distlock.locks"), "{message}");
                eprintln!("{message}");
            }
            other => panic!("expected a config error, got {other:?}"),
        }
    }
    let columns: Vec<String> = db
        .query(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_schema = 'distlock' AND table_name = 'locks' ORDER BY ordinal_position",
            &[],
        )
        .await
        .expect("read the columns")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(columns, ["id", "note"]);
    let note: String = db
        .query_one("SELECT note FROM distlock.locks", &[])
        .await
        .expect("read the row")
        .get(0);
    assert_eq!(note, "theirs");
    let made: bool = db
        .query_one(
            "SELECT to_regclass('distlock.tokens') IS NOT NULL \
             OR to_regprocedure('distlock.written_all(bigint,bigint)') IS NOT NULL",
            &[],
        )
        .await
        .expect("look for the store's objects")
        .get(0);
    assert!(
        !made,
        "the store made objects beside a table that is not its own"
    );
}

/// With schema creation off, an empty database is a clear error that says to run the DDL,
/// and nothing is created; once the DDL (`distlock::postgres_schema_sql`) is run by hand, the
/// same client and config work.
#[tokio::test]
async fn without_schema_creation_an_empty_database_is_an_error_until_the_ddl_is_run() {
    let name = "pgf_no_creation";
    let server = database(name);
    let db = &connect(&url_of(server, name, "pgf_test")).await;
    let config = config(&url_of(server, name, "pgf_no_creation")).postgres_create_schema(false);
    let store = client(config.clone());
    match store.lock("pgf:no-creation").try_acquire().await {
        Err(LockError::Config(message)) => {
            eprintln!("{message}");
            assert!(message.contains("distlock schema"), "{message}");
            assert!(message.contains("postgres_schema_sql"), "{message}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    let schemas: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'distlock'",
            &[],
        )
        .await
        .expect("read pg_namespace")
        .get(0);
    assert_eq!(
        schemas, 0,
        "the schema was created although creation is off"
    );

    db.batch_execute(&distlock::postgres_schema_sql(SCHEMA))
        .await
        .expect("run the DDL");
    let guard = store
        .lock("pgf:no-creation")
        .try_acquire()
        .await
        .expect("the same client, after the DDL")
        .expect("free");
    assert!(guard.release().await.expect("release"));
    let again = client(config);
    let guard = again
        .lock("pgf:no-creation")
        .acquire()
        .await
        .expect("the same config, after the DDL");
    assert!(guard.release().await.expect("release"));
}

/// A row in `distlock.locks` whose state is not a lock's (another tool's, or a newer
/// layout): a clear error naming the key, from a try, `inspect` and `force_unlock`, and the
/// row is left as it was.
#[tokio::test]
async fn a_row_of_another_shape_is_refused_naming_its_key_and_left_untouched() {
    let name = "pgf_foreign_row";
    let server = database(name);
    let db = &connect(&url_of(server, name, "pgf_test")).await;
    db.batch_execute(&distlock::postgres_schema_sql(SCHEMA))
        .await
        .expect("run the DDL");
    let key = "pgf:foreign-row";
    db.execute(
        "INSERT INTO distlock.locks (name, version, state) VALUES ($1, 7, '[1,2]')",
        &[&row_of(key)],
    )
    .await
    .expect("a foreign row");

    let store = client(config(&url_of(server, name, "pgf_foreign_row")));
    let outcomes = [
        store.lock(key).try_acquire().await.map(drop),
        store.inspect(key).await.map(drop),
        store.force_unlock(key).await.map(drop),
        store.read_lock(key).try_acquire().await.map(drop),
    ];
    for outcome in outcomes {
        let (_, message) = backend_error(outcome, "a request on a foreign row");
        assert!(
            message.contains(key),
            "the error does not name the key: {message}"
        );
        assert!(message.contains("untouched"), "{message}");
    }
    let row = db
        .query_one(
            "SELECT version, state::text FROM distlock.locks WHERE name = $1",
            &[&row_of(key)],
        )
        .await
        .expect("read the row");
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, String>(1)),
        (7, "[1, 2]".to_owned())
    );
}

// --- Least privilege ----------------------------------------------------------------------

/// What a role needs beyond connecting, the objects made beforehand by another role: the
/// grants docs/postgres.md lists.
const GRANTS: [&str; 4] = [
    "GRANT USAGE ON SCHEMA distlock TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON distlock.locks TO {role}",
    "GRANT USAGE, SELECT ON SEQUENCE distlock.tokens TO {role}",
    "GRANT EXECUTE ON FUNCTION distlock.written_all(bigint, bigint) TO {role}",
];

/// A role with only [`GRANTS`] (and `CONNECT` on its database, `PUBLIC` having nothing
/// there, not even `EXECUTE` on the function) runs every kind — lock, read and write lock,
/// semaphore, `lock_all`, fair, an election's campaign — with renewals and wake-ups, and the
/// operator's tools; a role lacking any one of them gets a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_role_runs_every_kind() {
    let name = "pgf_least_privilege";
    let server = database(name);
    let db = &connect(&url_of(server, name, "pgf_test")).await;
    db.batch_execute(&distlock::postgres_schema_sql(SCHEMA))
        .await
        .expect("run the DDL");
    db.batch_execute(&format!(
        "REVOKE ALL ON DATABASE {name} FROM PUBLIC;
         REVOKE EXECUTE ON FUNCTION distlock.written_all(bigint, bigint) FROM PUBLIC;"
    ))
    .await
    .expect("take PUBLIC's privileges away");
    let make_role = |role: &str, left_out: Option<usize>| {
        let mut sql =
            format!("CREATE ROLE {role} LOGIN; GRANT CONNECT ON DATABASE {name} TO {role};");
        for (i, grant) in GRANTS.iter().enumerate() {
            if Some(i) != left_out {
                sql.push_str(&grant.replace("{role}", role));
                sql.push(';');
            }
        }
        sql
    };
    db.batch_execute(&make_role("pgf_app", None))
        .await
        .expect("make the role");

    let store = client(config(&url_as(server, "pgf_app", name, "pgf_app")));
    let lease = Duration::from_millis(600);
    let guard = store
        .lock("pgf:role")
        .lease(lease)
        .acquire()
        .await
        .expect("lock");
    assert!(guard.fencing_token().is_some());
    // A renewal, and a waiter woken by the release.
    let waiting = tokio::spawn({
        let request = store.lock("pgf:role").wait(Duration::from_secs(5));
        async move { request.acquire().await }
    });
    sleep(lease).await;
    assert!(guard.is_held(), "not renewed");
    let state = store.inspect("pgf:role").await.expect("inspect");
    assert_eq!(state.holders.len(), 1);
    assert!(guard.release().await.expect("release"));
    let next = waiting
        .await
        .expect("the waiter's task")
        .expect("the waiter");
    let forced = store.force_unlock("pgf:role").await.expect("force_unlock");
    assert_eq!(forced.evicted.len(), 1);
    assert!(!next.release().await.expect("release after force_unlock"));

    let read = store
        .read_lock("pgf:role-rw")
        .acquire()
        .await
        .expect("read lock");
    assert!(read.release().await.expect("release"));
    let write = store
        .write_lock("pgf:role-rw")
        .acquire()
        .await
        .expect("write lock");
    assert!(write.release().await.expect("release"));
    let permit = store
        .semaphore("pgf:role-sem", 2)
        .acquire()
        .await
        .expect("semaphore");
    assert!(permit.release().await.expect("release"));
    let both = store
        .lock_all(["pgf:role-a", "pgf:role-b"])
        .acquire()
        .await
        .expect("lock_all");
    assert!(both.release().await.expect("release"));
    let fair = store
        .lock("pgf:role-fair")
        .fair()
        .acquire()
        .await
        .expect("fair");
    assert!(fair.release().await.expect("release"));
    let election = store.election("pgf:role-leader").value(b"me".to_vec());
    let leadership = election.campaign().await.expect("campaign");
    let leader = election.leader().await.expect("leader").expect("a leader");
    assert_eq!(leader.epoch(), leadership.epoch());
    leadership
        .proclaim(b"still me".to_vec())
        .await
        .expect("proclaim");
    assert!(leadership.resign().await.expect("resign"));
    let listed = store.list("pgf:role*", 10).await.expect("list");
    eprintln!("listed as the role: {listed:?}");

    for (left_out, grant) in GRANTS.iter().enumerate() {
        let role = format!("pgf_app_without_{left_out}");
        db.batch_execute(&make_role(&role, Some(left_out)))
            .await
            .expect("make the role");
        let lacking = client(config(&url_as(server, &role, name, &role)));
        match lacking.lock("pgf:role-lacking").try_acquire().await {
            Err(LockError::Backend(err)) => {
                let message = err.to_string();
                eprintln!("without `{grant}`: {message}");
                assert!(
                    message.contains("permission denied"),
                    "without `{grant}`: {message}"
                );
            }
            other => panic!("without `{grant}`: {other:?}"),
        }
    }
}

// --- Pitfalls of lease tables -------------------------------------------------------------

/// Pitfall 8 (openbao#2100): a renewal that arrives late must not take the lock back. The
/// key's turn and row are held by hand while a holder's lease (3 s) runs out: another
/// client's try (for the turn) and the holder's renewal (for the row) wait for them. The other gets the lock with a
/// greater token; the renewal after it changes nothing; the holder learns it lost the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_cannot_take_back_a_lock_granted_to_another() {
    let server = shared_postgres();
    let (holder_app, other_app) = ("pgf_late_holder", "pgf_late_other");
    let slow = Duration::from_secs(5);
    let holder = client(config(&url_of(server, "postgres", holder_app)).response_timeout(slow));
    let other = client(config(&url_of(server, "postgres", other_app)).response_timeout(slow));
    let db = &connect(&server.url()).await;
    let blocker = &connect(&server.url()).await;
    let key = "pgf:late-renewal";
    let old = holder
        .lock(key)
        .lease(Duration::from_secs(3))
        .acquire()
        .await
        .expect("acquire");
    let (owner, until) = writer(db, SCHEMA, key).await.expect("a writer");

    take_turn(blocker, SCHEMA, key).await;
    let taking = tokio::spawn({
        let request = other
            .lock(key)
            .lease(Duration::from_secs(10))
            .wait(Duration::from_secs(10));
        async move { request.acquire().await }
    });
    first_waiting(db, other_app, "advisory").await;
    // A renewal takes no turn: it waits for the row.
    first_waiting(db, holder_app, "transactionid").await;
    eventually(
        "the holder's lease to run out",
        Duration::from_secs(5),
        || async move {
            let now = db_micros(db).await;
            if now > until {
                Ok(())
            } else {
                Err(format!("{} µs left", until - now))
            }
        },
    )
    .await;
    blocker.batch_execute("COMMIT").await.expect("COMMIT");

    let new = taking
        .await
        .expect("the task")
        .expect("the other's acquire");
    timeout(Duration::from_secs(5), old.lost())
        .await
        .expect("the old holder learns it lost the lock");
    eventually(
        "the late renewal to be done",
        Duration::from_secs(5),
        || async move {
            let busy: i64 = db
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
                 AND state <> 'idle'",
                    &[&holder_app],
                )
                .await
                .expect("read pg_stat_activity")
                .get(0);
            if busy == 0 {
                Ok(())
            } else {
                Err(format!("{busy} of its sessions busy"))
            }
        },
    )
    .await;
    let (writer_now, _) = writer(db, SCHEMA, key).await.expect("a writer");
    assert_ne!(writer_now, owner, "the late renewal took the lock back");
    assert!(new.is_held());
    assert!(
        new.fencing_token() > old.fencing_token(),
        "{:?} after {:?}",
        new.fencing_token(),
        old.fencing_token()
    );
    assert!(!old.release().await.expect("the old holder's release"));
    assert!(new.release().await.expect("release"));
}

/// Pitfalls 1, 4, 5 and 6 (pooled session locks, a lock granted as its timeout fired, a
/// cancelled acquire's grant, a zero timeout that waits forever): the store's turns are
/// transaction locks, so tries cancelled at any point, tries that time out waiting for a
/// key's turn and tries with no wait leave no advisory lock on any connection and no grant
/// behind (the lock is free well within the 30 s lease); and a try with no time to wait
/// returns at once even when the key's turn is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_timed_out_tries_leave_no_advisory_lock_and_no_grant() {
    let server = shared_postgres();
    let app = "pgf_cancelled";
    let response = Duration::from_millis(500);
    let store = client(config(&url_of(server, "postgres", app)).response_timeout(response));
    let contender = client(config(&url_of(
        server,
        "postgres",
        "pgf_cancelled_contender",
    )));
    let db = &connect(&server.url()).await;
    let blocker = &connect(&server.url()).await;
    let key = "pgf:cancelled";
    let lease = Duration::from_secs(30);
    store.inspect(key).await.expect("the schema is there");

    // Cancelled at random points, under contention.
    let contending = tokio::spawn({
        let contender = contender.clone();
        async move {
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until {
                if let Ok(guard) = contender
                    .lock(key)
                    .lease(lease)
                    .wait(Duration::from_millis(200))
                    .acquire()
                    .await
                {
                    let _ = guard.release().await;
                }
            }
        }
    });
    for _ in 0..40 {
        let cut = Duration::from_micros(fastrand::u64(0..15_000));
        let request = store
            .lock(key)
            .lease(lease)
            .wait(Duration::from_millis(100));
        if let Ok(Ok(guard)) = timeout(cut, request.acquire()).await {
            drop(guard);
        }
    }
    contending.await.expect("the contender");

    // Timed out waiting for the key's turn, with waits down to none: each within its
    // first try's budget (a request that does not wait: the response timeout; one that
    // waits: its wait, and at least a tenth of the response timeout), although the clean-ups
    // of the tries before wait for the same turn meanwhile.
    take_turn(blocker, SCHEMA, key).await;
    let tries = [
        (Duration::ZERO, response),
        (Duration::from_micros(300), response / 10),
        (Duration::from_millis(50), response / 10),
    ];
    for (wait, budget) in tries {
        let started = Instant::now();
        let outcome = store.lock(key).lease(lease).wait(wait).acquire().await;
        let took = started.elapsed();
        eprintln!("a try with wait {wait:?} on a key whose turn is taken: {took:?}, {outcome:?}");
        assert!(outcome.is_err(), "granted while the key's turn is taken");
        assert!(
            took < budget + Duration::from_millis(400),
            "wait {wait:?}: the request took {took:?}"
        );
    }
    let started = Instant::now();
    let outcome = store.lock(key).try_acquire().await;
    let took = started.elapsed();
    eprintln!("try_acquire on a key whose turn is taken: {took:?}, {outcome:?}");
    assert!(
        took < response + Duration::from_millis(400),
        "try_acquire took {took:?}"
    );
    blocker.batch_execute("COMMIT").await.expect("COMMIT");

    let store = &store;
    eventually(
        "no advisory lock and no holder",
        Duration::from_secs(5),
        || async move {
            let locks = advisory_locks(db, app).await;
            let holders = store
                .inspect(key)
                .await
                .map_err(|err| err.to_string())?
                .holders;
            if locks == 0 && holders.is_empty() {
                Ok(())
            } else {
                Err(format!("{locks} advisory locks, holders {holders:?}"))
            }
        },
    )
    .await;
    let guard = contender
        .lock(key)
        .try_acquire()
        .await
        .expect("try")
        .expect("free");
    assert!(guard.release().await.expect("release"));
}

/// Pitfall 3 (liquibase#872): a holder that vanishes (its process gone: no release, no
/// renewal) holds the lock no longer than its lease on the database's clock.
#[tokio::test]
async fn an_abandoned_holders_lock_is_free_after_its_lease() {
    let server = shared_postgres();
    let gone = client(config(&url_of(server, "postgres", "pgf_abandoned")));
    let other = client(config(&url_of(server, "postgres", "pgf_abandoned_other")));
    let db = &connect(&server.url()).await;
    let key = "pgf:abandoned";
    // No renewals: as far as the store can tell, its holder is gone.
    let guard = gone
        .lock(key)
        .lease(Duration::from_secs(1))
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    let (_, until) = writer(db, SCHEMA, key).await.expect("a writer");

    let next = other
        .lock(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the lock once the lease ran out");
    let (_, next_until) = writer(db, SCHEMA, key).await.expect("a writer");
    let granted_at = next_until - 30_000_000;
    assert!(
        granted_at >= until,
        "granted at {granted_at} µs, before the lease ran out ({until} µs)"
    );
    assert!(
        granted_at - until < 1_000_000,
        "granted {} ms after the lease ran out",
        (granted_at - until) / 1_000
    );
    assert!(next.release().await.expect("release"));
    assert!(!guard.release().await.expect("the gone holder's release"));
}
