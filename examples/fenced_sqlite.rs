//! Why fencing tokens matter, on a real database: a lock holder is paused past its lease (a GC
//! pause, a stalled VM), the next holder takes the lock and writes, and then the paused one
//! wakes and writes what it had computed before. A lock alone cannot stop that late write; the
//! database can, with the fencing token in the `UPDATE`'s `WHERE` (`distlock::fenced` explains
//! the pattern):
//!
//! ```sql
//! UPDATE stock SET quantity = ?1, fence = ?2 WHERE sku = ?3 AND fence <= ?2
//! ```
//!
//! The late write updates 0 rows. The example prints what each holder did and exits with an
//! error status if the late write was accepted.
//!
//!     cargo run --example fenced_sqlite
//!
//! Locks on `REDIS_URL` (default `redis://127.0.0.1:6379`); if nothing answers there it says so
//! and uses the in-process backend. The stock lives in an SQLite file in the temp directory,
//! opened by each holder with a connection of its own, as two processes would.

use std::path::PathBuf;
use std::time::Duration;

use distlock::{Client, Config, FencingToken, LockError};
use rusqlite::{params, Connection};

type Error = Box<dyn std::error::Error + Send + Sync>;

const SKU: &str = "apples";
const LOCK: &str = "fenced-sqlite:apples";
/// The paused holder's lease: short, so the example is quick. No watchdog renews it.
const LEASE: Duration = Duration::from_millis(500);

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = connect().await?;
    let db = Database::create()?;

    // Holder A takes the lock, reads the stock and prepares to sell 3.
    let a = client
        .lock(LOCK)
        .lease(LEASE)
        .watchdog(false)
        .acquire()
        .await?;
    let a_token = a.fencing_token().expect("fencing is on by default");
    let a_conn = db.open()?;
    let a_read = read(&a_conn)?;
    println!("A: took the lock (token {a_token}, lease {LEASE:?}), read stock {a_read}");
    println!("A: paused (think of a GC pause or a stalled VM) ...");

    // While A is paused, its lease runs out: B's acquire completes then, not before.
    let b = client.lock(LOCK).wait(LEASE * 20).acquire().await?;
    let b_token = b.fencing_token().expect("fencing is on by default");
    let b_conn = db.open()?;
    let b_read = read(&b_conn)?;
    let b_applied = fenced_update(&b_conn, b_read - 1, b_token)?;
    println!(
        "B: took the lock once A's lease ran out (token {b_token}), sold 1: stock {b_read} -> {} ({})",
        b_read - 1,
        if b_applied { "written" } else { "REFUSED" }
    );
    b.release().await?;

    // A wakes up. It could have noticed (`is_held()` is false now), but code in flight rarely
    // looks; its write carries its token, and the database says no.
    println!(
        "A: woke up (is_held: {}), writes the stock it computed: {a_read} -> {}",
        a.is_held(),
        a_read - 3
    );
    let a_applied = fenced_update(&a_conn, a_read - 3, a_token)?;
    drop(a);
    let stock = read(&a_conn)?;
    let fence = fence(&a_conn)?;
    println!(
        "A: its late write {}",
        if a_applied {
            "was ACCEPTED"
        } else {
            "was refused: 0 rows updated (the row's fence holds B's newer token)"
        }
    );
    println!("stock is now {stock}, fence {fence}");
    drop((a_conn, b_conn, db));

    if a_applied || !b_applied || stock != b_read - 1 {
        eprintln!("the fence did not hold: B's sale was overwritten by a stale holder");
        std::process::exit(1);
    }
    println!("B's sale stands: the stale holder could not overwrite it.");
    Ok(())
}

/// The fenced write: sets the stock only if `token` is at least the last one that wrote it.
/// Whether a row was updated (0 rows: a newer holder has written).
fn fenced_update(conn: &Connection, quantity: i64, token: FencingToken) -> Result<bool, Error> {
    let updated = conn.execute(
        "UPDATE stock SET quantity = ?1, fence = ?2 WHERE sku = ?3 AND fence <= ?2",
        params![quantity, token.as_i64()?, SKU],
    )?;
    Ok(updated == 1)
}

fn read(conn: &Connection) -> Result<i64, Error> {
    Ok(conn.query_row(
        "SELECT quantity FROM stock WHERE sku = ?1",
        params![SKU],
        |row| row.get(0),
    )?)
}

fn fence(conn: &Connection) -> Result<i64, Error> {
    Ok(conn.query_row(
        "SELECT fence FROM stock WHERE sku = ?1",
        params![SKU],
        |row| row.get(0),
    )?)
}

/// The SQLite file the holders share, removed on drop.
struct Database {
    path: PathBuf,
}

impl Database {
    /// A fresh database with one row: 10 apples, fence 0 (no token has written yet).
    fn create() -> Result<Self, Error> {
        let path = std::env::temp_dir().join(format!("distlock-fenced-{}.db", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let conn = Connection::open(&path)?;
        conn.execute_batch(
            "CREATE TABLE stock (
                 sku      TEXT PRIMARY KEY,
                 quantity INTEGER NOT NULL,
                 fence    INTEGER NOT NULL DEFAULT 0
             );",
        )?;
        conn.execute(
            "INSERT INTO stock (sku, quantity) VALUES (?1, 10)",
            params![SKU],
        )?;
        Ok(Self { path })
    }

    fn open(&self) -> Result<Connection, Error> {
        Ok(Connection::open(&self.path)?)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A client for `REDIS_URL`, or for the in-process backend if no Redis answers.
async fn connect() -> Result<Client, LockError> {
    let config = Config::from_env_or(distlock::DEFAULT_REDIS_URL)?
        .connect_timeout(Duration::from_millis(500));
    let client = Client::new(config.clone())?;
    match client
        .lock("fenced-sqlite:probe")
        .wait(Duration::ZERO)
        .acquire()
        .await
    {
        Ok(guard) => {
            guard.release().await?;
            println!("locking on Redis\n");
            Ok(client)
        }
        Err(LockError::Backend(err)) => {
            println!("no Redis answered ({err});");
            println!("locking on the in-process backend instead\n");
            Client::new(Config::in_memory())
        }
        Err(other) => Err(other),
    }
}
