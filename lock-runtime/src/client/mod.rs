//! [`Client`]: a handle to one lock service — its store, opened from a [`Config`]
//! (`store/open.rs`), its watchdog, its releaser and the defaults of its requests — and its
//! graceful shutdown.
//! Requests it starts are [`LockRequest`](crate::LockRequest)s (`request.rs`), taken by the
//! acquire loop (`acquire/`); the global client is `global.rs`, the operator's tools
//! `client/operator.rs`.

mod operator;
mod requests;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::config::Config;
use crate::engine::Engine;
use crate::error::LockError;
use crate::store::Store;

/// A handle to one lock service: its store, its watchdog and the defaults of its requests.
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
///   and how to grant it (`docs/keys-and-acls.md` lists what distlock needs on each deployment).
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
    pub(crate) engine: Arc<Engine>,
}

impl Client {
    /// Makes a client from `config`. Does not connect.
    pub fn new(config: Config) -> Result<Self, LockError> {
        Ok(Self {
            engine: Arc::new(Engine::start(config)?),
        })
    }

    /// A client on an in-process store of its own ([`Config::in_memory`]) with the default
    /// settings — for unit tests and single-process programs. Nothing about it can be
    /// misconfigured, so there is no `Result`: it panics only if the operating system refuses
    /// the client its I/O thread, as [`std::thread::spawn`] does. Use
    /// [`Client::new`]`(Config::in_memory().…)` to change a setting.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::in_memory();
    /// let guard = client.lock("report:7").acquire().await?;
    /// assert!(guard.release().await?);
    /// # Ok(()) }
    /// ```
    pub fn in_memory() -> Self {
        match Self::new(Config::in_memory()) {
            Ok(client) => client,
            // The default in-process config always validates and opens; only the I/O thread
            // can fail, when the OS is out of threads.
            Err(err) => panic!("{err}"),
        }
    }

    /// Graceful shutdown: gives back every lock this client (and its clones) holds, and
    /// refuses new requests. Call it when the process is about to exit, after it has stopped
    /// taking work, so the next holders need not wait for leases to run out.
    ///
    /// Each held grant is first reported to its holder as ended ([`LockGuard::lost`](crate::guard::LockGuard::lost) completes,
    /// an annotated fn with `on_lost = "abort"` returns [`LockError::ShutDown`] at its next
    /// await), then released. Requests made afterwards fail with [`LockError::ShutDown`]; guards
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
        let inner = &self.engine;
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
        tracing::info!(target: crate::telemetry::LOG_TARGET, store = inner.store_name, released, "client shut down");
        first_error.map_or(Ok(released), Err)
    }

    /// Whether the store answers now, for a readiness probe: the server (or the primary
    /// Sentinel names), every primary of a Cluster, a majority of Redlock masters — each asked
    /// with a `PING`, connecting where needed; the in-process store always answers. The error
    /// names the server that did not answer and why; one whose ACL refuses `PING` is a
    /// [`BackendErrorKind::Server`](crate::BackendErrorKind::Server) error that names `PING`
    /// and how to grant it (the ACL user needs it on every deployment).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::new(distlock::Config::in_memory())?;
    /// client.ping().await?;
    /// # Ok(()) }
    /// ```
    pub async fn ping(&self) -> Result<(), LockError> {
        let inner = &self.engine;
        inner.clock.send(&inner.io, inner.store.ping()).await
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.engine, f)
    }
}
