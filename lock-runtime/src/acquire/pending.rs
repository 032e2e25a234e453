//! A try in flight, from the acquire loop's side (`acquire/mod.rs`): the grant it may have made
//! until its reply settles it, given back in the background (`release.rs`) if the reply is
//! ambiguous, comes too late, or never comes because the request was cancelled; and the owner
//! token every try gets afresh.

use std::sync::Arc;

use crate::inspect::HolderTag;
use crate::kind::{Holding, Kind};
use crate::protocol::LockKey;
use crate::release::Releaser;

/// A fresh owner token: a random v4 UUID from the thread-local generator (unique, and no
/// system call per try) with the holder record (`inspect.rs`).
pub(crate) fn new_owner(holder: &HolderTag) -> String {
    let uuid = uuid::Builder::from_random_bytes(fastrand::u128(..).to_le_bytes()).into_uuid();
    holder.owner(uuid.simple().encode_lower(&mut uuid::Uuid::encode_buffer()))
}

/// A try that may have taken the lock until its reply says otherwise. Dropped unsettled
/// (an ambiguous error, a grant that came too late, or the acquire future cancelled
/// mid-request), it deletes the possible grant in the background: of its one key, or of every
/// key of a multi-key try.
pub(crate) struct PendingGrant<'a> {
    pub(crate) releaser: &'a Arc<Releaser>,
    pub(crate) kind: Kind,
    pub(crate) keys: &'a [LockKey],
    pub(crate) owner: String,
    /// When a grant made by this try before its clean-up runs expires at the latest.
    pub(crate) expires: std::time::Instant,
    pub(crate) settled: bool,
}

impl PendingGrant<'_> {
    /// The try's outcome is known: nothing to clean up. Returns its owner token.
    pub(crate) fn settle(mut self) -> String {
        self.settled = true;
        std::mem::take(&mut self.owner)
    }
}

impl Drop for PendingGrant<'_> {
    fn drop(&mut self) {
        if !self.settled {
            for key in self.keys {
                // Only the grant: a fair request leaves the queue through its `FairWait`.
                self.releaser.clean_up(
                    Holding::Grant(self.kind),
                    key.clone(),
                    self.owner.clone(),
                    self.expires,
                );
            }
        }
    }
}
