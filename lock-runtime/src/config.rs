//! Configuration: where the locks live and the defaults every request starts from. A
//! [`Config`] is turned into a [`Client`](crate::Client) (or the global client by
//! [`init`](crate::init)); nothing here connects.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::memory::MemoryStore;
use crate::error::{server_address, LockError};

/// URL used by [`Config::from_env`] when `REDIS_URL` is not set.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Prefix put before every lock key in Redis.
pub const DEFAULT_KEY_PREFIX: &str = "distlock:";
/// Lease (time to live) of a grant when a request sets none.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Shortest lease accepted: the watchdog renews at a third of the lease and allows for 2 ms of
/// clock drift, which leaves nothing of a shorter lease.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// Longest lease accepted (a year): longer ones are mistakes, and would overflow clocks.
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long a request waits for a held lock when it sets no wait.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// First backoff step between tries of a held lock (the ceiling of the first random delay).
pub const DEFAULT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Largest backoff step between tries of a held lock.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_millis(200);
/// How long a request to Redis may go unanswered before it fails.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long connecting to Redis may take before it fails.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the locks are kept.
#[derive(Clone)]
pub(crate) enum BackendConfig {
    /// One Redis server, its URL parsed when the config is made.
    Redis(Box<redis::Client>),
    /// In this process; clients made from clones of one config share the store.
    InMemory(Arc<MemoryStore>),
}

/// Settings of a [`Client`](crate::Client): the backend and the defaults of every request.
///
/// ## Behavior
///
/// - Making a config never connects; the first lock request does.
/// - [`Config::in_memory`] is never chosen silently: a Redis config whose server is down gives
///   [`LockError::Backend`] errors, not an in-process fallback.
/// - `Debug` output and error messages never show the password of a URL.
///
/// ```
/// use std::time::Duration;
/// use distlock::Config;
///
/// let config = Config::from_url("redis://127.0.0.1:6379")?
///     .key_prefix("shop:locks:")
///     .default_lease(Duration::from_secs(15));
/// # Ok::<(), distlock::LockError>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct Config {
    pub(crate) backend: BackendConfig,
    pub(crate) key_prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) connect_timeout: Duration,
}

impl Config {
    fn with_backend(backend: BackendConfig) -> Self {
        Self {
            backend,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            default_lease: DEFAULT_LEASE,
            default_wait: DEFAULT_WAIT,
            backoff_min: DEFAULT_BACKOFF_MIN,
            backoff_max: DEFAULT_BACKOFF_MAX,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// A single Redis server, e.g. `redis://:password@host:6379/0` or `rediss://…` (TLS needs
    /// the redis crate's TLS feature). Fails with [`LockError::Config`] when the URL cannot be
    /// parsed; nothing connects yet.
    ///
    /// ```
    /// let config = distlock::Config::from_url("redis://127.0.0.1:6379/0")?;
    /// assert!(distlock::Config::from_url("http://nope").is_err());
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let client = redis::Client::open(url).map_err(|err| {
            LockError::Config(format!(
                "the Redis URL is not usable ({}); expected `redis://[:password@]host[:port][/db]`",
                err.category()
            ))
        })?;
        Ok(Self::with_backend(BackendConfig::Redis(Box::new(client))))
    }

    /// The Redis server named by the `REDIS_URL` environment variable, or
    /// [`DEFAULT_REDIS_URL`] when it is not set.
    ///
    /// ```no_run
    /// distlock::init(distlock::Config::from_env()?)?;
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    pub fn from_env() -> Result<Self, LockError> {
        match std::env::var("REDIS_URL") {
            Ok(url) => Self::from_url(&url),
            Err(std::env::VarError::NotPresent) => Self::from_url(DEFAULT_REDIS_URL),
            Err(std::env::VarError::NotUnicode(_)) => Err(LockError::Config(
                "REDIS_URL is not valid UTF-8; set it to a URL like `redis://127.0.0.1:6379`"
                    .to_owned(),
            )),
        }
    }

    /// Locks kept in this process, with the same semantics as Redis (leases expire, fencing
    /// tokens increase). For unit tests of code that takes locks, and demos without Redis.
    /// Clients made from clones of the returned config share one store; two calls make two
    /// independent stores.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::new(distlock::Config::in_memory())?;
    /// let guard = client.lock("report:7").acquire().await?;
    /// assert!(guard.is_held());
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn in_memory() -> Self {
        Self::with_backend(BackendConfig::InMemory(Arc::new(MemoryStore::default())))
    }

    /// Text put before every lock key (keys of different applications sharing one Redis stay
    /// apart). Defaults to [`DEFAULT_KEY_PREFIX`].
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Lease of a grant whose request sets none. Defaults to [`DEFAULT_LEASE`].
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.default_lease = lease;
        self
    }

    /// Wait of a request that sets none. Defaults to [`DEFAULT_WAIT`].
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// Bounds of the exponential backoff between tries of a held lock: the first delay is drawn
    /// from `0..=min`, each further one from a range twice as wide, up to `0..=max`.
    /// Defaults to [`DEFAULT_BACKOFF_MIN`] and [`DEFAULT_BACKOFF_MAX`].
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max;
        self
    }

    /// How long one request to Redis may go unanswered. Defaults to
    /// [`DEFAULT_RESPONSE_TIMEOUT`].
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long connecting to Redis may take. Defaults to [`DEFAULT_CONNECT_TIMEOUT`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Rejects settings no client can work with, naming the setting and what is accepted.
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        let positive = [
            ("default_lease", self.default_lease),
            ("response_timeout", self.response_timeout),
            ("connect_timeout", self.connect_timeout),
            ("backoff min", self.backoff_min),
            ("backoff max", self.backoff_max),
        ];
        for (name, value) in positive {
            if value.is_zero() {
                return Err(LockError::Config(format!(
                    "`{name}` must be greater than zero"
                )));
            }
        }
        if let Some(why) = lease_out_of_bounds(self.default_lease) {
            return Err(LockError::Config(format!("`default_lease` is {why}")));
        }
        if self.backoff_min > self.backoff_max {
            return Err(LockError::Config(format!(
                "backoff min ({:?}) must not exceed backoff max ({:?})",
                self.backoff_min, self.backoff_max
            )));
        }
        Ok(())
    }
}

/// Why `lease` cannot be a lease, if it cannot: "{lease}; it must be between … and …".
pub(crate) fn lease_out_of_bounds(lease: Duration) -> Option<String> {
    (!(MIN_LEASE..=MAX_LEASE).contains(&lease))
        .then(|| format!("{lease:?}; it must be between {MIN_LEASE:?} and {MAX_LEASE:?}"))
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend = match &self.backend {
            BackendConfig::Redis(client) => format!("Redis({})", server_address(client)),
            BackendConfig::InMemory(_) => "InMemory".to_owned(),
        };
        f.debug_struct("Config")
            .field("backend", &backend)
            .field("key_prefix", &self.key_prefix)
            .field("default_lease", &self.default_lease)
            .field("default_wait", &self.default_wait)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("response_timeout", &self.response_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_password() {
        let config = Config::from_url("redis://admin:hunter2@127.0.0.1:6379").unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("admin"), "{shown}");
    }

    #[test]
    fn a_garbage_url_is_a_config_error_without_the_secret() {
        let err = Config::from_url("http://user:hunter2@host").unwrap_err();
        assert!(matches!(err, LockError::Config(_)));
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn zero_lease_and_inverted_backoff_are_rejected() {
        let zero = Config::in_memory().default_lease(Duration::ZERO);
        assert!(zero
            .validate()
            .unwrap_err()
            .to_string()
            .contains("default_lease"));
        let inverted =
            Config::in_memory().backoff(Duration::from_secs(1), Duration::from_millis(1));
        assert!(inverted.validate().is_err());
    }
}
