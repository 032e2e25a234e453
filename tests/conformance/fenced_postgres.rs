//! `distlock::fenced::postgres` against a real PostgreSQL server (`support/postgres.rs`): a
//! fenced transaction holds the key's turn for its length, so a holder frozen past its lease
//! writes nothing once the next holder is granted, and a transaction open across an expiry
//! keeps the next holder — and a forced unlock — out until it commits or rolls back; a holder
//! frozen inside its transaction holds the key no longer than the bound the transaction sets.
//! Every kind of grant is checked as the holder it is. The fence column refuses a lower token
//! in another database; a guard of a Redis or in-process client, and a client on a database
//! without the store's objects, are refused with errors that say so. Events, not sleeps: a
//! waiter is seen waiting for the key's turn in `pg_locks`, a lease seen over on the
//! database's clock in the key's row.

use std::future::Future;
use std::time::Duration;

use crate::support::postgres::{shared_postgres, PostgresServer};
use crate::support::RedisServer;
use distlock::fenced::postgres::{self as fenced_pg, FencedError};
use distlock::fenced::FencedWrite;
use distlock::{Client, Config, FencingToken};

/// The lease of a holder that freezes: short, so the scenarios are quick.
const SHORT_LEASE: Duration = Duration::from_secs(1);

/// The lock clients' response timeout: a waiter's try waits this long for a key's turn held
/// by an open fenced transaction (the scenarios hold one for a few seconds at most).
const PATIENT: Duration = Duration::from_secs(10);

/// How long an event may take on a loaded 2-core machine.
const EVENT: Duration = Duration::from_secs(15);

/// The schema the lock clients keep their objects in (the store's default).
const SCHEMA: &str = "distlock";

/// A prefix of the test's own, so that no other test's keys meet its keys.
fn prefix(test: &str) -> String {
    format!("fenced-pg:{test}:{}:", uuid::Uuid::new_v4().simple())
}

/// A lock client on the shared server, as a process of its own would have.
fn locks(prefix: &str, response_timeout: Duration) -> Client {
    let config = Config::postgres(&shared_postgres().url())
        .expect("url")
        .key_prefix(prefix)
        .response_timeout(response_timeout);
    Client::new(config).expect("client")
}

/// The name of the key's row (`{prefix}{{name}}`).
fn row_name(prefix: &str, key: &str) -> String {
    format!("{prefix}{{{key}}}")
}

/// A table of the test's own in the lock database, written under the lock.
async fn ledger(db: &tokio_postgres::Client) -> String {
    let table = format!("ledger_{}", uuid::Uuid::new_v4().simple());
    db.batch_execute(&format!(
        "CREATE TABLE {table} (n serial PRIMARY KEY, writer text NOT NULL)"
    ))
    .await
    .expect("create the ledger");
    table
}

async fn write(db: &impl tokio_postgres::GenericClient, table: &str, writer: &str) {
    db.execute(
        &format!("INSERT INTO {table} (writer) VALUES ($1)"),
        &[&writer],
    )
    .await
    .expect("insert");
}

async fn writers(db: &tokio_postgres::Client, table: &str) -> Vec<String> {
    db.query(&format!("SELECT writer FROM {table} ORDER BY n"), &[])
        .await
        .expect("select")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Whether `db` is outside any transaction and holds no advisory lock: a refusal left
/// nothing behind. (A simple query: its implicit transaction starts with it, so `now()` is
/// its own start unless a transaction was open before.)
async fn left_nothing_open(db: &tokio_postgres::Client) {
    let messages = db
        .simple_query(
            "SELECT now() = statement_timestamp(), \
                    (SELECT count(*) FROM pg_locks \
                     WHERE locktype = 'advisory' AND pid = pg_backend_pid())",
        )
        .await
        .expect("look at the session");
    let row = messages
        .iter()
        .find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .expect("a row");
    assert_eq!(row.get(0), Some("t"), "a transaction is still open");
    assert_eq!(row.get(1), Some("0"), "an advisory lock is still held");
}

/// Polls `check` every 10 ms until it gives a value, panicking with `what` after [`EVENT`].
async fn until<T, F>(what: &str, mut check: impl FnMut() -> F) -> T
where
    F: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + EVENT;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(reason) if tokio::time::Instant::now() >= deadline => {
                panic!("timed out after {EVENT:?} waiting for {what}: {reason}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// Waits until the lease of the writer holding the row `name` now is over on the database's
/// clock (whoever holds the key after it).
async fn lease_over_in_the_database(db: &tokio_postgres::Client, name: &str) {
    let Some(ends) = db
        .query_opt(
            &format!("SELECT (state->'w'->>1)::bigint FROM {SCHEMA}.locks WHERE name = $1"),
            &[&name],
        )
        .await
        .expect("the writer's lease")
        .and_then(|row| row.get::<_, Option<i64>>(0))
    else {
        return; // no writer, or the row swept away: over
    };
    until("the lease to be over on the database's clock", || async {
        let over: bool = db
            .query_one(
                "SELECT $1::bigint <= extract(epoch FROM clock_timestamp()) * 1e6",
                &[&ends],
            )
            .await
            .map_err(|err| err.to_string())?
            .get(0);
        if over {
            Ok(())
        } else {
            Err("the lease still runs".to_owned())
        }
    })
    .await;
}

/// Waits until a session waits for the turn of the row `name` (an advisory lock not granted).
async fn waiting_for_the_turn(db: &tokio_postgres::Client, name: &str) {
    until("a session to wait for the key's turn", || async {
        let waiting: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                 AND objid = ((hashtext($1)::bigint + 4294967296) % 4294967296)::oid",
                &[&name],
            )
            .await
            .map_err(|err| err.to_string())?
            .get(0);
        if waiting > 0 {
            Ok(())
        } else {
            Err("nobody waits".to_owned())
        }
    })
    .await;
}

/// Whether `task` is still running after a moment (it is waiting for something).
async fn still_running<T>(task: &mut tokio::task::JoinHandle<T>) -> bool {
    tokio::time::timeout(Duration::from_millis(300), task)
        .await
        .is_err()
}

/// The error of a fenced transaction expected to be refused (`Transaction` is not `Debug`).
fn refusal<T>(begun: Result<T, FencedError>, why: &str) -> FencedError {
    match begun {
        Ok(_) => panic!("the fenced transaction was begun: {why}"),
        Err(err) => err,
    }
}

fn not_holder(err: FencedError) -> (String, bool, Option<FencingToken>) {
    match err {
        FencedError::NotHolder {
            key,
            held_by_another,
            highest,
        } => (key, held_by_another, highest),
        other => panic!("expected NotHolder, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_past_its_lease_writes_nothing_after_the_next_holders_grant() {
    let server = shared_postgres();
    let prefix = prefix("frozen");
    let (locks_a, locks_b) = (locks(&prefix, PATIENT), locks(&prefix, PATIENT));
    let (mut db_a, mut db_b, observer) = (
        server.connect().await,
        server.connect().await,
        server.connect().await,
    );
    let table = ledger(&observer).await;
    let name = row_name(&prefix, "stock");

    let a = locks_a
        .lock("stock")
        .lease(SHORT_LEASE)
        .watchdog(false)
        .acquire()
        .await
        .expect("A acquires");
    let a_token = a.fencing_token().expect("fenced");
    let held = fenced_pg::begin(&a, &mut db_a).await.expect("A holds it");
    write(&held, &table, "A while held").await;
    held.commit().await.expect("commit");

    // A freezes past its lease: nobody holds the lock, and A's check says so.
    a.lost().await;
    lease_over_in_the_database(&observer, &name).await;
    let (key, held_by_another, highest) = not_holder(refusal(
        fenced_pg::begin(&a, &mut db_a).await,
        "A's lease is over",
    ));
    assert_eq!(key, "stock");
    assert!(!held_by_another, "nobody took the lock yet");
    assert!(highest >= Some(a_token), "{highest:?} < {a_token}");
    left_nothing_open(&db_a).await;

    // B is granted the lock; A, waking, is refused, and B writes.
    let b = locks_b
        .lock("stock")
        .wait(EVENT)
        .acquire()
        .await
        .expect("B acquires");
    let b_token = b.fencing_token().expect("fenced");
    assert!(b_token > a_token);
    let refused = refusal(fenced_pg::begin(&a, &mut db_a).await, "B holds the lock");
    assert!(
        refused.to_string().contains("another grant holds it now"),
        "{refused}"
    );
    let (_, held_by_another, highest) = not_holder(refused);
    assert!(held_by_another);
    assert!(highest >= Some(b_token), "{highest:?} < {b_token}");
    left_nothing_open(&db_a).await;
    let transaction = fenced_pg::begin(&b, &mut db_b).await.expect("B holds it");
    write(&transaction, &table, "B").await;
    transaction.commit().await.expect("commit");

    assert_eq!(writers(&observer, &table).await, ["A while held", "B"]);
    assert!(b.release().await.expect("release"));
}

/// Holder A (short lease, no watchdog) opens a fenced transaction and writes; B asks for the
/// lock and waits for its turn; A's lease runs out on the database's clock while B still
/// waits; A writes again and ends the transaction as `commit` says; only then is B granted.
async fn open_across_an_expiry(commit: bool) {
    let server = shared_postgres();
    let prefix = prefix(if commit {
        "across-commit"
    } else {
        "across-rollback"
    });
    let (locks_a, locks_b) = (locks(&prefix, PATIENT), locks(&prefix, PATIENT));
    let (mut db_a, observer) = (server.connect().await, server.connect().await);
    let table = ledger(&observer).await;
    let name = row_name(&prefix, "stock");

    let a = locks_a
        .lock("stock")
        .lease(SHORT_LEASE)
        .watchdog(false)
        .acquire()
        .await
        .expect("A acquires");
    let a_token = a.fencing_token().expect("fenced");
    let transaction = fenced_pg::begin(&a, &mut db_a).await.expect("A holds it");
    write(&transaction, &table, "A before the expiry").await;

    let mut b = tokio::spawn(async move {
        let guard = locks_b.lock("stock").wait(EVENT).acquire().await;
        (guard, locks_b)
    });
    lease_over_in_the_database(&observer, &name).await;
    assert!(
        still_running(&mut b).await,
        "B was granted the lock while A's fenced transaction was open"
    );
    // B's try waits for the key's turn, which A's transaction holds.
    waiting_for_the_turn(&observer, &name).await;

    write(&transaction, &table, "A after the expiry").await;
    if commit {
        transaction
            .commit()
            .await
            .expect("A commits after its lease ran out");
    } else {
        transaction.rollback().await.expect("rollback");
    }
    let (guard, _locks_b) = tokio::time::timeout(EVENT, b)
        .await
        .expect("B is granted once A's transaction ends")
        .expect("task");
    let guard = guard.expect("B acquires");
    assert!(guard.fencing_token().expect("fenced") > a_token);

    let expected: &[&str] = if commit {
        &["A before the expiry", "A after the expiry"]
    } else {
        &[]
    };
    assert_eq!(writers(&observer, &table).await, expected);
    let (_, held_by_another, _) =
        not_holder(refusal(fenced_pg::begin(&a, &mut db_a).await, "B holds it"));
    assert!(held_by_another);
    assert!(guard.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_open_across_an_expiry_keeps_the_next_holder_out_until_it_commits() {
    open_across_an_expiry(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_open_across_an_expiry_keeps_the_next_holder_out_until_it_rolls_back() {
    open_across_an_expiry(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_unlock_waits_for_an_open_fenced_transaction() {
    let server = shared_postgres();
    let prefix = prefix("forced");
    let (locks_a, operator) = (locks(&prefix, PATIENT), locks(&prefix, PATIENT));
    let (mut db_a, observer) = (server.connect().await, server.connect().await);
    let table = ledger(&observer).await;
    let name = row_name(&prefix, "stock");

    let a = locks_a.lock("stock").acquire().await.expect("A acquires");
    let a_token = a.fencing_token().expect("fenced");
    let transaction = fenced_pg::begin(&a, &mut db_a).await.expect("A holds it");
    write(&transaction, &table, "A").await;

    let mut forced = tokio::spawn(async move { operator.force_unlock("stock").await });
    assert!(
        still_running(&mut forced).await,
        "the forced unlock went through an open fenced transaction"
    );
    waiting_for_the_turn(&observer, &name).await;
    transaction.commit().await.expect("A commits");
    let forced = tokio::time::timeout(EVENT, forced)
        .await
        .expect("the forced unlock ends once A commits")
        .expect("task")
        .expect("force_unlock");
    assert_eq!(forced.evicted.len(), 1, "{forced:?}");
    assert!(forced.token > a_token);

    assert_eq!(writers(&observer, &table).await, ["A"]);
    let (_, held_by_another, highest) = not_holder(refusal(
        fenced_pg::begin(&a, &mut db_a).await,
        "A was evicted",
    ));
    assert!(!held_by_another);
    assert!(highest >= Some(forced.token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_inside_its_fenced_transaction_holds_the_key_for_twice_the_response_timeout(
) {
    let server = shared_postgres();
    let prefix = prefix("frozen-inside");
    // A's client: the default response timeout (1 s), so its fenced transactions may idle 2 s.
    let (locks_a, locks_b) = (
        locks(&prefix, Duration::from_secs(1)),
        locks(&prefix, PATIENT),
    );
    let (mut db_a, observer) = (server.connect().await, server.connect().await);
    let table = ledger(&observer).await;

    let a = locks_a
        .lock("stock")
        .lease(SHORT_LEASE)
        .watchdog(false)
        .acquire()
        .await
        .expect("A acquires");
    let transaction = fenced_pg::begin(&a, &mut db_a).await.expect("A holds it");
    write(&transaction, &table, "A").await;
    let frozen = std::time::Instant::now();

    // A stops here, its transaction open: its lease runs out after 1 s, but B is granted only
    // once the server has ended A's session, 2 s after A's last statement.
    let b = locks_b
        .lock("stock")
        .wait(EVENT)
        .acquire()
        .await
        .expect("B acquires once A's session is ended");
    let waited = frozen.elapsed();
    assert!(
        waited >= Duration::from_millis(1900),
        "B was granted {waited:?} after A stopped"
    );
    transaction
        .commit()
        .await
        .expect_err("A's session was ended by the server");
    assert!(db_a.is_closed());
    assert_eq!(writers(&observer, &table).await, Vec::<String>::new());
    drop(a);
    assert!(b.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_grants_permits_and_multi_key_grants_are_checked_as_the_holders_they_are() {
    let server = shared_postgres();
    let prefix = prefix("kinds");
    let locks = locks(&prefix, PATIENT);
    let (mut db_1, mut db_2, observer) = (
        server.connect().await,
        server.connect().await,
        server.connect().await,
    );

    // Two readers: their fenced transactions run side by side (the turn is shared).
    let short = locks
        .read_lock("report")
        .lease(SHORT_LEASE)
        .watchdog(false)
        .acquire()
        .await
        .expect("read");
    let long = locks.read_lock("report").acquire().await.expect("read");
    let first = fenced_pg::begin(&short, &mut db_1).await.expect("reader 1");
    let second = tokio::time::timeout(EVENT, fenced_pg::begin(&long, &mut db_2))
        .await
        .expect("a second fenced transaction does not wait for the first")
        .expect("reader 2");
    first.rollback().await.expect("rollback");
    second.rollback().await.expect("rollback");
    short.lost().await;
    // Its lease runs a little longer on the database's clock than the process counts it.
    let deadline = std::time::Instant::now() + EVENT;
    let refused = loop {
        match fenced_pg::begin(&short, &mut db_1).await {
            Ok(transaction) => {
                transaction.rollback().await.expect("rollback");
                assert!(
                    std::time::Instant::now() < deadline,
                    "the lease never ran out"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(err) => break err,
        }
    };
    let (_, held_by_another, _) = not_holder(refused);
    assert!(held_by_another, "the other reader holds the key");

    // A semaphore permit, until the permits are force-freed.
    let permit = locks
        .semaphore("exports", 2)
        .acquire()
        .await
        .expect("permit");
    let transaction = fenced_pg::begin(&permit, &mut db_1).await.expect("permit");
    transaction.rollback().await.expect("rollback");
    locks.force_unlock("exports").await.expect("force_unlock");
    let (key, held_by_another, _) =
        not_holder(refusal(fenced_pg::begin(&permit, &mut db_1).await, "freed"));
    assert_eq!((key.as_str(), held_by_another), ("exports", false));

    // Several keys: each is checked, and the refusal names the one that is gone.
    let both = locks
        .lock_all(["a", "b"])
        .acquire()
        .await
        .expect("lock_all");
    let transaction = fenced_pg::begin(&both, &mut db_1).await.expect("both");
    let turns: i64 = observer
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND mode = 'ShareLock' AND objid IN ( \
                 ((hashtext($1)::bigint + 4294967296) % 4294967296)::oid, \
                 ((hashtext($2)::bigint + 4294967296) % 4294967296)::oid)",
            &[&row_name(&prefix, "a"), &row_name(&prefix, "b")],
        )
        .await
        .expect("pg_locks")
        .get(0);
    assert_eq!(turns, 2, "both keys' turns are held, shared");
    transaction.rollback().await.expect("rollback");
    locks.force_unlock("b").await.expect("force_unlock");
    let (key, _, _) = not_holder(refusal(
        fenced_pg::begin(&both, &mut db_1).await,
        "b is gone",
    ));
    assert_eq!(key, "b");
    left_nothing_open(&db_1).await;
}

/// A database of the test's own on the shared server, and a client connected to it.
async fn other_database(server: &PostgresServer) -> (tokio_postgres::Client, String) {
    let name = format!("data_{}", uuid::Uuid::new_v4().simple());
    let admin = server.connect().await;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    let url = format!("postgres://postgres@127.0.0.1:{}/{name}", server.port());
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_column_refuses_a_lower_token_and_leaves_the_row_as_it_was() {
    let server = shared_postgres();
    let locks = locks(&prefix("column"), PATIENT);
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let guard = locks.lock("stock").acquire().await.expect("acquire");
        tokens.push(guard.fencing_token().expect("fenced"));
        assert!(guard.release().await.expect("release"));
    }
    let (mut data, _) = other_database(server).await;
    data.batch_execute(
        "CREATE TABLE stock (sku text PRIMARY KEY, quantity bigint NOT NULL, \
             fence bigint NOT NULL DEFAULT 0); \
         INSERT INTO stock (sku, quantity) VALUES ('apples', 10)",
    )
    .await
    .expect("create the table");
    let sell = |token: FencingToken| {
        fenced_pg::update("stock", token)
            .set("quantity = quantity - $1")
            .filter("sku = $2")
    };

    let applied = sell(tokens[1])
        .execute(&data, &[&1_i64, &"apples"])
        .await
        .expect("update");
    assert_eq!(applied, FencedWrite::Applied(1));
    let stale = sell(tokens[0])
        .execute(&data, &[&3_i64, &"apples"])
        .await
        .expect("update");
    assert_eq!(stale, FencedWrite::Stale { highest: tokens[1] });
    let again = sell(tokens[1])
        .execute(&data, &[&1_i64, &"apples"])
        .await
        .expect("update");
    assert_eq!(again, FencedWrite::Applied(1), "an equal token passes");
    let row = data
        .query_one(
            "SELECT quantity, fence FROM stock WHERE sku = 'apples'",
            &[],
        )
        .await
        .expect("select");
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (8, tokens[1].as_i64().expect("fits")),
        "the refused update changed nothing"
    );

    let missing = sell(tokens[2])
        .execute(&data, &[&1_i64, &"pears"])
        .await
        .expect("update");
    assert_eq!(missing, FencedWrite::Applied(0), "no such row");

    // Raising the fence alone (after a forced unlock), inside a transaction of one's own.
    let transaction = data.transaction().await.expect("begin");
    let raised = fenced_pg::update("stock", tokens[2])
        .filter("sku = $1")
        .execute(&transaction, &[&"apples"])
        .await
        .expect("raise");
    assert_eq!(raised, FencedWrite::Applied(1));
    transaction.commit().await.expect("commit");
    let stale = sell(tokens[1])
        .execute(&data, &[&1_i64, &"apples"])
        .await
        .expect("update");
    assert_eq!(stale, FencedWrite::Stale { highest: tokens[2] });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_of_a_redis_or_in_process_client_is_refused_clearly() {
    let mut db = shared_postgres().connect().await;

    let redis = RedisServer::start();
    let on_redis = Client::new(Config::from_url(&redis.url()).expect("url")).expect("client");
    let guard = on_redis.lock("order:7").acquire().await.expect("acquire");
    let refused = refusal(fenced_pg::begin(&guard, &mut db).await, "a Redis lock");
    let message = refused.to_string();
    assert!(
        matches!(&refused, FencedError::NotPostgres { key, store: "Redis" } if key == "order:7"),
        "{refused:?}"
    );
    assert!(
        message.contains("kept in Redis, not in PostgreSQL"),
        "{message}"
    );
    left_nothing_open(&db).await;

    let in_process = Client::new(Config::in_memory()).expect("client");
    let guard = in_process.lock("order:7").acquire().await.expect("acquire");
    let refused = refusal(
        fenced_pg::begin(&guard, &mut db).await,
        "an in-process lock",
    );
    assert!(
        matches!(&refused, FencedError::NotPostgres { store, .. } if store.contains("in-process")),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_a_database_without_the_locks_is_refused_naming_them() {
    let locks = locks(&prefix("elsewhere"), PATIENT);
    let guard = locks.lock("order:7").acquire().await.expect("acquire");
    let (mut elsewhere, _) = other_database(shared_postgres()).await;
    let refused = refusal(
        fenced_pg::begin(&guard, &mut elsewhere).await,
        "no locks there",
    );
    assert!(
        matches!(&refused, FencedError::NotTheLockDatabase { schema, .. } if schema == SCHEMA),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("distlock.locks"), "{refused}");
    left_nothing_open(&elsewhere).await;
}
