//! The engine of a client: the state every request, grant and operator call of one
//! `Client` (`client/`) runs on — its settings, its store, its watchdog and
//! releaser, its holder record, its clock and its I/O runtime. It sits below the requests
//! layer, so the acquire loop (`acquire/`) and the elections read it without reaching up into
//! `client/`, which wraps it in the public handle and adds the builder methods.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::clock::Clock;
use crate::config::Config;
use crate::error::LockError;
use crate::inspect::HolderTag;
use crate::io::IoRuntime;
use crate::release::Releaser;
use crate::store::{AnyStore, Store};
use crate::telemetry;
use crate::watchdog::Watchdog;

/// What a client runs on; shared by the client's clones, its requests and its guards.
pub(crate) struct Engine {
    pub(crate) config: Config,
    pub(crate) store: Arc<AnyStore>,
    pub(crate) watchdog: Watchdog,
    /// The one way grants are given back; it keeps the I/O runtime alive while guards live.
    pub(crate) releaser: Arc<Releaser>,
    /// This process's holder record, in every owner token.
    pub(crate) holder: HolderTag,
    /// The store's name in spans and metrics ([`crate::telemetry`]).
    pub(crate) store_name: &'static str,
    /// Set by `Client::shutdown` (`client/`): no new grants.
    pub(crate) shut_down: AtomicBool,
    /// The clock of the store's leases.
    pub(crate) clock: Clock,
    /// The client's own runtime, whose (never paused) timers requests to Redis use.
    pub(crate) io: Arc<IoRuntime>,
}

impl Engine {
    /// Starts the engine of a client made from `config`: validates it, opens its store (not
    /// connecting) and starts the I/O runtime, the watchdog and the releaser.
    pub(crate) fn start(config: Config) -> Result<Self, LockError> {
        config.validate()?;
        let io = Arc::new(IoRuntime::start()?);
        let store = Arc::new(AnyStore::open(&config, io.handle())?);
        let watchdog = Watchdog::start(&io, store.clone());
        let releaser = Arc::new(Releaser::new(store.clone(), watchdog.clone(), io.clone()));
        telemetry::describe();
        // Which Redis this process locks on, at INFO: a configuration that fell back to the
        // default address (nothing set in the environment) shows here.
        tracing::info!(target: crate::telemetry::LOG_TARGET, store = AnyStore::name(&config.store), servers = %config.store.describe(), "distlock client created");
        Ok(Self {
            store_name: AnyStore::name(&config.store),
            shut_down: AtomicBool::new(false),
            holder: HolderTag::of_this_process(config.app_name.as_deref()),
            config,
            clock: store.clock(),
            store,
            watchdog,
            releaser,
            io,
        })
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
