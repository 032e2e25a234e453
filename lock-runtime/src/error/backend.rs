//! [`BackendError`]: a failure of the store behind the locks — which operation, what sort
//! ([`BackendErrorKind`]), whether it may have taken effect, and the advice its message gives;
//! and a try cut off by its request's wait. Neighbours: `error.rs` wraps it in
//! [`LockError`](super::LockError); `acl.rs` reads what a server's ACL refused; the stores
//! (`store/`) make it.

use std::fmt;
use std::time::Duration;

use super::acl::Refused;

/// A failure of the storage behind the locks: connecting, a timed-out or dropped request, or an
/// error reply. The source error is kept for [`std::error::Error::source`].
#[derive(Debug)]
pub struct BackendError {
    operation: &'static str,
    pub(super) kind: BackendErrorKind,
    /// The request may have taken effect on the server although it failed (it was sent, and
    /// no answer says otherwise): a grant nobody knows about may exist.
    maybe_applied: bool,
    /// A connect that ran out of time: the server may be up but frozen, which the advice says.
    connect_timed_out: bool,
    /// What the server's ACL refused, when that is the failure (a `NOPERM` reply).
    pub(super) refused: Option<Refused>,
    /// What to do, where the store that failed is not Redis (whose advice is the default).
    advice: Option<&'static str>,
    source: Box<dyn std::error::Error + Send + Sync>,
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
            advice: None,
            source,
        }
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    /// Gives the advice the message ends with, for a store other than Redis (whose advice,
    /// by the failure's kind, is the default).
    pub(crate) fn advice(mut self, advice: &'static str) -> Self {
        self.advice = Some(advice);
        self
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
    pub(super) fn script_refusal(&self, code: &str) -> Option<(String, String)> {
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

    /// This error with the advice of `store`'s error where it gives one (a store other than
    /// Redis): a cut-off try's error, made by the acquire loop, keeps the advice of the
    /// store's own timeout that it replaces.
    pub(crate) fn advised_as(mut self, store: &BackendError) -> Self {
        if let Some(advice) = store.advice {
            self.advice = Some(advice);
        }
        self
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
            _ if self.advice.is_some() => self.advice.unwrap_or_default(),
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
    fn a_cut_off_try_keeps_the_advice_of_the_store_that_timed_out() {
        let etcd = BackendError::new("acquire", BackendErrorKind::Timeout, "deadline exceeded")
            .advice("etcd did not answer in time");
        let cut =
            BackendError::cut_by_wait("etcd via 127.0.0.1:2400", Duration::from_secs(1), true)
                .advised_as(&etcd);
        let message = cut.to_string();
        assert!(message.contains("etcd did not answer in time"), "{message}");
        assert!(!message.contains("Redis"), "{message}");
        assert!(cut.is_cut_by_wait(), "{message}");
    }
}
