//! Fenced writes (`distlock::fenced`) against real redis-server processes and a real SQLite
//! database: the Redis guard accepts increasing and equal tokens and refuses a lower one without
//! changing anything, runs any write commands, keeps its fence for as long as the data, and
//! works on Redis Cluster; and the scenario fencing exists for — a holder paused past its lease
//! while the next holder writes — ends with the late write refused, by the Redis guard and by
//! the SQL pattern. Each scenario also runs without the fence, to show it does lose the next
//! holder's write there: the test can tell the difference. Then the day-two cases: writes
//! through a `ConnectionManager` resume after the data's Redis restarts (a plain multiplexed
//! connection does not), and an operator's raise of the fence after a forced unlock — on Redis
//! (`fenced::raise`) and in SQL — makes the evicted holder's late write stale.

use std::time::Duration;

use crate::support::cluster::shared_cluster;
use crate::support::RedisServer;
use distlock::fenced::{self, FenceRaise, FencedWrite};
use distlock::{Client, Config, FencingToken};

/// The lease of the paused holder: short, so the scenario is quick.
const SHORT_LEASE: Duration = Duration::from_millis(300);

fn client(server: &RedisServer) -> Client {
    Client::new(Config::from_url(&server.url()).expect("url")).expect("client")
}

async fn connection(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test redis-server")
}

/// `n` tokens of successive grants of the lock `name`, increasing.
async fn tokens(client: &Client, name: &str, n: usize) -> Vec<FencingToken> {
    let mut tokens = Vec::new();
    for _ in 0..n {
        let guard = client.lock(name).acquire().await.expect("acquire");
        tokens.push(guard.fencing_token().expect("fencing is on by default"));
        assert!(guard.release().await.expect("release"));
    }
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{tokens:?}"
    );
    tokens
}

async fn get(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET")
}

async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_accepts_increasing_tokens_and_refuses_a_lower_one_leaving_the_value_untouched() {
    let server = RedisServer::start();
    let mut conn = connection(&server).await;
    let t = tokens(&client(&server), "stock", 3).await;

    let first = fenced::set(&mut conn, "stock", 10, t[0])
        .await
        .expect("set");
    assert_eq!(first, FencedWrite::Applied(()));
    let third = fenced::set(&mut conn, "stock", 30, t[2])
        .await
        .expect("set");
    assert_eq!(third, FencedWrite::Applied(()));

    let second = fenced::set(&mut conn, "stock", 20, t[1])
        .await
        .expect("set");
    assert_eq!(second, FencedWrite::Stale { highest: t[2] });
    assert!(!second.is_applied());
    assert_eq!(get(&mut conn, "stock").await.as_deref(), Some("30"));
    assert_eq!(
        get(&mut conn, &fenced::fence_key("stock")).await,
        Some(t[2].to_string()),
        "a refused write leaves the fence at the highest token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_equal_token_is_current_so_one_grant_writes_repeatedly() {
    let server = RedisServer::start();
    let mut conn = connection(&server).await;
    let t = tokens(&client(&server), "counter", 1).await[0];
    for value in 1..=3 {
        let outcome = fenced::set(&mut conn, "counter", value, t)
            .await
            .expect("set");
        assert!(outcome.is_applied(), "write {value} with the same token");
    }
    assert_eq!(get(&mut conn, "counter").await.as_deref(), Some("3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_too_long_for_the_script_is_refused_before_anything_is_written() {
    let server = RedisServer::start();
    let mut conn = connection(&server).await;
    let t = tokens(&client(&server), "long", 1).await[0];
    let mut push = redis::cmd("RPUSH");
    push.arg("long");
    for i in 0..8_000 {
        push.arg(i);
    }
    let err = fenced::pipe("long", t)
        .cmd(&push)
        .query_async::<i64>(&mut conn)
        .await
        .expect_err("more arguments than Lua's unpack takes");
    assert!(err.to_string().contains("split it"), "{err}");
    assert_eq!(
        get(&mut conn, &fenced::fence_key("long")).await,
        None,
        "no fence raised"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_pipeline_runs_any_commands_and_returns_their_replies() {
    let server = RedisServer::start();
    let mut conn = connection(&server).await;
    let t = tokens(&client(&server), "order:42", 2).await;

    let applied = fenced::pipe("order:42", t[1])
        .cmd(redis::cmd("HSET").arg("order:42").arg("status").arg("paid"))
        .cmd(redis::cmd("HINCRBY").arg("order:42").arg("version").arg(1))
        .cmd(redis::cmd("HGET").arg("order:42").arg("missing"))
        .query_async::<(i64, i64, Option<String>)>(&mut conn)
        .await
        .expect("pipe");
    assert_eq!(applied, FencedWrite::Applied((1, 1, None)));

    let stale = fenced::pipe("order:42", t[0])
        .cmd(
            redis::cmd("HSET")
                .arg("order:42")
                .arg("status")
                .arg("cancelled"),
        )
        .query_async::<(i64,)>(&mut conn)
        .await
        .expect("pipe");
    assert_eq!(stale, FencedWrite::Stale { highest: t[1] });
    let status: String = redis::cmd("HGET")
        .arg("order:42")
        .arg("status")
        .query_async(&mut conn)
        .await
        .expect("HGET");
    assert_eq!(status, "paid");

    // No commands: only the fence is raised, which makes lower tokens stale.
    let raised = fenced::pipe("bump", t[1])
        .query_async::<()>(&mut conn)
        .await
        .expect("pipe");
    assert!(raised.is_applied());
    let stale = fenced::set(&mut conn, "bump", 1, t[0]).await.expect("set");
    assert_eq!(stale, FencedWrite::Stale { highest: t[1] });

    // A fence key of one's own choosing is the one consulted.
    let own = fenced::pipe("order:42", t[0])
        .fence_key("order:42:my-fence")
        .cmd(redis::cmd("HSET").arg("order:42").arg("note").arg("x"))
        .query_async::<(i64,)>(&mut conn)
        .await
        .expect("pipe");
    assert!(own.is_applied());
    assert_eq!(
        get(&mut conn, "order:42:my-fence").await,
        Some(t[0].to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_lives_as_long_as_the_data_it_guards() {
    let server = RedisServer::start();
    let mut conn = connection(&server).await;
    let t = tokens(&client(&server), "session", 2).await;
    let fence = fenced::fence_key("session");

    let expiring = fenced::pipe("session", t[0])
        .cmd(
            redis::cmd("SET")
                .arg("session")
                .arg("a")
                .arg("PX")
                .arg(60_000),
        )
        .query_async::<()>(&mut conn)
        .await
        .expect("pipe");
    assert!(expiring.is_applied());
    let ttl = pttl(&mut conn, &fence).await;
    assert!(
        (50_000..=60_000).contains(&ttl),
        "the fence takes the value's TTL: {ttl} ms"
    );

    let lasting = fenced::set(&mut conn, "session", "b", t[1])
        .await
        .expect("set");
    assert!(lasting.is_applied());
    assert_eq!(
        pttl(&mut conn, &fence).await,
        -1,
        "a value without TTL keeps its fence for good"
    );

    let deleted = fenced::pipe("session", t[1])
        .cmd(redis::cmd("DEL").arg("session"))
        .query_async::<(i64,)>(&mut conn)
        .await
        .expect("pipe");
    assert_eq!(deleted, FencedWrite::Applied((1,)));
    assert_eq!(pttl(&mut conn, &fence).await, -1);
    let stale = fenced::set(&mut conn, "session", "stale", t[0])
        .await
        .expect("set");
    assert_eq!(
        stale,
        FencedWrite::Stale { highest: t[1] },
        "a deleted value cannot be written back by a stale holder"
    );
    assert_eq!(get(&mut conn, "session").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_key_holding_no_token_is_an_error_naming_it() {
    let server = RedisServer::start();
    let mut conn = connection(&server).await;
    let t = tokens(&client(&server), "k", 1).await[0];
    let () = redis::cmd("SET")
        .arg(fenced::fence_key("k"))
        .arg("not a token")
        .query_async(&mut conn)
        .await
        .expect("SET");
    let err = fenced::set(&mut conn, "k", 1, t)
        .await
        .expect_err("a fence key holding text");
    let message = err.to_string();
    assert!(
        message.contains("{k}:fence") && message.contains("does not hold a fencing token"),
        "{message}"
    );
    assert_eq!(get(&mut conn, "k").await, None, "nothing was written");
}

// ---- the paused holder ------------------------------------------------------------------

/// Where the stock lives in the scenario, and whether its writes check the token.
enum Stock {
    Redis(redis::aio::MultiplexedConnection),
    Sqlite(rusqlite::Connection),
}

const SKU: &str = "apples";

impl Stock {
    async fn redis(server: &RedisServer, initial: i64) -> Stock {
        let mut conn = connection(server).await;
        let () = redis::cmd("SET")
            .arg(SKU)
            .arg(initial)
            .query_async(&mut conn)
            .await
            .expect("SET");
        Stock::Redis(conn)
    }

    fn sqlite(initial: i64) -> Stock {
        let db = rusqlite::Connection::open_in_memory().expect("open SQLite");
        db.execute_batch(
            "CREATE TABLE stock (
                 sku TEXT PRIMARY KEY,
                 quantity INTEGER NOT NULL,
                 fence INTEGER NOT NULL DEFAULT 0
             )",
        )
        .expect("create table");
        db.execute(
            "INSERT INTO stock (sku, quantity) VALUES (?1, ?2)",
            rusqlite::params![SKU, initial],
        )
        .expect("insert");
        Stock::Sqlite(db)
    }

    async fn read(&mut self) -> i64 {
        match self {
            Stock::Redis(conn) => redis::cmd("GET")
                .arg(SKU)
                .query_async(conn)
                .await
                .expect("GET"),
            Stock::Sqlite(db) => db
                .query_row("SELECT quantity FROM stock WHERE sku = ?1", [SKU], |row| {
                    row.get(0)
                })
                .expect("SELECT"),
        }
    }

    /// Writes `quantity`, checking `token` when `fenced`. Whether the write was applied.
    async fn write(&mut self, quantity: i64, token: FencingToken, fenced: bool) -> bool {
        match (self, fenced) {
            (Stock::Redis(conn), true) => fenced::set(conn, SKU, quantity, token)
                .await
                .expect("fenced SET")
                .is_applied(),
            (Stock::Redis(conn), false) => {
                let () = redis::cmd("SET")
                    .arg(SKU)
                    .arg(quantity)
                    .query_async(conn)
                    .await
                    .expect("SET");
                true
            }
            (Stock::Sqlite(db), true) => {
                let token = token.as_i64().expect("a token fits a SQL integer");
                let updated = db
                    .execute(
                        "UPDATE stock SET quantity = ?1, fence = ?2 WHERE sku = ?3 AND fence <= ?2",
                        rusqlite::params![quantity, token, SKU],
                    )
                    .expect("UPDATE");
                updated == 1
            }
            (Stock::Sqlite(db), false) => {
                let updated = db
                    .execute(
                        "UPDATE stock SET quantity = ?1 WHERE sku = ?2",
                        rusqlite::params![quantity, SKU],
                    )
                    .expect("UPDATE");
                updated == 1
            }
        }
    }
}

/// What the paused holder's late write did.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    late_write_applied: bool,
    final_stock: i64,
}

/// Holder A takes the lock with a short lease and no watchdog, reads the stock (10) and
/// "pauses" (a GC pause, a stalled VM: it does nothing) past its lease. Holder B's acquire
/// completes once A's lease has run out; B sells 1 (writes 9). Then A wakes and writes the
/// 3 it meant to sell (7): with the fence that write is refused and B's sale stands (9);
/// without it, B's sale is lost (7).
async fn paused_holder(client: &Client, name: &str, stock: &mut Stock, fenced: bool) -> Outcome {
    let a = client
        .lock(name)
        .lease(SHORT_LEASE)
        .watchdog(false)
        .acquire()
        .await
        .expect("A acquires");
    let a_token = a.fencing_token().expect("fenced");
    let a_read = stock.read().await;
    assert_eq!(a_read, 10);

    // A is paused here. B waits for the lock, which frees when A's lease runs out.
    let b = client
        .lock(name)
        .wait(SHORT_LEASE * 20)
        .acquire()
        .await
        .expect("B acquires once A's lease has run out");
    let b_token = b.fencing_token().expect("fenced");
    assert!(b_token > a_token, "{b_token} after {a_token}");
    let b_read = stock.read().await;
    assert!(stock.write(b_read - 1, b_token, fenced).await, "B's write");
    assert!(b.release().await.expect("release"));

    // A wakes, unaware (it would know if it looked: its lease is gone), and writes.
    assert!(!a.is_held());
    let late_write_applied = stock.write(a_read - 3, a_token, fenced).await;
    assert!(!a.release().await.expect("release"), "A's lock was gone");
    Outcome {
        late_write_applied,
        final_stock: stock.read().await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_write_is_refused_by_the_redis_guard() {
    let server = RedisServer::start();
    let client = client(&server);

    let mut stock = Stock::redis(&server, 10).await;
    let fenced = paused_holder(&client, "fenced", &mut stock, true).await;
    assert_eq!(
        fenced,
        Outcome {
            late_write_applied: false,
            final_stock: 9
        },
        "the fence refuses the paused holder's write, B's sale stands"
    );

    // The same without the fence: B's sale is lost. (Shows the scenario really puts a late
    // write after B's, so the assertion above can fail.)
    let () = redis::cmd("FLUSHALL")
        .query(&mut server.connection())
        .expect("FLUSHALL");
    let mut stock = Stock::redis(&server, 10).await;
    let plain = paused_holder(&client, "plain", &mut stock, false).await;
    assert_eq!(
        plain,
        Outcome {
            late_write_applied: true,
            final_stock: 7
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_write_is_refused_by_the_sql_fence_condition() {
    let server = RedisServer::start();
    let client = client(&server);

    let mut stock = Stock::sqlite(10);
    let fenced = paused_holder(&client, "fenced", &mut stock, true).await;
    assert_eq!(
        fenced,
        Outcome {
            late_write_applied: false,
            final_stock: 9
        },
        "UPDATE … WHERE fence <= token updates 0 rows for the paused holder"
    );

    let mut stock = Stock::sqlite(10);
    let plain = paused_holder(&client, "plain", &mut stock, false).await;
    assert_eq!(
        plain,
        Outcome {
            late_write_applied: true,
            final_stock: 7
        }
    );
}

// ---- Redis Cluster ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_run_on_a_cluster_for_keys_with_and_without_hash_tags() {
    let cluster = shared_cluster();
    let locks = Client::new(Config::cluster(cluster.urls()).expect("urls")).expect("client");
    let mut conn = redis::cluster::ClusterClient::new(cluster.urls())
        .expect("cluster urls")
        .get_async_connection()
        .await
        .expect("connect to the cluster");

    for key in ["inventory:apples", "{user:1}:balance", "a{b", "x{a}{b}"] {
        let fence = fenced::fence_key(key);
        assert_eq!(
            cluster.slot_of(&fence),
            cluster.slot_of(key),
            "{fence} shares {key}'s slot"
        );
        let t = tokens(&locks, key, 2).await;
        let applied = fenced::set(&mut conn, key, "new", t[1]).await.expect("set");
        assert!(applied.is_applied(), "{key}");
        let stale = fenced::set(&mut conn, key, "stale", t[0])
            .await
            .expect("set");
        assert_eq!(stale, FencedWrite::Stale { highest: t[1] }, "{key}");
        let value: String = redis::cmd("GET")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("GET");
        assert_eq!(value, "new", "{key}");
    }
}

// ---- a restart of the data's Redis ------------------------------------------------------

/// How long a write may keep failing while the connection comes back: the server restarts at
/// once; a `ConnectionManager` reconnects within its first backoff steps (milliseconds).
const RECONNECT_WITHIN: Duration = Duration::from_secs(15);

/// A leader writes through a `ConnectionManager` to a data Redis apart from the locks' Redis;
/// the data's Redis restarts mid-leadership. The test only retries a failed write (bounded):
/// no reconnect code. A write succeeds again, with the leader's epoch as its token. A
/// `MultiplexedConnection` made before the restart stays broken, which is what this guards
/// against.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_through_a_connection_manager_resume_after_the_data_redis_restarts() {
    let locks = RedisServer::start();
    let mut data = RedisServer::start();
    let leadership = client(&locks)
        .election("ledger-writer")
        .campaign()
        .await
        .expect("campaign");
    let token = leadership.epoch();
    let redis_client = redis::Client::open(data.url()).expect("url");
    let mut managed = redis_client
        .get_connection_manager()
        .await
        .expect("connection manager");
    let mut multiplexed = connection(&data).await;
    let before = fenced::set(&mut managed, "ledger", "before", token).await;
    assert!(before.expect("set").is_applied());
    let before = fenced::set(&mut multiplexed, "ledger", "before", token).await;
    assert!(before.expect("set").is_applied());

    data.restart();

    let started = std::time::Instant::now();
    let mut failures = 0;
    let resumed = loop {
        match fenced::set(&mut managed, "ledger", "after", token).await {
            Ok(outcome) => break outcome,
            Err(err) => {
                failures += 1;
                assert!(
                    started.elapsed() < RECONNECT_WITHIN,
                    "no write succeeded within {RECONNECT_WITHIN:?} of the restart ({failures} \
                     failures); the last: {err}"
                );
                // A pause between retries, as an application's retry would have.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(
        resumed,
        FencedWrite::Applied(()),
        "after {failures} failures"
    );
    assert!(
        leadership.is_leader(),
        "still leading: the locks' Redis never went away"
    );
    let value: String = redis::cmd("GET")
        .arg("ledger")
        .query_async(&mut managed)
        .await
        .expect("GET");
    assert_eq!(value, "after");
    // The script was gone with the restarted server's cache: sent again with its source.
    let again = fenced::set(&mut managed, "ledger", "again", token).await;
    assert!(again.expect("set").is_applied());

    // The plain multiplexed connection does not come back by itself.
    assert!(
        fenced::set(&mut multiplexed, "ledger", "lost", token)
            .await
            .is_err(),
        "a MultiplexedConnection stays broken after its server restarts"
    );
    leadership.resign().await.expect("resign");
}

// ---- raising a fence after a forced unlock ----------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_forced_unlock_a_raised_fence_refuses_the_evicted_holders_write() {
    let server = RedisServer::start();
    let locks = client(&server);
    let mut conn = connection(&server).await;
    let hung = locks.lock("report").acquire().await.expect("acquire");
    let evicted = hung.fencing_token().expect("fenced");
    let first = fenced::set(&mut conn, "report", "draft", evicted).await;
    assert!(first.expect("set").is_applied());

    let forced = locks.force_unlock("report").await.expect("force_unlock");
    assert!(forced.token > evicted);
    // What the issue found: nothing has written a newer token, so the late write passes.
    let late = fenced::set(&mut conn, "report", "late", evicted).await;
    assert!(late.expect("set").is_applied(), "unfenced before the raise");

    let raised = fenced::raise(&mut conn, "report", forced.token).await;
    assert_eq!(
        raised.expect("raise"),
        FenceRaise::Raised {
            previous: Some(evicted)
        }
    );
    let refused = fenced::set(&mut conn, "report", "later", evicted).await;
    assert_eq!(
        refused.expect("set"),
        FencedWrite::Stale {
            highest: forced.token
        }
    );
    assert_eq!(get(&mut conn, "report").await.as_deref(), Some("late"));

    // The next holder's token is above the raised fence.
    let next = locks.lock("report").acquire().await.expect("acquire");
    let next_token = next.fencing_token().expect("fenced");
    let written = fenced::set(&mut conn, "report", "final", next_token).await;
    assert!(written.expect("set").is_applied());
    assert!(!hung.release().await.expect("release"), "it was evicted");
    assert!(next.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_a_fence_never_lowers_it_and_leaves_a_key_that_holds_no_fence() {
    let server = RedisServer::start();
    let mut conn = connection(&server).await;
    let t = tokens(&client(&server), "stock", 3).await;
    let fence = fenced::fence_key("stock");

    let raised = fenced::raise(&mut conn, "stock", t[1])
        .await
        .expect("raise");
    assert_eq!(raised, FenceRaise::Raised { previous: None });
    assert_eq!(raised.highest(t[1]), t[1]);
    for lower_or_equal in [t[0], t[1]] {
        let kept = fenced::raise(&mut conn, "stock", lower_or_equal).await;
        assert_eq!(
            kept.expect("raise"),
            FenceRaise::AlreadyAtLeast { highest: t[1] },
            "never lowered"
        );
    }
    assert_eq!(get(&mut conn, &fence).await, Some(t[1].to_string()));
    assert_eq!(pttl(&mut conn, &fence).await, -1, "no data, no TTL: kept");

    // An expiring value: the raised fence takes its time to live, as after a write.
    let () = redis::cmd("SET")
        .arg("stock")
        .arg(1)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .expect("SET");
    let raised = fenced::raise(&mut conn, "stock", t[2]).await;
    assert_eq!(
        raised.expect("raise"),
        FenceRaise::Raised {
            previous: Some(t[1])
        }
    );
    let ttl = pttl(&mut conn, &fence).await;
    assert!((50_000..=60_000).contains(&ttl), "{ttl} ms");

    // A fence key of another type, or a string that is no token: an error, left untouched.
    let () = redis::cmd("HSET")
        .arg(fenced::fence_key("profile"))
        .arg("name")
        .arg("x")
        .query_async(&mut conn)
        .await
        .expect("HSET");
    let err = fenced::raise(&mut conn, "profile", t[2])
        .await
        .expect_err("a hash is no fence");
    assert!(
        err.to_string().contains("{profile}:fence") && err.to_string().contains("hash"),
        "{err}"
    );
    let () = redis::cmd("SET")
        .arg(fenced::fence_key("note"))
        .arg("hello")
        .query_async(&mut conn)
        .await
        .expect("SET");
    let err = fenced::raise(&mut conn, "note", t[2])
        .await
        .expect_err("text is no fence");
    assert!(
        err.to_string().contains("does not hold a fencing token"),
        "{err}"
    );
    assert_eq!(
        get(&mut conn, &fenced::fence_key("note")).await.as_deref(),
        Some("hello")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_forced_unlock_the_sql_fence_raised_refuses_the_evicted_holders_update() {
    /// The SQL counterpart of `fenced::raise` (docs/fenced-writes.md), as documented.
    const RAISE: &str = "UPDATE stock SET fence = ?1 WHERE sku = ?2 AND fence < ?1";

    let server = RedisServer::start();
    let locks = client(&server);
    let mut stock = Stock::sqlite(10);
    let hung = locks.lock("stock").acquire().await.expect("acquire");
    let evicted = hung.fencing_token().expect("fenced");
    assert!(stock.write(9, evicted, true).await);

    let forced = locks.force_unlock("stock").await.expect("force_unlock");
    let Stock::Sqlite(db) = &stock else {
        unreachable!("a SQLite stock")
    };
    let raise = |token: FencingToken| {
        db.execute(RAISE, rusqlite::params![token.as_i64().expect("fits"), SKU])
            .expect("UPDATE")
    };
    assert_eq!(raise(forced.token), 1, "raised");
    assert_eq!(raise(evicted), 0, "never lowered");
    assert_eq!(raise(forced.token), 0, "already there");
    let fence: i64 = db
        .query_row("SELECT fence FROM stock WHERE sku = ?1", [SKU], |row| {
            row.get(0)
        })
        .expect("SELECT");
    assert_eq!(fence, forced.token.as_i64().expect("fits"));

    assert!(
        !stock.write(7, evicted, true).await,
        "the evicted holder's UPDATE finds 0 rows"
    );
    assert_eq!(stock.read().await, 9);
    let next = locks.lock("stock").acquire().await.expect("acquire");
    assert!(
        stock
            .write(8, next.fencing_token().expect("fenced"), true)
            .await
    );
    assert!(next.release().await.expect("release"));
}
