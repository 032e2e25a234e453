//! Redlock's tally of the masters' refusals of one try ([`Refusals`]), read as the one reply the
//! acquire loop gets when too few masters granted. A store's rule, not a kind's: it follows
//! from one try going to several masters. Neighbours: `store/redlock.rs` counts each master's
//! reply here and asks for the reply when its quorum (`Kind::quorum`) is missed.

use std::time::Duration;

use crate::protocol::AcquireReply;

/// The refusals of one try by several masters (Redlock), tallied into the one reply the
/// acquire loop gets when too few granted: held for the shortest remaining lease any master
/// reported, or for no time when masters that refused the proposed token as too low (free
/// there) and those that granted would make a quorum (try again at once, with a raised
/// proposal); a fair try queued at the highest place any master gave it, and behind
/// others unless a quorum of masters had it at the head (the lock held there, or free but for
/// the token) or granted it — a try behind others waits as one, whatever a master that had
/// it at the head said.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    /// A fair try was refused (`AcquireReply::Queued`).
    fair: bool,
    /// Masters where the fair try is the queue's head, the lock held there.
    heads: usize,
    /// Masters that refused the proposed token as too low (`AcquireReply::TooLow`): the lock
    /// is free there, and a fair try was the queue's head (only the head tries the write
    /// side, which refuses so).
    too_low: usize,
    /// Its place: the same on every master (the caller's ticket, or the place it was given).
    place: u64,
    /// The shortest remaining lease of a holder, where a master said it.
    held_for: Option<Duration>,
}

impl Refusals {
    /// Counts one master's refusal (a grant is not one: the caller counts grants).
    pub(crate) fn count(&mut self, reply: &AcquireReply) {
        let remaining = match *reply {
            AcquireReply::Acquired(_) => return,
            AcquireReply::Held(remaining) => remaining,
            AcquireReply::TooLow(_) => {
                self.too_low += 1;
                return;
            }
            AcquireReply::Queued {
                place,
                behind,
                remaining,
            } => {
                self.fair = true;
                self.place = self.place.max(place);
                if behind {
                    return;
                }
                self.heads += 1;
                remaining
            }
        };
        if let Some(remaining) = remaining {
            self.held_for = Some(self.held_for.map_or(remaining, |h| h.min(remaining)));
        }
    }

    /// The reply for a try that `granted` masters granted, `quorum` being needed.
    pub(crate) fn reply(self, granted: usize, quorum: usize) -> AcquireReply {
        // Free on enough masters but for the token, with the grants, to make a quorum: try
        // again at once (the proposal is raised). Held on too many for that, the holder's
        // lease is what there is to wait for, however many free masters refused the token.
        let remaining = if self.too_low > 0 && granted + self.too_low >= quorum {
            Some(Duration::ZERO)
        } else {
            self.held_for
        };
        if self.fair {
            let behind = granted + self.heads + self.too_low < quorum;
            return AcquireReply::Queued {
                place: self.place,
                behind,
                remaining: if behind { self.held_for } else { remaining },
            };
        }
        AcquireReply::Held(remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::TooLow;

    fn too_low() -> AcquireReply {
        AcquireReply::TooLow(TooLow { hint: 2, clock: 1 })
    }

    /// A fair try's refusal by a master where others are ahead of it, at place 7.
    fn behind() -> AcquireReply {
        AcquireReply::Queued {
            place: 7,
            behind: true,
            remaining: None,
        }
    }

    fn held(seconds: u64) -> AcquireReply {
        AcquireReply::Held(Some(Duration::from_secs(seconds)))
    }

    /// The refusals of one try, counted from each master's reply.
    fn counted(replies: &[AcquireReply]) -> Refusals {
        let mut refusals = Refusals::default();
        for reply in replies {
            refusals.count(reply);
        }
        refusals
    }

    /// A fair try whose token a majority refused as too low was at their queues' head: it
    /// tries again at once, not reported behind others; one behind others on a majority
    /// waits as one, however many masters refused its token.
    #[test]
    fn a_fair_try_refused_as_too_low_by_a_majority_is_at_the_head_and_tries_again_at_once() {
        assert_eq!(
            counted(&[too_low(), too_low(), behind()]).reply(0, 2),
            AcquireReply::Queued {
                place: 7,
                behind: false,
                remaining: Some(Duration::ZERO),
            }
        );

        // One master's too-low refusal and one grant make the quorum's head too.
        assert!(matches!(
            counted(&[too_low(), behind()]).reply(1, 2),
            AcquireReply::Queued { behind: false, .. }
        ));

        // Behind others on a majority is behind.
        assert_eq!(
            counted(&[too_low(), behind(), behind()]).reply(0, 2),
            behind(),
            "a waiter behind others waits as one, not again at once"
        );

        // Not fair: held for no time when the refusals of the token and the grants make a
        // quorum, for the holder's lease when the holder has too many masters for that.
        assert_eq!(
            counted(&[held(3), too_low()]).reply(1, 2),
            AcquireReply::Held(Some(Duration::ZERO))
        );
        assert_eq!(
            counted(&[too_low(), held(3), held(3)]).reply(0, 2),
            held(3),
            "held on a majority: wait for the holder, not again at once"
        );
    }
}
