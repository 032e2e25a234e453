//! The one error type of distlock. Every variant's message says what happened and what to do
//! next; keys are shortened and URLs redacted before they reach a message. A store's failure is
//! a [`BackendError`] (`error/backend.rs`: its kinds and advice), which names what a server's
//! ACL refused when that is the cause (`error/acl.rs`).

mod acl;
mod backend;

use std::fmt;
use std::time::Duration;

pub use backend::{BackendError, BackendErrorKind};

/// Longest stretch of a lock key that is quoted in an error message.
const KEY_IN_MESSAGE: usize = 120;

/// Everything that can go wrong when taking, keeping or giving back a lock.
///
/// ```
/// use distlock::LockError;
///
/// fn explain(err: &LockError) -> &'static str {
///     match err {
///         LockError::Timeout { .. } => "busy, try later",
///         LockError::LeaseLost { .. } => "work may have overlapped",
///         _ => "configuration or infrastructure problem",
///     }
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// A lock was requested through the global client before [`init`](crate::init) was called.
    #[error(
        "distlock is not initialized: call `distlock::init(distlock::Config::from_env()?)` \
         once at startup, before the first lock is taken"
    )]
    NotInitialized,

    /// The lock stayed held by someone else for the whole wait.
    #[error(
        "timed out after {waited:?} waiting for lock `{}`: another owner still holds it (or, \
         with the failover guard, no grant was acknowledged by enough replicas in time); \
         raise `wait`, or retry later",
        Shortened(key)
    )]
    Timeout {
        /// The key that was requested.
        key: String,
        /// How long the request waited before giving up.
        waited: Duration,
    },

    /// The lease ran out (or the key was taken over) before the work under the lock finished.
    #[error(
        "the lease on lock `{}` was lost before the work finished (it expired or was deleted); \
         another owner may have run concurrently: reject stale writes with the fencing token, \
         or give the lock a longer lease",
        Shortened(key)
    )]
    LeaseLost {
        /// The key whose lease was lost.
        key: String,
    },

    /// A leader asked for something only the leader may do
    /// ([`Leadership::proclaim`](crate::Leadership::proclaim)) after its leadership had ended:
    /// its lease ran out or was lost, the lock was freed by force, or another leader took
    /// over. Nothing was written.
    #[error(
        "this process no longer leads election `{}` (its epoch {epoch} ended: the lease ran          out or was lost, or the lock was freed by force): nothing was published; stop acting          as the leader, and campaign again to lead",
        Shortened(election)
    )]
    LeadershipLost {
        /// The election's name.
        election: String,
        /// The epoch of the leadership that ended.
        epoch: u64,
    },

    /// The client was shut down ([`Client::shutdown`](crate::Client::shutdown)): a request
    /// made or still waiting then ends with this, and so does an annotated fn whose lock the
    /// shutdown gave back (with `on_lost = "abort"`, at its next await) — not
    /// [`LeaseLost`](Self::LeaseLost): nothing was lost, the process is stopping.
    #[error(
        "this distlock client was shut down (`Client::shutdown`): it takes no more locks and \
         gave back the ones it held; make a new client to take locks again"
    )]
    ShutDown,

    /// A semaphore's key is in use with another number of permits than the request asked for:
    /// a semaphore's count is not changed while permits are held.
    #[error(
        "lock `{}` is a semaphore of {} in use, and this request asked for {asked}: a \
         semaphore's count is not changed while permits are held; use the same count \
         everywhere, or a distinct key for a different count",
        Shortened(key),
        held.map_or_else(|| "another number of permits".to_owned(), |held| format!("{held} permits"))
    )]
    PermitsMismatch {
        /// The semaphore's key.
        key: String,
        /// The permits the request asked for.
        asked: u32,
        /// The permits of the semaphore in use (`None`: not known, e.g. on an older server
        /// script's answer).
        held: Option<u32>,
    },

    /// The lock was held for its `max_hold` (renewals included): the watchdog stopped renewing
    /// it and the work under it was cancelled.
    #[error(
        "lock `{}` was held for its max_hold of {max_hold:?}: the watchdog stopped renewing it \
         and the work was cancelled; find out why the work hangs, or raise max_hold",
        Shortened(key)
    )]
    HeldTooLong {
        /// The key that was held too long.
        key: String,
        /// The request's `max_hold`.
        max_hold: Duration,
    },

    /// A task holding the read lock of a key asked for its write lock (through the attribute):
    /// an upgrade. It fails at once, because two readers upgrading would wait for each other
    /// forever.
    #[error(
        "this task holds the read lock `{}` and asked for its write lock: a read lock cannot be \
         upgraded (two readers upgrading would wait for each other forever); take the write lock \
         in the outer call (a read inside a write joins it), or release the read lock first",
        Shortened(key)
    )]
    UpgradeRefused {
        /// The key whose read lock the task holds.
        key: String,
    },

    /// The store could not be reached, timed out, or answered with an error.
    #[error("{0}")]
    Backend(BackendError),

    /// A Redis key of the lock holds data that distlock did not write (another application's
    /// hash, list, string or sorted set under the same name): the request was refused at once,
    /// and nothing of the key was changed.
    #[error(
        "the Redis key `{}` holds a {holds} that distlock did not write, not a lock: another \
         application uses this key, and distlock leaves it alone; choose another \
         `Config::key_prefix` (or another lock name)",
        Shortened(redis_key)
    )]
    NotALock {
        /// The Redis key (with the prefix and hash tag), as the server named it.
        redis_key: String,
        /// The Redis type found there (`hash`, `string`, `zset`, …).
        holds: String,
    },

    /// A Redlock master's fencing counter for the lock holds 2^53 or more, or 2^53 − 1 where
    /// a write grant or `force_unlock` would need a token above it (set by hand, raised by
    /// grants from a counter set by hand near it, or by a clock decades ahead): the
    /// masters' scripts compare tokens as doubles, exact only below 2^53, and never write a
    /// counter at or past it, so no token above it could ever be granted. The request was
    /// refused at once and no grant of it was left (masters that granted before another
    /// refused were undone; a counter one of them raised stays raised, below 2^53).
    #[error(
        "the fencing counter `{}` on a Redlock master holds {}, at or above 2^53 - 1, and the \
         masters' scripts count only below 2^53: no fencing token above it can be granted. Find \
         out what set it so high (a master's clock decades ahead, a hand-made `SET`); once no \
         holder of the lock is left, delete it on every master that holds such a value (`DEL` \
         the key): tokens then start again from the masters' clocks, so reset the highest \
         token any fenced resource keeps for this lock as well",
        Shortened(redis_key),
        Shortened(value)
    )]
    FencingCounterTooLarge {
        /// The counter's Redis key (with the prefix and hash tag), as the server named it.
        redis_key: String,
        /// What the counter holds (or, should a proposal itself reach 2^53, that proposal).
        value: String,
    },

    /// Too few Redlock masters granted the request (or its renewal) within its validity.
    /// A semaphore permit needs more than a majority (see
    /// [`LockGuard::permits`](crate::LockGuard::permits)): with 3 masters and 2 permits or
    /// more, every master.
    #[error(
        "lock `{}` needs {needed} of {nodes} Redis masters, but only {answered} answered in \
         time ({granted} granted or renewed it): check that a majority of the configured \
         masters is reachable and answers within the node timeout{}",
        Shortened(key),
        if *needed > *nodes / 2 + 1 {
            "; a semaphore permit needs more than a majority, so that no more holders than \
             permits can each hold that many masters: with 3 masters, all of them, so one \
             master down makes a semaphore of 2 permits or more unavailable (5 masters keep \
             2 or 3 permits available with one down)"
        } else {
            ""
        }
    )]
    QuorumUnavailable {
        /// The key that was requested.
        key: String,
        /// Masters that answered in time, whatever they answered.
        answered: usize,
        /// Masters that granted the request.
        granted: usize,
        /// Masters needed: a majority, or more for a semaphore permit.
        needed: usize,
        /// Masters configured.
        nodes: usize,
    },

    /// The key cannot be used as a lock key.
    #[error("invalid lock key `{}`: {reason}", Shortened(key))]
    InvalidKey {
        /// The offending key (an oversized one cut to 120 characters).
        key: String,
        /// Why it was rejected and what is accepted.
        reason: String,
    },

    /// [`fencing_token()`](crate::fencing_token) found no token: no lock is held by the
    /// calling task through the attribute, or it was taken without one. The text says which.
    #[error("no fencing token: {0}")]
    NoFencingToken(&'static str),

    /// The configuration or a request's settings are unusable.
    #[error("invalid distlock configuration: {0}")]
    Config(String),
}

impl From<BackendError> for LockError {
    /// A store failure, or [`LockError::NotALock`] when a script found data it did not write
    /// at a lock's key (its `NOTALOCK` error, `scripts/lock_key.lua`), or
    /// [`LockError::FencingCounterTooLarge`] (its `FENCETOOLARGE` error).
    fn from(err: BackendError) -> Self {
        if let Some((holds, redis_key)) = err.script_refusal("NOTALOCK") {
            return LockError::NotALock { redis_key, holds };
        }
        if let Some((value, redis_key)) = err.script_refusal("FENCETOOLARGE") {
            return LockError::FencingCounterTooLarge { redis_key, value };
        }
        LockError::Backend(err)
    }
}

impl LockError {
    /// Whether this failure may pass, so that trying again later can succeed: a connection
    /// refused, reset or timed out, a server not ready or read-only (a failover under way), a
    /// Cluster slot in migration or the Cluster down, too few Redlock masters
    /// ([`QuorumUnavailable`](Self::QuorumUnavailable)) or replicas. Not an ACL refusal,
    /// credentials, TLS, an error reply, a configuration error or a lock held by someone else
    /// ([`Timeout`](Self::Timeout)): trying again cannot mend those.
    ///
    /// A request has already retried such failures within its wait
    /// ([`Config::retry`](crate::Config::retry)); this tells a caller whether to try again
    /// later (say, a job's next run) or to alert someone.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::LockError;
    ///
    /// let quorum = LockError::QuorumUnavailable {
    ///     key: "report".into(),
    ///     answered: 1,
    ///     granted: 1,
    ///     needed: 2,
    ///     nodes: 3,
    /// };
    /// assert!(quorum.is_transient());
    /// let busy = LockError::Timeout { key: "report".into(), waited: Duration::from_secs(5) };
    /// assert!(!busy.is_transient());
    /// assert!(!LockError::Config("a zero lease".into()).is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        match self {
            LockError::QuorumUnavailable { .. } => true,
            LockError::Backend(err) => {
                err.refused.is_none()
                    && matches!(
                        err.kind,
                        BackendErrorKind::Connection
                            | BackendErrorKind::Timeout
                            | BackendErrorKind::Unavailable
                            | BackendErrorKind::Unreplicated
                    )
            }
            _ => false,
        }
    }

    /// A refusal that waiting cannot change: the request ends with it at once, and a Redlock
    /// master that says so speaks for the deployment (a semaphore of another count in use, a
    /// key that holds no lock).
    pub(crate) fn is_final_refusal(&self) -> bool {
        matches!(
            self,
            LockError::Config(_)
                | LockError::NotALock { .. }
                | LockError::FencingCounterTooLarge { .. }
                | LockError::PermitsMismatch { .. }
        )
    }
}

/// Displays a key cut to [`KEY_IN_MESSAGE`] characters, so a huge key does not flood a log.
struct Shortened<'a>(&'a str);

impl fmt::Display for Shortened<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(KEY_IN_MESSAGE) {
            None => f.write_str(self.0),
            Some((cut, _)) => write!(f, "{}… ({} bytes)", &self.0[..cut], self.0.len()),
        }
    }
}

/// `err` and each of its causes not already in the text, `: `-separated: for a client whose
/// `Display` keeps the cause to itself ("error performing TLS handshake", "transport error").
#[cfg(any(feature = "etcd", feature = "postgres"))]
pub(crate) fn with_causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_passwords_and_user_names() {
        let client = redis::Client::open("redis://user:s3cret@host:6379/2").unwrap();
        assert_eq!(crate::url::server_address(&client), "host:6379 (db 2)");
        // Whether a URL parses or not, no message or Debug output shows its secret.
        for url in [
            "redis://:s3cret@host",
            "redis://:s3cr/et?#x@host:6379/0",
            "redis://127.0.0.1:6379/0?password=pa@ss-s3cret",
            "redis+unix:///tmp/r.sock?db=1&pass=s3cret",
            "http://user:s3cret@host",
            "redis://:s3cret@host:99999",
            "not a url s3cret",
        ] {
            let shown = match crate::config::Config::from_url(url) {
                Ok(config) => format!("{config:?}"),
                Err(err) => err.to_string(),
            };
            assert!(!shown.contains("s3cret"), "{url} -> {shown}");
        }
    }

    #[test]
    fn long_keys_are_shortened_in_messages() {
        let key = "k".repeat(1 << 20);
        let message = LockError::LeaseLost { key }.to_string();
        assert!(message.len() < 400, "{}", message.len());
        assert!(message.contains("1048576 bytes"));
    }
}
