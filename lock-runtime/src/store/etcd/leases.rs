//! The etcd leases of one client's grants: each grant's key lives on a lease of its own
//! (granted with the grant's lease, in whole seconds; the server may raise it to its
//! minimum), renewed by one keep-alive per round on a stream kept open for the grant's life,
//! and revoked when the grant is given back (which deletes whatever key is still on it). A
//! keep-alive answered with a TTL of 0 means the lease is gone: the grant is lost; so is a
//! grant whose key the watch saw deleted by anyone but this client (`watcher.rs`), though its
//! lease lives on. Which lease holds which grant is kept here, by lock key and owner. Neighbours: `etcd.rs` grants
//! and revokes around its transactions and renews through [`Leases::renew`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};

use crate::protocol::Renewed;

/// A grant's lease in etcd's seconds: `lease` rounded up, at least a second.
pub(super) fn ttl_secs(lease: Duration) -> i64 {
    let secs = lease.as_secs() + u64::from(lease.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// A keep-alive stream of one lease, opened at its first renewal.
type Keeper = Arc<tokio::sync::Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>>;

/// The leases of this client's grants.
#[derive(Default)]
pub(super) struct Leases {
    /// By lock key and owner: the lease of the grant.
    grants: Mutex<HashMap<(String, String), i64>>,
    /// By lease: its keep-alive stream.
    keepers: Mutex<HashMap<i64, Keeper>>,
}

impl Leases {
    /// Notes that `owner`'s grant at `lock` lives on `lease`.
    pub(super) fn insert(&self, lock: &str, owner: &str, lease: i64) {
        self.grants
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((lock.to_owned(), owner.to_owned()), lease);
    }

    /// Forgets `owner`'s grant at `lock` (and the stream of its lease).
    pub(super) fn remove(&self, lock: &str, owner: &str) {
        let lease = self
            .grants
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(lock.to_owned(), owner.to_owned()));
        if let Some(lease) = lease {
            self.keepers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&lease);
        }
    }

    /// The lease of `owner`'s grant at `lock`, as this client made it.
    pub(super) fn of(&self, lock: &str, owner: &str) -> Option<i64> {
        self.grants
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(lock.to_owned(), owner.to_owned()))
            .copied()
    }

    fn keeper(&self, lease: i64) -> Keeper {
        self.keepers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(lease)
            .or_default()
            .clone()
    }

    /// One keep-alive of `lease` on its stream (opened now if it is not): `Yes` while etcd
    /// keeps it, `No` once it is gone; an error (the stream is then opened again next time)
    /// says nothing.
    pub(super) async fn renew(
        &self,
        client: &Client,
        lease: i64,
    ) -> Result<Renewed, etcd_client::Error> {
        let keeper = self.keeper(lease);
        let mut slot = keeper.lock().await;
        if slot.is_none() {
            match client.lease_client().keep_alive(lease).await {
                // Opening the stream sent a keep-alive and read its answer, a TTL above 0: the
                // lease was renewed (a second keep-alive now cost each lease's first renewal
                // two messages).
                Ok(stream) => {
                    *slot = Some(stream);
                    return Ok(Renewed::Yes);
                }
                // etcd-client says so when the first answer has a TTL of 0: the lease is gone.
                Err(err) if err.to_string().contains("not found") => return Ok(Renewed::No),
                Err(err) => return Err(err),
            }
        }
        let Some((sender, stream)) = slot.as_mut() else {
            return Ok(Renewed::Unknown);
        };
        let answer = async {
            sender.keep_alive().await?;
            stream.message().await
        };
        match answer.await {
            Ok(Some(response)) if response.ttl() > 0 => Ok(Renewed::Yes),
            Ok(Some(_)) => Ok(Renewed::No),
            Ok(None) => {
                *slot = None;
                Ok(Renewed::Unknown)
            }
            Err(err) => {
                *slot = None;
                Err(err)
            }
        }
    }
}
