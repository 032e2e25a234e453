//! An operation on one key's lock that is not a try — the operator's view and forced release
//! (`operator_scripts.rs`), an election's leader record (`election_scripts.rs`) — as a value
//! every store runs the same way ([`KeyOperation`]): a Redis store sends its script and reads
//! the reply, the in-process store runs its twin on the key's state under its mutex, and
//! Redlock runs it on every master and makes one answer of theirs by the operation's rule
//! ([`KeyOperation::agree`]). So an operation is written once, beside its scripts, and no
//! store changes for a new one. Neighbours: the store contract (`store/mod.rs`,
//! `Store::run`) runs these; the kinds' tries (`kind/`) are run by the stores' own
//! methods, as a try's quorum, undo and fencing are each store's.

use std::time::Instant;

use redis::FromRedisValue;

use crate::error::LockError;
use crate::kind::twins::State;
use crate::kind::Tokens;
use crate::protocol::{Announce, LockKey};
use crate::script::ScriptCall;

/// One operation on a key's lock: its script, its in-process twin and, for Redlock, how the
/// masters' answers make one.
pub(crate) trait KeyOperation: Sync {
    /// The operation's name in errors and logs.
    const NAME: &'static str;

    /// A write that the failover guard covers as it covers a grant (sent with `WAIT` when
    /// [`wrote`](Self::wrote) says its reply wrote), so that a failover cannot lose it.
    const GUARDED: bool = false;

    /// What its script replies.
    type Reply: FromRedisValue + Send;

    /// What it answers.
    type Output: Send;

    /// The key whose lock it is on.
    fn key(&self) -> &LockKey;

    /// Its script call, on a store that announces releases by `announce` and takes fencing
    /// tokens as `tokens` says.
    fn call(&self, announce: Announce, tokens: Tokens) -> ScriptCall;

    /// Whether a reply wrote, so that the failover guard waits for it ([`GUARDED`](Self::GUARDED)).
    fn wrote(reply: &Self::Reply) -> bool {
        let _ = reply;
        false
    }

    /// Reads its script's reply; `replicated` says whether enough replicas acknowledged it
    /// (always `true` outside the failover guard).
    fn read(&self, reply: Self::Reply, replicated: bool) -> Result<Self::Output, LockError>;

    /// Its in-process twin, on the store's state at `now`.
    fn twin(&self, state: &mut State, now: Instant) -> Self::Output;

    /// One answer from every Redlock master's (`answers`, one per master, in order; `quorum`
    /// masters make a majority).
    fn agree(
        &self,
        answers: Vec<Result<Self::Output, LockError>>,
        quorum: usize,
    ) -> Result<Self::Output, NoAgreement>;
}

/// Why the Redlock masters' answers make no answer.
pub(crate) enum NoAgreement {
    /// A master refused for good (a key that holds no lock, a counter of another
    /// application's): its error is the answer.
    Refused(LockError),
    /// Too few masters answered: `answered` did, `granted` of them did what was asked.
    TooFew { answered: usize, granted: usize },
}

impl From<LockError> for NoAgreement {
    fn from(err: LockError) -> Self {
        NoAgreement::Refused(err)
    }
}

/// The answers of the masters that answered, if they are at least `quorum`; a master's final
/// refusal (a key that holds no lock) is the answer, whatever the others said.
pub(crate) fn quorum_answered<T>(
    answers: Vec<Result<T, LockError>>,
    quorum: usize,
) -> Result<Vec<T>, NoAgreement> {
    let mut said = Vec::with_capacity(answers.len());
    for answer in answers {
        match answer {
            Ok(answer) => said.push(answer),
            Err(err) if err.is_final_refusal() => return Err(NoAgreement::Refused(err)),
            Err(_) => {}
        }
    }
    if said.len() < quorum {
        return Err(NoAgreement::TooFew {
            answered: said.len(),
            granted: 0,
        });
    }
    Ok(said)
}
