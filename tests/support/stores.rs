//! The stores the conformance suites run each test on (`tests/conformance/`): a single
//! server of the test's own, and — shared by every test of the binary, each test under a key
//! prefix of its own — a Sentinel setup, the 3+3 Cluster, three Redlock masters, and the
//! in-process store. Backoff is short (1–20 ms) so waiting tests stay quick.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use distlock::{Client, Config};

use super::cluster::shared_cluster;
use super::masters::start_masters;
use super::sentinel::SentinelSetup;
use super::RedisServer;

/// A store under test: its config, and the Redis server behind it, if it has its own.
pub struct Harness {
    pub config: Config,
    _server: Option<RedisServer>,
    /// Whether waiters listen for releases on a channel of the lock's own, so that `inspect`
    /// counts them (every Redis store; the in-process store polls, PostgreSQL notifies on
    /// one channel for every key).
    pub pub_sub: bool,
    /// The key prefix of this test's locks.
    pub prefix: String,
    /// Whether the store is etcd (its leases are whole seconds: [`Harness::expired_within`]).
    etcd: bool,
    /// Where the store keeps its keys, for commands behind its back ([`Harness::raw`]).
    nodes: Nodes,
}

/// Where a store keeps its keys.
enum Nodes {
    /// The in-process store: no Redis.
    None,
    /// One server (its URL).
    Node(String),
    /// The primary that Sentinel names now.
    Sentinel(&'static SentinelSetup),
    /// A Redis Cluster (its nodes' URLs).
    Cluster(Vec<String>),
    /// Independent Redlock masters (their URLs).
    Masters(Vec<String>),
}

/// A key prefix no other test of this binary uses.
fn own_prefix() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("distlock:t{}:", NEXT.fetch_add(1, Ordering::Relaxed))
}

impl Harness {
    pub fn redis() -> Self {
        let server = RedisServer::start();
        let config = Config::from_url(&server.url()).expect("valid url");
        let nodes = Nodes::Node(server.url());
        Self::tuned(
            config,
            Some(server),
            true,
            distlock::DEFAULT_KEY_PREFIX.into(),
            nodes,
        )
    }

    pub fn sentinel() -> Self {
        static SETUP: OnceLock<SentinelSetup> = OnceLock::new();
        let setup = SETUP.get_or_init(|| SentinelSetup::start("conformance"));
        let prefix = own_prefix();
        let config = Config::sentinel(setup.sentinel_urls(), setup.master_name())
            .expect("valid urls")
            .key_prefix(&prefix);
        Self::tuned(config, None, true, prefix, Nodes::Sentinel(setup))
    }

    pub fn cluster() -> Self {
        let prefix = own_prefix();
        let config = Config::cluster(shared_cluster().urls())
            .expect("valid urls")
            .key_prefix(&prefix);
        let nodes = Nodes::Cluster(shared_cluster().urls());
        Self::tuned(config, None, true, prefix, nodes)
    }

    pub fn redlock() -> Self {
        static MASTERS: OnceLock<Vec<RedisServer>> = OnceLock::new();
        let masters = MASTERS.get_or_init(|| start_masters(3));
        let prefix = own_prefix();
        let config = Config::redlock(masters.iter().map(RedisServer::url))
            .expect("valid urls")
            .key_prefix(&prefix)
            // Many tests run at once on two cores: allow for scheduling delays (a semaphore's
            // release needs every master to answer within the timeout). No test stops or
            // freezes these shared masters.
            .node_timeout(Duration::from_secs(1));
        let nodes = Nodes::Masters(masters.iter().map(RedisServer::url).collect());
        Self::tuned(config, None, true, prefix, nodes)
    }

    /// PostgreSQL: one server for the test binary (`support/postgres.rs`), a key prefix per
    /// test; no Redis behind it, so [`Harness::raw`] runs nothing there. Its waiters are
    /// woken by `NOTIFY` on one channel for every key, so no count of a key's waiting
    /// processes is kept (`pub_sub: false`).
    pub fn postgres() -> Self {
        let server = super::postgres::shared_postgres();
        let prefix = own_prefix();
        let config = Config::postgres(&server.url())
            .expect("valid url")
            .key_prefix(&prefix);
        Self::tuned(config, None, false, prefix, Nodes::None)
    }

    /// etcd: one member for the test binary (`support/etcd.rs`), a key prefix per test; no
    /// Redis behind it. Its waiters are woken by one watch on every key, so no count of a
    /// key's waiting processes is kept (`pub_sub: false`). The response timeout is 2 s, not
    /// the default 1 s: the one member serves every test of the binary beside five other
    /// stores' servers on two cores, and a read or a release has waited over a second there
    /// (`tests/etcd/etcd_faults.rs` runs at the default).
    pub fn etcd() -> Self {
        let server = super::etcd::shared_etcd();
        let prefix = own_prefix();
        let config = Config::etcd([server.endpoint()])
            .expect("valid endpoint")
            .key_prefix(&prefix)
            .response_timeout(Duration::from_secs(2));
        Self {
            etcd: true,
            ..Self::tuned(config, None, false, prefix, Nodes::None)
        }
    }

    pub fn in_memory() -> Self {
        let prefix = distlock::DEFAULT_KEY_PREFIX.into();
        Self::tuned(Config::in_memory(), None, false, prefix, Nodes::None)
    }

    fn tuned(
        config: Config,
        server: Option<RedisServer>,
        pub_sub: bool,
        prefix: String,
        nodes: Nodes,
    ) -> Self {
        let config = config.backoff(Duration::from_millis(1), Duration::from_millis(20));
        Self {
            config,
            _server: server,
            pub_sub,
            prefix,
            etcd: false,
            nodes,
        }
    }

    /// How long after a grant of `lease` that nobody renews the store has surely let it go:
    /// the lease itself, but on etcd, whose leases are whole seconds and at least its
    /// minimum TTL (2 s at the default election timeout), the lease as etcd grants it plus
    /// a second for its expiry scan (every 500 ms) — `docs/etcd.md`.
    pub fn expired_within(&self, lease: Duration) -> Duration {
        if self.etcd {
            let secs = lease.as_secs() + u64::from(lease.subsec_nanos() > 0);
            Duration::from_secs(secs.max(2) + 1)
        } else {
            lease
        }
    }

    /// The Redis key of the lock named `name` (`{prefix}{{name}}`, for names without braces).
    pub fn lock_key(&self, name: &str) -> String {
        format!("{}{{{name}}}", self.prefix)
    }

    /// Runs `cmd` behind the store's back where the store keeps the key it names: on the one
    /// server, Sentinel's primary, the Cluster node serving the key, or every Redlock master.
    /// One reply per server it ran on; none on the in-process store.
    pub fn raw(&self, cmd: &redis::Cmd) -> Vec<redis::Value> {
        let on = |url: &str| {
            let mut connection = redis::Client::open(url)
                .and_then(|client| client.get_connection())
                .expect("a raw connection");
            cmd.query::<redis::Value>(&mut connection)
                .expect("the raw command")
        };
        match &self.nodes {
            Nodes::None => Vec::new(),
            Nodes::Node(url) => vec![on(url)],
            Nodes::Sentinel(setup) => vec![on(&setup.primary_url())],
            Nodes::Masters(urls) => urls.iter().map(|url| on(url)).collect(),
            Nodes::Cluster(urls) => {
                let mut connection = redis::cluster::ClusterClient::new(urls.clone())
                    .and_then(|client| client.get_connection())
                    .expect("a raw cluster connection");
                vec![cmd
                    .query::<redis::Value>(&mut connection)
                    .expect("the raw command")]
            }
        }
    }

    /// A new client, as another process would have: its own connection and watchdog.
    pub fn client(&self) -> Client {
        Client::new(self.config.clone()).expect("valid config")
    }

    /// [`client`](Self::client), of the application `app` (its holder records name it).
    pub fn app_client(&self, app: &str) -> Client {
        Client::new(self.config.clone().app_name(app)).expect("valid config")
    }
}

/// One store's module of tests, each an `async fn(Harness)` of the module that invokes the
/// macro, run on a multi-thread runtime with the store's [`Harness`].
#[allow(unused_macros)] // each test binary uses its own part of the support
macro_rules! store_tests {
    ($store:ident, $harness:ident, [$($name:ident),*]) => {
        mod $store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::stores::Harness::$harness()).await
                }
            )*
        }
    };
}

/// The tests named, each on every store: a module per store (`redis_store`, `sentinel_store`,
/// `cluster_store`, `redlock_store`, `in_memory_store`, `postgres_store`, `etcd_store`).
#[allow(unused_macros)] // each test binary uses its own part of the support
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        $crate::support::stores::store_tests!(redis_store, redis, [$($name),*]);
        $crate::support::stores::store_tests!(sentinel_store, sentinel, [$($name),*]);
        $crate::support::stores::store_tests!(cluster_store, cluster, [$($name),*]);
        $crate::support::stores::store_tests!(redlock_store, redlock, [$($name),*]);
        $crate::support::stores::store_tests!(in_memory_store, in_memory, [$($name),*]);
        // Without the `postgres` feature there is no PostgreSQL store to test.
        #[cfg(feature = "postgres")]
        $crate::support::stores::store_tests!(postgres_store, postgres, [$($name),*]);
        // Without the `etcd` feature there is no etcd store to test.
        #[cfg(feature = "etcd")]
        $crate::support::stores::store_tests!(etcd_store, etcd, [$($name),*]);
    };
}

/// [`on_every_store`] but the in-process store (for what only Redis has: pub/sub wake-ups).
#[allow(unused_macros)] // each test binary uses its own part of the support
macro_rules! on_every_redis_store {
    ($($name:ident),* $(,)?) => {
        $crate::support::stores::store_tests!(redis_store, redis, [$($name),*]);
        $crate::support::stores::store_tests!(sentinel_store, sentinel, [$($name),*]);
        $crate::support::stores::store_tests!(cluster_store, cluster, [$($name),*]);
        $crate::support::stores::store_tests!(redlock_store, redlock, [$($name),*]);
    };
}

#[allow(unused_imports)] // each test binary uses its own part of the support
pub(crate) use {on_every_redis_store, on_every_store, store_tests};
