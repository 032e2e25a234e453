//! The etcd store's requests (`etcd.rs`): a client per endpoint, connected on the I/O runtime
//! on first use, and the one in use moved on to the next when a connection fails or breaks, a
//! member has no leader or a request gets no answer in its time; a request run as a task of
//! the I/O runtime until its deadline, sent again to the next endpoint when it was never sent;
//! leases granted and revoked. `https://` endpoints get TLS, and a connection that broke at
//! once there is told apart from a TLS refusal by a handshake of the store's own
//! (`Shared::diagnosed`). Neighbours:
//! `transaction.rs` reads and writes through it, `leases.rs` keeps grants' leases alive on its
//! clients, `errors.rs` names its failures.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, ConnectOptions};
use tokio::runtime::Handle;

use super::errors::{self, etcd_error, store_error, timed_out};
use super::leases::Leases;
use crate::config::EtcdTarget;
use crate::error::{BackendErrorKind, LockError};

/// What the store's requests share: the client (made on first use), the key prefix, the
/// timeouts and the leases of this client's grants.
pub(crate) struct Shared {
    pub(super) target: EtcdTarget,
    /// The key prefix every lock key starts with (`Config::key_prefix`).
    pub(super) prefix: String,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) io: Handle,
    /// A client per endpoint, connected on first use.
    pub(super) clients: Vec<tokio::sync::OnceCell<Client>>,
    /// The endpoint in use: the next one after a failure.
    pub(super) current: AtomicUsize,
    pub(super) leases: Leases,
}

/// Microseconds since the Unix epoch on this process' wall clock: the clock of the times the
/// bookkeeping keeps (never a grant's lease).
pub(crate) fn wall_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

impl Shared {
    /// The client of the endpoint in use, connected on the I/O runtime on first use.
    pub(super) async fn client(&self) -> Result<Client, LockError> {
        self.client_at(self.current.load(Ordering::Acquire)).await
    }

    /// The client of endpoint `index`, connected on first use.
    pub(super) async fn client_at(&self, index: usize) -> Result<Client, LockError> {
        let endpoint = &self.target.endpoints[index % self.target.endpoints.len()];
        let client = self.clients[index % self.clients.len()]
            .get_or_try_init(|| async {
                let mut options = ConnectOptions::new()
                    .with_connect_timeout(self.connect_timeout)
                    .with_keep_alive(
                        self.response_timeout.max(Duration::from_secs(1)),
                        self.response_timeout,
                    )
                    .with_require_leader(true);
                if let Some((user, password)) = &self.target.user {
                    options = options.with_user(user.clone(), password.clone());
                }
                #[cfg(feature = "tls")]
                if self.target.is_tls() {
                    options = options.with_tls(tls_options(&self.target.tls, self.connect_timeout));
                }
                let endpoints = [endpoint.clone()];
                let connecting = self
                    .io
                    .spawn(async move { Client::connect(endpoints, Some(options)).await });
                match tokio::time::timeout(self.connect_timeout, connecting).await {
                    Ok(Ok(Ok(client))) => Ok(client),
                    Ok(Ok(Err(err))) => {
                        let error = store_error("connect", err);
                        let error = self.diagnosed(error, index, self.connect_timeout).await;
                        Err(LockError::from(error))
                    }
                    Ok(Err(_)) => Err(etcd_error(
                        "connect",
                        BackendErrorKind::Connection,
                        "the client's I/O runtime is gone",
                    )
                    .into()),
                    Err(_) => Err(etcd_error(
                        "connect",
                        BackendErrorKind::Connection,
                        format!("no connection to etcd at {endpoint} within the connect timeout"),
                    )
                    .connect_timed_out(true)
                    .into()),
                }
            })
            .await?;
        Ok(client.clone())
    }

    /// `error`, or, when it is a connection that broke at once on an `https://` endpoint, the
    /// TLS refusal that broke it. A member that takes TLS 1.3 connections checks the client's
    /// certificate after the client has finished its handshake, and its alert ("bad
    /// certificate") races the client's first request: the request often sees only a closed
    /// connection. A handshake of its own with endpoint `index` (at most `within`), that
    /// waits for the member's first word, tells which it was.
    async fn diagnosed(
        &self,
        error: crate::error::BackendError,
        index: usize,
        within: Duration,
    ) -> crate::error::BackendError {
        #[cfg(feature = "tls")]
        if error.kind() == BackendErrorKind::Connection && self.target.is_tls() {
            let endpoint = self.target.endpoints[index % self.target.endpoints.len()].clone();
            let settings = self.target.tls.clone();
            let probe = self.io.spawn(async move {
                tokio::time::timeout(within, tls_refusal(&endpoint, &settings))
                    .await
                    .ok()
                    .flatten()
                    .map(|said| format!("{endpoint} refused this client in TLS: {said}"))
            });
            if let Ok(Some(said)) = probe.await {
                return etcd_error(error.operation(), BackendErrorKind::Tls, said);
            }
        }
        #[cfg(not(feature = "tls"))]
        let _ = (index, within);
        error
    }

    /// Moves on from endpoint `index` to the next, unless another request already did.
    pub(super) fn move_on(&self, index: usize) {
        let next = (index + 1) % self.target.endpoints.len();
        let _ = self
            .current
            .compare_exchange(index, next, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Runs `request` on the client of the endpoint in use, as a task on the I/O runtime,
    /// and waits for it until `deadline`: a request without an answer by then fails with a
    /// timeout (and may still take effect). A failed connection, a member without a leader,
    /// a broken connection or a request without an answer moves the client on to the next
    /// endpoint (a frozen member keeps its connections open and answers nothing: a client
    /// that stayed would fail every request for as long as it is frozen); a request that was
    /// never sent (its connection refused) is sent again there, within the deadline, once
    /// to each endpoint at most.
    pub(super) async fn call<T, F, Fut>(
        &self,
        operation: &'static str,
        deadline: Instant,
        request: F,
    ) -> Result<T, LockError>
    where
        T: Send + 'static,
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            let index = self.current.load(Ordering::Acquire);
            let again = tries < self.target.endpoints.len() && Instant::now() < deadline;
            let client = match tokio::time::timeout_at(deadline.into(), self.client_at(index)).await
            {
                Ok(Ok(client)) => client,
                Ok(Err(err)) => {
                    self.move_on(index);
                    if again {
                        continue;
                    }
                    return Err(err);
                }
                Err(_) => {
                    self.move_on(index);
                    return Err(timed_out(operation).into());
                }
            };
            let running = self.io.spawn(request(client));
            let err = match tokio::time::timeout_at(deadline.into(), running).await {
                Ok(Ok(Ok(answer))) => return Ok(answer),
                Ok(Ok(Err(err))) => err,
                Ok(Err(_)) => {
                    return Err(etcd_error(
                        operation,
                        BackendErrorKind::Connection,
                        "the client's I/O runtime is gone",
                    )
                    .into())
                }
                Err(_) => {
                    self.move_on(index);
                    return Err(timed_out(operation).into());
                }
            };
            let unsent = errors::never_sent(&err);
            let error = store_error(if unsent { "connect" } else { operation }, err);
            let left = deadline.saturating_duration_since(Instant::now());
            let error = self
                .diagnosed(error, index, left.min(self.connect_timeout))
                .await;
            if matches!(
                error.kind(),
                BackendErrorKind::Connection | BackendErrorKind::Unavailable
            ) {
                self.move_on(index);
            }
            if unsent && again {
                continue;
            }
            return Err(error.into());
        }
    }

    /// Grants a lease of `ttl` seconds.
    pub(super) async fn grant(&self, ttl: i64, deadline: Instant) -> Result<Lease, LockError> {
        let granted = self
            .call("acquire", deadline, move |mut client| async move {
                client.lease_grant(ttl, None).await
            })
            .await?;
        Ok(Lease {
            id: granted.id(),
            asked: ttl,
            granted: granted.ttl(),
        })
    }

    /// Revokes `leases` in the background: grants given back or never written. One that
    /// cannot be revoked runs out by itself.
    pub(super) fn revoke(self: &Arc<Self>, leases: Vec<i64>) {
        if leases.is_empty() {
            return;
        }
        let shared = self.clone();
        self.io.spawn(async move {
            let Ok(client) = shared.client().await else {
                return;
            };
            for lease in leases {
                let mut leases = client.lease_client();
                let _ = tokio::time::timeout(shared.response_timeout, leases.revoke(lease)).await;
            }
        });
    }
}

/// The TLS of `https://` endpoints: the CA given (alone) or the system's roots, the client
/// certificate given, and a handshake cut off at the connect timeout. The certificates were
/// checked when the client was made (`config/tls_settings.rs`).
#[cfg(feature = "tls")]
fn tls_options(
    settings: &crate::config::TlsSettings,
    connect_timeout: Duration,
) -> etcd_client::TlsOptions {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let mut options = TlsOptions::new().timeout(connect_timeout);
    options = match &settings.ca_pem {
        Some(pem) => options.ca_certificate(Certificate::from_pem(pem)),
        None => options.with_native_roots(),
    };
    if let Some((cert, key)) = &settings.client_cert {
        options = options.identity(Identity::from_pem(cert, key));
    }
    options
}

/// What the member at `endpoint` (`https://host:port`) says in TLS to a client with
/// `settings`, when it refuses it: a handshake, then its first word (HTTP/2's settings, or
/// the alert of a refused client certificate). `None` if it takes the client, or answers
/// nothing in TLS.
#[cfg(feature = "tls")]
async fn tls_refusal(endpoint: &str, settings: &crate::config::TlsSettings) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let authority = endpoint.strip_prefix("https://")?;
    let (host, _) = authority.rsplit_once(':')?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let server = rustls::pki_types::ServerName::try_from(host).ok()?;
    let mut config = settings.client_config("etcd", true).ok()?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(authority).await.ok()?;
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let said = match connector.connect(server, tcp).await {
        Ok(mut tls) => tls.read(&mut [0u8; 1]).await.err()?.to_string(),
        Err(err) => err.to_string(),
    };
    // A connection reset or cut is no refusal of TLS's.
    errors::is_tls_failure(&said).then_some(said)
}

/// An etcd lease as granted: its id and the TTL etcd gave it (seconds).
#[derive(Debug, Clone, Copy)]
pub(super) struct Lease {
    pub(super) id: i64,
    /// The TTL asked for.
    pub(super) asked: i64,
    /// The TTL etcd granted (at least its minimum).
    pub(super) granted: i64,
}
