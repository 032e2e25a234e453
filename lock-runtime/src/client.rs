//! [`Client`], the global client behind [`init`], [`lock`], [`read_lock`] and [`write_lock`],
//! and [`LockRequest`] with the acquire loop, the same for every lock kind: try, and while the lock is held, back off with full jitter — capped by the
//! holder's remaining lease and never past the wait deadline — and try again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::cluster::ClusterBackend;
use crate::backend::endpoint::{Endpoint, Sentinel};
use crate::backend::memory::MemoryBackend;
use crate::backend::redis::{NodeOptions, RedisBackend};
use crate::backend::redlock::RedlockBackend;
use crate::backend::wake::ReleaseListener;
use crate::backend::{is_ambiguous, AcquireReply, Backend, Kind, LockBackend, LockKey, Try};
use crate::clock::Clock;
use crate::config::{lease_out_of_bounds, BackendConfig, Config};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::inspect::{scan_patterns, ForcedUnlock, Holder, HolderTag, LockState};
use crate::io::IoRuntime;
use crate::kind::fair::{self, Seat};
use crate::kind::Tokens;
use crate::lease::{drift, Lease};
use crate::release::Releaser;
use crate::telemetry::{self, Acquire};
use crate::watchdog::Watchdog;
use crate::FencingToken;

static GLOBAL: OnceLock<Client> = OnceLock::new();

/// Added to twice the longest backoff step for how long a waiting writer's mark keeps new
/// readers out: the round trip of its next try.
const WRITER_WAITING_MARGIN: Duration = Duration::from_millis(100);
/// The longest a waiting writer's mark lives, whatever the backoff.
const MAX_WRITER_WAITING_MARK: Duration = Duration::from_secs(60);

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
    let global_settings = format!("{:?}", global.inner.config);
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

/// The global client, `None` before [`init`] (for the attribute, `scope`).
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
    LockRequest::new(GLOBAL.get().cloned(), key.into(), Kind::Write)
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
/// new one but sorts between the write tokens around it (see [`LockGuard::fencing_token`]).
///
/// ```no_run
/// # async fn f() -> Result<(), distlock::LockError> {
/// let guard = distlock::read_lock("catalog").acquire().await?;
/// // … other readers may hold it too; no writer does …
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub fn read_lock(key: impl Into<String>) -> LockRequest {
    LockRequest::new(GLOBAL.get().cloned(), key.into(), Kind::Read)
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
    LockRequest::new(GLOBAL.get().cloned(), key.into(), Kind::Semaphore(permits))
}

/// Starts a request for the locks of every key of `keys` at once, through the global client:
/// all or nothing, under one guard, with one wait deadline and a fencing token per key
/// ([`LockGuard::fencing_token_of`]). A transfer between two accounts, an order over several
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
    LockRequest::all(GLOBAL.get().cloned(), keys)
}

/// A handle to one lock service: its backend, its watchdog and the defaults of its requests.
/// Cheap to clone; clones share everything. Use one beside the global client when a program
/// needs a second configuration.
///
/// ## Behavior
///
/// - Connects on the first request, and again after the connection breaks; a request made
///   while Redis is unreachable fails with [`LockError::Backend`].
/// - Owns one background thread with a small runtime for its connection, its watchdog and
///   the releases of dropped guards, so it keeps working when used from several tokio
///   runtimes one after another. The thread ends when the last clone (and guard) is dropped.
/// - A command the server's ACL refuses fails the request with a [`BackendError`](crate::BackendError) of kind
///   [`BackendErrorKind::Server`](crate::BackendErrorKind::Server) that names the command
///   and how to grant it (the README's section "Keys in Redis" lists what distlock needs).
///   A user without `MULTI` or `EXEC` still locks: each new connection asks first, and a write
///   lock's first try then runs the script instead of a transaction (one warning says so).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// let client = distlock::Client::new(distlock::Config::in_memory())?;
/// let guard = client.lock("cart:1").acquire().await?;
/// assert_eq!(guard.key(), "cart:1");
/// assert!(guard.release().await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub(crate) config: Config,
    pub(crate) backend: Arc<Backend>,
    pub(crate) watchdog: Watchdog,
    /// The one way grants are given back; it keeps the I/O runtime alive while guards live.
    pub(crate) releaser: Arc<Releaser>,
    /// This process's holder record, in every owner token.
    pub(crate) holder: HolderTag,
    /// The store's name in spans and metrics ([`crate::telemetry`]).
    pub(crate) store: &'static str,
    /// Set by [`Client::shutdown`]: no new grants.
    pub(crate) shut_down: AtomicBool,
    /// The clock of the backend's leases.
    pub(crate) clock: Clock,
    /// The client's own runtime, whose (never paused) timers requests to Redis use.
    pub(crate) io: Arc<IoRuntime>,
}

impl Client {
    /// Makes a client from `config`. Does not connect.
    pub fn new(config: Config) -> Result<Self, LockError> {
        config.validate()?;
        let io = Arc::new(IoRuntime::start()?);
        let options = NodeOptions {
            response_timeout: config.response_timeout,
            connect_timeout: config.connect_timeout,
            require_primary: false,
            guard: config.replicas,
            wake_ups: true,
            tokens: Tokens::Clock,
        };
        let backend = Arc::new(match &config.backend {
            BackendConfig::Redis(client) => Backend::Redis(Box::new(RedisBackend::new(
                Endpoint::Fixed((**client).clone()),
                options,
                io.handle(),
            ))),
            BackendConfig::Sentinel { sentinels, master } => {
                Backend::Redis(Box::new(RedisBackend::new(
                    Endpoint::Sentinel(Sentinel::new(
                        sentinels.clone(),
                        master.clone(),
                        config.connect_timeout,
                        config.response_timeout,
                    )),
                    options,
                    io.handle(),
                )))
            }
            BackendConfig::Cluster(nodes) => {
                Backend::Cluster(Box::new(ClusterBackend::new(nodes, options, io.handle())?))
            }
            BackendConfig::Redlock(masters) => Backend::Redlock(Box::new(RedlockBackend::new(
                masters,
                options,
                config.node_timeout,
                io.handle(),
            ))),
            BackendConfig::InMemory(store) => Backend::Memory(MemoryBackend::new(store.clone())),
        });
        let watchdog = Watchdog::start(&io, backend.clone());
        let releaser = Arc::new(Releaser::new(backend.clone(), watchdog.clone(), io.clone()));
        telemetry::describe();
        Ok(Self {
            inner: Arc::new(ClientInner {
                store: store_name(&config.backend),
                shut_down: AtomicBool::new(false),
                holder: HolderTag::of_this_process(config.app_name.as_deref()),
                config,
                clock: backend.clock(),
                backend,
                watchdog,
                releaser,
                io,
            }),
        })
    }

    /// Whether `other` is this client or a clone of it: the same grants, watchdog and store.
    pub(crate) fn is_same(&self, other: &Client) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Starts a request for the lock `key` through this client (exclusive: the write side of
    /// the key's read/write lock).
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(Some(self.clone()), key.into(), Kind::Write)
    }

    /// Starts a request for the write side of the read/write lock `key`: the same lock as
    /// [`Client::lock`]. See [`write_lock`].
    pub fn write_lock(&self, key: impl Into<String>) -> LockRequest {
        self.lock(key)
    }

    /// Starts a request for the locks of every key of `keys` at once: all or nothing, one
    /// guard, a fencing token per key. See [`lock_all`].
    pub fn lock_all<I, K>(&self, keys: I) -> LockRequest
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        LockRequest::all(Some(self.clone()), keys)
    }

    /// Starts a request for the read side of the read/write lock `key`. See [`read_lock`].
    pub fn read_lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(Some(self.clone()), key.into(), Kind::Read)
    }

    /// Starts a request for one of `permits` permits of the semaphore `key`. See
    /// [`semaphore`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// use std::time::Duration;
    /// let client = distlock::Client::new(distlock::Config::in_memory())?;
    /// let a = client.semaphore("api", 2).acquire().await?;
    /// let b = client.semaphore("api", 2).acquire().await?;
    /// assert_eq!(a.permits(), Some(2));
    /// // Both permits are taken: a third request waits, here not at all.
    /// let third = client.semaphore("api", 2).wait(Duration::ZERO).acquire().await;
    /// assert!(matches!(third, Err(distlock::LockError::Timeout { .. })));
    /// b.release().await?;
    /// let c = client.semaphore("api", 2).acquire().await?;
    /// # drop((a, c)); Ok(()) }
    /// ```
    pub fn semaphore(&self, key: impl Into<String>, permits: u32) -> LockRequest {
        LockRequest::new(Some(self.clone()), key.into(), Kind::Semaphore(permits))
    }

    /// Graceful shutdown: gives back every lock this client (and its clones) holds, and
    /// refuses new requests. Call it when the process is about to exit, after it has stopped
    /// taking work, so the next holders need not wait for leases to run out.
    ///
    /// Each held grant is first reported lost to its holder ([`LockGuard::lost`] completes, an
    /// annotated fn with `on_lost = "abort"` returns [`LockError::LeaseLost`] at its next
    /// await), then released. Requests made afterwards fail with [`LockError::Config`]; guards
    /// dropped afterwards cost one request that finds nothing to delete.
    ///
    /// Returns how many grants were held and given back; an error is the first release that
    /// failed (every release is tried; a failed one's lease runs out).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::new(distlock::Config::in_memory())?;
    /// let guard = client.lock("job:1").acquire().await?;
    /// assert_eq!(client.shutdown().await?, 1);
    /// assert!(!guard.is_held());
    /// assert!(client.lock("job:1").acquire().await.is_err());
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(&self) -> Result<usize, LockError> {
        let inner = &self.inner;
        inner.shut_down.store(true, Ordering::SeqCst);
        let mut leases = inner.watchdog.drain();
        leases.retain(|lease| lease.shut_down());
        let released = leases.len();
        // A holder told of the shutdown may drop its guard meanwhile: its release and this
        // one are the same compare-and-delete, and whichever comes second finds nothing.
        let releases = leases.iter().map(|lease| inner.releaser.release(lease));
        let first_error = futures_util::future::join_all(releases)
            .await
            .into_iter()
            .find_map(Result::err);
        tracing::info!(target: crate::LOG_TARGET, store = inner.store, released, "client shut down");
        first_error.map_or(Ok(released), Err)
    }

    pub(crate) fn shut_down_error() -> LockError {
        LockError::Config(
            "this distlock client was shut down (`Client::shutdown`); make a new client to \
             take locks again"
                .to_owned(),
        )
    }
}

/// [`Client::shutdown`] for the global client set up by [`init`]: gives back every lock it
/// holds and refuses new requests. Without [`init`], nothing to do (`Ok(0)`).
pub async fn shutdown() -> Result<usize, LockError> {
    match GLOBAL.get() {
        Some(client) => client.shutdown().await,
        None => Ok(0),
    }
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

/// Operator's tools: who holds a lock, freeing it by force, and the locks held. They read
/// (and, for [`force_unlock`](Client::force_unlock), change) the store directly, never the
/// state of this process, so they see locks held by every process; the `distlock` command-line
/// tool is built on them.
impl Client {
    /// Who holds the lock `key` now (the writer, or every reader, each with its host, process
    /// id, application name and since when), how long it stays held, whether a writer waits,
    /// how many processes wait for its release, and the fencing token ceiling. Read-only: one
    /// request (on Redlock, one per master; see [`LockState`] for how they are merged).
    ///
    /// Errors: [`LockError::InvalidKey`], [`LockError::Backend`] when the store failed (or
    /// the key holds something that is no lock: another application uses the same prefix),
    /// [`LockError::QuorumUnavailable`] when too few Redlock masters answered.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::new(distlock::Config::in_memory().app_name("billing"))?;
    /// let guard = client.lock("invoice:7").acquire().await?;
    /// let state = client.inspect("invoice:7").await?;
    /// assert_eq!(state.mode, Some(distlock::LockMode::Write));
    /// assert_eq!(state.holders[0].app.as_deref(), Some("billing"));
    /// assert_eq!(state.holders[0].pid, Some(std::process::id()));
    /// # drop(guard); Ok(()) }
    /// ```
    pub async fn inspect(&self, key: impl Into<String>) -> Result<LockState, LockError> {
        let key = LockKey::new(&self.inner.config.key_prefix, key.into())?;
        let inner = &self.inner;
        let view = inner
            .clock
            .send(&inner.io, inner.backend.inspect(&key))
            .await?;
        Ok(LockState {
            mode: view.mode,
            holders: view
                .holders
                .into_iter()
                .map(|(owner, remaining)| Holder::parse(owner, remaining))
                .collect(),
            remaining: view.remaining,
            writer_waiting: view.writer_waiting,
            waiting_processes: view.subscribers,
            queued: view.queued,
            token_ceiling: FencingToken(view.token_ceiling),
            permits: view.permits.filter(|_| view.mode.is_some()),
            key: key.name,
        })
    }

    /// Whether anyone (any process) holds the lock `key` now, as a writer, a reader or a
    /// semaphore permit holder. The answer can be stale by the time it arrives: to act on a
    /// lock, take it.
    ///
    /// Errors: those of [`Client::inspect`].
    pub async fn is_locked(&self, key: impl Into<String>) -> Result<bool, LockError> {
        Ok(self.inspect(key).await?.is_locked())
    }

    /// **An operator's tool**: frees the lock `key` whatever holds it — its writer, every
    /// reader, or every permit holder of a semaphore — and the writer-waiting mark, and wakes
    /// the waiters. Returns the evicted holders and a fencing token greater than every token
    /// handed out for the key so far (every later grant's token is greater still).
    ///
    /// **Warning**: this breaks mutual exclusion for the evicted holders. Each notices only at
    /// its next renewal (a third of its lease at most): its guard then reports the lease lost
    /// ([`LockGuard::lost`]) and an annotated fn with `on_lost = "abort"` is cancelled; until
    /// then it runs beside the next holder. Only a fenced store is safe: hand it the returned
    /// token, and it rejects the evicted holders' late writes. Use it for a lock left held by
    /// a hung process, not as part of normal operation.
    ///
    /// Errors: those of [`Client::inspect`]; on Redlock also [`LockError::QuorumUnavailable`]
    /// when the lock could not be freed, or the token not made to stand, on a majority.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::new(distlock::Config::in_memory())?;
    /// let hung = client.lock("report").acquire().await?;
    /// let forced = client.force_unlock("report").await?;
    /// assert_eq!(forced.evicted.len(), 1);
    /// assert!(Some(forced.token) > hung.fencing_token());
    /// // … store forced.token in the fenced store, so the hung holder's writes are refused …
    /// assert!(!client.is_locked("report").await?);
    /// # Ok(()) }
    /// ```
    pub async fn force_unlock(&self, key: impl Into<String>) -> Result<ForcedUnlock, LockError> {
        let key = LockKey::new(&self.inner.config.key_prefix, key.into())?;
        let inner = &self.inner;
        let (evicted, token) = inner
            .clock
            .send(&inner.io, inner.backend.force_unlock(&key))
            .await?;
        tracing::warn!(target: crate::LOG_TARGET, key = %key.name, evicted = evicted.len(), token,
            "lock freed by force_unlock; its evicted holders learn it at their next renewal");
        Ok(ForcedUnlock {
            evicted: evicted
                .into_iter()
                .map(|(owner, remaining)| Holder::parse(owner, remaining))
                .collect(),
            token: FencingToken(token),
            key: key.name,
        })
    }

    /// The names of the locks held now whose name matches the glob `pattern` (Redis glob:
    /// `*`, `?`, `[a-z]`, `[^a-z]`, `\` escapes; `*` for all), sorted, at most `limit`. Found
    /// with `SCAN … MATCH` (never `KEYS`, which blocks the server) under this client's key
    /// prefix: on every primary of a Cluster, and the union over Redlock's masters. A lock
    /// taken or freed during the scan may or may not be listed; a name beyond `limit` is
    /// left out, not the scan cut short at random.
    ///
    /// Errors: [`LockError::Backend`], [`LockError::QuorumUnavailable`] (Redlock).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::new(distlock::Config::in_memory())?;
    /// let _a = client.lock("order:1").acquire().await?;
    /// let _b = client.read_lock("user:2").acquire().await?;
    /// assert_eq!(client.list("order:*", 100).await?, ["order:1"]);
    /// # Ok(()) }
    /// ```
    pub async fn list(&self, pattern: &str, limit: usize) -> Result<Vec<String>, LockError> {
        let inner = &self.inner;
        let prefix = &inner.config.key_prefix;
        let patterns = scan_patterns(prefix, pattern);
        let keys = inner
            .clock
            .send(&inner.io, inner.backend.scan(&patterns, usize::MAX))
            .await?;
        let mut names: Vec<String> = keys
            .iter()
            .filter_map(|key| crate::inspect::name_of(prefix, key))
            .collect();
        names.sort_unstable();
        names.dedup();
        names.truncate(limit);
        Ok(names)
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// A request for one lock, built with consuming setters and sent by
/// [`acquire`](LockRequest::acquire).
///
/// ## Behavior
///
/// - One try is one round trip. While the lock is held, the request sleeps a random time
///   between zero and an exponentially growing ceiling (full jitter), never longer than the
///   holder's remaining lease and never past the wait deadline, and tries again; the last try
///   happens at the deadline. A wait of zero tries once.
/// - A backend error ends the request at once with [`LockError::Backend`] (on Redlock,
///   [`LockError::QuorumUnavailable`] when too few masters answered). If the failed try
///   may still have taken the lock (a timeout, a broken connection), or the acquire future is
///   dropped while a try is under way, the possible grant is deleted in the background with a
///   compare-and-delete.
#[must_use = "a lock request does nothing until `.acquire().await`"]
#[derive(Debug)]
pub struct LockRequest {
    pub(crate) client: Option<Client>,
    pub(crate) kind: Kind,
    key: String,
    pub(crate) lease: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) watchdog: bool,
    pub(crate) fencing: Option<bool>,
    /// A multi-key request ([`lock_all`]): every key, as given (`key` is then unused).
    pub(crate) all_keys: Option<Vec<String>>,
    /// Queued in request order among fair waiters ([`LockRequest::fair`]).
    pub(crate) fair: bool,
}

impl LockRequest {
    fn new(client: Option<Client>, key: String, kind: Kind) -> Self {
        Self {
            client,
            kind,
            key,
            lease: None,
            wait: None,
            max_hold: None,
            watchdog: true,
            fencing: None,
            all_keys: None,
            fair: false,
        }
    }

    /// A request for the write locks of every key of `keys` at once ([`lock_all`]).
    fn all<I, K>(client: Option<Client>, keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        let mut request = Self::new(client, String::new(), Kind::Write);
        request.all_keys = Some(keys.into_iter().map(Into::into).collect());
        request
    }

    /// Lease (time to live) of the grant; the watchdog renews it while the guard lives.
    /// Defaults to the client's [`Config::default_lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long to wait while someone else holds the lock; zero tries once.
    /// Defaults to the client's [`Config::default_wait`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The longest the lock is held, renewals included: past it the watchdog stops renewing
    /// and the guard reports the lease lost ([`LockGuard::lost`] completes; an annotated fn
    /// with `on_lost = "abort"` returns [`LockError::HeldTooLong`]). A cap on hung work, like
    /// a maximum number of renewals. At least the lease; none by default.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Whether the watchdog renews the lease while the guard lives; with `false` the lease is a
    /// hard time limit and the guard reports it lost when it runs out. Defaults to `true`.
    pub fn watchdog(mut self, renew: bool) -> Self {
        self.watchdog = renew;
        self
    }

    /// Whether the grant carries a fencing token. Defaults to the client's
    /// [`Config::fencing`] (`true`).
    ///
    /// `false` is the efficiency mode, for a lock that only keeps work from being done twice:
    /// the first try of a write grant is a bare `SET NX PX` (no script), no fencing counter is
    /// written, and [`LockGuard::fencing_token`] is `None` — there is no token to hand to a
    /// store, so a holder paused past its lease can still write after the next holder.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), distlock::LockError> {
    /// let guard = distlock::lock("report:daily").fencing(false).acquire().await?;
    /// assert_eq!(guard.fencing_token(), None);
    /// # Ok(()) }
    /// ```
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = Some(fencing);
        self
    }

    /// Makes the request fair: it waits in the key's queue and is granted in request order
    /// among the key's fair waiters (FIFO), instead of to whoever tries first after a release.
    /// Only for the exclusive (write) lock; a read, semaphore or multi-key request made fair
    /// fails with [`LockError::Config`]. Defaults to not fair.
    ///
    /// ## Behavior
    ///
    /// - The first try joins the queue; its place is the server's clock when it got there
    ///   (on Redlock, this client's clock when the request started, the same on every master,
    ///   so that the masters agree on the order). Only the queue's head is granted the lock.
    /// - A release wakes the head alone; every waiter also tries again at least every half
    ///   [`Config::fair_heartbeat`], which keeps its place (the fallback when a wake-up is lost).
    /// - A waiter that stops trying — crashed, frozen, cut off — is dropped from the queue one
    ///   and a half heartbeats after its last try, on the server's clock, by the next try of
    ///   any waiter; so a dead waiter holds the queue up for at most two heartbeats. A waiter
    ///   whose request times out, fails or is cancelled (its future dropped) leaves the queue at
    ///   once, in the background. A waiter dropped while alive (its process stalled past its
    ///   heartbeat) comes back at the place it had: each refusal tells it its place.
    /// - Unfair requests for the same key ([`lock`], [`write_lock`]) do not queue: they take the
    ///   lock whenever they find it free, and exclude fair holders as any writer does.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), distlock::LockError> {
    /// let guard = distlock::lock("invoice:7").fair().acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    /// Takes the lock, waiting as configured.
    ///
    /// Errors: [`LockError::Timeout`] when the lock stayed held for the whole wait (or no grant
    /// counted: see [`Config::replicas`]), [`LockError::Backend`] when the backend failed,
    /// [`LockError::QuorumUnavailable`] when fewer than a majority of Redlock masters answered,
    /// [`LockError::InvalidKey`] for an empty or oversized key, [`LockError::Config`] for a
    /// zero lease or a Redlock master that is a replica, and [`LockError::NotInitialized`]
    /// for the global client before [`init`].
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let client = self.client.clone().ok_or(LockError::NotInitialized)?;
        if self.fair {
            if let Some(err) = self.unfair_kind() {
                return Err(err);
            }
        }
        if self.all_keys.is_some() {
            return self.acquire_all(&client).await;
        }
        let mut observed = Acquire::start(&self.key, self.kind.into(), client.inner.store);
        let outcome = if observed.span.is_disabled() {
            // No subscriber takes the span: no wrapper around the acquire loop (hot path).
            self.acquire_on(&client, &mut observed).await
        } else {
            let span = observed.span.clone();
            self.acquire_on(&client, &mut observed)
                .instrument(span)
                .await
        };
        if let Err(err) = &outcome {
            match err {
                LockError::Timeout { .. } => observed.timed_out(),
                err => observed.failed(err),
            }
        }
        outcome
    }

    /// The error for a request made [`fair`](Self::fair) whose kind has no queue.
    fn unfair_kind(&self) -> Option<LockError> {
        let what = match (&self.all_keys, self.kind) {
            (Some(_), _) => "multi-key lock (taken in a fixed key order, not queued)",
            (None, Kind::Read) => "read lock (readers share the lock and need no queue)",
            (None, Kind::Semaphore(_)) => "semaphore",
            (None, Kind::Write | Kind::Fair) => return None,
        };
        Some(LockError::Config(format!(
            "lock `{}` was requested fair as a {what}; only the exclusive lock (`lock`, \
             `write_lock`) queues its waiters: drop `.fair()`",
            self.all_keys
                .as_ref()
                .map_or_else(|| self.key.clone(), |keys| keys.join(", "))
        )))
    }

    /// The request's lease, or the client's default, checked against its bounds and against
    /// `max_hold`; `name` names the lock in the error.
    pub(crate) fn checked_lease(&self, config: &Config, name: &str) -> Result<Duration, LockError> {
        let lease = self.lease.unwrap_or(config.default_lease);
        if let Some(why) = lease_out_of_bounds(lease) {
            return Err(LockError::Config(format!(
                "the lease of lock `{name}` is {why}"
            )));
        }
        if let Some(max_hold) = self.max_hold.filter(|&max_hold| max_hold < lease) {
            return Err(LockError::Config(format!(
                "the max_hold of lock `{name}` ({max_hold:?}) is shorter than its lease ({lease:?}): \
                 it would be given up before its first renewal; make max_hold at least the lease"
            )));
        }
        Ok(lease)
    }

    /// The acquire loop, observed through `observed`.
    async fn acquire_on(
        mut self,
        client: &Client,
        observed: &mut Acquire,
    ) -> Result<LockGuard, LockError> {
        let inner = &client.inner;
        if inner.shut_down.load(Ordering::Relaxed) {
            return Err(Client::shut_down_error());
        }
        let config = &inner.config;
        let key = LockKey::new(&config.key_prefix, std::mem::take(&mut self.key))?;
        if self.kind == Kind::Semaphore(0) {
            return Err(crate::kind::semaphore::no_permits(&key));
        }
        let lease = self.checked_lease(config, &key.name)?;
        let wait = self.wait.unwrap_or(config.default_wait);
        observed.try_once = wait.is_zero();
        // The wait runs on the caller's clock; leases on the backend's (see `clock`).
        let started = Instant::now();
        let deadline = started
            .checked_add(wait)
            .unwrap_or_else(|| started + Duration::from_secs(100 * 365 * 24 * 3600));
        let mut backoff = Backoff::new(config.backoff_min, config.backoff_max);
        let waker = inner.backend.waker();
        // Registered on the first wait, kept for the rest of this request.
        let mut interest = None;
        let kind = if self.fair { Kind::Fair } else { self.kind };
        let fencing = self.fencing.unwrap_or(config.fencing);
        let mut refused_before = false;
        // A fair request's place in the key's queue, until the request ends.
        let mut fair = self
            .fair
            .then(|| FairWait::new(&inner.releaser, &key, config.fair_heartbeat));
        loop {
            // A shutdown also ends a request that is waiting: it takes no grant after it.
            if inner.shut_down.load(Ordering::Relaxed) {
                return Err(Client::shut_down_error());
            }
            // Every try has an owner token of its own, so a try can never be mistaken for an
            // earlier one whose grant is being given back: a late grant's clean-up and the
            // next try may reach Redis in either order.
            let sent = inner.clock.now();
            let writer_waiting =
                writer_waiting_mark(config.backoff_max, deadline - Instant::now().min(deadline));
            let attempt = Attempt {
                releaser: &inner.releaser,
                kind,
                keys: std::slice::from_ref(&key),
                owner: match &fair {
                    Some(fair) => fair.new_owner(&inner.holder),
                    None => new_owner(&inner.holder),
                },
                expires: sent + lease,
                settled: false,
            };
            observed.tried();
            if let Some(fair) = &mut fair {
                fair.trying(&attempt.owner, attempt.expires);
            }
            let reply = inner
                .clock
                .send(
                    &inner.io,
                    inner.backend.acquire(&Try {
                        kind,
                        key: &key,
                        owner: &attempt.owner,
                        lease,
                        writer_waiting,
                        refused_before,
                        fencing,
                        seat: fair.as_ref().map(|fair| fair.seat),
                    }),
                )
                .await;
            let remaining = match reply {
                Ok(AcquireReply::Acquired(_))
                    if inner.clock.now() >= sent + lease - drift(lease) =>
                {
                    // The reply came too late to leave any of the lease: dropping the
                    // unsettled attempt gives the grant back; try again like a held lock.
                    drop(attempt);
                    None
                }
                Ok(AcquireReply::Acquired(token)) => {
                    let owner = attempt.settle();
                    if let Some(fair) = fair.take() {
                        fair.granted();
                    }
                    let hold = observed.granted(&key.name, token, lease);
                    let lease = Arc::new(Lease::new(
                        kind,
                        key,
                        owner,
                        token,
                        lease,
                        self.watchdog,
                        self.max_hold,
                        sent,
                        inner.clock,
                        hold,
                    ));
                    inner.watchdog.watch(lease.clone());
                    let guard = LockGuard::new(lease, inner.releaser.clone());
                    if inner.shut_down.load(Ordering::SeqCst) {
                        // Granted while the client shut down: given back at once.
                        let _ = guard.release().await;
                        return Err(Client::shut_down_error());
                    }
                    return Ok(guard);
                }
                Ok(AcquireReply::Held(remaining)) => {
                    attempt.settle();
                    observed.refused();
                    refused_before = true;
                    remaining
                }
                Ok(AcquireReply::Queued {
                    place,
                    behind,
                    remaining,
                }) => {
                    attempt.settle();
                    observed.refused();
                    refused_before = true;
                    if let Some(fair) = &mut fair {
                        fair.refused(place, behind);
                    }
                    remaining
                }
                Err(err) => {
                    if !is_ambiguous(&err) {
                        attempt.settle();
                    }
                    return Err(err);
                }
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::Timeout {
                    key: key.name,
                    waited: now - started,
                });
            }
            let mut delay = match &fair {
                Some(fair) => fair.next_delay(&mut backoff, waker, &key.channel),
                None => backoff.next_delay(),
            }
            .min(deadline - now);
            if let Some(remaining) = remaining {
                delay = delay.min(remaining);
            }
            match waker {
                // Woken by the holder's release, or after the backoff step at the latest.
                Some(waker) => {
                    let interest = interest.get_or_insert_with(|| {
                        let waiter = fair.as_ref().map_or("", |fair| fair.waiter.as_str());
                        waker.interest(&key.channel, kind, waiter)
                    });
                    observed.waited(waker.wait(interest, delay).await);
                }
                None => tokio::time::sleep(delay).await,
            }
        }
    }
}

/// The name of the store a config chooses, as spans and metrics label it.
fn store_name(backend: &BackendConfig) -> &'static str {
    match backend {
        BackendConfig::Redis(_) => "redis",
        BackendConfig::Sentinel { .. } => "sentinel",
        BackendConfig::Cluster(_) => "cluster",
        BackendConfig::Redlock(_) => "redlock",
        BackendConfig::InMemory(_) => "memory",
    }
}

/// How long a writer's try that finds the lock held keeps new readers out: longer than any
/// pause before its next try (twice the longest backoff step, plus a round trip), but not past
/// the end of its wait, and nothing on its last try — a writer that will not try again must
/// not hold readers up.
pub(crate) fn writer_waiting_mark(backoff_max: Duration, left_to_wait: Duration) -> Duration {
    if left_to_wait.is_zero() {
        return Duration::ZERO;
    }
    backoff_max
        .saturating_mul(2)
        .min(left_to_wait)
        .saturating_add(WRITER_WAITING_MARGIN)
        .min(MAX_WRITER_WAITING_MARK)
}

/// A fresh owner token: a random v4 UUID from the thread-local generator (unique, and no
/// system call per try) with the holder record (`inspect.rs`).
pub(crate) fn new_owner(holder: &HolderTag) -> String {
    let uuid = uuid::Builder::from_random_bytes(fastrand::u128(..).to_le_bytes()).into_uuid();
    holder.owner(uuid.simple().encode_lower(&mut uuid::Uuid::encode_buffer()))
}

/// A fair request's place in its key's queue until the request ends: its waiter id (which
/// every owner token of the request starts with), its [`Seat`], and whether its last try found
/// waiters ahead of it. Dropped without a grant (timed out, failed, cancelled), it takes the
/// waiter out of the queue in the background — the fair kind's release with the owner token
/// of the waiter's last try, which also gives back a grant that try may have made, and wakes
/// the new head — so the queue does not wait for the waiter's deadline.
struct FairWait<'a> {
    releaser: &'a Arc<Releaser>,
    key: LockKey,
    /// [`fair::WAITER_ID_LEN`] hex digits.
    waiter: String,
    seat: Seat,
    /// The last try found other waiters ahead.
    behind: bool,
    /// The owner token of the waiter's last try (empty: nothing to leave).
    owner: String,
    /// When the waiter's place, or the last try's grant, would be gone anyway, at the latest.
    until: std::time::Instant,
}

impl<'a> FairWait<'a> {
    fn new(releaser: &'a Arc<Releaser>, key: &LockKey, heartbeat: Duration) -> Self {
        let mut waiter = format!("{:032x}", fastrand::u128(..));
        waiter.truncate(fair::WAITER_ID_LEN);
        Self {
            releaser,
            key: key.clone(),
            waiter,
            seat: Seat {
                heartbeat,
                requested_at: unix_micros(),
                place: 0,
            },
            behind: false,
            owner: String::new(),
            until: std::time::Instant::now(),
        }
    }

    /// A fresh owner token for a try: the waiter id, then random hex digits up to the length
    /// of a UUID's, then the holder record, as [`new_owner`]'s.
    fn new_owner(&self, holder: &HolderTag) -> String {
        let mut uuid = format!("{:032x}", fastrand::u128(..));
        uuid.replace_range(..self.waiter.len().min(uuid.len()), &self.waiter);
        holder.owner(&uuid)
    }

    /// A try with `owner` is sent; a grant it makes expires at `expires` at the latest. Should
    /// the request end with this try (cancelled mid-request, an ambiguous error), leaving the
    /// queue with its owner token also gives back that grant.
    fn trying(&mut self, owner: &str, expires: std::time::Instant) {
        owner.clone_into(&mut self.owner);
        self.until = expires.max(std::time::Instant::now() + self.seat.heartbeat * 2);
    }

    /// The try was refused: the waiter's `place` (0: not said), and whether others are ahead.
    fn refused(&mut self, place: u64, behind: bool) {
        self.behind = behind;
        if place != 0 {
            // Asked for again should the waiter have to join again.
            self.seat.place = place;
        }
    }

    /// How long to wait before the next try, at most half a heartbeat, which keeps the place.
    /// Behind other waiters, the release that makes this one the head wakes it, and the
    /// heartbeat is the fallback; until this client listens for releases (and on the
    /// in-process store, which wakes nobody), backoff polls as for any lock.
    fn next_delay(
        &self,
        backoff: &mut Backoff,
        waker: Option<&ReleaseListener>,
        channel: &str,
    ) -> Duration {
        let half_beat = self.seat.heartbeat / 2;
        if self.behind && waker.is_some_and(|waker| waker.listening(channel)) {
            return half_beat;
        }
        backoff.next_delay().min(half_beat)
    }

    /// The request was granted: the grant took the waiter out of the queue.
    fn granted(mut self) {
        self.owner.clear();
    }
}

impl Drop for FairWait<'_> {
    fn drop(&mut self) {
        if !self.owner.is_empty() {
            self.releaser.clean_up(
                Kind::Fair,
                self.key.clone(),
                std::mem::take(&mut self.owner),
                self.until,
            );
        }
    }
}

/// The time since the Unix epoch in microseconds on this machine's clock (a fair waiter's
/// place on Redlock). A clock before the epoch gives a place behind every real one (2^52 µs
/// is the year 2112; places stay below 2^53, which a Redis score holds exactly).
fn unix_micros() -> u64 {
    const BEHIND_EVERY_CLOCK: u64 = 1 << 52;
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(BEHIND_EVERY_CLOCK, |d| {
            u64::try_from(d.as_micros()).unwrap_or(BEHIND_EVERY_CLOCK)
        })
}

/// A try that may have taken the lock until its reply says otherwise. Dropped unsettled
/// (an ambiguous error, a grant that came too late, or the acquire future cancelled
/// mid-request), it deletes the possible grant in the background: of its one key, or of every
/// key of a multi-key try (`multi.rs`).
pub(crate) struct Attempt<'a> {
    pub(crate) releaser: &'a Arc<Releaser>,
    pub(crate) kind: Kind,
    pub(crate) keys: &'a [LockKey],
    pub(crate) owner: String,
    /// When a grant made by this try before its clean-up runs expires at the latest.
    pub(crate) expires: std::time::Instant,
    pub(crate) settled: bool,
}

impl Attempt<'_> {
    /// The try's outcome is known: nothing to clean up. Returns its owner token.
    pub(crate) fn settle(mut self) -> String {
        self.settled = true;
        std::mem::take(&mut self.owner)
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.settled {
            for key in self.keys {
                // Only the grant: a fair request leaves the queue through its `FairWait`.
                self.releaser.clean_up(
                    self.kind.of_grant(),
                    key.clone(),
                    self.owner.clone(),
                    self.expires,
                );
            }
        }
    }
}

/// Exponential backoff with full jitter: each delay is uniform in `0..=ceiling`, the ceiling
/// doubling from `min` up to `max`.
pub(crate) struct Backoff {
    ceiling: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        Self { ceiling: min, max }
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = u64::try_from(self.ceiling.as_nanos()).unwrap_or(u64::MAX);
        self.ceiling = self.ceiling.saturating_mul(2).min(self.max);
        Duration::from_nanos(fastrand::u64(0..=ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writers_mark_outlives_its_pauses_but_not_its_wait() {
        let step = Duration::from_millis(200);
        assert_eq!(writer_waiting_mark(step, Duration::ZERO), Duration::ZERO);
        assert_eq!(
            writer_waiting_mark(step, Duration::from_secs(10)),
            2 * step + WRITER_WAITING_MARGIN
        );
        assert_eq!(
            writer_waiting_mark(step, Duration::from_millis(30)),
            Duration::from_millis(30) + WRITER_WAITING_MARGIN
        );
        assert_eq!(
            writer_waiting_mark(Duration::MAX, Duration::MAX),
            MAX_WRITER_WAITING_MARK
        );
    }

    #[test]
    fn an_unbounded_backoff_maximum_never_overflows() {
        let mut backoff = Backoff::new(Duration::from_secs(1 << 40), Duration::MAX);
        for _ in 0..200 {
            backoff.next_delay();
        }
        assert_eq!(backoff.ceiling, Duration::MAX);
    }

    #[test]
    fn backoff_ceilings_double_up_to_the_maximum() {
        let max = Duration::from_millis(40);
        let mut backoff = Backoff::new(Duration::from_millis(5), max);
        for expected in [5, 10, 20, 40, 40, 40] {
            assert_eq!(backoff.ceiling, Duration::from_millis(expected));
            assert!(backoff.next_delay() <= Duration::from_millis(expected));
        }
        assert_eq!(backoff.ceiling, max);
    }
}
