//! The etcd store's failures as [`BackendError`]s: what etcd said (no leader, refused
//! credentials, missing permissions) or a lost connection, each with etcd's advice. Neighbours:
//! every file of the store reports through here.

use crate::error::{BackendError, BackendErrorKind};

/// What a connection that could not be made or broke advises.
const CONNECT_ADVICE: &str = "check that etcd is running and reachable at the configured \
    endpoints (`etcdctl --endpoints=… endpoint health`)";

/// What a request without an answer advises.
const TIMEOUT_ADVICE: &str = "etcd did not answer in time: a member may be overloaded, frozen \
    or cut off from its quorum (`etcdctl endpoint status`); or raise the response timeout if \
    it is just slow";

/// An error of the etcd store with the advice its kind gives.
pub(crate) fn etcd_error(
    operation: &'static str,
    kind: BackendErrorKind,
    message: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> BackendError {
    let advice = match kind {
        BackendErrorKind::Timeout => TIMEOUT_ADVICE,
        BackendErrorKind::Connection => CONNECT_ADVICE,
        BackendErrorKind::Unavailable => {
            "etcd has no leader: a quorum of its members is down or cut off; requests go \
             on once a majority is back"
        }
        BackendErrorKind::Authentication => {
            "check the user and password given to `Config::etcd_user` (`etcdctl user get`)"
        }
        BackendErrorKind::Tls => {
            "check that the members serve TLS on these `https://` endpoints, that their \
             certificates name the host of the endpoint and chain to the CA given by \
             `Config::etcd_ca_pem` (or, without one, to a root this machine trusts), and, \
             with `--client-cert-auth`, that `Config::etcd_client_cert` gives a certificate \
             their `--trusted-ca-file` signed (docs/tls.md)"
        }
        _ => {
            "check etcd's log and the role of the user distlock authenticates as: it needs \
              read and write on the key prefix (docs/etcd.md)"
        }
    };
    BackendError::new(operation, kind, message).advice(advice)
}

/// A failure of the etcd client as a [`BackendError`].
pub(crate) fn store_error(operation: &'static str, err: etcd_client::Error) -> BackendError {
    use etcd_client::Error;
    use tonic::Code;
    let details = format!("{err:?}");
    let kind = match &err {
        // The HTTP/2 keep-alive got no answer: a member that takes connections and answers
        // nothing (frozen, or cut off).
        _ if details.contains("KeepAliveTimedOut") => BackendErrorKind::Timeout,
        _ if is_tls_failure(&details) => BackendErrorKind::Tls,
        Error::GRpcStatus(status) => match status.code() {
            Code::DeadlineExceeded => BackendErrorKind::Timeout,
            Code::Unauthenticated => BackendErrorKind::Authentication,
            Code::Unavailable
                if status.message().contains("leader") || status.message().contains("quorum") =>
            {
                BackendErrorKind::Unavailable
            }
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Aborted => {
                BackendErrorKind::Connection
            }
            Code::InvalidArgument if status.message().contains("authentication failed") => {
                BackendErrorKind::Authentication
            }
            Code::FailedPrecondition if status.message().contains("auth") => {
                BackendErrorKind::Authentication
            }
            _ => BackendErrorKind::Server,
        },
        Error::TransportError(_) | Error::IoError(_) | Error::EndpointError(_) => {
            BackendErrorKind::Connection
        }
        _ => BackendErrorKind::Server,
    };
    if kind == BackendErrorKind::Tls {
        // The client's `Display` says "transport error" alone; the cause is in the chain.
        return etcd_error(operation, kind, crate::error::with_causes(&err));
    }
    etcd_error(operation, kind, err.to_string())
}

/// Whether a failure (its `Debug`, where the gRPC layer keeps the causes) is TLS's: a
/// certificate refused either way, a handshake broken or cut off, no roots to check with,
/// or a server that does not speak HTTP/2 over TLS.
pub(crate) fn is_tls_failure(details: &str) -> bool {
    [
        "InvalidCertificate",
        "invalid peer certificate",
        "AlertReceived",
        "received fatal alert",
        "peer is incompatible",
        "PeerIncompatible",
        "PeerMisbehaved",
        "InvalidContentType",
        "CorruptMessage",
        "NativeCertsNotFound",
        "HandshakeTimeout",
        "H2NotNegotiated",
    ]
    .iter()
    .any(|sign| details.contains(sign))
}

/// Whether the request that failed with `err` was never sent: its connection could not be
/// made (refused, unreachable), so it cannot have taken effect and may be sent elsewhere.
pub(crate) fn never_sent(err: &etcd_client::Error) -> bool {
    let text = err.to_string();
    [
        "tcp connect error",
        "Connection refused",
        "error trying to connect",
    ]
    .iter()
    .any(|sign| text.contains(sign))
}

/// A request that got no answer within its time.
pub(crate) fn timed_out(operation: &'static str) -> BackendError {
    etcd_error(
        operation,
        BackendErrorKind::Timeout,
        "no answer from etcd within the response timeout (or what was left of the request's wait)",
    )
}
