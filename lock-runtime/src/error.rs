//! The one error type of distlock. Every variant's message says what happened and what to do
//! next; keys are shortened and URLs redacted before they reach a message.

use std::fmt;
use std::time::Duration;

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

/// A failure of the storage behind the locks: connecting, a timed-out or dropped request, or an
/// error reply. The source error is kept for [`std::error::Error::source`].
#[derive(Debug)]
pub struct BackendError {
    operation: &'static str,
    kind: BackendErrorKind,
    /// The request may have taken effect on the server although it failed (it was sent, and
    /// no answer says otherwise): a grant nobody knows about may exist.
    maybe_applied: bool,
    /// A connect that ran out of time: the server may be up but frozen, which the advice says.
    connect_timed_out: bool,
    /// What the server's ACL refused, when that is the failure (a `NOPERM` reply).
    refused: Option<Refused>,
    source: Box<dyn std::error::Error + Send + Sync>,
}

/// What a server's ACL refused this connection's user, read from the error reply: Redis says
/// `NOPERM this user has no permissions to run the 'zcard' command` (or `… to access one of
/// the keys …`), and inside a script `The user executing the script can't run this command or
/// subcommand` without naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// This command, as the ACL names it: `zcard`, `script|load`.
    Command(String),
    /// A command one of distlock's scripts runs (Redis does not say which).
    ScriptCommand,
    /// A key (`~pattern`).
    Keys,
    /// A pub/sub channel (`&pattern`).
    Channels,
}

impl Refused {
    /// Reads the refusal from an error's text, if it is one.
    pub(crate) fn of(message: &str) -> Option<Self> {
        if let Some((_, rest)) = message.split_once("no permissions to run the '") {
            let command = rest.split_once('\'').map_or(rest, |(command, _)| command);
            return Some(Self::Command(command.to_ascii_lowercase()));
        }
        if message.contains("no permissions to access one of the keys") {
            return Some(Self::Keys);
        }
        if message.contains("no permissions to access one of the channels") {
            return Some(Self::Channels);
        }
        let (_, in_script) = message.split_once("The user executing the script can't")?;
        Some(if in_script.contains("channel") {
            Self::Channels
        } else if in_script.contains("key") {
            Self::Keys
        } else {
            Self::ScriptCommand
        })
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const LIST: &str = "docs/keys-and-acls.md (\"Keys in Redis and the ACL a user needs\") \
                            lists every command, key and channel distlock needs, per deployment";
        match self {
            Self::Command(command) => write!(
                f,
                "the server's ACL does not allow this connection's user the command `{}`: grant \
                 it in the user's ACL (`ACL SETUSER <user> +{command}`); {LIST}",
                command.replace('|', " ").to_ascii_uppercase()
            ),
            Self::ScriptCommand => write!(
                f,
                "the server's ACL does not allow this connection's user a command one of \
                 distlock's scripts runs (Redis does not say which): grant the user's ACL the \
                 commands {LIST}"
            ),
            Self::Keys => write!(
                f,
                "the server's ACL does not allow this connection's user the lock keys: grant \
                 the key prefix in the user's ACL (`~distlock:*` for the default prefix); {LIST}"
            ),
            Self::Channels => write!(
                f,
                "the server's ACL does not allow this connection's user the lock channels: \
                 grant them in the user's ACL (`&distlock:*` for the default prefix); {LIST}"
            ),
        }
    }
}

/// What sort of store failure a [`BackendError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// No connection could be made, or the connection broke.
    Connection,
    /// The request got no answer within the response timeout (or, for a lock request's try,
    /// within what was left of its wait). It may still have taken effect.
    Timeout,
    /// The server answered with an error (authentication, script error, wrong type, …).
    Server,
    /// The server refused the credentials in the URL (wrong password, unknown or disabled
    /// user, or a password given to a server that has none).
    Authentication,
    /// The server answered but cannot serve locks now: it is a read-only replica (say, a
    /// primary demoted by a failover), has lost its primary, or is still loading its data
    /// (the connection is dropped, so the next request reconnects); or a Cluster slot is being
    /// migrated (`TRYAGAIN`) or the Cluster is down (`CLUSTERDOWN`).
    Unavailable,
    /// The failover guard ([`Config::replicas`](crate::Config::replicas)): too few replicas
    /// acknowledged a renewal within the guard's timeout, so it does not count.
    Unreplicated,
    /// What came back is not the Redis protocol: the server at that address is not Redis (an
    /// HTTP or SSH server on the port, say). Not retried: the URL is wrong.
    Protocol,
    /// TLS could not be set up or the handshake failed: no rustls crypto provider, a server
    /// certificate that no trusted root vouches for or that names another host, or a server
    /// that does not speak TLS on that port.
    Tls,
}

impl BackendError {
    pub(crate) fn new(
        operation: &'static str,
        kind: BackendErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        let source = source.into();
        // Only the server's own error reply can be a refusal (not, say, a message of ours
        // that quotes one).
        let refused = source
            .downcast_ref::<redis::RedisError>()
            .filter(|err| matches!(err.kind(), redis::ErrorKind::Server(_)))
            .and_then(|err| Refused::of(&err.to_string()));
        Self {
            operation,
            kind,
            maybe_applied: false,
            connect_timed_out: false,
            refused,
            source,
        }
    }

    /// Reads what the server's ACL refused from `err`, the server's own error reply, for an
    /// error whose source is a message of ours that quotes it (the server's address first).
    pub(crate) fn refused_by(mut self, err: &redis::RedisError) -> Self {
        if matches!(err.kind(), redis::ErrorKind::Server(_)) {
            self.refused = Refused::of(&err.to_string()).or(self.refused);
        }
        self
    }

    /// Keeps what `other`'s ACL refused, for an error that sums up several (a Redlock
    /// `PING` of every master).
    pub(crate) fn refused_as(mut self, other: &BackendError) -> Self {
        self.refused = other.refused.clone().or(self.refused);
        self
    }

    /// Marks a failed connect as one that ran out of time (rather than being refused).
    pub(crate) fn connect_timed_out(mut self, timed_out: bool) -> Self {
        self.connect_timed_out = timed_out;
        self
    }

    /// Marks the failed request as one that may nevertheless have taken effect.
    pub(crate) fn maybe_applied(mut self, maybe: bool) -> Self {
        self.maybe_applied = maybe;
        self
    }

    /// The command the server's ACL refused, as the ACL names it (`zcard`, `script|load`), if
    /// that is why the request failed.
    pub(crate) fn refused_command(&self) -> Option<&str> {
        match &self.refused {
            Some(Refused::Command(command)) => Some(command),
            _ => None,
        }
    }

    /// Whether the request may have taken effect although it failed.
    pub(crate) fn may_have_applied(&self) -> bool {
        self.maybe_applied
    }

    /// What was found and the Redis key, when this is a script's error `code` of the form
    /// `<code> <what> at <key>` (`NOTALOCK <type> at <key>`, `FENCETOOLARGE <value> at <key>`:
    /// `scripts/lock_key.lua`), without what Redis appends to an error a script raises.
    fn script_refusal(&self, code: &str) -> Option<(String, String)> {
        let err = self.source.downcast_ref::<redis::RedisError>()?;
        if err.code() != Some(code) {
            return None;
        }
        let detail = err.detail()?;
        let (holds, rest) = detail.split_once(" at ")?;
        let key = rest.rsplit_once(" script: ").map_or(rest, |(key, _)| key);
        Some((holds.to_owned(), key.trim_end().to_owned()))
    }

    /// What sort of failure this is.
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }

    /// The failure underneath, without the operation or the advice (for an error that wraps
    /// this one and gives its own).
    pub(crate) fn cause(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }

    /// Whether this is a failure to connect (made by `connect_error`, or a connect task that
    /// did not finish): the request it was for never went out on a connection.
    pub(crate) fn is_connect_failure(&self) -> bool {
        self.operation == "connect"
    }

    /// A try of the acquire loop that got no answer from `servers` within `budget`: what was
    /// left of its request's wait (`waits`), or the response timeout of a request that does
    /// not wait. A timeout that may have taken effect.
    pub(crate) fn cut_by_wait(servers: &str, budget: Duration, waits: bool) -> Self {
        BackendError::new(
            "acquire",
            BackendErrorKind::Timeout,
            CutByWait {
                servers: servers.to_owned(),
                budget,
                waits,
            },
        )
        .maybe_applied(true)
    }

    /// Whether this is a try cut off by the end of its request's wait ([`Self::cut_by_wait`]).
    pub(crate) fn is_cut_by_wait(&self) -> bool {
        self.source.is::<CutByWait>()
    }

    /// Whether this was a connect that ran out of time.
    pub(crate) fn is_connect_timeout(&self) -> bool {
        self.connect_timed_out
    }

    /// The operation that failed: `"connect"`, `"acquire"`, `"release"` or `"renew"`.
    pub fn operation(&self) -> &'static str {
        self.operation
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(refused) = &self.refused {
            return write!(
                f,
                "lock backend failed to {}: {}; {refused}",
                self.operation, self.source
            );
        }
        let advice = match self.kind {
            // Refused at once means nothing listens; no answer in time is a server (or a path
            // to it) that takes the connection and then says nothing.
            BackendErrorKind::Connection | BackendErrorKind::Timeout if self.connect_timed_out => {
                "no answer within the connect timeout: the server may be unreachable (a \
                 firewall that drops packets, a wrong address), or up but frozen — it accepts \
                 TCP connections but answers nothing when it is stopped (SIGSTOP, a paused VM or \
                 container), swapping, busy in a long script or command (see its SLOWLOG), \
                 or behind a proxy or load balancer whose backend is gone; check with \
                 `redis-cli -h HOST -p PORT PING`, or raise `connect_timeout` if the server is \
                 just slow"
            }
            BackendErrorKind::Connection => {
                "check that Redis is running and reachable at the configured URL"
            }
            BackendErrorKind::Timeout => {
                "Redis did not answer in time: it may be overloaded, or up but frozen — it \
                 takes connections but answers nothing when it is stopped (SIGSTOP, a paused \
                 VM or container), busy in a long script, or behind a proxy whose backend is \
                 gone; check its load and the network (`redis-cli -h HOST -p PORT PING`), or \
                 raise the response timeout (or the request's wait) if it is just slow"
            }
            BackendErrorKind::Server => "Redis rejected the request; check its log and ACLs",
            BackendErrorKind::Protocol => {
                "the server does not speak the Redis protocol (an HTTP or SSH server on that \
                 port, say): check the host and port in the URL"
            }
            BackendErrorKind::Authentication => {
                "Redis refused the credentials; check the user name and password in the URL \
                 (and that the user is enabled)"
            }
            BackendErrorKind::Unavailable => {
                "the server cannot take writes now (a replica, after a failover, still loading, \
                 a Cluster slot in migration or the Cluster down); point the URL at the \
                 primary, or let acquires retry longer within their wait (`Config::retry`)"
            }
            BackendErrorKind::Tls => {
                "check that the port serves TLS, that the server's certificate names the host in \
                 the URL and chains to a root this machine trusts (for a private CA build a \
                 `redis::Client` with `build_with_tls` and pass it to \
                 `Config::from_redis_client`), and that distlock's `tls` feature is enabled"
            }
            BackendErrorKind::Unreplicated => {
                "check that the replicas are up and linked to the primary, or give the failover \
                 guard a longer timeout or fewer replicas"
            }
        };
        write!(
            f,
            "lock backend failed to {}: {}; {}",
            self.operation, self.source, advice
        )
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// Why a try of the acquire loop failed when its request's wait ended before any answer
/// ([`BackendError::cut_by_wait`]).
#[derive(Debug)]
struct CutByWait {
    /// The deployment and its servers ([`StoreConfig::describe`](crate::config)).
    servers: String,
    budget: Duration,
    /// Whether the request waits (`false`: its one try had the response timeout).
    waits: bool,
}

impl fmt::Display for CutByWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Whole milliseconds: what is left of a wait is never a round figure.
        let budget =
            Duration::from_millis(u64::try_from(self.budget.as_millis()).unwrap_or(u64::MAX));
        let what = if self.waits {
            "what was left of the request's wait"
        } else {
            "the response timeout, the bound of a request that does not wait"
        };
        write!(
            f,
            "no answer from {} within {budget:?}, {what}",
            self.servers
        )
    }
}

impl std::error::Error for CutByWait {}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_try_cut_off_by_its_wait_names_the_servers_the_bound_and_a_frozen_server() {
        let waited = BackendError::cut_by_wait(
            "127.0.0.1:6400 (db 0)",
            Duration::from_micros(499_987),
            true,
        );
        assert!(waited.is_cut_by_wait() && waited.may_have_applied());
        assert_eq!(waited.kind(), BackendErrorKind::Timeout);
        let message = waited.to_string();
        for part in [
            "failed to acquire: no answer from 127.0.0.1:6400 (db 0) within 499ms, what was \
             left of the request's wait",
            "frozen",
            "SIGSTOP",
        ] {
            assert!(message.contains(part), "{part:?} in {message}");
        }
        let once =
            BackendError::cut_by_wait("127.0.0.1:6400 (db 0)", Duration::from_secs(1), false);
        assert!(
            once.to_string().contains("within 1s, the response timeout"),
            "{once}"
        );
    }

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
    fn an_acl_refusal_names_what_to_grant() {
        let refusals = [
            (
                "NOPERM this user has no permissions to run the 'zcard' command",
                Some(Refused::Command("zcard".into())),
            ),
            (
                "EXECABORT Transaction discarded because of: NOPERM this user has no \
                 permissions to run the 'exec' command",
                Some(Refused::Command("exec".into())),
            ),
            (
                "NOPERM this user has no permissions to run the 'script|load' command",
                Some(Refused::Command("script|load".into())),
            ),
            (
                "NOPERM this user has no permissions to access one of the keys used as arguments",
                Some(Refused::Keys),
            ),
            (
                "NOPERM this user has no permissions to access one of the channels used as \
                 arguments",
                Some(Refused::Channels),
            ),
            (
                "ERR The user executing the script can't run this command or subcommand \
                 script: 0690, on @user_script:1.",
                Some(Refused::ScriptCommand),
            ),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                None,
            ),
        ];
        for (reply, expected) in refusals {
            assert_eq!(Refused::of(reply), expected, "{reply}");
        }
        let err = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
            "NOPERM",
            "this user has no permissions to run the 'script|load' command".to_owned(),
        ));
        let message = BackendError::new("acquire", BackendErrorKind::Server, err).to_string();
        assert!(message.contains("`SCRIPT LOAD`"), "{message}");
        assert!(message.contains("+script|load"), "{message}");
        assert!(message.contains("Keys in Redis"), "{message}");
        // Our own words quoting a refusal are no refusal of the server's.
        let ours = BackendError::new(
            "acquire",
            BackendErrorKind::Server,
            "no permissions to run the 'zcard' command",
        );
        assert!(ours.to_string().contains("check its log and ACLs"));
    }

    #[test]
    fn long_keys_are_shortened_in_messages() {
        let key = "k".repeat(1 << 20);
        let message = LockError::LeaseLost { key }.to_string();
        assert!(message.len() < 400, "{}", message.len());
        assert!(message.contains("1048576 bytes"));
    }
}
