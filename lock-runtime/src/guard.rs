//! [`LockGuard`]: proof of a grant, with its fencing token, a way to learn that the lease was
//! lost, and the release — awaited on the normal path, spawned from `Drop` otherwise.

use std::fmt;
use std::sync::Arc;

use crate::error::LockError;
use crate::kind::Kind;
use crate::lease::Lease;
#[cfg(feature = "postgres")]
use crate::protocol::LockKey;
use crate::protocol::{FencingToken, LockMode};
use crate::release::Releaser;
#[cfg(feature = "postgres")]
use crate::store::AnyStore;

/// A held lock. Dropping it releases the lock in the background; prefer
/// [`release`](LockGuard::release) so the next waiter does not wait on a background task.
///
/// ## Behavior
///
/// - While the guard lives, the client's watchdog renews the lease at about a third of its
///   duration (unless the request turned the watchdog off).
/// - The lease is *lost* when Redis says the lock is no longer ours, or when its local deadline
///   (send time of the last successful acquire or renewal + lease − clock drift) passes without
///   a successful renewal. [`lost`](LockGuard::lost) then completes and
///   [`is_held`](LockGuard::is_held) turns false; the work under the lock may now overlap
///   with another owner's, which the [fencing token](LockGuard::fencing_token) lets a store
///   detect.
/// - Release and drop stop the renewals first: no renewal is sent after the release.
/// - `Drop` of an unreleased guard never blocks and never panics: it spawns the release on the
///   client's I/O runtime, which outlives the caller's runtime (the in-process store answers at
///   once, so its lock is released on the spot). If even that fails (the process is exiting),
///   the lease's expiry frees the lock.
/// - [`Client::shutdown`](crate::Client::shutdown) ends every guard of the client: each is
///   reported lost, then released.
///
/// ```no_run
/// # async fn f() -> Result<(), distlock::LockError> {
/// let guard = distlock::lock("invoice:7").acquire().await?;
/// let token = guard.fencing_token();   // pass it to the store you protect
/// // … work …
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    pub(crate) lease: Arc<Lease>,
    /// The other keys of a multi-key grant ([`lock_all`](crate::lock_all)), in the order
    /// taken; empty otherwise.
    more: Vec<Arc<Lease>>,
    releaser: Arc<Releaser>,
    released: bool,
}

impl LockGuard {
    /// The guard of a grant: its (first) lease, and the leases of the other keys of a
    /// multi-key grant in the order taken (none for one key).
    pub(crate) fn new(lease: Arc<Lease>, more: Vec<Arc<Lease>>, releaser: Arc<Releaser>) -> Self {
        Self {
            lease,
            more,
            releaser,
            released: false,
        }
    }

    /// Every lease of the grant: one, or one per key of a multi-key grant.
    pub(crate) fn leases(&self) -> impl Iterator<Item = &Arc<Lease>> {
        std::iter::once(&self.lease).chain(&self.more)
    }

    /// Each key of the grant as its store keeps it, with this grant's owner token there and
    /// the kind it holds: what a check of the grant inside the store's own database compares
    /// (`fenced::postgres`). The owner token never leaves the crate: whoever knows it can give
    /// the grant back or renew it.
    #[cfg(feature = "postgres")]
    pub(crate) fn held(&self) -> impl Iterator<Item = (&LockKey, &str, Kind)> {
        self.leases()
            .map(|lease| (&lease.key, lease.owner.as_str(), lease.kind()))
    }

    /// The store the grant is kept in (its client's).
    #[cfg(feature = "postgres")]
    pub(crate) fn store(&self) -> &AnyStore {
        self.releaser.store()
    }

    /// Every key this guard holds, in the order they were taken: the one key, or each key of a
    /// [`lock_all`](crate::lock_all) grant (sorted, each once).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::new(distlock::Config::in_memory())?;
    /// let guard = client.lock_all(["acct:2", "acct:1", "acct:2"]).acquire().await?;
    /// assert_eq!(guard.keys().collect::<Vec<_>>(), ["acct:1", "acct:2"]);
    /// assert!(guard.fencing_token_of("acct:2").is_some());
    /// assert_eq!(guard.fencing_token_of("acct:3"), None);
    /// # drop(guard); Ok(()) }
    /// ```
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.leases().map(|lease| lease.key.name.as_str())
    }

    /// The fencing token of one key of this guard (a multi-key grant has one per key, each
    /// greater than every earlier write token of that key); `None` when the guard does not
    /// hold `key` or holds it without fencing.
    pub fn fencing_token_of(&self, key: &str) -> Option<FencingToken> {
        self.leases()
            .find(|lease| lease.key.name == key)
            .and_then(|lease| lease.token)
    }

    /// The key as it was requested (without the configured prefix); for a multi-key grant, its
    /// first key (see [`keys`](LockGuard::keys)).
    pub fn key(&self) -> &str {
        &self.lease.key.name
    }

    /// The fencing token of this grant: for a write (exclusive) grant, strictly greater than
    /// the token of every earlier write grant of the same key; for a read grant, no new token
    /// but one that sorts between the write tokens around it (the server clock at the read;
    /// on Redlock, the latest write token while the key's counter lives); for a semaphore
    /// permit, a token taken as for a read grant: it sorts after every earlier write grant of
    /// the key, but permits held at the same time have no order among them (a fenced store
    /// that refuses lower tokens would refuse a concurrent permit's write). Give it to the
    /// resource you protect and let it refuse writes carrying a token lower than one it has
    /// already seen.
    ///
    /// `None` for a grant taken without fencing ([`LockRequest::fencing`](crate::LockRequest::fencing)`(false)`):
    /// such a lock only avoids duplicate work, and there is no token to invent.
    ///
    /// For a multi-key grant, the token of its first key (see
    /// [`fencing_token_of`](LockGuard::fencing_token_of)).
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.lease.token
    }

    /// Which side of the key's read/write lock this guard holds, or
    /// [`LockMode::Semaphore`] for a semaphore permit.
    pub fn mode(&self) -> LockMode {
        self.lease.kind().into()
    }

    /// The semaphore's number of permits for a permit ([`semaphore`](crate::semaphore)),
    /// `None` for a write or read grant.
    ///
    /// On Redlock a permit is granted (and renewed) only by more than `permits · masters /
    /// (permits + 1)` masters, not by a bare majority: each master counts at most `permits`
    /// holders, and with a majority per permit up to about twice as many holders could each
    /// hold one (3 masters, 5 permits: 7 holders of 2 masters each). With one permit that is
    /// the usual majority; with 3 masters and 2 permits or more it is every master, so the
    /// semaphore is unavailable ([`LockError::QuorumUnavailable`](crate::LockError::QuorumUnavailable))
    /// while a master is down; 5 masters keep 2 or 3 permits available with one down.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::new(distlock::Config::in_memory())?;
    /// let permit = client.semaphore("exports", 3).acquire().await?;
    /// assert_eq!(permit.mode(), distlock::LockMode::Semaphore);
    /// assert_eq!(permit.permits(), Some(3));
    /// let lock = client.lock("report").acquire().await?;
    /// assert_eq!(lock.permits(), None);
    /// # drop((permit, lock)); Ok(()) }
    /// ```
    pub fn permits(&self) -> Option<u32> {
        match self.lease.kind() {
            Kind::Semaphore(permits) => Some(permits),
            _ => None,
        }
    }

    /// Whether the lease is still ours as far as this process can tell: not lost, and its
    /// local deadline not passed.
    ///
    /// A multi-key grant is held while every one of its keys is.
    pub fn is_held(&self) -> bool {
        self.leases().all(|lease| lease.is_held())
    }

    /// Completes when the lease is lost: Redis no longer has us as the owner, or the local
    /// deadline passed unrenewed. Never completes while the lease is kept.
    ///
    /// ```no_run
    /// # async fn work() {}
    /// # async fn f() -> Result<(), distlock::LockError> {
    /// let guard = distlock::lock("job:9").acquire().await?;
    /// tokio::select! {
    ///     () = work() => {}
    ///     () = guard.lost() => return Err(distlock::LockError::LeaseLost { key: guard.key().into() }),
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// A multi-key grant is lost when any of its keys is.
    pub async fn lost(&self) {
        if self.more.is_empty() {
            return self.lease.lost().await;
        }
        let lost = self.leases().map(|lease| Box::pin(lease.lost()));
        futures_util::future::select_all(lost).await;
    }

    /// Gives the lock back. `Ok(true)`: it was ours and is now free; `Ok(false)`: it was no
    /// longer ours (its lease expired or it was force-unlocked, and perhaps someone else holds
    /// it now — their key is left untouched). An error means Redis could not be asked; the lease's expiry will free
    /// the lock.
    pub async fn release(mut self) -> Result<bool, LockError> {
        // `released` is set only once the release has completed: if this future is dropped
        // midway (a `timeout` around it, say), `Drop` still sends the release.
        let outcome = if self.more.is_empty() {
            self.releaser.release(&self.lease).await
        } else {
            // Every key, at once; `true` only when every one was still ours.
            let releases = self.leases().map(|lease| self.releaser.release(lease));
            futures_util::future::join_all(releases)
                .await
                .into_iter()
                .try_fold(true, |all, released| released.map(|ours| all && ours))
        };
        self.released = true;
        outcome
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            for lease in std::iter::once(&self.lease).chain(&self.more) {
                self.releaser.release_in_background(lease.clone());
            }
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("mode", &self.mode())
            .field("fencing_token", &self.fencing_token())
            .field("lease", &self.lease.duration)
            .field("held", &self.is_held())
            .finish()
    }
}
