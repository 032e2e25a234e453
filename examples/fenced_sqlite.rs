//! Fencing tokens end to end: a lock on a stock row, the row in a real SQL database (SQLite),
//! and a holder that is paused past its lease.
//!
//! 1. Holder A takes the lock (a 300 ms lease, no watchdog) and reads the stock.
//! 2. A stalls — a GC pause, a frozen VM — and its lease runs out meanwhile.
//! 3. Holder B takes the lock, with a greater fencing token, and sells one item.
//! 4. A wakes and writes what it computed before the pause: its read less the 3 it sold.
//!
//! With the fence column (`… WHERE sku = ? AND fence <= ?token`) A's late write matches no row
//! and B's sale stands; the plain `UPDATE` shown after it overwrites B's sale. The example
//! exits with an error if the fenced late write was accepted.
//!
//!     cargo run --example fenced_sqlite
//!
//! Uses `REDIS_URL` (default `redis://127.0.0.1:6379`), or the in-process backend if nothing
//! answers there.

use std::time::Duration;

use distlock::{Client, Config, FencingToken};
use rusqlite::{params, Connection};

const FENCED_UPDATE: &str =
    "UPDATE stock SET quantity = ?1, fence = ?2 WHERE sku = ?3 AND fence <= ?2";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = client().await?;
    let db = Connection::open_in_memory()?;
    db.execute_batch(
        "CREATE TABLE stock (sku TEXT PRIMARY KEY, quantity INTEGER NOT NULL,
                             fence BIGINT NOT NULL DEFAULT 0);
         INSERT INTO stock (sku, quantity) VALUES ('sku-1', 10);",
    )?;
    let bind = |token: FencingToken| i64::try_from(token);
    let quantity = |db: &Connection| -> rusqlite::Result<i64> {
        db.query_row("SELECT quantity FROM stock WHERE sku = 'sku-1'", [], |r| {
            r.get(0)
        })
    };

    // 1. A holds the lock and reads.
    let a = client
        .lock("stock:sku-1")
        .lease(Duration::from_millis(300))
        .watchdog(false)
        .acquire()
        .await?;
    let token_a = a.fencing_token().expect("fencing is on by default");
    let a_saw = quantity(&db)?;
    println!("A holds the lock (token {token_a}) and reads stock {a_saw}");

    // 2. A stalls past its lease.
    println!("A stalls...");
    a.lost().await;
    println!("A's lease ran out while it stalled");

    // 3. B takes the lock and sells one.
    let b = client
        .lock("stock:sku-1")
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    let token_b = b.fencing_token().expect("fencing is on by default");
    let b_saw = quantity(&db)?;
    let rows = db.execute(FENCED_UPDATE, params![b_saw - 1, bind(token_b)?, "sku-1"])?;
    println!(
        "B holds the lock (token {token_b}), sells one: stock {} ({rows} row updated)",
        b_saw - 1
    );
    b.release().await?;

    // 4. A wakes and writes what it computed before the pause (it sold 3).
    let rows = db.execute(FENCED_UPDATE, params![a_saw - 3, bind(token_a)?, "sku-1"])?;
    let after = quantity(&db)?;
    println!(
        "A wakes and writes stock {} with token {token_a}: {rows} rows updated; stock is {after}",
        a_saw - 3
    );
    drop(a);
    if rows != 0 || after != b_saw - 1 {
        return Err("the fence let a stale write through".into());
    }
    println!("-> the fence rejected A's late write; B's sale stands");

    // The same late write without the fence condition:
    db.execute(
        "UPDATE stock SET quantity = ?1 WHERE sku = 'sku-1'",
        params![a_saw - 3],
    )?;
    println!(
        "without the fence the same write goes through: stock {}, where the 4 sales leave {} \
         (B's sale is lost)",
        quantity(&db)?,
        a_saw - 4
    );
    Ok(())
}

/// A client on `REDIS_URL`, or the in-process backend when no Redis answers.
async fn client() -> Result<Client, Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| distlock::DEFAULT_REDIS_URL.into());
    let redis = redis::Client::open(url.as_str())?;
    let reachable = tokio::time::timeout(
        Duration::from_secs(2),
        redis.get_multiplexed_async_connection(),
    )
    .await;
    Ok(if matches!(reachable, Ok(Ok(_))) {
        println!("locks on Redis at {url}\n");
        Client::new(Config::from_url(&url)?)?
    } else {
        println!("no Redis answered at {url}; locks on the in-process backend\n");
        Client::new(Config::in_memory())?
    })
}
