//! Fenced writes on the resource side (`distlock::fenced` and the SQL fence column), against a
//! real `redis-server` and SQLite: increasing tokens are applied, a lower one is refused and
//! changes nothing, an equal one (the same holder writing again) is applied; and the scenario
//! fencing exists for — a holder paused past its lease writes after the next holder — ends with
//! the late write rejected, while the same late write without the fence overwrites the next
//! holder's (so the scenario does reproduce the hazard).

mod support;

use std::time::Duration;

use distlock::fenced::{self, FencedWrite};
use distlock::{Client, Config, FencingToken, LockGuard};
use support::RedisServer;

async fn connection(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

async fn get(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET")
}

/// Tokens as a lock hands them out, for the rules alone.
async fn tokens(client: &Client, n: usize) -> Vec<FencingToken> {
    let mut tokens = Vec::new();
    for _ in 0..n {
        let guard = client.lock("fenced:tokens").acquire().await.expect("free");
        tokens.push(guard.fencing_token().expect("fenced"));
        guard.release().await.expect("release");
    }
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_guard_applies_current_tokens_and_refuses_older_ones() {
    let server = RedisServer::start();
    let client = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
    let mut conn = connection(&server).await;
    let [t1, t2, t3] = tokens(&client, 3).await[..] else {
        unreachable!()
    };

    assert_eq!(
        fenced::set(&mut conn, "res", "one", t1).await.unwrap(),
        FencedWrite::Applied
    );
    assert_eq!(
        fenced::set(&mut conn, "res", "three", t3).await.unwrap(),
        FencedWrite::Applied
    );
    // The same holder writes again with its token.
    assert_eq!(
        fenced::set(&mut conn, "res", "three again", t3)
            .await
            .unwrap(),
        FencedWrite::Applied
    );
    // An older holder's late write changes nothing.
    assert_eq!(
        fenced::set(&mut conn, "res", "two", t2).await.unwrap(),
        FencedWrite::Stale { highest: t3.get() }
    );
    assert_eq!(get(&mut conn, "res").await.as_deref(), Some("three again"));
    assert_eq!(
        get(&mut conn, &fenced::fence_key("res")).await,
        Some(t3.get().to_string())
    );

    // Any write command, under a fence key of the caller's choice.
    let mut push = redis::cmd("RPUSH");
    push.arg("orders").arg("a");
    let fence = fenced::fence_key("orders");
    assert!(fenced::write(&mut conn, &fence, t2, &push)
        .await
        .unwrap()
        .is_applied());
    let mut late = redis::cmd("RPUSH");
    late.arg("orders").arg("late");
    assert!(fenced::write(&mut conn, &fence, t3, &push)
        .await
        .unwrap()
        .is_applied());
    assert!(!fenced::write(&mut conn, &fence, t1, &late)
        .await
        .unwrap()
        .is_applied());
    let orders: Vec<String> = redis::cmd("LRANGE")
        .arg("orders")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(orders, ["a", "a"]);
}

/// A takes the lock and is paused past its lease (it waits for its own loss, as a stalled
/// process would sleep through it); B then takes the lock and writes; A wakes and writes late.
/// Returns (A's token, B's token, A's guard) after B has written with `write_b`.
async fn paused_holder<F, Fut>(
    client: &Client,
    key: &str,
    write_b: F,
) -> (FencingToken, FencingToken)
where
    F: FnOnce(FencingToken) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let a: LockGuard = client
        .lock(key)
        .lease(Duration::from_millis(200))
        .watchdog(false)
        .acquire()
        .await
        .expect("free");
    let token_a = a.fencing_token().expect("fenced");
    // The pause: A's lease runs out while it is stalled.
    tokio::time::timeout(Duration::from_secs(5), a.lost())
        .await
        .expect("the lease runs out");
    let b = client
        .lock(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("free once A's lease ran out");
    let token_b = b.fencing_token().expect("fenced");
    assert!(token_b > token_a);
    write_b(token_b).await;
    b.release().await.expect("release");
    drop(a);
    (token_a, token_b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_redis_write_is_rejected_with_the_fence_and_wins_without() {
    let server = RedisServer::start();
    let client = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
    let mut conn = connection(&server).await;

    // Fenced: A's late write is refused.
    let (token_a, token_b) = paused_holder(&client, "fenced:paused", |token| {
        let mut conn = conn.clone();
        async move {
            let wrote = fenced::set(&mut conn, "balance", "B", token).await.unwrap();
            assert!(wrote.is_applied());
        }
    })
    .await;
    let late = fenced::set(&mut conn, "balance", "A (late)", token_a)
        .await
        .unwrap();
    assert_eq!(
        late,
        FencedWrite::Stale {
            highest: token_b.get()
        }
    );
    assert_eq!(get(&mut conn, "balance").await.as_deref(), Some("B"));

    // Unfenced, the same schedule loses B's write: the hazard is real.
    paused_holder(&client, "fenced:paused-unfenced", |_| {
        let mut conn = conn.clone();
        async move {
            let () = redis::cmd("SET")
                .arg("plain")
                .arg("B")
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    })
    .await;
    let () = redis::cmd("SET")
        .arg("plain")
        .arg("A (late)")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(get(&mut conn, "plain").await.as_deref(), Some("A (late)"));
}

const UPDATE_FENCED: &str =
    "UPDATE stock SET quantity = ?1, fence = ?2 WHERE sku = ?3 AND fence <= ?2";
const UPDATE_PLAIN: &str = "UPDATE stock SET quantity = ?1 WHERE sku = ?2";

fn stock_db() -> rusqlite::Connection {
    let db = rusqlite::Connection::open_in_memory().expect("sqlite");
    db.execute_batch(
        "CREATE TABLE stock (sku TEXT PRIMARY KEY, quantity INTEGER NOT NULL, \
         fence INTEGER NOT NULL DEFAULT 0);
         INSERT INTO stock (sku, quantity) VALUES ('s1', 100), ('s2', 100);",
    )
    .expect("schema");
    db
}

fn quantity(db: &rusqlite::Connection, sku: &str) -> i64 {
    db.query_row("SELECT quantity FROM stock WHERE sku = ?1", [sku], |row| {
        row.get(0)
    })
    .expect("row")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_sql_update_matches_no_row_with_the_fence_column() {
    let server = RedisServer::start();
    let client = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
    let db = std::sync::Arc::new(std::sync::Mutex::new(stock_db()));
    let bind = |token: FencingToken| i64::try_from(token).expect("a token fits a BIGINT");

    let (token_a, _) = paused_holder(&client, "fenced:sql", |token| {
        let db = db.clone();
        async move {
            let db = db.lock().unwrap();
            let updated = db
                .execute(UPDATE_FENCED, rusqlite::params![90, bind(token), "s1"])
                .unwrap();
            assert_eq!(updated, 1);
        }
    })
    .await;
    {
        let db = db.lock().unwrap();
        let late = db
            .execute(UPDATE_FENCED, rusqlite::params![99, bind(token_a), "s1"])
            .unwrap();
        assert_eq!(late, 0, "the late update matches no row");
        assert_eq!(quantity(&db, "s1"), 90);
    }

    // Without the fence column the late update overwrites B's.
    paused_holder(&client, "fenced:sql-plain", |_| {
        let db = db.clone();
        async move {
            db.lock()
                .unwrap()
                .execute(UPDATE_PLAIN, rusqlite::params![90, "s2"])
                .unwrap();
        }
    })
    .await;
    let db_now = db.lock().unwrap();
    db_now
        .execute(UPDATE_PLAIN, rusqlite::params![99, "s2"])
        .unwrap();
    assert_eq!(quantity(&db_now, "s2"), 99);
}
