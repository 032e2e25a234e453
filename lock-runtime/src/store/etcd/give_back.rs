//! A release in one round trip: a write or read grant (each key of a multi-key grant is one)
//! given back from a lock whose etcd keys are its grants alone (no bookkeeping key). There the twin's give-back deletes the grant's
//! key and changes nothing else (`Holding::removes_alone`, `kind/mod.rs`), so one transaction
//! deletes it, if the lock still keeps no bookkeeping and the key is still on the grant's
//! lease — the same outcome as the read, the twin and the write of the whole release
//! (`transaction.rs`), one round trip sooner. Anything else (the key gone or on another lease,
//! bookkeeping written meanwhile, a grant this client made no lease for) is left to the whole
//! release, which then decides. Neighbours: `etcd.rs` tries it first; `layout.rs` names the
//! keys; `leases.rs` knows each grant's lease.

use std::time::Instant;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::{layout, EtcdStore};
use crate::error::LockError;
use crate::kind::HolderSlot;
use crate::protocol::LockKey;

impl EtcdStore {
    /// Deletes `owner`'s grant in `slot` at `key` in one transaction, if the lock keeps no
    /// bookkeeping and the grant's key is still on the lease this client made for it (the
    /// lease is then revoked): `true` when it did, `false` when the whole release must decide.
    /// An error is the transaction's, which may have been applied.
    pub(super) async fn give_back_alone(
        &self,
        slot: HolderSlot,
        key: &LockKey,
        owner: &str,
    ) -> Result<bool, LockError> {
        let Some(lease) = self.shared.leases.of(&key.lock, owner) else {
            return Ok(false);
        };
        let path = layout::holder_key(&key.lock, layout::side(slot), owner);
        // An absent key compares as a key of create revision 0 and lease 0.
        let txn = Txn::new()
            .when(vec![
                Compare::create_revision(layout::state_key(&key.lock), CompareOp::Equal, 0),
                Compare::lease(path.clone(), CompareOp::Equal, lease),
            ])
            .and_then(vec![TxnOp::delete(path, None)]);
        let deadline = Instant::now() + self.shared.response_timeout;
        let response = self
            .shared
            .call("release", deadline, |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .await
            .map_err(crate::store::ambiguous)?;
        if !response.succeeded() {
            return Ok(false);
        }
        self.shared.leases.remove(&key.lock, owner);
        self.shared.revoke(vec![lease]);
        Ok(true)
    }
}
