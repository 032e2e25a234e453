//! A try as Redlock's quorum sees it (`redlock.rs`): one key ([`Try`]) or several at once
//! ([`MultiTry`]) behind one [`QuorumTry`], so that one tally (`tally.rs`) serves both; how a
//! try that did not stand is undone on the masters ([`Undo`]); what several masters' refusals
//! of a multi-key try add up to ([`HeldKeys`]); and which token a grant takes
//! ([`quorum_token`]). Neighbours: `answers.rs` (what each master said), `Refusals` (what one
//! key's refusals add up to).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::answers::MasterAnswer;
use super::refusals::Refusals;
use super::RedlockStore;
use crate::error::LockError;
use crate::kind::multi::{MultiReply, MultiTry};
use crate::kind::{TokenRule, Try};
use crate::protocol::{AcquireReply, FencingToken, LockKey, TooLow};
use crate::store::redis::NodeStore;
use crate::store::Store;

/// Where a try that did not stand is undone: on each master that granted it, failed in a way
/// that leaves it unknown, or was not awaited. The undo waits for the masters that answered
/// the try; one that was not awaited gets the undo behind the try and is not waited for.
///
/// A try that fell short of a quorum gives back without announcing a release
/// ([`RedisStore::give_back`](crate::store::redis::RedisStore::give_back), `announced` false): the lock was free on
/// those masters only for it. One that a quorum granted and that does not stand anyway (too
/// late, or refused by a master for good) kept everyone else out: its give-back is announced,
/// as a release is.
pub(super) struct Undo {
    /// Per master: (undo it, wait for the undo's answer).
    masters: Vec<(bool, bool)>,
    /// The give-back is announced to waiters.
    announced: bool,
}

impl Undo {
    pub(super) fn of<Q: QuorumTry>(answers: &[MasterAnswer<Q::Reply>], announced: bool) -> Self {
        let masters = answers
            .iter()
            .map(|answer| match answer {
                MasterAnswer::Said(reply) => (Q::granted(reply).is_some(), true),
                MasterAnswer::Failed(err) => (crate::store::is_ambiguous(err), true),
                MasterAnswer::NotAwaited => (true, false),
            })
            .collect();
        Self { masters, announced }
    }

    pub(super) fn any(&self) -> bool {
        self.masters.iter().any(|&(undo, _)| undo)
    }

    fn needed(&self, master: usize) -> bool {
        self.masters.get(master).is_some_and(|&(undo, _)| undo)
    }

    /// Every master whose undo is waited for has answered it (or failed to).
    fn answered<T>(&self, answers: &[MasterAnswer<T>]) -> bool {
        answers
            .iter()
            .zip(&self.masters)
            .all(|(answer, &(undo, wait))| {
                !(undo && wait && matches!(answer, MasterAnswer::NotAwaited))
            })
    }
}

/// A try as Redlock sends it to every master: one key ([`Try`]) or several at once
/// ([`MultiTry`]). The quorum's steps ([`RedlockStore::tally`]) are the same for both; this
/// is what they ask of either.
pub(super) trait QuorumTry: Sync {
    /// What one master answers.
    type Reply: Send + Sync;
    /// The refusals among the answers, added up into the reply of a try that fell short.
    type Refusals: Default;

    fn lease(&self) -> Duration;

    /// When the request's wait ends ([`Try::deadline`]).
    fn deadline(&self) -> Option<Instant>;

    /// The keys, in the order of a grant's tokens.
    fn keys(&self) -> &[LockKey];

    /// How many masters must grant.
    fn quorum(&self, redlock: &RedlockStore) -> usize;

    /// Whether the masters take a token the tally proposes (a fenced write grant's,
    /// [`TokenRule::Fresh`]); the other grants' tokens are the masters' own.
    fn proposes(&self) -> bool;

    /// The same try, proposing `token` to every master.
    fn proposing(&self, token: Option<FencingToken>) -> Self;

    /// A master's refusal of the proposed token.
    fn too_low(reply: &Self::Reply) -> Option<TooLow>;

    /// The try on one master.
    fn send<'a>(
        &'a self,
        master: &'a NodeStore,
    ) -> impl Future<Output = Result<Self::Reply, LockError>> + Send + 'a;

    /// Gives back whatever the try may have taken on the masters in `undo`, waiting for the
    /// answers of those that answered the try (best effort: a master that does not answer
    /// lets the lease run out); a master whose answer to the try was not awaited gets the
    /// undo after the try on its connection, and is not waited for again ([`Undo`]). `true`
    /// when every undo sent was answered: none is left to run later, after a next round of
    /// the same owner (which a late undo would give back).
    fn undo<'a>(
        &'a self,
        redlock: &'a RedlockStore,
        timeout: Duration,
        undo: &'a Undo,
    ) -> impl Future<Output = bool> + Send + 'a;

    /// A grant's token per key; `None` when the answer is a refusal.
    fn granted(reply: &Self::Reply) -> Option<&[Option<FencingToken>]>;

    /// Counts one master's refusal.
    fn count(refusals: &mut Self::Refusals, reply: &Self::Reply);

    /// The grant, with the token `token_of` key `i`.
    fn acquired(&self, token_of: impl Fn(usize) -> Option<FencingToken>) -> Self::Reply;

    /// The reply to a try that `granted` masters granted, `quorum` being needed.
    fn refused(refusals: Self::Refusals, granted: usize, quorum: usize) -> Self::Reply;
}

impl QuorumTry for Try<'_> {
    type Reply = AcquireReply;
    type Refusals = Refusals;

    fn lease(&self) -> Duration {
        self.lease
    }

    fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    fn keys(&self) -> &[LockKey] {
        std::slice::from_ref(self.key)
    }

    /// A majority, and more for a semaphore (the kind's `quorum`).
    fn quorum(&self, redlock: &RedlockStore) -> usize {
        self.kind.quorum(redlock.masters.len())
    }

    fn proposes(&self) -> bool {
        self.fencing && self.kind.token_rule() == TokenRule::Fresh
    }

    fn proposing(&self, proposed: Option<FencingToken>) -> Self {
        Self { proposed, ..*self }
    }

    fn too_low(reply: &AcquireReply) -> Option<TooLow> {
        match *reply {
            AcquireReply::TooLow(too_low) => Some(too_low),
            _ => None,
        }
    }

    fn send<'a>(
        &'a self,
        master: &'a NodeStore,
    ) -> impl Future<Output = Result<AcquireReply, LockError>> + Send + 'a {
        master.acquire(self)
    }

    async fn undo(&self, redlock: &RedlockStore, timeout: Duration, undo: &Undo) -> bool {
        let holding = self.grant();
        // Owned: an undo not waited for finishes in the background.
        let (key, owner) = (Arc::new(self.key.clone()), Arc::<str>::from(self.owner));
        let (_, out) = redlock
            .until_decided(
                timeout,
                |i, master| {
                    let (needed, announced) = (undo.needed(i), undo.announced);
                    let (master, key, owner) = (master.clone(), key.clone(), owner.clone());
                    async move {
                        if needed {
                            master.give_back(holding, &key, &owner, announced).await
                        } else {
                            Ok(false)
                        }
                    }
                },
                |answers| undo.answered(answers),
            )
            .await;
        let settled = out.iter().all(Option::is_none);
        redlock.finish_in_background(out);
        settled
    }

    fn granted(reply: &AcquireReply) -> Option<&[Option<FencingToken>]> {
        match reply {
            AcquireReply::Acquired(token) => Some(std::slice::from_ref(token)),
            _ => None,
        }
    }

    fn count(refusals: &mut Refusals, reply: &AcquireReply) {
        refusals.count(reply);
    }

    fn acquired(&self, token_of: impl Fn(usize) -> Option<FencingToken>) -> AcquireReply {
        AcquireReply::Acquired(token_of(0))
    }

    /// Held, or a split between waiters.
    fn refused(refusals: Refusals, granted: usize, quorum: usize) -> AcquireReply {
        refusals.reply(granted, quorum)
    }
}

impl QuorumTry for MultiTry<'_> {
    type Reply = MultiReply;
    type Refusals = HeldKeys;

    fn lease(&self) -> Duration {
        self.lease
    }

    fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    fn keys(&self) -> &[LockKey] {
        self.keys
    }

    fn quorum(&self, redlock: &RedlockStore) -> usize {
        redlock.quorum()
    }

    /// Every key is a write lock.
    fn proposes(&self) -> bool {
        self.fencing
    }

    fn proposing(&self, proposed: Option<FencingToken>) -> Self {
        Self { proposed, ..*self }
    }

    fn too_low(reply: &MultiReply) -> Option<TooLow> {
        match *reply {
            MultiReply::TooLow(too_low) => Some(too_low),
            _ => None,
        }
    }

    fn send<'a>(
        &'a self,
        master: &'a NodeStore,
    ) -> impl Future<Output = Result<MultiReply, LockError>> + Send + 'a {
        master.acquire_all(self)
    }

    async fn undo(&self, redlock: &RedlockStore, timeout: Duration, undo: &Undo) -> bool {
        // Owned: an undo not waited for finishes in the background.
        let (keys, owner) = (Arc::new(self.keys.to_vec()), Arc::<str>::from(self.owner));
        let (_, out) = redlock
            .until_decided(
                timeout,
                |i, master| {
                    let (needed, announced) = (undo.needed(i), undo.announced);
                    let (master, keys, owner) = (master.clone(), keys.clone(), owner.clone());
                    async move {
                        let keys: Vec<&LockKey> = keys.iter().collect();
                        if needed {
                            master.give_back_all(&keys, &owner, announced).await
                        } else {
                            Ok(false)
                        }
                    }
                },
                |answers| undo.answered(answers),
            )
            .await;
        let settled = out.iter().all(Option::is_none);
        redlock.finish_in_background(out);
        settled
    }

    fn granted(reply: &MultiReply) -> Option<&[Option<FencingToken>]> {
        match reply {
            MultiReply::Acquired(tokens) => Some(tokens),
            MultiReply::Held(..) | MultiReply::TooLow(_) => None,
        }
    }

    fn count(refusals: &mut HeldKeys, reply: &MultiReply) {
        refusals.count(reply);
    }

    fn acquired(&self, token_of: impl Fn(usize) -> Option<FencingToken>) -> MultiReply {
        MultiReply::Acquired((0..self.keys.len()).map(token_of).collect())
    }

    fn refused(refusals: HeldKeys, _: usize, _: usize) -> MultiReply {
        let (remaining, at) = refusals.0.unwrap_or((None, 0));
        MultiReply::Held(remaining, at)
    }
}

/// The refusals of a multi-key try by several masters: the remaining lease of a held key (the
/// shortest that two known ones give) and the position of the first answer's held key.
#[derive(Default)]
pub(super) struct HeldKeys(Option<(Option<Duration>, usize)>);

impl HeldKeys {
    fn count(&mut self, reply: &MultiReply) {
        let (remaining, at) = match *reply {
            MultiReply::Held(remaining, at) => (remaining, at),
            // Free, but for a token too low: try again at once.
            MultiReply::TooLow(_) => (Some(Duration::ZERO), 0),
            MultiReply::Acquired(_) => return,
        };
        self.0 = Some(match self.0 {
            None => (remaining, at),
            Some((known, first)) => (known.min(remaining).or(known), first),
        });
    }
}

/// The token key `i` of a grant takes: the largest of those its quorum handed out (`None`
/// without fencing) — a write grant's proposal, which every master of its quorum took.
pub(super) fn quorum_token<Q: QuorumTry>(
    answers: &[MasterAnswer<Q::Reply>],
    i: usize,
) -> Option<FencingToken> {
    answers
        .iter()
        .filter_map(|answer| match answer {
            MasterAnswer::Said(reply) => Q::granted(reply),
            MasterAnswer::Failed(_) | MasterAnswer::NotAwaited => None,
        })
        .filter_map(|tokens| tokens.get(i).copied().flatten())
        .max()
}
