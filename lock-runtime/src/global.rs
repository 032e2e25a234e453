//! The global client: [`init`] and [`try_init`] set it up once per process, and the free
//! functions ([`lock`], [`read_lock`], [`write_lock`], [`semaphore`], [`lock_all`],
//! [`shutdown`], [`inspect`], [`is_locked`]) start requests and operator calls through it.
//! The attribute's runtime (`attribute.rs`) reaches it through [`global`]. Everything else is
//! [`Client`]'s (`client/mod.rs`).

use std::sync::OnceLock;

use crate::client::Client;
use crate::config::Config;
use crate::error::LockError;
use crate::inspect::LockState;
use crate::request::LockRequest;

static GLOBAL: OnceLock<Client> = OnceLock::new();

/// Sets up the global client that [`lock`] (and the attribute) use. Call it once at startup;
/// it is synchronous and does not connect, so it can run before the async runtime starts.
///
/// Fails with [`LockError::Config`] when called a second time or when the config is unusable.
/// In tests, where every test sets up what it uses, call [`try_init`] instead.
///
/// ```no_run
/// fn main() -> Result<(), distlock::LockError> {
///     distlock::init(distlock::Config::from_env()?)?;
///     // … start the runtime, take locks …
///     Ok(())
/// }
/// ```
pub fn init(config: Config) -> Result<(), LockError> {
    let already = || {
        LockError::Config(
            "`distlock::init` was already called; it may be called once per process \
             (in tests, call `distlock::try_init` in each test instead; build a \
             `distlock::Client` for a second configuration)"
                .to_owned(),
        )
    };
    if GLOBAL.get().is_some() {
        return Err(already());
    }
    GLOBAL.set(Client::new(config)?).map_err(|_| already())
}

/// Sets up the global client like [`init`], unless it is set up already with the same
/// settings: made for tests, where every test calls it and whichever runs first sets it up.
/// `Ok(true)` when this call set it up, `Ok(false)` when it already was (`config` is then
/// dropped unused: an in-process store stays the first one, shared by every test of the
/// binary).
///
/// Fails with [`LockError::Config`] when the config is unusable, or when the global client
/// was set up with other settings (another server, say): a test would otherwise lock on a
/// server it does not know. Settings are compared as [`Config`]'s `Debug` shows them.
///
/// The global client works in every test although each `#[tokio::test]` runs on a runtime of
/// its own: its connections and watchdog do not depend on the runtime of the test that set
/// it up. Leases of the in-process store keep the clock of the test that takes them, paused
/// or not (see [`Config::in_memory`]).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// // At the start of each `#[tokio::test]` that locks through the global client:
/// distlock::try_init(distlock::Config::in_memory())?;
/// let guard = distlock::lock("stock:42").acquire().await?;
/// // … the code under test …
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub fn try_init(config: Config) -> Result<bool, LockError> {
    let settings = format!("{config:?}");
    if GLOBAL.get().is_none() {
        let client = Client::new(config)?;
        // Two tests may get here at once: one client is kept, the other dropped unused.
        if GLOBAL.set(client).is_ok() {
            return Ok(true);
        }
    } else {
        config.validate()?;
    }
    let Some(global) = GLOBAL.get() else {
        return Err(LockError::NotInitialized);
    };
    let global_settings = format!("{:?}", global.engine.config);
    if settings != global_settings {
        return Err(LockError::Config(format!(
            "`distlock::try_init` was called with other settings than the global client has \
             ({settings} instead of {global_settings}): give every test of a binary the same \
             configuration, or build a `distlock::Client` of its own for a test that needs \
             another"
        )));
    }
    Ok(false)
}

/// The global client, `None` before [`init`] (for the attribute's runtime).
pub(crate) fn global() -> Option<Client> {
    GLOBAL.get().cloned()
}

/// Starts a request for the lock `key` through the global client set up by [`init`].
/// Without [`init`], [`acquire`](LockRequest::acquire) fails with [`LockError::NotInitialized`].
///
/// ```no_run
/// use std::time::Duration;
/// # async fn f() -> Result<(), distlock::LockError> {
/// let guard = distlock::lock("order:42")
///     .lease(Duration::from_secs(15))
///     .wait(Duration::from_secs(5))
///     .acquire()
///     .await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub fn lock(key: impl Into<String>) -> LockRequest {
    LockRequest::write(GLOBAL.get().map(|client| client.engine.clone()), key.into())
}

/// Starts a request for the write side of the read/write lock `key` through the global
/// client: the same lock as [`lock`] — exclusive against writers and readers.
///
/// ```no_run
/// # async fn f() -> Result<(), distlock::LockError> {
/// let guard = distlock::write_lock("catalog").acquire().await?;
/// // … no reader and no other writer meanwhile; write with guard.fencing_token() …
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub fn write_lock(key: impl Into<String>) -> LockRequest {
    lock(key)
}

/// Starts a request for the read side of the read/write lock `key` through the global
/// client: shared with other readers, excluding writers. A waiting writer keeps new readers
/// out, so readers cannot starve writers.
///
/// Every reader has its own lease, renewed by the watchdog; its guard's fencing token is not a
/// new one but sorts between the write tokens around it (see [`LockGuard::fencing_token`](crate::guard::LockGuard::fencing_token)).
///
/// ```no_run
/// # async fn f() -> Result<(), distlock::LockError> {
/// let guard = distlock::read_lock("catalog").acquire().await?;
/// // … other readers may hold it too; no writer does …
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub fn read_lock(key: impl Into<String>) -> LockRequest {
    LockRequest::read(GLOBAL.get().map(|client| client.engine.clone()), key.into())
}

/// Starts a request for one of `permits` permits of the semaphore `key` through the global
/// client: at most `permits` holders at once, in every process.
///
/// Every permit has its own owner and lease, renewed by the watchdog like any grant: a
/// crashed holder's permit comes back when its lease ends, and a release (safe to retry)
/// gives back only its own permit. Waiters are woken when a permit is released, with backoff
/// as the fallback. Every request for a key must name the same count: a request naming
/// another count while permits are held fails with [`LockError::Config`] (never a silent
/// resize); `permits == 0` fails with [`LockError::Config`] too. While permits are held the
/// key's writers and readers wait, and while they hold it permits wait.
///
/// On Redlock a permit needs more than a majority of masters (see
/// [`LockGuard::permits`](crate::LockGuard::permits)): with 3 masters and 2 permits or more,
/// every master must grant it, so such a semaphore is unavailable while a master is down.
///
/// ```no_run
/// # async fn call_rate_limited_api() {}
/// # async fn f() -> Result<(), distlock::LockError> {
/// // At most 5 calls to the partner API at once, across every process.
/// let permit = distlock::semaphore("partner-api", 5).acquire().await?;
/// call_rate_limited_api().await;
/// permit.release().await?;
/// # Ok(()) }
/// ```
pub fn semaphore(key: impl Into<String>, permits: u32) -> LockRequest {
    LockRequest::semaphore(
        GLOBAL.get().map(|client| client.engine.clone()),
        key.into(),
        permits,
    )
}

/// Starts a request for the locks of every key of `keys` at once, through the global client:
/// all or nothing, under one guard, with one wait deadline and a fencing token per key
/// ([`LockGuard::fencing_token_of`](crate::guard::LockGuard::fencing_token_of)). A transfer between two accounts, an order over several
/// SKUs.
///
/// The keys are taken in a fixed order (sorted, duplicates taken once) and never one by one
/// while holding others: a try takes every key or none (one script per node, or per hash slot
/// on Cluster, where a partial grant is given back before the request backs off), so two
/// requests naming the same keys in opposite orders cannot deadlock. Each key is an ordinary
/// exclusive lock: a `lock(key)` elsewhere excludes it. The lease is counted from the first
/// request of the grant; the watchdog renews every key, and the guard reports the lease lost
/// when any key is lost. An empty list fails with [`LockError::Config`].
///
/// ```no_run
/// # async fn f() -> Result<(), distlock::LockError> {
/// let guard = distlock::lock_all(["acct:7", "acct:3"]).acquire().await?;
/// let to = guard.fencing_token_of("acct:3");     // each key has its own token
/// // … move the money …
/// guard.release().await?;                          // gives back both
/// # Ok(()) }
/// ```
pub fn lock_all<I, K>(keys: I) -> LockRequest
where
    I: IntoIterator<Item = K>,
    K: Into<String>,
{
    LockRequest::all(GLOBAL.get().map(|client| client.engine.clone()), keys)
}

/// [`Client::shutdown`] for the global client set up by [`init`]: gives back every lock it
/// holds and refuses new requests. Without [`init`], nothing to do (`Ok(0)`).
pub async fn shutdown() -> Result<usize, LockError> {
    match GLOBAL.get() {
        Some(client) => client.shutdown().await,
        None => Ok(0),
    }
}

/// [`Client::ping`] for the global client set up by [`init`]: whether its store answers now,
/// for a readiness probe. Without [`init`], [`LockError::NotInitialized`].
pub async fn ping() -> Result<(), LockError> {
    GLOBAL.get().ok_or(LockError::NotInitialized)?.ping().await
}

/// [`Client::inspect`] on the global client set up by [`init`]: who holds the lock `key`
/// (any process), its lease, its waiters and its fencing token ceiling. Without [`init`],
/// [`LockError::NotInitialized`].
pub async fn inspect(key: impl Into<String>) -> Result<LockState, LockError> {
    GLOBAL
        .get()
        .ok_or(LockError::NotInitialized)?
        .inspect(key)
        .await
}

/// [`Client::is_locked`] on the global client set up by [`init`]: whether any process holds
/// the lock `key` now. Without [`init`], [`LockError::NotInitialized`].
pub async fn is_locked(key: impl Into<String>) -> Result<bool, LockError> {
    GLOBAL
        .get()
        .ok_or(LockError::NotInitialized)?
        .is_locked(key)
        .await
}
