//! How a client's store is opened from its [`Config`]: which store a `StoreConfig` names,
//! the options every Redis node of it gets, and the store's name in spans and metrics. The
//! client (`client/mod.rs`) calls [`AnyStore::open`] once; nothing connects until the first
//! request.

use tokio::runtime::Handle;

use super::cluster::ClusterStore;
use super::endpoint::{Endpoint, Sentinel};
use super::memory::MemoryStore;
use super::redis::{NodeOptions, NodeStore};
use super::redlock::RedlockStore;
use super::AnyStore;
use crate::config::{Config, StoreConfig};
use crate::error::LockError;
use crate::kind::Tokens;

impl AnyStore {
    /// The store `config` names, whose connections and background tasks run on `io`.
    pub(crate) fn open(config: &Config, io: Handle) -> Result<Self, LockError> {
        let options = NodeOptions {
            response_timeout: config.response_timeout,
            connect_timeout: config.connect_timeout,
            require_primary: false,
            guard: config.replicas,
            wake_ups: true,
            tokens: Tokens::Clock,
        };
        Ok(match &config.store {
            StoreConfig::Redis(client) => AnyStore::Redis(Box::new(NodeStore::new(
                Endpoint::Fixed((**client).clone()),
                options,
                io,
            ))),
            StoreConfig::Sentinel { sentinels, master } => {
                AnyStore::Redis(Box::new(NodeStore::new(
                    Endpoint::Sentinel(Sentinel::new(
                        sentinels.clone(),
                        master.clone(),
                        config.connect_timeout,
                        config.response_timeout,
                    )),
                    options,
                    io,
                )))
            }
            StoreConfig::Cluster(nodes) => {
                AnyStore::Cluster(Box::new(ClusterStore::new(nodes, options, io)?))
            }
            StoreConfig::Redlock(masters) => AnyStore::Redlock(Box::new(RedlockStore::new(
                masters,
                options,
                config.node_timeout,
                io,
            ))),
            StoreConfig::InMemory(locks) => AnyStore::Memory(MemoryStore::new(locks.state())),
            #[cfg(feature = "postgres")]
            StoreConfig::Postgres(target) => {
                AnyStore::Postgres(Box::new(super::postgres::PostgresStore::new(
                    target.connect.clone(),
                    target.options.clone(),
                    config.connect_timeout,
                    config.response_timeout,
                    io,
                )?))
            }
            #[cfg(feature = "etcd")]
            StoreConfig::Etcd(target) => AnyStore::Etcd(Box::new(super::etcd::EtcdStore::new(
                (**target).clone(),
                config.key_prefix.clone(),
                config.connect_timeout,
                config.response_timeout,
                io,
            ))),
        })
    }

    /// The name of the store `config` names, as spans and metrics label it.
    pub(crate) fn name(config: &StoreConfig) -> &'static str {
        match config {
            StoreConfig::Redis(_) => "redis",
            StoreConfig::Sentinel { .. } => "sentinel",
            StoreConfig::Cluster(_) => "cluster",
            StoreConfig::Redlock(_) => "redlock",
            StoreConfig::InMemory(_) => "memory",
            #[cfg(feature = "postgres")]
            StoreConfig::Postgres(_) => "postgres",
            #[cfg(feature = "etcd")]
            StoreConfig::Etcd(_) => "etcd",
        }
    }
}
