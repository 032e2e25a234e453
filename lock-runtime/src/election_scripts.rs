//! The leader record of an election: what a leader writes beside the lock it leads by (its
//! epoch, its owner token, the value it publishes and that value's revision — 0 from the
//! campaign, greater from each `Leadership::proclaim`) and the calls that write and delete it —
//! `scripts/election/{proclaim,withdraw}.lua`, and their in-process twins — as two
//! [`KeyOperation`]s, [`Proclaim`] and [`Withdraw`], that every store runs.
//! The operator's inspect script reads the record together with the lock's holder
//! (`operator_scripts.rs`), and a record counts only while its owner holds the lock
//! ([`LeaderInfo::from_view`](super::LeaderInfo::from_view)): a record left by a leader that crashed, or written by a leader
//! whose lease then ran out, is never shown as the leader. Neighbours: `election/mod.rs` (the
//! public API), the stores in `store/` (which run these operations; Redlock on a majority).

use std::sync::LazyLock;
use std::time::Instant;

use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::key_operation::{KeyOperation, NoAgreement};
use crate::kind::twins::State;
use crate::kind::{lock_keys, Tokens};
use crate::protocol::{Announce, LockKey, RawRecord};
use crate::script::{LuaScript, ScriptCall};

static PROCLAIM: LazyLock<LuaScript> =
    LazyLock::new(|| crate::kind::script(include_str!("../scripts/election/proclaim.lua")));
static WITHDRAW: LazyLock<LuaScript> =
    LazyLock::new(|| crate::kind::script(include_str!("../scripts/election/withdraw.lua")));

/// The call that writes `record` beside `key`'s lock if its owner holds the lock.
fn proclaim_call(
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
        .arg(key.channel())
        .arg(record.revision);
    call
}

/// The call that deletes `key`'s record if `owner` wrote it.
fn withdraw_call(key: &LockKey, owner: &str, tokens: Tokens) -> ScriptCall {
    let mut call = WITHDRAW.prepare_invoke();
    lock_keys(&mut call, key, tokens);
    call.arg(owner).arg(key.leader());
    call
}

/// Reads the proclaim script's reply: whether the record stands (written, or already this
/// leader's of a later revision: two proclaims that crossed); a record key on the other node
/// of a slot migration is a transient error (the campaign tries again).
fn read_proclaim_reply(key: &LockKey, written: i64) -> Result<bool, LockError> {
    match written {
        1 | 2 => Ok(true),
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

/// Writes an election's leader record beside its lock and announces it, if the record's owner
/// holds the lock: `false` when it does not (any more), and nothing is written. A record of
/// the same owner and a revision not below this one's is kept (`true`: a later value of this
/// leader's stands). Under the failover guard, as a grant is: a record a failover lost would
/// leave the term without a leader to read. On Redlock it stands when a majority wrote it (the
/// masters where the leader holds the lock). The key, then the record.
pub(crate) struct Proclaim<'a>(pub(crate) &'a LockKey, pub(crate) &'a RawRecord);

impl KeyOperation for Proclaim<'_> {
    const NAME: &'static str = "proclaim";
    const GUARDED: bool = true;
    type Reply = i64;
    type Output = bool;

    fn key(&self) -> &LockKey {
        self.0
    }

    fn call(&self, announce: Announce, tokens: Tokens) -> ScriptCall {
        proclaim_call(self.0, self.1, announce, tokens)
    }

    fn wrote(&written: &i64) -> bool {
        written == 1
    }

    fn read(&self, written: i64, replicated: bool) -> Result<bool, LockError> {
        if written == 1 && !replicated {
            return Err(BackendError::new(
                "proclaim",
                BackendErrorKind::Unreplicated,
                "too few replicas acknowledged the leader record within the failover guard's \
                 timeout",
            )
            .into());
        }
        read_proclaim_reply(self.0, written)
    }

    /// Keeps the record if its owner is the lock's writer and it is not older than the
    /// owner's record there (no announcement: the in-process store has no channels, its
    /// observers read at a period).
    fn twin(&self, state: &mut State, now: Instant) -> bool {
        let Proclaim(key, record) = *self;
        let holds = state.with_entry(&key.lock, |entry| {
            entry.purge(now);
            entry
                .writer
                .as_ref()
                .is_some_and(|(owner, _)| *owner == record.owner)
        });
        let superseded = state
            .records
            .get(&key.lock)
            .is_some_and(|kept| kept.owner == record.owner && kept.revision >= record.revision);
        if holds && !superseded {
            state.records.insert(key.lock.clone(), record.clone());
        }
        holds
    }

    /// Written when a majority wrote it; not ours only when the masters that said so leave
    /// no quorum that could be (a master that did not answer may still hold the lock for us).
    fn agree(
        &self,
        answers: Vec<Result<bool, LockError>>,
        quorum: usize,
    ) -> Result<bool, NoAgreement> {
        let written = answers.iter().filter(|a| matches!(a, Ok(true))).count();
        let not_ours = answers.iter().filter(|a| matches!(a, Ok(false))).count();
        if written >= quorum {
            return Ok(true);
        }
        if answers.len() - not_ours < quorum {
            return Ok(false);
        }
        if let Some(Err(err)) = answers
            .into_iter()
            .find(|answer| matches!(answer, Err(err) if err.is_final_refusal()))
        {
            return Err(NoAgreement::Refused(err));
        }
        Err(NoAgreement::TooFew {
            answered: written + not_ours,
            granted: written,
        })
    }
}

/// Deletes an election's leader record if `owner` wrote it; on Redlock, on every master where
/// it did (`true` when any did). The key, then the owner.
pub(crate) struct Withdraw<'a>(pub(crate) &'a LockKey, pub(crate) &'a str);

impl KeyOperation for Withdraw<'_> {
    const NAME: &'static str = "withdraw";
    type Reply = i64;
    type Output = bool;

    fn key(&self) -> &LockKey {
        self.0
    }

    fn call(&self, _: Announce, tokens: Tokens) -> ScriptCall {
        withdraw_call(self.0, self.1, tokens)
    }

    fn read(&self, deleted: i64, _: bool) -> Result<bool, LockError> {
        Ok(deleted == 1)
    }

    fn twin(&self, state: &mut State, _: Instant) -> bool {
        let own = state
            .records
            .get(&self.0.lock)
            .is_some_and(|record| record.owner == self.1);
        if own {
            state.records.remove(&self.0.lock);
        }
        own
    }

    fn agree(&self, answers: Vec<Result<bool, LockError>>, _: usize) -> Result<bool, NoAgreement> {
        Ok(answers.iter().any(|answer| matches!(answer, Ok(true))))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::kind::TwinEntry;

    fn record(owner: &str, value: &str, revision: u64) -> RawRecord {
        RawRecord {
            epoch: 7,
            owner: owner.to_owned(),
            value: Some(value.as_bytes().to_vec()),
            revision,
        }
    }

    fn held_by(state: &mut State, key: &LockKey, owner: &str, now: Instant) {
        let entry = TwinEntry {
            writer: Some((owner.to_owned(), now + Duration::from_secs(30))),
            ..TwinEntry::default()
        };
        state.locks.insert(key.lock.clone(), entry);
    }

    #[test]
    fn the_twin_keeps_a_leaders_latest_value_and_only_its_holders() {
        let key = LockKey::new("distlock:", "leader".to_owned()).expect("key");
        let (mut state, now) = (State::default(), Instant::now());
        held_by(&mut state, &key, "a", now);
        let kept = |state: &State| state.records.get(&key.lock).cloned();

        assert!(Proclaim(&key, &record("a", "v0", 0)).twin(&mut state, now));
        assert!(Proclaim(&key, &record("a", "v2", 2)).twin(&mut state, now));
        assert!(
            Proclaim(&key, &record("a", "v1", 1)).twin(&mut state, now),
            "a later value of its own stands: not a lost leadership"
        );
        assert_eq!(kept(&state), Some(record("a", "v2", 2)), "never older");
        assert!(!Proclaim(&key, &record("b", "late", 9)).twin(&mut state, now));
        assert_eq!(kept(&state), Some(record("a", "v2", 2)), "not the holder's");

        // The next leader's campaign (revision 0) replaces the last leader's latest.
        held_by(&mut state, &key, "b", now);
        assert!(Proclaim(&key, &record("b", "b0", 0)).twin(&mut state, now));
        assert_eq!(kept(&state), Some(record("b", "b0", 0)));
    }
}
