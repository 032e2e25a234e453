//! The classic scenario: workers sell items from one stock counter through an annotated
//! service method. The counter lives in Redis and is updated with a non-atomic GET + SET, so
//! without the lock concurrent sales overwrite each other; with it, none are lost. Under the
//! lock the SET carries the grant's fencing token (`distlock::fenced::set`): a holder that lost
//! its lease mid-sale (paused past it) has its write refused instead of overwriting the sale
//! of the holder after it.
//!
//!     cargo run --example inventory                 # 8 tasks in this process
//!     cargo run --example inventory -- --processes 4  # also 4 OS processes at once
//!
//! Uses `REDIS_URL` (default `redis://127.0.0.1:6379`). If nothing answers there it says so and
//! runs on the in-process backend (the stock then lives in this process, and `--processes` is
//! not available).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::fenced::{self, FencedWrite};
use distlock::{distributed_lock, Config, FencingToken, LockError};

const WORKERS: usize = 8;
const SALES_PER_WORKER: i64 = 25;
const INITIAL_STOCK: i64 = 10_000;

/// Where the stock lives: a Redis key, or a number in this process.
#[derive(Clone)]
enum Store {
    /// A `ConnectionManager`: the fenced writes go on by themselves after a Redis restart
    /// (docs/fenced-writes.md, "Which connection").
    Redis(redis::aio::ConnectionManager),
    Local(Arc<Mutex<LocalStock>>),
}

/// The in-process stock, fenced like the Redis key: it remembers the highest token that wrote.
#[derive(Default)]
struct LocalStock {
    value: i64,
    fence: Option<FencingToken>,
}

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Store(String),
    /// A sale's write was refused: its lock was lost and a newer holder has written since.
    Stale {
        sku: String,
        highest: FencingToken,
    },
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Lock(err) => write!(f, "{err}"),
            AppError::Store(err) => write!(f, "store: {err}"),
            AppError::Stale { sku, highest } => write!(
                f,
                "the sale of {sku} was refused: this worker lost its lock, and the holder \
                 with token {highest} has written since"
            ),
        }
    }
}

struct InventoryService {
    store: Store,
}

impl InventoryService {
    async fn read(&self, sku: &str) -> Result<i64, AppError> {
        match &self.store {
            Store::Redis(conn) => {
                let mut conn = conn.clone();
                redis::cmd("GET")
                    .arg(format!("inventory:{sku}"))
                    .query_async::<Option<i64>>(&mut conn)
                    .await
                    .map(|v| v.unwrap_or(0))
                    .map_err(|e| AppError::Store(e.to_string()))
            }
            Store::Local(stock) => Ok(local(stock).value),
        }
    }

    /// A plain write: setting the stock up, and the sale without a lock.
    async fn write(&self, sku: &str, value: i64) -> Result<(), AppError> {
        match &self.store {
            Store::Redis(conn) => {
                let mut conn = conn.clone();
                redis::cmd("SET")
                    .arg(format!("inventory:{sku}"))
                    .arg(value)
                    .query_async::<()>(&mut conn)
                    .await
                    .map_err(|e| AppError::Store(e.to_string()))
            }
            Store::Local(stock) => {
                local(stock).value = value;
                Ok(())
            }
        }
    }

    /// A write that carries the lock's fencing token: refused (and nothing changed) when a
    /// holder with a newer token has written since.
    async fn write_fenced(
        &self,
        sku: &str,
        value: i64,
        token: FencingToken,
    ) -> Result<(), AppError> {
        let outcome = match &self.store {
            Store::Redis(conn) => {
                let mut conn = conn.clone();
                fenced::set(&mut conn, &format!("inventory:{sku}"), value, token)
                    .await
                    .map_err(|e| AppError::Store(e.to_string()))?
            }
            Store::Local(stock) => {
                let mut stock = local(stock);
                match stock.fence {
                    Some(highest) if token < highest => FencedWrite::Stale { highest },
                    _ => {
                        *stock = LocalStock {
                            value,
                            fence: Some(token),
                        };
                        FencedWrite::Applied(())
                    }
                }
            }
        };
        match outcome {
            FencedWrite::Applied(()) => Ok(()),
            FencedWrite::Stale { highest } => Err(AppError::Stale {
                sku: sku.to_owned(),
                highest,
            }),
        }
    }

    /// The highest fencing token that wrote the stock, if any.
    async fn fence(&self, sku: &str) -> Result<Option<u64>, AppError> {
        match &self.store {
            Store::Redis(conn) => {
                let mut conn = conn.clone();
                redis::cmd("GET")
                    .arg(fenced::fence_key(&format!("inventory:{sku}")))
                    .query_async::<Option<u64>>(&mut conn)
                    .await
                    .map_err(|e| AppError::Store(e.to_string()))
            }
            Store::Local(stock) => Ok(local(stock).fence.map(FencingToken::get)),
        }
    }

    /// A sale without a lock: read, think, write back.
    async fn sell_unlocked(&self, sku: &str) -> Result<(), AppError> {
        let stock = self.read(sku).await?;
        price_the_order().await;
        self.write(sku, stock - 1).await
    }

    /// The same sale, under a distributed lock on the SKU, its write fenced by the grant's
    /// token.
    #[distributed_lock(key = "inventory:{sku}", lease = "5s", wait = "30s")]
    async fn sell(&self, sku: &str) -> Result<(), AppError> {
        let token = distlock::current()
            .and_then(|lock| lock.fencing_token())
            .expect("inside the lock, with fencing on by default");
        let stock = self.read(sku).await?;
        price_the_order().await;
        self.write_fenced(sku, stock - 1, token).await
    }
}

/// The "think" between a sale's read and its write.
async fn price_the_order() {
    tokio::time::sleep(Duration::from_micros(500)).await;
}

fn local(stock: &Mutex<LocalStock>) -> std::sync::MutexGuard<'_, LocalStock> {
    // A panic elsewhere while holding it leaves a number that is still a number.
    stock
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn run(
    service: Arc<InventoryService>,
    sku: &'static str,
    locked: bool,
) -> Result<(), AppError> {
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let service = service.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..SALES_PER_WORKER {
                if locked {
                    service.sell(sku).await?;
                } else {
                    service.sell_unlocked(sku).await?;
                }
            }
            Ok::<(), AppError>(())
        }));
    }
    for worker in workers {
        worker.await.map_err(|e| AppError::Store(e.to_string()))??;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), AppError> {
    let args: Vec<String> = std::env::args().collect();
    // Child mode: `--child SKU LOCKED` sells as one more OS process.
    if let Some(at) = args.iter().position(|a| a == "--child") {
        let sku: &'static str = args[at + 1].clone().leak();
        let locked = args[at + 2] == "locked";
        let service = connect()
            .await?
            .ok_or_else(|| AppError::Store("worker process: Redis did not answer".into()))?;
        let service = Arc::new(service);
        return run(service, sku, locked).await;
    }
    let processes: usize = args
        .iter()
        .position(|a| a == "--processes")
        .and_then(|at| args.get(at + 1)?.parse().ok())
        .unwrap_or(0);

    let service = match connect().await? {
        Some(service) => Arc::new(service),
        None => {
            println!("running on the in-process backend instead\n");
            distlock::init(Config::in_memory())?;
            Arc::new(InventoryService {
                store: Store::Local(Arc::default()),
            })
        }
    };
    let multi = processes > 0 && matches!(service.store, Store::Redis(_));
    let sales = WORKERS as i64 * SALES_PER_WORKER * (1 + if multi { processes as i64 } else { 0 });
    for (sku, locked) in [("sku-unlocked", false), ("sku-locked", true)] {
        service.write(sku, INITIAL_STOCK).await?;
        let mut children = Vec::new();
        if multi {
            for _ in 0..processes {
                children.push(
                    std::process::Command::new(std::env::current_exe().expect("own path"))
                        .args(["--child", sku, if locked { "locked" } else { "unlocked" }])
                        .spawn()
                        .expect("spawn a worker process"),
                );
            }
        }
        run(service.clone(), sku, locked).await?;
        for mut child in children {
            let status = child.wait().map_err(|e| AppError::Store(e.to_string()))?;
            if !status.success() {
                return Err(AppError::Store(format!(
                    "a worker process failed: {status}"
                )));
            }
        }
        let left = service.read(sku).await?;
        let expected = INITIAL_STOCK - sales;
        println!(
            "{:<16} {sales} sales: stock {left}, expected {expected} -> {} updates lost",
            if locked {
                "with the lock:"
            } else {
                "without a lock:"
            },
            left - expected
        );
        if locked {
            if let Some(fence) = service.fence(sku).await? {
                println!(
                    "{:<16} the last sale wrote with fencing token {fence}; a lower one is refused",
                    ""
                );
            }
        }
    }
    Ok(())
}

/// Initialises distlock on `REDIS_URL` and returns a Redis-backed service, or `None` (after
/// saying so) when no Redis answers.
async fn connect() -> Result<Option<InventoryService>, AppError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| distlock::DEFAULT_REDIS_URL.into());
    let client = redis::Client::open(url.as_str()).map_err(|e| AppError::Store(e.to_string()))?;
    let connection =
        tokio::time::timeout(Duration::from_secs(3), client.get_connection_manager()).await;
    // The address tried, without credentials: on a machine whose 6379 is someone else's
    // Redis, this says where the locks went.
    let address = client.get_connection_info().addr().to_string();
    match connection {
        Ok(Ok(conn)) => {
            println!("using Redis at {address} (REDIS_URL, or the default)\n");
            distlock::init(Config::from_url(&url)?)?;
            Ok(Some(InventoryService {
                store: Store::Redis(conn),
            }))
        }
        _ => {
            println!("no Redis answered at {address} (REDIS_URL, or the default);");
            Ok(None)
        }
    }
}
