//! The leader record of an election: what a leader writes beside the lock it leads by (its
//! epoch, its owner token, the value it publishes) and the calls that write and delete it —
//! `scripts/election/{proclaim,withdraw}.lua`, and their in-process twins in the memory store.
//! The operator's inspect script reads the record together with the lock's holder
//! (`operator_scripts.rs`), and a record counts only while its owner holds the lock
//! ([`LeaderInfo::from_view`](super::LeaderInfo::from_view)): a record left by a leader that crashed, or written by a leader
//! whose lease then ran out, is never shown as the leader. Neighbours: `election/mod.rs` (the
//! public API), the stores in `store/` (which run these calls; Redlock on a majority).

use std::sync::LazyLock;

use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::kind::{lock_keys, Tokens};
use crate::protocol::{Announce, LockKey, RawRecord};
use crate::script::{LuaScript, ScriptCall};

static PROCLAIM: LazyLock<LuaScript> =
    LazyLock::new(|| crate::kind::script(include_str!("../scripts/election/proclaim.lua")));
static WITHDRAW: LazyLock<LuaScript> =
    LazyLock::new(|| crate::kind::script(include_str!("../scripts/election/withdraw.lua")));

/// The call that writes `record` beside `key`'s lock if its owner holds the lock.
pub(crate) fn proclaim_call(
    key: &LockKey,
    record: &RawRecord,
    announce: Announce,
    tokens: Tokens,
) -> ScriptCall {
    let mut call = PROCLAIM.prepare_invoke();
    lock_keys(&mut call, key, tokens);
    call.arg(&record.owner)
        .arg(key.leader())
        .arg(record.epoch)
        .arg(record.value.as_deref().unwrap_or_default())
        .arg(if record.value.is_some() { "1" } else { "0" })
        .arg(announce.command())
        .arg(key.channel());
    call
}

/// The call that deletes `key`'s record if `owner` wrote it.
pub(crate) fn withdraw_call(key: &LockKey, owner: &str, tokens: Tokens) -> ScriptCall {
    let mut call = WITHDRAW.prepare_invoke();
    lock_keys(&mut call, key, tokens);
    call.arg(owner).arg(key.leader());
    call
}

/// Reads the proclaim script's reply: whether the record was written; a record key on the
/// other node of a slot migration is a transient error (the campaign tries again).
pub(crate) fn read_proclaim_reply(key: &LockKey, written: i64) -> Result<bool, LockError> {
    match written {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(BackendError::new(
            "proclaim",
            BackendErrorKind::Unavailable,
            format!(
                "the leader record of election `{}` is on a Cluster node its slot is migrating \
                 to; try again",
                key.name
            ),
        )
        .into()),
    }
}
