//! What a failed request to a Redis server means ([`Failure`]): the error's kind, whether the
//! connection must be replaced, and whether the request may have run; and the errors a failed
//! connect or request becomes. Neighbours: the one-server transport (`connection.rs` and its
//! `requests.rs`) and the Cluster transport (`cluster.rs`, `primaries.rs`) read failures here.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::error::{BackendError, BackendErrorKind, LockError};

/// A failed connect as the caller sees it: TLS when the handshake failed, else what the
/// error means ([`Failure`]), and whether it timed out.
pub(crate) fn connect_error(err: RedisError) -> BackendError {
    let timed_out = err.is_timeout();
    let kind = if crate::tls::is_handshake_failure(&err) {
        BackendErrorKind::Tls
    } else {
        Failure::of(&err).kind
    };
    BackendError::new("connect", kind, err).connect_timed_out(timed_out)
}

/// The server refused a command (permissions, unknown command): not a broken connection.
pub(super) fn is_refusal(err: &RedisError) -> bool {
    matches!(err.kind(), ErrorKind::Server(_)) && Failure::of(err).kind == BackendErrorKind::Server
}

/// A failed request as the caller sees it: what it means ([`Failure`]), and whether it may
/// have run.
pub(crate) fn request_error(operation: &'static str, err: RedisError) -> LockError {
    let failure = Failure::of(&err);
    BackendError::new(operation, failure.kind, err)
        .maybe_applied(failure.maybe_applied)
        .into()
}

/// What a failed request means for the request and its connection.
pub(crate) struct Failure {
    pub(crate) kind: BackendErrorKind,
    /// The connection cannot serve locks: use a new one.
    pub(crate) reconnect: bool,
    /// The request may have run although it failed.
    pub(crate) maybe_applied: bool,
}

impl Failure {
    pub(crate) fn of(err: &RedisError) -> Self {
        // A transaction the server refused at a command (`EXECABORT`: a replica's `READONLY`,
        // say) fails as that command did; nothing of it ran.
        if err.kind() == ErrorKind::Server(ServerErrorKind::ExecAbort) {
            let first = err.clone().into_server_errors().and_then(|errors| {
                errors
                    .first()
                    .map(|(_, error)| RedisError::from(error.clone()))
            });
            if let Some(first) = first {
                return Self {
                    maybe_applied: false,
                    ..Self::of(&first)
                };
            }
        }
        let (kind, reconnect, maybe_applied) = if err.is_timeout() {
            (BackendErrorKind::Timeout, true, true)
        } else if err.code() == Some("NOAUTH") {
            // The server wants a password and the URL gives none.
            (BackendErrorKind::Authentication, false, false)
        } else {
            match err.kind() {
                // The server (a replica now, or not ready) refused before running anything.
                ErrorKind::Server(
                    ServerErrorKind::ReadOnly
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::BusyLoading,
                ) => (BackendErrorKind::Unavailable, true, false),
                // A Cluster slot in migration (`TRYAGAIN`: keys of a call on both sides) or a
                // Cluster without a quorum of primaries: nothing ran, and the connection is fine.
                ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => {
                    (BackendErrorKind::Unavailable, false, false)
                }
                // Wrong credentials: sent during the handshake, before any request.
                ErrorKind::AuthenticationFailed => (BackendErrorKind::Authentication, false, false),
                // Not the Redis protocol: another kind of server on the port. The request may
                // have reached a Redis that then sent garbage, so it may have run.
                ErrorKind::Parse => (BackendErrorKind::Protocol, true, true),
                // An error reply: a script that fails undoes its grant first.
                ErrorKind::Server(_)
                | ErrorKind::UnexpectedReturnType
                | ErrorKind::InvalidClientConfig
                | ErrorKind::Extension
                | ErrorKind::RESP3NotSupported => (BackendErrorKind::Server, false, false),
                _ => (BackendErrorKind::Connection, true, true),
            }
        };
        Self {
            kind,
            reconnect,
            maybe_applied,
        }
    }
}
