//! Redlock's one tally, the same for one key and for several (`redlock.rs`): a try on every
//! master, granted when enough granted it within its validity, else undone and answered with
//! what the refusals add up to; and the rare second round with a higher token after masters
//! refused the first as too low, within the request's wait ([`Bounds`]). Neighbours:
//! `quorum.rs` (what a try is to the tally, its undo), `fencing.rs` (the token proposed),
//! `masters.rs` (the connects before a try).

use std::time::{Duration, Instant};

use super::answers::{not_awaited, MasterAnswer};
use super::quorum::{quorum_token, QuorumTry, Undo};
use super::RedlockStore;
use crate::clock::drift;
use crate::error::{BackendErrorKind, LockError};

/// How long a try may keep its caller: the wait for connects before it no longer than until
/// the request's deadline ([`RedlockStore::warm_up`]), each round and each undo at most the
/// node timeout, and nothing after the first round waited for past one node timeout after the
/// deadline — so a try sent before its deadline ends within one node timeout after it (or
/// after its first round, a try sent at its deadline: `wait(0)`), as a try on the other
/// stores ends within one response timeout.
#[derive(Clone, Copy)]
pub(super) struct Bounds {
    /// The node timeout for the try's lease ([`RedlockStore::timeout_for`]).
    timeout: Duration,
    /// When the request's wait ends ([`Try::deadline`](crate::kind::Try::deadline); `None`: not within reach).
    deadline: Option<Instant>,
}

impl Bounds {
    /// Whether the request's wait lasts.
    fn wait_lasts(&self) -> bool {
        self.deadline
            .is_none_or(|deadline| Instant::now() < deadline)
    }

    /// How long a wait after the first round (an undo, the second round) may take: the node
    /// timeout, and no longer than until one node timeout past the deadline; zero once that
    /// has passed.
    pub(super) fn left(&self) -> Duration {
        match self
            .deadline
            .and_then(|deadline| deadline.checked_add(self.timeout))
        {
            Some(end) => end
                .saturating_duration_since(Instant::now())
                .min(self.timeout),
            None => self.timeout,
        }
    }
}

/// How one round of a try ended.
pub(super) enum Round<R> {
    /// Granted, or refused with this reply.
    Decided(R),
    /// Masters refused the proposed token as too low, and the others granted it, or enough
    /// would have without them; undone, and refused with this reply. `hint`: the largest
    /// token they would take now.
    TooLow { hint: u64, refused: R },
}

/// The quorum's steps, the same for one key and for several.
impl RedlockStore {
    /// One try on every master: granted when enough masters granted it within its validity,
    /// else undone everywhere and answered with what the refusals add up to, or the error
    /// that explains them. A fenced write try proposes its token ([`propose`](Self::propose));
    /// one that masters refused as too low, when the others granted it or would have made a
    /// quorum with them, is undone and tried once more at once with their largest hint (the
    /// module's "Fencing tokens").
    ///
    /// The second round and the undo before it wait at most until one node timeout past the
    /// request's deadline ([`Bounds`]). A try that a quorum granted in the first round is
    /// sent again only while the wait lasts (else its grant stands, with the first round's
    /// token); one that fell short, only while there is time left for it. One that cannot be
    /// sent again, or whose second round ran out of that time, is refused as held for no
    /// time: the acquire loop tries again at once or, past its deadline, times out.
    pub(super) async fn tally<Q: QuorumTry>(&self, attempt: &Q) -> Result<Q::Reply, LockError> {
        let bounds = Bounds {
            timeout: self.timeout_for(attempt.lease()),
            deadline: attempt.deadline(),
        };
        self.warm_up(bounds.deadline).await;
        if let Some(refusal) = self
            .masters
            .iter()
            .find_map(|master| master.node().refusal())
        {
            // Replication defeats Redlock: refuse the deployment, not just the node.
            return Err(LockError::Config(format!(
                "a Redlock master is not a master: {refusal}"
            )));
        }
        let quorum = attempt.quorum(self);
        let first = attempt.proposing(attempt.proposes().then(|| self.propose(0)));
        let hint = match self.round(&first, quorum, bounds, true).await? {
            Round::Decided(reply) => return Ok(reply),
            // The time left ran out while the first round was undone.
            Round::TooLow { refused, .. } if bounds.left().is_zero() => return Ok(refused),
            Round::TooLow { hint, .. } => hint,
        };
        // The rare second round; should it fall short too, the acquire loop tries again.
        let again = attempt.proposing(Some(self.propose(hint)));
        match self.round(&again, quorum, bounds, false).await? {
            Round::Decided(reply) | Round::TooLow { refused: reply, .. } => Ok(reply),
        }
    }

    /// One round of a try: the try on every master, then the grant, or the undo and the
    /// refusal, or the error. A first round (`first`) whose token a master refused as too
    /// low is undone even when a quorum granted it, so that a grant's token is at least what
    /// every master that answered would take: the masters' counters keep together, and a
    /// master whose counter ran ahead costs one second round, not one on every later quorum
    /// it joins — unless the request's wait has ended ([`Bounds`]). The first round takes
    /// the node timeout; the undo and the second round at most what `bounds` leaves, and a
    /// second round cut short by that, too short for a quorum to answer, is a refusal.
    async fn round<Q: QuorumTry>(
        &self,
        attempt: &Q,
        quorum: usize,
        bounds: Bounds,
        first: bool,
    ) -> Result<Round<Q::Reply>, LockError> {
        let started = Instant::now();
        let timeout = if first { bounds.timeout } else { bounds.left() };
        // Decided as soon as enough masters granted, or so many refused that the rest cannot
        // make a quorum (or one refused for good); failures do not decide early, so the error
        // says how many answered. A master that answers late still runs the try, before the
        // release or undo sent to it afterwards, which also gives its late grant back
        // ([`until_decided`](Self::until_decided)).
        let refusals_decide = self.masters.len() - quorum;
        let (answers, _) = self
            .until_decided(
                timeout,
                |_, master| attempt.send(master),
                |answers| {
                    let (mut granted, mut refused) = (0, 0);
                    for answer in answers {
                        match answer {
                            MasterAnswer::Said(reply) if Q::granted(reply).is_some() => {
                                granted += 1
                            }
                            MasterAnswer::Said(_) => refused += 1,
                            MasterAnswer::Failed(err) if err.is_final_refusal() => return true,
                            _ => {}
                        }
                    }
                    granted >= quorum || refused > refusals_decide
                },
            )
            .await;
        let mut answered = 0;
        let mut granted = 0;
        let mut too_low = 0;
        let mut hint = 0;
        let mut refusals = Q::Refusals::default();
        for answer in &answers {
            if let MasterAnswer::Said(reply) = answer {
                answered += 1;
                match Q::granted(reply) {
                    Some(_) => granted += 1,
                    None => Q::count(&mut refusals, reply),
                }
                if let Some(refused) = Q::too_low(reply) {
                    too_low += 1;
                    hint = hint.max(refused.hint);
                }
            }
        }
        if too_low > 0 {
            self.learn(answers.iter().filter_map(|answer| match answer {
                MasterAnswer::Said(reply) => Q::too_low(reply),
                _ => None,
            }));
        }
        // A semaphore of another count in use, or a key that holds no lock, as any master
        // says: refused, not granted by the others nor waited for.
        let refused = answers
            .iter()
            .any(|answer| matches!(answer, MasterAnswer::Failed(err) if err.is_final_refusal()));
        let valid_until = started + attempt.lease() - drift(attempt.lease());
        // A second round is the only way to a grant when the first fell short, and only
        // keeps the counters together when it did not: sent then only while the wait lasts.
        let rerun = first
            && too_low > 0
            && granted + too_low >= quorum
            && if granted < quorum {
                !bounds.left().is_zero()
            } else {
                bounds.wait_lasts()
            };
        if !refused && !rerun && granted >= quorum && Instant::now() < valid_until {
            return Ok(Round::Decided(
                attempt.acquired(|i| quorum_token::<Q>(&answers, i)),
            ));
        }
        // Too few grants, too late, or a token to propose again: undo wherever a grant may be
        // (also where the answer got lost or was not awaited), then report. A quorum's grant
        // kept the others out: its give-back wakes them, unless this request tries again at
        // once.
        let undo = Undo::of::<Q>(&answers, granted >= quorum && !rerun);
        // A second round reuses the owner token: only once every undo of this one has been
        // answered, so that none can run after it and give its grant back. An undo cut short
        // by the request's end finishes in the background (its masters are asked as slow ones
        // until they answer).
        let settled = !undo.any() || attempt.undo(self, bounds.left(), &undo).await;
        let out = not_awaited(&answers);
        // Masters that did not answer within the round's time: in a round cut short by the
        // request's end, for want of time rather than a failure of theirs.
        let timed_out = answers
            .iter()
            .filter(|answer| {
                matches!(answer, MasterAnswer::Failed(LockError::Backend(err))
                    if err.kind() == BackendErrorKind::Timeout)
            })
            .count();
        if let Some(MasterAnswer::Failed(err)) = answers
            .into_iter()
            .find(|answer| matches!(answer, MasterAnswer::Failed(err) if err.is_final_refusal()))
        {
            return Err(err);
        }
        // Too many masters failed for a quorum (those not awaited might still have granted);
        // in a second round cut short by the request's end, for want of time — unless those
        // that did answer or fail for other reasons (refused, reset) were too many for a
        // quorum anyway: that is a quorum unavailable, whatever time there was.
        if answered + out < quorum
            && timeout < bounds.timeout
            && answered + out + timed_out >= quorum
        {
            return Ok(Round::Decided(Q::refused(refusals, granted, quorum)));
        }
        if answered + out < quorum {
            let key = &attempt.keys()[0];
            return Err(self.quorum_unavailable_needing(key, answered, granted, quorum));
        }
        // A majority answered but did not grant in time.
        let refused = Q::refused(refusals, granted, quorum);
        if rerun && settled {
            return Ok(Round::TooLow { hint, refused });
        }
        Ok(Round::Decided(refused))
    }
}
