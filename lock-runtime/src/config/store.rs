//! Where the locks live, as a [`Config`](super::Config) holds it: the deployment and its
//! servers ([`StoreConfig`]), and the in-process store's shared locks ([`InProcessLocks`]).
//! Neighbours: `config.rs` makes them from URLs; the stores (`store/open.rs`) open them.

use std::any::Any;
use std::sync::{Arc, OnceLock};

/// The servers' addresses, comma-separated, without credentials.
pub(super) fn server_list(clients: &[redis::Client]) -> String {
    clients
        .iter()
        .map(crate::url::server_address)
        .collect::<Vec<_>>()
        .join(", ")
}

impl StoreConfig {
    /// The deployment and the servers it is reached through, without credentials: what a
    /// client says at start which Redis it uses (`127.0.0.1:6379`; `sentinel mymaster via
    /// s1:26379, s2:26379`; …).
    pub(crate) fn describe(&self) -> String {
        use crate::url::server_address;
        let list = server_list;
        match self {
            StoreConfig::Redis(client) => server_address(client),
            StoreConfig::Cluster(nodes) => format!("cluster via {}", list(nodes)),
            StoreConfig::Sentinel { sentinels, master } => {
                format!("sentinel `{master}` via {}", list(sentinels))
            }
            StoreConfig::Redlock(masters) => format!("redlock over {}", list(masters)),
            StoreConfig::InMemory(_) => "in-process".to_owned(),
            #[cfg(feature = "postgres")]
            StoreConfig::Postgres(postgres) => postgres.describe(),
            #[cfg(feature = "etcd")]
            StoreConfig::Etcd(etcd) => format!("etcd {}", etcd.endpoints.join(",")),
        }
    }
}

/// Where the locks are kept.
#[derive(Clone)]
pub(crate) enum StoreConfig {
    /// One Redis server, its URL parsed when the config is made.
    Redis(Box<redis::Client>),
    /// A Redis Cluster, reached first through these nodes.
    Cluster(Vec<redis::Client>),
    /// The primary that these sentinels know by `master`.
    Sentinel {
        sentinels: Vec<redis::Client>,
        master: String,
    },
    /// Redlock over these independent masters (an odd number, at least 3).
    Redlock(Vec<redis::Client>),
    /// In this process; clients made from clones of one config share the store.
    InMemory(InProcessLocks),
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(Box<PostgresTarget>),
    /// etcd.
    #[cfg(feature = "etcd")]
    Etcd(Box<EtcdTarget>),
}

/// An etcd cluster as a [`Config`](super::Config) names it: its endpoints and the user to
/// authenticate as.
#[cfg(feature = "etcd")]
#[derive(Clone)]
pub(crate) struct EtcdTarget {
    /// `http://host:port`, one per member the client may use.
    pub(crate) endpoints: Vec<String>,
    /// User and password, when the cluster has authentication on.
    pub(crate) user: Option<(String, String)>,
    /// The CA and client certificate for `https://` endpoints (`Config::etcd_ca_pem`,
    /// `Config::etcd_client_cert`).
    pub(crate) tls: super::TlsSettings,
}

/// A PostgreSQL server as a [`Config`](super::Config) names it: how to connect, and the
/// store's schema.
#[cfg(feature = "postgres")]
#[derive(Clone)]
pub(crate) struct PostgresTarget {
    pub(crate) connect: tokio_postgres::Config,
    pub(crate) options: PostgresOptions,
}

/// The PostgreSQL store's schema and whether it may create what is missing there.
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PostgresOptions {
    /// The schema the store's objects live in (a lower-case SQL identifier).
    pub(crate) schema: String,
    /// Create what is missing on first use (the default), or only check it.
    pub(crate) create: bool,
    /// Whether the URL asked for TLS, and how (`sslmode`).
    pub(crate) ssl_mode: PostgresSslMode,
    /// The CA and client certificate (`Config::postgres_ca_pem`,
    /// `Config::postgres_client_cert`).
    pub(crate) tls: super::TlsSettings,
}

/// What a PostgreSQL URL's `sslmode` asked for, of the modes distlock honours
/// (`config/postgres.rs` refuses the others).
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum PostgresSslMode {
    /// No `sslmode`: TLS if certificates were given, else none.
    #[default]
    Unset,
    /// `sslmode=disable`: no TLS.
    Disable,
    /// `sslmode=require` or `verify-full`: TLS, the certificate checked against its roots and
    /// the host name.
    VerifyFull,
}

#[cfg(feature = "postgres")]
impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            schema: super::DEFAULT_POSTGRES_SCHEMA.to_owned(),
            create: true,
            ssl_mode: PostgresSslMode::Unset,
            tls: super::TlsSettings::default(),
        }
    }
}

#[cfg(feature = "postgres")]
impl PostgresTarget {
    /// `postgres 127.0.0.1:5432/app (schema distlock)`: hosts, database and schema, no
    /// credentials.
    fn describe(&self) -> String {
        use tokio_postgres::config::Host;
        let hosts: Vec<String> = self
            .connect
            .get_hosts()
            .iter()
            .zip(
                self.connect
                    .get_ports()
                    .iter()
                    .chain(std::iter::repeat(&5432)),
            )
            .map(|(host, port)| match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                #[cfg(unix)]
                Host::Unix(path) => format!("{}:{port}", path.display()),
            })
            .collect();
        format!(
            "postgres {}/{} (schema {}{})",
            hosts.join(","),
            self.connect.get_dbname().unwrap_or(""),
            self.options.schema,
            if self.options.uses_tls() { ", TLS" } else { "" }
        )
    }
}

/// The locks of one [`Config::in_memory`](super::Config::in_memory), shared by every client made from its clones. Made
/// empty here; the in-process store (`store/memory.rs`) alone knows what they hold, so the
/// settings do not depend on it: it fills this with its state on first use.
#[derive(Clone, Default)]
pub(crate) struct InProcessLocks(Arc<OnceLock<Arc<dyn Any + Send + Sync>>>);

impl InProcessLocks {
    /// The state these locks hold, made on first use; the same `Arc` for every caller that
    /// asks for the same `T` (there is one: the in-process store's).
    pub(crate) fn state<T: Any + Send + Sync + Default>(&self) -> Arc<T> {
        let state = self.0.get_or_init(|| Arc::new(T::default()));
        // Only the in-process store fills it, always with its own state type; a different
        // `T` would get a store of its own rather than a panic.
        state.clone().downcast::<T>().unwrap_or_default()
    }
}
