//! The classic scenario: workers sell items from one stock counter through an annotated
//! service method. The counter lives in Redis and is updated with a non-atomic GET + SET, so
//! without the lock concurrent sales overwrite each other; with it, none are lost. Under the
//! lock the write is fenced (`distlock::fenced::set` with the grant's token): a seller whose
//! lease ran out while it stalled cannot overwrite a later seller's stock.
//!
//!     cargo run --example inventory                 # 8 tasks in this process
//!     cargo run --example inventory -- --processes 4  # also 4 OS processes at once
//!
//! Uses `REDIS_URL` (default `redis://127.0.0.1:6379`). If nothing answers there it says so and
//! runs on the in-process backend (the stock then lives in this process, and `--processes` is
//! not available).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::fenced::FencedWrite;
use distlock::{distributed_lock, Config, FencingToken, LockError};

const WORKERS: usize = 8;
const SALES_PER_WORKER: i64 = 25;
const INITIAL_STOCK: i64 = 10_000;

/// Where the stock lives: a Redis key, or a number in this process.
#[derive(Clone)]
enum Store {
    Redis(redis::aio::MultiplexedConnection),
    Local(Arc<AtomicI64>),
}

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Store(String),
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
            Store::Local(stock) => Ok(stock.load(Ordering::SeqCst)),
        }
    }

    /// Sets the stock, for a run's start: the fence is reset with it.
    async fn reset(&self, sku: &str, value: i64) -> Result<(), AppError> {
        match &self.store {
            Store::Redis(conn) => {
                let key = format!("inventory:{sku}");
                redis::pipe()
                    .cmd("SET")
                    .arg(&key)
                    .arg(value)
                    .cmd("DEL")
                    .arg(distlock::fenced::fence_key(&key))
                    .exec_async(&mut conn.clone())
                    .await
                    .map_err(|e| AppError::Store(e.to_string()))
            }
            Store::Local(stock) => {
                stock.store(value, Ordering::SeqCst);
                Ok(())
            }
        }
    }

    /// Writes the stock back; with a fencing token, only if no later holder has written.
    async fn write(
        &self,
        sku: &str,
        value: i64,
        token: Option<FencingToken>,
    ) -> Result<(), AppError> {
        match (&self.store, token) {
            (Store::Redis(conn), Some(token)) => {
                let key = format!("inventory:{sku}");
                let wrote = distlock::fenced::set(&mut conn.clone(), &key, value, token)
                    .await
                    .map_err(|e| AppError::Store(e.to_string()))?;
                match wrote {
                    FencedWrite::Applied => Ok(()),
                    FencedWrite::Stale { highest } => Err(AppError::Store(format!(
                        "stale write refused: token {token} after {highest}"
                    ))),
                }
            }
            (Store::Redis(conn), None) => redis::cmd("SET")
                .arg(format!("inventory:{sku}"))
                .arg(value)
                .query_async::<()>(&mut conn.clone())
                .await
                .map_err(|e| AppError::Store(e.to_string())),
            (Store::Local(stock), _) => {
                stock.store(value, Ordering::SeqCst);
                Ok(())
            }
        }
    }

    /// A sale without a lock: read, think, write back.
    async fn sell_unlocked(&self, sku: &str) -> Result<(), AppError> {
        self.sell_with(sku, None).await
    }

    async fn sell_with(&self, sku: &str, token: Option<FencingToken>) -> Result<(), AppError> {
        let stock = self.read(sku).await?;
        tokio::time::sleep(Duration::from_micros(500)).await; // e.g. price the order
        self.write(sku, stock - 1, token).await
    }

    /// The same sale, under a distributed lock on the SKU.
    #[distributed_lock(key = "inventory:{sku}", lease = "5s", wait = "30s")]
    async fn sell(&self, sku: &str) -> Result<(), AppError> {
        // The grant's fencing token goes to the store with the write.
        let token = distlock::current().and_then(|lock| lock.fencing_token());
        self.sell_with(sku, token).await
    }
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
                store: Store::Local(Arc::new(AtomicI64::new(0))),
            })
        }
    };
    let multi = processes > 0 && matches!(service.store, Store::Redis(_));
    let sales = WORKERS as i64 * SALES_PER_WORKER * (1 + if multi { processes as i64 } else { 0 });
    for (sku, locked) in [("sku-unlocked", false), ("sku-locked", true)] {
        service.reset(sku, INITIAL_STOCK).await?;
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
    }
    Ok(())
}

/// Initialises distlock on `REDIS_URL` and returns a Redis-backed service, or `None` (after
/// saying so) when no Redis answers.
async fn connect() -> Result<Option<InventoryService>, AppError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| distlock::DEFAULT_REDIS_URL.into());
    let client = redis::Client::open(url.as_str()).map_err(|e| AppError::Store(e.to_string()))?;
    let connection = tokio::time::timeout(
        Duration::from_secs(3),
        client.get_multiplexed_async_connection(),
    )
    .await;
    match connection {
        Ok(Ok(conn)) => {
            distlock::init(Config::from_url(&url)?)?;
            Ok(Some(InventoryService {
                store: Store::Redis(conn),
            }))
        }
        _ => {
            println!(
                "no Redis answered at REDIS_URL (or {});",
                distlock::DEFAULT_REDIS_URL
            );
            Ok(None)
        }
    }
}
