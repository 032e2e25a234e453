//! Configuration: where the locks live (a single server, a Cluster, a Sentinel-managed
//! primary, Redlock masters or this process) and the defaults every request starts from. A
//! [`Config`] is turned into a [`Client`](crate::Client) (or the global client by
//! [`init`](crate::init)); nothing here connects. This file has the type, its constructors
//! from URLs and its setters; `config/` the environment's variables (`env.rs`), where the
//! locks live (`store.rs`), the failover guard (`replicas.rs`) and the checks
//! (`validate.rs`). URLs are read by `url.rs`.

mod env;
mod etcd;
mod postgres;
mod replicas;
mod store;
#[cfg(any(feature = "etcd", feature = "postgres"))]
mod tls_settings;
mod validate;

use std::fmt;
use std::time::Duration;

use crate::error::LockError;
use crate::url::server_address;
use crate::url::{self, UrlFor};

/// The URL of a Redis server on this machine's default port, for examples and tests that
/// mean it: `Config::from_env_or(DEFAULT_REDIS_URL)` ([`Config::from_env_or`]).
/// [`Config::from_env`] never falls back to it.
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
/// How many times a request tries again, within its wait, after a try that failed for a
/// passing reason ([`Config::retry`]).
pub const DEFAULT_RETRY_ATTEMPTS: u32 = 3;
/// The pause before a request's first retry; each further one doubles ([`Config::retry`]).
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_millis(200);
/// Default [`Config::fair_heartbeat`]: how often a fair waiter shows it is alive.
pub const DEFAULT_FAIR_HEARTBEAT: Duration = Duration::from_secs(1);
/// Bounds of [`Config::fair_heartbeat`].
pub const FAIR_HEARTBEAT_BOUNDS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(10)..=Duration::from_secs(60);
/// How long a request to Redis may go unanswered before it fails.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long connecting to Redis may take before it fails.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Redlock: how long one master may take to answer one request before it counts as
/// unavailable for that request (far below the lease, as the algorithm asks).
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Redlock: the most a client proposes a write grant's fencing token ahead of its own clock,
/// whatever the settings. A client leads by its node timeout at first (so a master whose clock
/// agrees and that answers within it takes the token) and raises the lead after a master
/// refused a token as too low, never past this. Every documented fencing bound grows with it
/// and none with a setting: a counter lives at most this much longer than a lease after its
/// last grant, a read token exceeds a later write token by less than this, and a master may be
/// restarted empty a lease plus this after its last grant (all while the clocks agree).
pub const MAX_TOKEN_LEAD: Duration = Duration::from_secs(1);
/// Redlock: the longest node timeout [`Config`] accepts ([`Config::node_timeout`]): a client
/// proposes tokens at most [`MAX_TOKEN_LEAD`] ahead of its clock, so a master that takes
/// longer than that to answer would refuse them as too low even with clocks that agree.
pub const MAX_NODE_TIMEOUT: Duration = MAX_TOKEN_LEAD;

pub use env::{
    ENV_APP_NAME, ENV_CLUSTER_URLS, ENV_ETCD_ENDPOINTS, ENV_POSTGRES_URL, ENV_REDIS_URL,
    ENV_REDLOCK_URLS, ENV_SENTINEL_MASTER, ENV_SENTINEL_URLS,
};
pub use postgres::DEFAULT_POSTGRES_SCHEMA;
pub(crate) use replicas::ReplicaGuard;
use store::server_list;
#[cfg(feature = "etcd")]
pub(crate) use store::EtcdTarget;
pub(crate) use store::{InProcessLocks, StoreConfig};
#[cfg(feature = "postgres")]
pub(crate) use store::{PostgresOptions, PostgresSslMode, PostgresTarget};
#[cfg(any(feature = "etcd", feature = "postgres"))]
pub(crate) use tls_settings::TlsSettings;
pub(crate) use validate::lease_out_of_bounds;

/// Settings of a [`Client`](crate::Client): the store and the defaults of every request.
///
/// ## Behavior
///
/// - Making a config never connects; the first lock request does.
/// - [`Config::in_memory`] is never chosen silently: a Redis config whose server is down gives
///   [`LockError::Backend`] errors, not an in-process fallback.
/// - `Debug` output and error messages never show the password of a URL.
/// - A `rediss://` server needs the `tls` feature, which also installs rustls' `ring` crypto
///   provider as the process default when the application has none (install yours before
///   making the config to have it used instead).
/// - On the first connection to each server (per process), its `maxmemory-policy` is read
///   beside the first request: a policy that may evict keys with a TTL (`volatile-*`,
///   `allkeys-*`) is warned about once, since an evicted lock key hands the lock to a second
///   owner. Where `CONFIG` is disabled, nothing is said above debug level.
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
    pub(crate) store: StoreConfig,
    pub(crate) key_prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) retry_attempts: u32,
    pub(crate) retry_interval: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) node_timeout: Duration,
    pub(crate) replicas: Option<ReplicaGuard>,
    pub(crate) fencing: bool,
    pub(crate) app_name: Option<String>,
    pub(crate) fair_heartbeat: Duration,
}

impl Config {
    fn with_store(store: StoreConfig) -> Self {
        Self {
            store,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            default_lease: DEFAULT_LEASE,
            default_wait: DEFAULT_WAIT,
            backoff_min: DEFAULT_BACKOFF_MIN,
            backoff_max: DEFAULT_BACKOFF_MAX,
            retry_attempts: DEFAULT_RETRY_ATTEMPTS,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            replicas: None,
            fencing: true,
            app_name: None,
            fair_heartbeat: DEFAULT_FAIR_HEARTBEAT,
        }
    }

    /// A single Redis server, e.g. `redis://:password@host:6379/0`, or `rediss://…` over TLS
    /// (with distlock's `tls` feature; the server's certificate must chain to a root the
    /// system trusts, else see [`Config::from_redis_client`]). Fails with [`LockError::Config`]
    /// naming the part of the URL that cannot work (scheme, host, port, database, a query
    /// parameter, TLS without the feature); nothing connects yet.
    ///
    /// ```
    /// let config = distlock::Config::from_url("redis://127.0.0.1:6379/0")?;
    /// assert!(distlock::Config::from_url("http://nope").is_err());
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let client = url::parse(url, UrlFor::Single)?;
        Ok(Self::with_store(StoreConfig::Redis(Box::new(client))))
    }

    /// A single Redis server reached through a `redis::Client` the application built itself:
    /// the escape hatch for what a URL cannot say, such as a private certificate authority or
    /// a client certificate (`redis::Client::build_with_tls`), or connection settings made in
    /// code. Cluster, Sentinel and Redlock take URLs only: their TLS servers need certificates
    /// the system trusts.
    ///
    /// A TLS client needs distlock's `tls` feature (or the redis crate's own TLS support,
    /// enabled by the application with a rustls crypto provider installed); without either it
    /// is a [`LockError::Config`] that names the feature. Nothing connects yet.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = redis::Client::open("redis://127.0.0.1:6379/0")?;
    /// let config = distlock::Config::from_redis_client(redis)?;
    /// # Ok(()) }
    /// ```
    pub fn from_redis_client(client: redis::Client) -> Result<Self, LockError> {
        crate::tls::prepare("the Redis client", &client)?;
        Ok(Self::with_store(StoreConfig::Redis(Box::new(client))))
    }

    /// A Redis Cluster, found through one or more of its nodes (primaries or replicas; the
    /// rest are discovered). All keys of one lock share a hash slot, wake-ups use sharded
    /// pub/sub, and `MOVED`/`ASK` redirections and failovers are followed.
    ///
    /// ```
    /// let config = distlock::Config::cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])?;
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    pub fn cluster<S: AsRef<str>>(urls: impl IntoIterator<Item = S>) -> Result<Self, LockError> {
        let nodes = url::parse_list(urls, UrlFor::Cluster)?;
        if nodes.is_empty() {
            return Err(LockError::Config(
                "`Config::cluster` needs at least one node URL".to_owned(),
            ));
        }
        Ok(Self::with_store(StoreConfig::Cluster(nodes)))
    }

    /// The primary that Redis Sentinel knows as `master_name`, found through these sentinels
    /// and found again after a failover: after a connection error or a `READONLY` reply the
    /// sentinels are asked anew and the new primary's role is checked before it is used.
    /// The user name, password and db in the first sentinel URL are also used for the
    /// primary, and so is TLS: with `rediss://` sentinels the primary is reached over TLS.
    ///
    /// ```
    /// let config = distlock::Config::sentinel(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    /// )?;
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    pub fn sentinel<S: AsRef<str>>(
        sentinel_urls: impl IntoIterator<Item = S>,
        master_name: &str,
    ) -> Result<Self, LockError> {
        let sentinels = url::parse_list(sentinel_urls, UrlFor::Sentinel)?;
        if sentinels.is_empty() {
            return Err(LockError::Config(
                "`Config::sentinel` needs at least one sentinel URL".to_owned(),
            ));
        }
        if master_name.trim().is_empty() {
            return Err(LockError::Config(
                "`Config::sentinel` needs the master name the sentinels monitor (e.g. `mymaster`)"
                    .to_owned(),
            ));
        }
        Ok(Self::with_store(StoreConfig::Sentinel {
            sentinels,
            master: master_name.to_owned(),
        }))
    }

    /// Redlock over independent Redis masters (an odd number, at least 3): a lock is granted
    /// when a majority grants it within its validity (lease − elapsed − drift), a try that
    /// falls short is undone on every master, and renewals need a majority too. A master that
    /// turns out to be a replica refuses the deployment: replication defeats the algorithm.
    /// Masters should not be restarted empty within the longest lease of a grant they took
    /// part in (the algorithm's delayed restart).
    ///
    /// Fencing tokens stay strictly increasing across quorums, in one round trip. The client
    /// proposes the same token to every master; a master grants it only above its counter for
    /// the key and not below its clock, and keeps it in the counter until its clock has passed
    /// it by a lease. Every later quorum shares a master with this one, which takes a later
    /// token only when it is larger. A master whose counter or clock is ahead refuses, says
    /// what it would take, and the client proposes again at once (a second round, rare).
    ///
    /// A [semaphore](crate::semaphore) permit needs more than a majority: more than
    /// `N · masters / (N + 1)` masters for N permits (see
    /// [`LockGuard::permits`](crate::LockGuard::permits)) — with 3 masters and N ≥ 2, all of
    /// them, so such a semaphore is unavailable while one master is down.
    ///
    /// ```
    /// let config = distlock::Config::redlock([
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.0.2:6379",
    ///     "redis://10.0.0.3:6379",
    /// ])?;
    /// assert!(distlock::Config::redlock(["redis://a:1", "redis://b:2"]).is_err());
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    pub fn redlock<S: AsRef<str>>(urls: impl IntoIterator<Item = S>) -> Result<Self, LockError> {
        let masters = url::parse_list(urls, UrlFor::Redlock)?;
        if masters.len() < 3 || masters.len() % 2 == 0 {
            return Err(LockError::Config(format!(
                "`Config::redlock` needs an odd number of independent masters, at least 3; got {}",
                masters.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for master in &masters {
            // The address alone: two databases of one server are one master.
            let address = master.get_connection_info().addr().to_string();
            if !seen.insert(address.clone()) {
                return Err(LockError::Config(format!(
                    "`Config::redlock` lists the master {address} twice; every master must be \
                     a different server"
                )));
            }
        }
        Ok(Self::with_store(StoreConfig::Redlock(masters)))
    }

    /// Locks kept in this process, with the same semantics as Redis (leases expire, fencing
    /// tokens increase). For unit tests of code that takes locks, and demos without Redis.
    /// Clients made from clones of the returned config share one store; two calls make two
    /// independent stores.
    ///
    /// Its time is tokio's clock: in a test with a paused clock (`start_paused = true`),
    /// `tokio::time::advance` past a lease frees the lock and reports it lost to its holder,
    /// unless the watchdog renews it — it renews on the same clock, from a task on the
    /// runtime that took the lock, so a renewed lease lives through any amount of virtual
    /// time. (The Redis stores keep real time, as Redis does.)
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
        Self::with_store(StoreConfig::InMemory(InProcessLocks::default()))
    }

    /// The application name recorded with every grant, for operators to see who holds a lock
    /// ([`Client::inspect`](crate::Client::inspect), the `distlock` command-line tool), beside
    /// the host name and process id. Characters other than letters, digits, `.`, `-` and `_`
    /// become `_`, and it is cut to 48 bytes: it travels in every request. [`Config::from_env`]
    /// reads it from `DISTLOCK_APP_NAME`. Defaults to the executable's file name.
    ///
    /// ```
    /// let config = distlock::Config::in_memory().app_name("billing-worker");
    /// ```
    pub fn app_name(mut self, name: impl Into<String>) -> Self {
        self.app_name = Some(name.into());
        self
    }

    /// Text put before every lock key (keys of different applications sharing one Redis stay
    /// apart). Defaults to [`DEFAULT_KEY_PREFIX`]. It may not hold `{` or `}`: the lock's hash
    /// tag (which keeps a lock's keys in one Cluster slot) comes after it.
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

    /// Retries, within a request's wait, of a try that failed for a reason that may pass: a
    /// connection refused, reset or timed out; a server still loading, read-only or without
    /// its primary (a failover under way); a Cluster slot being migrated (`TRYAGAIN`) or the
    /// Cluster down; too few Redlock masters answering; too few replicas acknowledging (the
    /// failover guard). Such a try is tried again up to `attempts` times per request, after
    /// `interval`, then twice that, and so on (each pause drawn between half and all of it),
    /// but never past the request's wait: a request that does not wait (`wait = 0`) tries
    /// once, and one whose wait runs out first gets the failure. A try whose outcome is
    /// unknown (a timeout, a cut connection) has its possible grant given back first, as when
    /// no retry follows; the next try has an owner token of its own. Failures that trying
    /// again cannot mend — credentials, TLS, an ACL refusal, data at the key that is not a
    /// lock, a script error — end the request at once. `attempts = 0` turns retrying off.
    /// Defaults to [`DEFAULT_RETRY_ATTEMPTS`] and [`DEFAULT_RETRY_INTERVAL`] (Redisson's
    /// `retryAttempts`/`retryInterval`, node-redlock's `retryCount`/`retryDelay`).
    pub fn retry(mut self, attempts: u32, interval: Duration) -> Self {
        self.retry_attempts = attempts;
        self.retry_interval = interval;
        self
    }

    /// The heartbeat of fair waiters ([`LockRequest::fair`](crate::LockRequest::fair)): a
    /// waiter in a key's queue tries again at least every half heartbeat, which keeps its
    /// place; a waiter that stops (crashed, frozen, cut off) is dropped from the queue one and
    /// a half heartbeats after its last try, on the server's clock, and the next try of any
    /// waiter (at most half a heartbeat later) wakes the new head. So a dead waiter holds the
    /// queue up for at most two heartbeats. A shorter heartbeat frees the queue sooner at the
    /// cost of two tries per heartbeat from every waiting process. Between 10 ms and 60 s;
    /// defaults to [`DEFAULT_FAIR_HEARTBEAT`].
    pub fn fair_heartbeat(mut self, heartbeat: Duration) -> Self {
        self.fair_heartbeat = heartbeat;
        self
    }

    /// How long one request to Redis may go unanswered; a lock request's try is cut off
    /// sooner when less is left of its wait, and a request that does not wait (`wait(0)`,
    /// `try_acquire`) ends within it. Defaults to [`DEFAULT_RESPONSE_TIMEOUT`].
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long connecting to Redis may take. Defaults to [`DEFAULT_CONNECT_TIMEOUT`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Whether grants carry fencing tokens, for requests that do not say
    /// ([`LockRequest::fencing`](crate::LockRequest::fencing)). Defaults to `true`.
    ///
    /// `false` is the efficiency mode, for locks that only keep work from being done twice
    /// (where a paused holder doing it again costs time, not correctness): a write grant is a
    /// bare `SET NX PX`, no fencing counter is kept, and
    /// [`LockGuard::fencing_token`](crate::LockGuard::fencing_token) is `None`.
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    /// Redlock: how long one master may take to answer one request (at most a tenth of the
    /// lease is used, whichever is shorter). Defaults to [`DEFAULT_NODE_TIMEOUT`]; at most
    /// [`MAX_NODE_TIMEOUT`] (a second), else [`Client::new`](crate::Client::new) refuses the
    /// config: it is also how far ahead of its clock a client first proposes a fencing token,
    /// which stays within [`MAX_TOKEN_LEAD`].
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The failover guard, for a Cluster, a Sentinel-managed primary or a single primary with
    /// replicas: a grant or a renewal counts only after `WAIT` reports that `replicas`
    /// replicas have it, within `timeout`. A grant that is not acknowledged in time is given
    /// back and tried again within the request's wait; a renewal that is not acknowledged does
    /// not count (the watchdog tries again, and the lease is lost if none counts in time).
    /// So a failover to any replica that acknowledged cannot hand the lock out twice; to keep
    /// a replica that did not acknowledge from being promoted, ask for all the replicas (or
    /// make sure the failover picks only acknowledged ones). `WAIT` holds the connection it
    /// is sent on, so guarded writes go on connections of their own (up to 16 at once per
    /// client): a lagging replica slows the guarded grants and renewals up to `timeout` (on a
    /// Cluster, only its own primary's), never a release, a refused try or a health check.
    /// Off by default; not available with Redlock (whose masters have no replicas).
    pub fn replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = Some(ReplicaGuard::new(replicas, timeout));
        self
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = server_list;
        let store = match &self.store {
            StoreConfig::Redis(client) => format!("Redis({})", server_address(client)),
            StoreConfig::Cluster(nodes) => format!("Cluster({})", list(nodes)),
            StoreConfig::Sentinel { sentinels, master } => {
                format!("Sentinel({master} via {})", list(sentinels))
            }
            StoreConfig::Redlock(masters) => format!("Redlock({})", list(masters)),
            StoreConfig::InMemory(_) => "InMemory".to_owned(),
            #[cfg(feature = "postgres")]
            StoreConfig::Postgres(_) => format!("Postgres({})", self.store.describe()),
            #[cfg(feature = "etcd")]
            StoreConfig::Etcd(_) => format!("Etcd({})", self.store.describe()),
        };
        f.debug_struct("Config")
            .field("store", &store)
            .field("key_prefix", &self.key_prefix)
            .field("default_lease", &self.default_lease)
            .field("default_wait", &self.default_wait)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("response_timeout", &self.response_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("node_timeout", &self.node_timeout)
            .field("replicas", &self.replicas)
            .field("fencing", &self.fencing)
            .field("app_name", &self.app_name)
            .field("fair_heartbeat", &self.fair_heartbeat)
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

    /// A node timeout past the token lead is refused, naming the setting, its bound and what
    /// to do; the largest accepted is accepted. Zero is refused too.
    #[test]
    fn a_node_timeout_past_the_token_lead_is_refused_with_what_to_do() {
        let redlock = || {
            Config::redlock([
                "redis://127.0.0.1:1",
                "redis://127.0.0.1:2",
                "redis://127.0.0.1:3",
            ])
            .expect("valid urls")
        };
        assert!(redlock().node_timeout(MAX_NODE_TIMEOUT).validate().is_ok());
        assert!(redlock()
            .node_timeout(DEFAULT_NODE_TIMEOUT)
            .validate()
            .is_ok());
        for refused in [
            MAX_NODE_TIMEOUT + Duration::from_micros(1),
            Duration::from_secs(3),
            Duration::from_secs(10),
            Duration::MAX,
        ] {
            let err = redlock().node_timeout(refused).validate().unwrap_err();
            let message = err.to_string();
            assert!(matches!(err, LockError::Config(_)), "{refused:?}: {err:?}");
            assert!(
                message.contains("node_timeout")
                    && message.contains("MAX_NODE_TIMEOUT")
                    && message.contains("at most 1s")
                    && message.contains("Lower it"),
                "{refused:?}: {message}"
            );
        }
        assert!(redlock()
            .node_timeout(Duration::ZERO)
            .validate()
            .unwrap_err()
            .to_string()
            .contains("node_timeout"));
    }
}
