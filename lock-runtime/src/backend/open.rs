//! How a client's store is opened from its [`Config`]: which store a `BackendConfig` names,
//! the options every Redis node of it gets, and the store's name in spans and metrics. The
//! client (`client/mod.rs`) calls [`Backend::open`] once; nothing connects until the first
//! request.

use tokio::runtime::Handle;

use super::cluster::ClusterBackend;
use super::endpoint::{Endpoint, Sentinel};
use super::memory::MemoryBackend;
use super::redis::{NodeOptions, RedisBackend};
use super::redlock::RedlockBackend;
use super::Backend;
use crate::config::{BackendConfig, Config};
use crate::error::LockError;
use crate::kind::Tokens;

impl Backend {
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
        Ok(match &config.backend {
            BackendConfig::Redis(client) => Backend::Redis(Box::new(RedisBackend::new(
                Endpoint::Fixed((**client).clone()),
                options,
                io,
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
                    io,
                )))
            }
            BackendConfig::Cluster(nodes) => {
                Backend::Cluster(Box::new(ClusterBackend::new(nodes, options, io)?))
            }
            BackendConfig::Redlock(masters) => Backend::Redlock(Box::new(RedlockBackend::new(
                masters,
                options,
                config.node_timeout,
                io,
            ))),
            BackendConfig::InMemory(store) => Backend::Memory(MemoryBackend::new(store.clone())),
        })
    }

    /// The name of the store `config` names, as spans and metrics label it.
    pub(crate) fn name(config: &BackendConfig) -> &'static str {
        match config {
            BackendConfig::Redis(_) => "redis",
            BackendConfig::Sentinel { .. } => "sentinel",
            BackendConfig::Cluster(_) => "cluster",
            BackendConfig::Redlock(_) => "redlock",
            BackendConfig::InMemory(_) => "memory",
        }
    }
}
