//! What a try of the acquire loop came to, read the same way for one key and many: granted
//! with a fencing token per key ([`GrantTokens`]), or refused with what the refusal taught
//! ([`Refusal`]: how long the holder keeps the lock, which key was held, a fair try's place).
//! Neighbours: the kinds' replies (`kind/`, `protocol.rs`) are read here; the loop
//! (`acquire/mod.rs`) acts on them.

use std::time::Duration;

use crate::kind::multi::MultiReply;
use crate::protocol::{AcquireReply, FencingToken};

/// What a try's reply says, for one key or many.
pub(super) enum Outcome {
    /// Granted, with the fencing token of each key in the order taken.
    Granted(GrantTokens),
    Refused(Refusal),
}

/// The fencing tokens of a grant: one key's, or one per key of a multi-key grant.
pub(super) enum GrantTokens {
    One(Option<FencingToken>),
    Many(Vec<Option<FencingToken>>),
}

impl GrantTokens {
    pub(super) fn of(&self, at: usize) -> Option<FencingToken> {
        match self {
            GrantTokens::One(token) => *token,
            GrantTokens::Many(tokens) => tokens.get(at).copied().flatten(),
        }
    }
}

/// What a refused try learnt.
#[derive(Default)]
pub(super) struct Refusal {
    /// The longest the holder keeps the lock (`None`: unknown).
    pub(super) remaining: Option<Duration>,
    /// The position of the key found held, whose release the request waits for.
    pub(super) at: usize,
    /// A fair try's place in the queue and whether others are ahead of it.
    pub(super) queued: Option<(u64, bool)>,
}

impl From<AcquireReply> for Outcome {
    fn from(reply: AcquireReply) -> Self {
        match reply {
            AcquireReply::Acquired(token) => Outcome::Granted(GrantTokens::One(token)),
            AcquireReply::Held(remaining) => Outcome::Refused(Refusal {
                remaining,
                ..Refusal::default()
            }),
            // Only from one Redlock master, whose store tallies it: try again at once.
            AcquireReply::TooLow(_) => Outcome::Refused(Refusal {
                remaining: Some(Duration::ZERO),
                ..Refusal::default()
            }),
            AcquireReply::Queued {
                place,
                behind,
                remaining,
            } => Outcome::Refused(Refusal {
                remaining,
                at: 0,
                queued: Some((place, behind)),
            }),
        }
    }
}

impl From<MultiReply> for Outcome {
    fn from(reply: MultiReply) -> Self {
        match reply {
            MultiReply::Acquired(tokens) => Outcome::Granted(GrantTokens::Many(tokens)),
            MultiReply::Held(remaining, at) => Outcome::Refused(Refusal {
                remaining,
                at,
                queued: None,
            }),
            MultiReply::TooLow(_) => Outcome::Refused(Refusal {
                remaining: Some(Duration::ZERO),
                ..Refusal::default()
            }),
        }
    }
}
