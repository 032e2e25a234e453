//! A read of some locks' directories (`layout.rs`): the range gets one transaction sends, at
//! one revision, and the answers turned into each lock's [`Directory`] — its bookkeeping and
//! its grants' keys — refusing a key the store does not write as not a lock's. Sent alone by
//! an operation's read, or as the else branch of a blind first try (`transaction.rs`,
//! `FirstTry::Blind`), which then needs no read of its own. Neighbours: `transaction.rs` runs
//! the twin on what was read; `directory.rs` maps a directory to the twin's entry.

use std::collections::HashMap;
use std::time::Instant;

use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};

use super::directory::{Directory, HolderKey};
use super::errors::etcd_error;
use super::{layout, EtcdStore};
use crate::error::{BackendErrorKind, LockError};

/// What one read found: the keys' directories, at one revision.
pub(super) struct Loaded {
    pub(super) revision: i64,
    pub(super) keys: HashMap<String, Directory>,
}

impl EtcdStore {
    /// Reads the directories of `locks` in one transaction (one revision).
    pub(super) async fn read(
        &self,
        locks: &[String],
        deadline: Instant,
    ) -> Result<Loaded, LockError> {
        let ops = read_ops(locks);
        let response = self
            .shared
            .call("read", deadline, |mut client| {
                let txn = Txn::new().and_then(ops.clone());
                async move { client.txn(txn).await }
            })
            .await?;
        let revision = response.header().map_or(0, |header| header.revision());
        loaded_from(locks, revision, response.op_responses())
    }
}

/// The gets of the directories of `locks`, in their order: what a read sends, and what a
/// blind try brings back when it finds them not empty.
pub(super) fn read_ops(locks: &[String]) -> Vec<TxnOp> {
    locks
        .iter()
        .map(|lock| {
            let directory = layout::directory(lock);
            let end = layout::range_end(&directory);
            TxnOp::get(directory, Some(GetOptions::new().with_range(end)))
        })
        .collect()
}

/// The directories of `locks` from the answers to [`read_ops`], read at `revision`.
pub(super) fn loaded_from(
    locks: &[String],
    revision: i64,
    responses: Vec<TxnOpResponse>,
) -> Result<Loaded, LockError> {
    let mut keys = HashMap::new();
    for (lock, op) in locks.iter().zip(responses) {
        let TxnOpResponse::Get(range) = op else {
            continue;
        };
        let mut directory = Directory::default();
        for kv in range.kvs() {
            let key = String::from_utf8_lossy(kv.key());
            match layout::parse(&key) {
                Some((_, layout::Part::State)) => {
                    let json = serde_json::from_slice(kv.value())
                        .map_err(|err| not_a_lock(lock, &err.to_string()))?;
                    directory.state = Some((kv.mod_revision(), json));
                }
                Some((_, layout::Part::Holder(side, name))) => {
                    let value = std::str::from_utf8(kv.value()).unwrap_or("");
                    let mut fields = value.split(' ');
                    let ttl = fields.next().and_then(|ttl| ttl.parse().ok());
                    // A permit's value: its lease, the semaphore's count, its owner.
                    let (permits, owner) = match side {
                        'p' => (
                            fields.next().and_then(|count| count.parse().ok()),
                            fields.next().filter(|_| layout::seat_of(&key).is_some()),
                        ),
                        _ => (Some(0), Some(name)),
                    };
                    let (Some(ttl), Some(permits), Some(owner), None) =
                        (ttl, permits, owner, fields.next())
                    else {
                        return Err(not_a_lock(lock, "a grant's key of another shape"));
                    };
                    let holder = HolderKey {
                        side,
                        path: key.to_string(),
                        create_revision: kv.create_revision(),
                        lease: kv.lease(),
                        ttl,
                        permits,
                    };
                    if directory.holders.insert(owner.to_owned(), holder).is_some() {
                        return Err(not_a_lock(lock, "one owner holding it twice"));
                    }
                }
                None => return Err(not_a_lock(lock, "a key the store does not write")),
            }
        }
        keys.insert(lock.clone(), directory);
    }
    Ok(Loaded { revision, keys })
}

/// A key of the lock's directory that the store did not write.
pub(super) fn not_a_lock(lock: &str, why: &str) -> LockError {
    etcd_error(
        "read",
        BackendErrorKind::Server,
        format!(
            "the etcd keys of `{lock}` are not a distlock lock ({why}); they were left \
             untouched"
        ),
    )
    .into()
}
