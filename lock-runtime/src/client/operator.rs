//! The operator's tools on [`Client`]: who holds a lock, freeing it by force, and the locks
//! held. They read (and `force_unlock` changes) the store directly through the store's
//! operator calls (`operator_scripts.rs`), never the state of this process; the `distlock`
//! command-line tool is built on them, and `inspect.rs` says what their answers mean.

use crate::client::Client;
use crate::error::LockError;
use crate::inspect::{scan_patterns, ForcedUnlock, Holder, LeaderInfo, LockState};
use crate::operator_scripts::Inspect;
use crate::protocol::FencingToken;
use crate::protocol::LockKey;
use crate::store::Store;

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
        let key = LockKey::new(&self.engine.config.key_prefix, key.into())?;
        let inner = &self.engine;
        let view = inner
            .clock
            .send(&inner.io, inner.store.run(&Inspect(&key)))
            .await?;
        let holders: Vec<Holder> = view
            .holders
            .into_iter()
            .map(|(owner, remaining)| Holder::parse(owner, remaining))
            .collect();
        Ok(LockState {
            leader: LeaderInfo::from_view(view.record, view.mode, &holders),
            mode: view.mode,
            holders,
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
    /// ([`LockGuard::lost`](crate::guard::LockGuard::lost)) and an annotated fn with `on_lost = "abort"` is cancelled; until
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
        let key = LockKey::new(&self.engine.config.key_prefix, key.into())?;
        let inner = &self.engine;
        let (evicted, token) = inner
            .clock
            .send(&inner.io, inner.store.force_unlock(&key))
            .await?;
        tracing::warn!(target: crate::telemetry::LOG_TARGET, key = %key.name, evicted = evicted.len(), token,
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
        let inner = &self.engine;
        let prefix = &inner.config.key_prefix;
        let patterns = scan_patterns(prefix, pattern);
        let keys = inner
            .clock
            .send(&inner.io, inner.store.scan(&patterns, usize::MAX))
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
