//! Giving back on the Redis store (`redis.rs`): one grant (or seat) by its holding's release
//! script, or the write locks of several keys, one call per hash slot on a Cluster, all at
//! once; announced to waiters, or not for a Redlock try's give-back where it fell short of a
//! quorum. Neighbours: `tries.rs` gives back a try that did not stand; `redlock/` undoes
//! tries on its masters with these.

use std::collections::HashMap;

use redis::cluster_routing::Slot;

use super::RedisStore;
use crate::error::LockError;
use crate::kind::{multi, Holding};
use crate::protocol::{Announce, LockKey};
use crate::store::transport::Transport;

impl<T: Transport> RedisStore<T> {
    /// Gives back `owner`'s write lock of each of `keys` (which one call may name), announced
    /// as `announce` says; `true` when every one was still ours.
    async fn release_keys(
        &self,
        keys: &[&LockKey],
        owner: &str,
        announce: Option<Announce>,
    ) -> Result<bool, LockError> {
        let released: usize = self
            .invoke(
                "release",
                multi::release_call(keys.iter().copied(), owner, announce),
            )
            .await?;
        Ok(released == keys.len())
    }

    /// One call per slot, all slots at once.
    async fn release_per_slot(
        &self,
        keys: &[&LockKey],
        owner: &str,
        announce: Option<Announce>,
    ) -> Result<bool, LockError> {
        let mut by_slot: HashMap<Slot, Vec<&LockKey>> = HashMap::new();
        for &key in keys {
            by_slot
                .entry(Slot::for_key(&key.lock))
                .or_default()
                .push(key);
        }
        let calls = by_slot
            .into_values()
            .map(|slot_keys| async move { self.release_keys(&slot_keys, owner, announce).await });
        let mut all = true;
        for outcome in futures_util::future::join_all(calls).await {
            all &= outcome?;
        }
        Ok(all)
    }

    /// Releases `owner`'s grant (or seat) at `key`, the release announced when `announced`;
    /// `true` when it was still ours. Unannounced, it is a Redlock try's give-back on a master
    /// where the try fell short of a quorum (`redlock.rs`, `Undo`): the lock was free there only
    /// for that try, so no waiter was kept out of a lock it could take now (except in a split
    /// between waiters, which their backoff spreads). Announced, that give-back woke the waiters
    /// of the client giving it back, its own request among them: while a minority of masters
    /// held the lock for a lease, that request tried again after each give-back, a try every
    /// millisecond.
    pub(crate) async fn give_back(
        &self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
        announced: bool,
    ) -> Result<bool, LockError> {
        let announce = announced.then_some(T::ANNOUNCE);
        let released: i64 = self
            .invoke("release", holding.release_call(key, owner, announce))
            .await?;
        Ok(released == 1)
    }

    /// [`give_back`](Self::give_back) for `owner`'s write lock of each of `keys`; `true` when
    /// every one was still ours.
    pub(crate) async fn give_back_all(
        &self,
        keys: &[&LockKey],
        owner: &str,
        announced: bool,
    ) -> Result<bool, LockError> {
        let announce = announced.then_some(T::ANNOUNCE);
        if T::ROUTES_BY_SLOT {
            self.release_per_slot(keys, owner, announce).await
        } else {
            self.release_keys(keys, owner, announce).await
        }
    }
}
