//! The etcd store's requests (`etcd.rs`): a client per endpoint, connected on the I/O runtime
//! on first use, and the one in use moved on to the next when a connection fails or breaks, a
//! member has no leader or a request gets no answer in its time; a request run as a task of the I/O runtime until its deadline, sent
//! again to the next endpoint when it was never sent; leases granted and revoked. Neighbours:
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
                let endpoints = [endpoint.clone()];
                let connecting = self
                    .io
                    .spawn(async move { Client::connect(endpoints, Some(options)).await });
                match tokio::time::timeout(self.connect_timeout, connecting).await {
                    Ok(Ok(Ok(client))) => Ok(client),
                    Ok(Ok(Err(err))) => Err(LockError::from(store_error("connect", err))),
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

/// An etcd lease as granted: its id and the TTL etcd gave it (seconds).
#[derive(Debug, Clone, Copy)]
pub(super) struct Lease {
    pub(super) id: i64,
    /// The TTL asked for.
    pub(super) asked: i64,
    /// The TTL etcd granted (at least its minimum).
    pub(super) granted: i64,
}
