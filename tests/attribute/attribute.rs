//! `#[distributed_lock]` end to end on the global client against a real `redis-server`: every
//! row of the README's attribute table, the fn shapes it must accept, re-entrancy, `current()`
//! and abort-on-loss.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::init_once;
use crate::support::RedisServer;
use distlock::{distributed_lock, LockError};
use tokio::time::Instant;

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Invalid,
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

fn current_key() -> String {
    distlock::current()
        .expect("inside an annotated fn")
        .key()
        .to_owned()
}

// ---- key templates ----------------------------------------------------------------------

struct Item {
    sku: &'static str,
    dims: (u32, u32),
}

#[distributed_lock(key = "order:{order_id}")]
async fn plain(order_id: u64) -> Result<String, AppError> {
    Ok(current_key())
}

#[distributed_lock(key = "item:{item.sku}:{item.dims.1}:{{literal}}")]
async fn nested(item: &Item) -> Result<String, AppError> {
    Ok(current_key())
}

#[tokio::test]
async fn key_templates_interpolate_arguments_fields_and_escapes() {
    init_once();
    assert_eq!(plain(42).await.unwrap(), "order:42");
    let item = Item {
        sku: "A-1",
        dims: (3, 4),
    };
    assert_eq!(nested(&item).await.unwrap(), "item:A-1:4:{literal}");
    assert!(
        distlock::current().is_none(),
        "no lock outside an annotated fn"
    );
}

// ---- methods, generics, patterns --------------------------------------------------------

struct Inventory {
    warehouse: String,
    stock: AtomicU64,
}

impl Inventory {
    #[distributed_lock(key = "stock:{self.warehouse}:{sku}")]
    async fn by_ref(&self, sku: &str) -> Result<String, AppError> {
        Ok(current_key())
    }

    #[distributed_lock(key = "stock:{self.warehouse}")]
    async fn by_mut(&mut self, delta: u64) -> Result<u64, AppError> {
        *self.stock.get_mut() += delta;
        Ok(*self.stock.get_mut())
    }

    #[distributed_lock(key = "arc:{self.warehouse}")]
    async fn by_arc(self: Arc<Self>) -> Result<String, AppError> {
        Ok(current_key())
    }
}

#[distributed_lock(key = "generic:{id}")]
async fn generic<T, E>(id: T, value: impl std::fmt::Display) -> Result<String, E>
where
    T: std::fmt::Display + Send,
    E: From<LockError>,
{
    Ok(format!("{} {value}", current_key()))
}

struct Path<T>(T);

#[distributed_lock(key = "path:{id}:{a}-{b}")]
async fn destructured(Path(id): Path<u64>, (a, b): (u8, u8)) -> Result<String, AppError> {
    Ok(current_key())
}

struct NotClone(String);

#[distributed_lock(key = "moved:{value.0}")]
async fn moves_its_argument(value: NotClone) -> Result<String, AppError> {
    let owned: NotClone = value; // moved in the body: the key was built before
    Ok(owned.0)
}

#[distributed_lock(key = "borrowed:{name}")]
async fn borrowed<'a>(name: &'a str, out: &'a mut Vec<String>) -> Result<&'a str, AppError> {
    out.push(current_key());
    Ok(name)
}

#[distributed_lock(key = "anyhow:{n}")]
async fn with_anyhow(n: u32) -> anyhow::Result<u32> {
    anyhow::ensure!(n > 0, "n must be positive");
    Ok(n)
}

#[tokio::test]
async fn methods_generics_patterns_and_borrows_all_work() {
    init_once();
    let mut inventory = Inventory {
        warehouse: "north".into(),
        stock: AtomicU64::new(1),
    };
    assert_eq!(inventory.by_ref("x").await.unwrap(), "stock:north:x");
    assert_eq!(inventory.by_mut(2).await.unwrap(), 3);
    let shared = Arc::new(inventory);
    assert_eq!(shared.by_arc().await.unwrap(), "arc:north");
    assert_eq!(
        generic::<_, AppError>(7u8, "v").await.unwrap(),
        "generic:7 v"
    );
    assert_eq!(destructured(Path(9), (1, 2)).await.unwrap(), "path:9:1-2");
    assert_eq!(moves_its_argument(NotClone("n".into())).await.unwrap(), "n");
    let mut out = Vec::new();
    assert_eq!(borrowed("b", &mut out).await.unwrap(), "b");
    assert_eq!(out, ["borrowed:b"]);
    assert_eq!(with_anyhow(3).await.unwrap(), 3);
    assert!(with_anyhow(0).await.is_err());
}

// ---- trait impls ------------------------------------------------------------------------

trait Native {
    fn reserve(
        &self,
        id: u64,
    ) -> impl std::future::Future<Output = Result<String, AppError>> + Send;
}

struct Service;

impl Native for Service {
    #[distributed_lock(key = "native:{id}")]
    async fn reserve(&self, id: u64) -> Result<String, AppError> {
        Ok(current_key())
    }
}

#[async_trait::async_trait]
trait Boxed {
    async fn reserve(&self, id: u64) -> Result<String, AppError>;
}

#[async_trait::async_trait]
impl Boxed for Inventory {
    #[distributed_lock(key = "boxed:{self.warehouse}:{id}")]
    async fn reserve(&self, id: u64) -> Result<String, AppError> {
        if id == 0 {
            return Err(AppError::Invalid);
        }
        Ok(current_key())
    }
}

#[async_trait::async_trait(?Send)]
trait LocalBoxed {
    async fn reserve_local(&self, id: u64) -> Result<String, AppError>;
}

#[async_trait::async_trait(?Send)]
impl LocalBoxed for Service {
    #[distributed_lock(key = "local:{id}")]
    async fn reserve_local(&self, id: u64) -> Result<String, AppError> {
        let not_send = std::rc::Rc::new(current_key());
        Ok((*not_send).clone())
    }
}

#[tokio::test]
async fn native_and_async_trait_impls_work() {
    init_once();
    assert_eq!(Service.reserve_local(4).await.unwrap(), "local:4");
    assert_eq!(Service.reserve(5).await.unwrap(), "native:5");
    let inventory = Inventory {
        warehouse: "south".into(),
        stock: AtomicU64::new(0),
    };
    assert_eq!(
        Boxed::reserve(&inventory, 6).await.unwrap(),
        "boxed:south:6"
    );
    assert!(matches!(
        Boxed::reserve(&inventory, 0).await,
        Err(AppError::Invalid)
    ));
    // The future is Send: it can be spawned.
    tokio::spawn(async { Service.reserve(8).await.unwrap() })
        .await
        .unwrap();
}

// ---- mutual exclusion, fencing, wait, lease, watchdog, on_lost --------------------------

static SHARED: AtomicU64 = AtomicU64::new(0);

#[distributed_lock(key = "counter", wait = "30s")]
async fn increment() -> Result<u64, AppError> {
    let read = SHARED.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_micros(300)).await;
    SHARED.store(read + 1, Ordering::SeqCst);
    Ok(distlock::current()
        .unwrap()
        .fencing_token()
        .expect("fenced")
        .get())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_are_mutually_exclusive_and_fenced() {
    init_once();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(async {
                let mut tokens = Vec::new();
                for _ in 0..10 {
                    tokens.push(increment().await.unwrap());
                }
                tokens
            })
        })
        .collect();
    for task in tasks {
        let tokens = task.await.unwrap();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]));
    }
    assert_eq!(SHARED.load(Ordering::SeqCst), 80);
}

static UNFENCED: AtomicU64 = AtomicU64::new(0);

/// The efficiency mode: the same exclusion, and `current()` says there is no token.
#[distributed_lock(key = "unfenced", wait = "30s", fencing = false)]
async fn increment_unfenced() -> Result<Option<distlock::FencingToken>, AppError> {
    let read = UNFENCED.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_micros(300)).await;
    UNFENCED.store(read + 1, Ordering::SeqCst);
    Ok(distlock::current().unwrap().fencing_token())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_false_excludes_like_the_default_and_hands_out_no_token() {
    init_once();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(async {
                for _ in 0..10 {
                    assert_eq!(increment_unfenced().await.unwrap(), None);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(UNFENCED.load(Ordering::SeqCst), 80);
}

#[distributed_lock(key = "held:{name}", wait = "0s")]
async fn try_once(name: &str) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "held:{name}", wait = "300ms")]
async fn wait_briefly(name: &str) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn wait_zero_tries_once_and_wait_bounds_the_wait() {
    init_once();
    let guard = distlock::lock("held:busy").acquire().await.unwrap();
    let started = Instant::now();
    assert!(matches!(
        try_once("busy").await,
        Err(AppError::Lock(LockError::Timeout { .. }))
    ));
    assert!(started.elapsed() < Duration::from_millis(250));
    let started = Instant::now();
    assert!(matches!(
        wait_briefly("busy").await,
        Err(AppError::Lock(LockError::Timeout { .. }))
    ));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(700),
        "{waited:?}"
    );
    guard.release().await.unwrap();
    try_once("busy").await.unwrap();
}

#[distributed_lock(key = "renewed", lease = "300ms")]
async fn outlives_its_lease() -> Result<bool, AppError> {
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Still held: a rival with wait 0 is refused.
    Ok(matches!(
        distlock::lock("renewed")
            .wait(Duration::ZERO)
            .acquire()
            .await,
        Err(LockError::Timeout { .. })
    ))
}

#[tokio::test]
async fn the_watchdog_keeps_a_short_lease_for_a_long_body() {
    init_once();
    assert!(outlives_its_lease().await.unwrap());
}

static ABORTED_BODY_FINISHED: AtomicU64 = AtomicU64::new(0);

#[distributed_lock(key = "hard-abort", lease = "300ms", watchdog = false)]
async fn hard_lease_abort() -> Result<(), AppError> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    ABORTED_BODY_FINISHED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(
    key = "hard-continue",
    lease = "300ms",
    watchdog = false,
    on_lost = "continue"
)]
async fn hard_lease_continue() -> Result<&'static str, AppError> {
    tokio::time::sleep(Duration::from_millis(700)).await;
    Ok("finished")
}

#[tokio::test]
async fn a_lost_lease_aborts_the_body_unless_told_to_continue() {
    init_once();
    let started = Instant::now();
    let result = hard_lease_abort().await;
    assert!(
        matches!(result, Err(AppError::Lock(LockError::LeaseLost { ref key })) if key == "hard-abort"),
        "{result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(ABORTED_BODY_FINISHED.load(Ordering::SeqCst), 0);
    assert_eq!(hard_lease_continue().await.unwrap(), "finished");
}

static HUNG_BODY_FINISHED: AtomicU64 = AtomicU64::new(0);

#[distributed_lock(key = "hung-job", lease = "200ms", max_hold = "600ms")]
async fn hung_job() -> Result<(), AppError> {
    // A body that hangs: it would hold the lock, renewed, for ten seconds.
    tokio::time::sleep(Duration::from_secs(10)).await;
    HUNG_BODY_FINISHED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn a_body_held_past_max_hold_is_cancelled_with_an_error_that_says_so() {
    init_once();
    let started = Instant::now();
    let result = hung_job().await;
    let elapsed = started.elapsed();
    match &result {
        Err(AppError::Lock(err @ LockError::HeldTooLong { key, max_hold })) => {
            assert_eq!(key, "hung-job");
            assert_eq!(*max_hold, Duration::from_millis(600));
            assert!(err.to_string().contains("max_hold"), "{err}");
        }
        other => panic!("expected HeldTooLong, got {other:?}"),
    }
    assert!(
        elapsed >= Duration::from_millis(550) && elapsed < Duration::from_secs(3),
        "cancelled after {elapsed:?}, max_hold 600ms"
    );
    assert_eq!(HUNG_BODY_FINISHED.load(Ordering::SeqCst), 0);
    // Released on the way out: the lock is free at once.
    let next = distlock::lock("hung-job")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("released after the cancelled body");
    next.release().await.expect("release");
}

// ---- re-entrancy --------------------------------------------------------------------------

#[distributed_lock(key = "account:{id}", wait = "0s")]
async fn inner(id: u64) -> Result<u64, AppError> {
    Ok(distlock::current()
        .unwrap()
        .fencing_token()
        .expect("fenced")
        .get())
}

#[distributed_lock(key = "account:{id}", wait = "0s")]
async fn outer(id: u64) -> Result<(u64, u64), AppError> {
    let mine = distlock::current()
        .unwrap()
        .fencing_token()
        .expect("fenced")
        .get();
    let joined = inner(id).await?;
    Ok((mine, joined))
}

#[distributed_lock(key = "account:{id}", wait = "0s")]
async fn outer_spawning(id: u64) -> Result<bool, AppError> {
    let spawned = tokio::spawn(async move { inner(id).await }).await.unwrap();
    Ok(matches!(
        spawned,
        Err(AppError::Lock(LockError::Timeout { .. }))
    ))
}

#[tokio::test]
async fn a_nested_call_on_the_same_key_joins_the_outer_grant_but_a_spawned_task_does_not() {
    init_once();
    let (mine, joined) = outer(1).await.unwrap();
    assert_eq!(mine, joined, "the inner call ran under the outer grant");
    assert!(
        outer_spawning(2).await.unwrap(),
        "a spawned task is another owner"
    );
    inner(1).await.expect("released after the outer call");
}

// ---- crate = "…" ----------------------------------------------------------------------

mod renamed {
    use distlock as my_locks;

    #[my_locks::distributed_lock(key = "renamed:{n}", crate = "my_locks")]
    pub async fn call(n: u8) -> Result<String, my_locks::LockError> {
        Ok(my_locks::current().unwrap().key().to_owned())
    }
}

#[tokio::test]
async fn the_crate_argument_names_a_renamed_facade() {
    init_once();
    assert_eq!(renamed::call(3).await.unwrap(), "renamed:3");
}

// ---- release failures ---------------------------------------------------------------------

#[distributed_lock(key = "vanishing-key", on_lost = "continue")]
async fn deletes_its_own_key() -> Result<u32, AppError> {
    let mut connection = init_once().connection();
    let deleted: i64 = redis::cmd("DEL")
        .arg("distlock:{vanishing-key}")
        .query(&mut connection)
        .expect("DEL");
    assert_eq!(deleted, 1);
    Ok(5)
}

#[tokio::test]
async fn a_failed_release_never_masks_the_bodys_result() {
    init_once();
    // The release finds the key gone (it reports `false`, which is logged); the fn still
    // returns what its body returned.
    assert_eq!(deletes_its_own_key().await.unwrap(), 5);
}

// ---- review regressions: unicode, keywords, inner attributes, impl Trait, macro_rules -----

#[allow(non_snake_case)]
#[distributed_lock(key = "{é}:{id}/ключ")]
async fn unicode(é: u32, id: u32) -> Result<String, AppError> {
    Ok(current_key())
}

struct Tagged {
    r#type: &'static str,
}

#[distributed_lock(key = "kind:{tag.type}:{r#fn}")]
async fn keywords(tag: &Tagged, r#fn: u8) -> Result<String, AppError> {
    Ok(current_key())
}

#[distributed_lock(key = "inner-attr:{id}")]
async fn with_inner_attribute(id: u64) -> Result<String, AppError> {
    #![allow(unused_variables)]
    let unused = 1;
    Ok(current_key())
}

#[distributed_lock(key = "impl-trait:{id}")]
async fn returns_impl_trait(id: u64) -> Result<impl std::fmt::Display, AppError> {
    Ok(current_key())
}

macro_rules! locked_fn {
    ($name:ident, $key:literal) => {
        #[distributed_lock(key = $key)]
        async fn $name(id: u64) -> Result<String, AppError> {
            Ok(current_key())
        }
    };
}

locked_fn!(from_macro_rules, "macro:{id}");

#[async_trait::async_trait]
trait Pairs {
    async fn pair(&self, pair: (u64, u64)) -> Result<String, AppError>;
}

#[async_trait::async_trait]
impl Pairs for Service {
    #[distributed_lock(key = "pair:{a}-{b}")]
    async fn pair(&self, (a, b): (u64, u64)) -> Result<String, AppError> {
        Ok(current_key())
    }
}

#[tokio::test]
async fn unicode_keywords_inner_attributes_impl_trait_and_macro_rules_work() {
    init_once();
    assert_eq!(unicode(1, 2).await.unwrap(), "1:2/ключ");
    let tag = Tagged { r#type: "t" };
    assert_eq!(keywords(&tag, 7).await.unwrap(), "kind:t:7");
    assert_eq!(with_inner_attribute(3).await.unwrap(), "inner-attr:3");
    assert_eq!(
        returns_impl_trait(4).await.unwrap().to_string(),
        "impl-trait:4"
    );
    assert_eq!(from_macro_rules(5).await.unwrap(), "macro:5");
    assert_eq!(Service.pair((8, 9)).await.unwrap(), "pair:8-9");
}

#[distributed_lock(key = "A", wait = "0s")]
async fn a_inner() -> Result<String, AppError> {
    Ok(current_key())
}

#[distributed_lock(key = "B", wait = "0s")]
async fn b_mid() -> Result<String, AppError> {
    let inner = a_inner().await?;
    assert_eq!(current_key(), "B", "back in B after the nested call");
    Ok(inner)
}

#[distributed_lock(key = "A", wait = "0s")]
async fn a_outer() -> Result<String, AppError> {
    b_mid().await
}

#[tokio::test]
async fn current_names_the_joined_key_inside_a_re_entrant_call() {
    init_once();
    assert_eq!(a_outer().await.unwrap(), "A");
}

#[distributed_lock(key = "join-lost")]
async fn join_lost_inner() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(
    key = "join-lost",
    lease = "100ms",
    watchdog = false,
    on_lost = "continue"
)]
async fn join_lost_outer() -> Result<bool, AppError> {
    tokio::time::sleep(Duration::from_millis(400)).await; // the outer lease runs out
    Ok(matches!(
        join_lost_inner().await,
        Err(AppError::Lock(LockError::LeaseLost { .. }))
    ))
}

#[tokio::test]
async fn a_re_entrant_call_on_a_lost_grant_fails_instead_of_running_unprotected() {
    init_once();
    assert!(join_lost_outer().await.unwrap());
}

// ---- a joined call lives and dies with the grant it joined --------------------------------

type Escaped = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<distlock::LockInfo>, AppError>> + Send>,
>;

#[distributed_lock(key = "escape", wait = "0s")]
async fn escaping_inner(
    go: Arc<tokio::sync::Notify>,
) -> Result<Option<distlock::LockInfo>, AppError> {
    go.notified().await;
    Ok(distlock::current())
}

#[distributed_lock(key = "escape", wait = "0s")]
async fn lets_a_joined_call_escape(go: Arc<tokio::sync::Notify>) -> Result<Escaped, AppError> {
    let mut joined: Escaped = Box::pin(escaping_inner(go));
    // Polled once under the grant, so it joins it; then handed out unfinished.
    tokio::select! {
        biased;
        _ = &mut joined => panic!("the joined call waits for `go`"),
        () = std::future::ready(()) => {}
    }
    Ok(joined)
}

#[tokio::test]
async fn a_joined_call_polled_after_its_outer_call_released_ends_with_lease_lost() {
    init_once();
    let go = Arc::new(tokio::sync::Notify::new());
    let escaped = lets_a_joined_call_escape(go.clone()).await.unwrap();
    // The outer call has released the lock: another owner takes it.
    let other = distlock::lock("escape")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("free once the outer call returned");
    go.notify_one();
    let result = escaped.await;
    assert!(
        matches!(result, Err(AppError::Lock(LockError::LeaseLost { .. }))),
        "a joined call must not run on after its grant ended: {result:?}"
    );
    assert!(other.release().await.unwrap());
}

#[distributed_lock(key = "siblings", wait = "0s")]
async fn sibling_reads(counter: &AtomicU64) -> Result<u64, AppError> {
    Ok(counter.load(Ordering::SeqCst))
}

/// A read-modify-write with suspensions in the middle, and a nested call on the same key.
#[distributed_lock(key = "siblings", wait = "0s")]
async fn sibling_increments(counter: &AtomicU64) -> Result<(), AppError> {
    let read = sibling_reads(counter).await?;
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    counter.store(read + 1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "siblings", wait = "0s")]
async fn two_joined_calls_side_by_side(counter: &AtomicU64) -> Result<(), AppError> {
    let (a, b) = tokio::join!(sibling_increments(counter), sibling_increments(counter));
    a.and(b)
}

#[tokio::test]
async fn joined_calls_driven_side_by_side_in_one_task_take_turns() {
    init_once();
    let counter = AtomicU64::new(0);
    two_joined_calls_side_by_side(&counter).await.unwrap();
    assert_eq!(
        counter.load(Ordering::SeqCst),
        2,
        "two joined calls overlapped and one update was lost"
    );
}

// ---- `client = <expr>` and duration expressions -------------------------------------------

/// A client of its own, on a server of its own: what its locks exclude, the global client's
/// server cannot see.
struct Warehouse {
    locks: distlock::Client,
    wait: Duration,
    active: AtomicU64,
    most_active: AtomicU64,
}

impl Warehouse {
    fn new(server: &RedisServer) -> Self {
        let config = distlock::Config::from_url(&server.url())
            .expect("url")
            .backoff(Duration::from_millis(1), Duration::from_millis(20));
        Warehouse {
            locks: distlock::Client::new(config).expect("client"),
            wait: Duration::from_secs(30),
            active: AtomicU64::new(0),
            most_active: AtomicU64::new(0),
        }
    }

    #[distributed_lock(key = "stock:{sku}", client = self.locks, wait = self.wait)]
    async fn reserve(&self, sku: &str) -> Result<(), AppError> {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_active.fetch_max(now, Ordering::SeqCst);
        // A window for a second holder to overlap, were the lock not exclusive.
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.active.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    /// Reports who can take `stock:{sku}` while this holds it: this client, the global one.
    #[distributed_lock(key = "stock:{sku}", client = self.locks)]
    async fn rivals_while_held(&self, sku: &str) -> Result<(bool, bool), AppError> {
        let same_client = self
            .locks
            .lock(format!("stock:{sku}"))
            .wait(Duration::ZERO)
            .acquire()
            .await;
        let global = distlock::lock(format!("stock:{sku}"))
            .wait(Duration::ZERO)
            .acquire()
            .await;
        let global_taken = match global {
            Ok(guard) => guard.release().await.is_ok(),
            Err(_) => false,
        };
        Ok((same_client.is_ok(), global_taken))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_with_client_self_locks_excludes_a_concurrent_call_through_that_client() {
    init_once();
    let server = RedisServer::start();
    let warehouse = Arc::new(Warehouse::new(&server));
    // Through `self.locks`, on its server: the global client, on another, is not involved.
    let (same_client_taken, global_taken) = warehouse.rivals_while_held("rival").await.unwrap();
    assert!(
        !same_client_taken,
        "a rival through the same client took a held lock"
    );
    assert!(
        global_taken,
        "the global client's server saw the lock: taken through it?"
    );

    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let warehouse = warehouse.clone();
            tokio::spawn(async move {
                for _ in 0..5 {
                    warehouse.reserve("sku-1").await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(warehouse.most_active.load(Ordering::SeqCst), 1);
}

#[async_trait::async_trait]
trait Restock {
    async fn restock(self: Arc<Self>, sku: &str) -> Result<bool, AppError>;
}

#[async_trait::async_trait]
impl Restock for Warehouse {
    /// An `#[async_trait]` method whose body moves `self`: the client was taken before.
    #[distributed_lock(key = "stock:{sku}", client = self.locks, lease = SHORT_LEASE)]
    async fn restock(self: Arc<Self>, sku: &str) -> Result<bool, AppError> {
        let moved = self;
        let rival = moved
            .locks
            .lock(format!("stock:{sku}"))
            .wait(Duration::ZERO)
            .acquire()
            .await;
        Ok(matches!(rival, Err(LockError::Timeout { .. })))
    }
}

#[tokio::test]
async fn an_async_trait_method_locks_through_its_client_even_when_its_body_moves_self() {
    init_once();
    let server = RedisServer::start();
    let warehouse = Arc::new(Warehouse::new(&server));
    assert!(
        warehouse.clone().restock("sku-2").await.unwrap(),
        "a rival through the same client took the lock the method held"
    );
}

#[distributed_lock(key = "shared:{id}", client = locks, wait = "0s")]
async fn nested_through(locks: &distlock::Client, id: u64) -> Result<u64, AppError> {
    Ok(id)
}

/// What a nested call returned.
type Nested = Result<u64, AppError>;

#[distributed_lock(key = "shared:{id}", client = outer, wait = "0s")]
async fn outer_through(
    outer: &distlock::Client,
    inner: &distlock::Client,
    id: u64,
) -> Result<(Nested, Nested), AppError> {
    Ok((
        nested_through(outer, id).await,
        nested_through(inner, id).await,
    ))
}

#[tokio::test]
async fn a_nested_call_joins_through_the_same_client_and_waits_through_another() {
    let server = init_once();
    let client = || {
        distlock::Client::new(distlock::Config::from_url(&server.url()).expect("url"))
            .expect("client")
    };
    let (one, other) = (client(), client());
    let (same, another) = outer_through(&one, &other, 7).await.unwrap();
    // A clone is the same client; joined, with `wait = "0s"` and the key held.
    assert_eq!(same.unwrap(), 7);
    assert!(
        matches!(another, Err(AppError::Lock(LockError::Timeout { .. }))),
        "another client is another owner: {another:?}"
    );
    let cloned = one.clone();
    let (same, _) = outer_through(&one, &cloned, 8).await.unwrap();
    assert_eq!(same.unwrap(), 8);
}

const SHORT_LEASE: Duration = Duration::from_millis(300);

/// With no watchdog, the lease from the const is a hard limit: a rival gets the lock when it
/// runs out (the default lease, 30s, would outlast the rival's wait).
#[distributed_lock(
    key = "const-lease",
    lease = SHORT_LEASE,
    watchdog = false,
    on_lost = "continue"
)]
async fn holds_for_the_const_lease() -> Result<Duration, AppError> {
    let started = Instant::now();
    let rival = distlock::lock("const-lease")
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    let waited = started.elapsed();
    rival.release().await?;
    Ok(waited)
}

#[tokio::test]
async fn a_const_lease_is_honoured() {
    init_once();
    let waited = holds_for_the_const_lease().await.unwrap();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
        "the rival waited {waited:?} for a 300ms lease"
    );
}

static RAN_WITH_BAD_DURATIONS: AtomicU64 = AtomicU64::new(0);

fn half_a_second() -> Duration {
    Duration::from_millis(500)
}

#[distributed_lock(key = "bad-max-hold", lease = "1s", max_hold = half_a_second())]
async fn max_hold_below_the_lease() -> Result<(), AppError> {
    RAN_WITH_BAD_DURATIONS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "zero-lease", lease = Duration::ZERO)]
async fn zero_lease() -> Result<(), AppError> {
    RAN_WITH_BAD_DURATIONS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn duration_expressions_are_checked_at_run_time_with_an_error_naming_the_argument() {
    init_once();
    match max_hold_below_the_lease().await {
        Err(AppError::Lock(LockError::Config(msg))) => {
            assert!(msg.contains("`max_hold = half_a_second()`"), "{msg}");
            assert!(msg.contains("bad-max-hold"), "{msg}");
            assert!(msg.contains("at least the lease"), "{msg}");
        }
        other => panic!("expected LockError::Config, got {other:?}"),
    }
    match zero_lease().await {
        Err(AppError::Lock(LockError::Config(msg))) => {
            assert!(msg.contains("`lease = Duration::ZERO`"), "{msg}");
            assert!(msg.contains("zero-lease"), "{msg}");
        }
        other => panic!("expected LockError::Config, got {other:?}"),
    }
    assert_eq!(RAN_WITH_BAD_DURATIONS.load(Ordering::SeqCst), 0);
}
