//! Whom a release announcement wakes: the kinds' rule, stated once. A waiter registers with its
//! kind's [`WakeRule`] (or as a fair waiter, by its id); an announcement's payload, as the
//! scripts that publish it write it, reads as an [`Announcement`]; and [`Announcement::wakes`]
//! says which of one client's waiters on the lock's channel it is for ([`Wake`]). Neighbours:
//! `kind/fair.rs` defines a fair wake-up's payload ([`fair::WAKE_PREFIX`]), `protocol.rs` an
//! election's ([`PROCLAIMED_PREFIX`]); the waiting mechanism (`wake.rs`) applies the rule to
//! the waiters it holds, whichever store delivered the message.

use super::{fair, Kind};
use crate::protocol::PROCLAIMED_PREFIX;

/// Whom a release announcement wakes, for a waiter of a kind (applied by `wake.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WakeRule {
    /// One waiter of each client per announced release (a writer, a permit waiter); a wake-up
    /// with nobody waiting is kept for the next.
    OnePerRelease,
    /// Every reader of each client.
    AllReaders,
}

impl Kind {
    /// How a waiter for a grant of this kind is woken by a release announcement
    /// ([`WakeRule`]); a fair waiter is woken by name instead ([`Announcement::Head`]).
    pub(crate) fn wake_rule(self) -> WakeRule {
        match self {
            // A semaphore waiter is woken as a writer is: one per announced release (one freed
            // permit) per client.
            Kind::Write | Kind::Semaphore(_) => WakeRule::OnePerRelease,
            Kind::Read => WakeRule::AllReaders,
        }
    }
}

/// What one message on a lock's release channel says, read from its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announcement<'a> {
    /// A new leader's record (`e:` and its epoch, `scripts/election/proclaim.lua`): news for
    /// an election's observers alone, no lock was released.
    Proclaimed,
    /// A fair queue's new head, by its waiter id (`f:` and the id, `scripts/fair/`): the lock
    /// is that waiter's to take, nobody else's.
    Head(&'a str),
    /// Any other release: a write grant, the last reader while a writer waits, a permit.
    Release,
}

/// Which of one client's waiters on a channel an announcement wakes, besides the election
/// observers, whom every message wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wake<'a> {
    /// The fair waiter to wake, if it waits in this client.
    pub(crate) fair: Option<FairWake<'a>>,
    /// The waiters of which rule to wake: one [`WakeRule::OnePerRelease`] waiter, or every
    /// [`WakeRule::AllReaders`] one.
    pub(crate) rule: Option<WakeRule>,
}

/// Which fair waiter an announcement wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FairWake<'a> {
    /// The one of this id (the queue's head).
    Named(&'a str),
    /// Any one of them: finding the lock free but not at the head, it wakes the head by name.
    Any,
}

impl<'a> Announcement<'a> {
    /// Reads a message's payload (an unknown payload is a release: every store's release
    /// scripts publish one the waiters need not read).
    pub(crate) fn parse(payload: &'a [u8]) -> Self {
        if payload.starts_with(PROCLAIMED_PREFIX) {
            return Announcement::Proclaimed;
        }
        if let Some(waiter) = payload.strip_prefix(fair::WAKE_PREFIX) {
            return Announcement::Head(std::str::from_utf8(waiter).unwrap_or_default());
        }
        Announcement::Release
    }

    /// Whom this announcement wakes among one client's waiters on its channel, given whether
    /// a [`WakeRule::OnePerRelease`] waiter (a writer) is among them: a release wakes one
    /// writer, or all the readers when no writer waits (a waiting writer has set the
    /// writer-waiting mark, which keeps readers out; readers share the lock, writers would only
    /// collide), and one fair waiter; a queue's head wakes that waiter alone; a new leader's
    /// record none of them.
    pub(crate) fn wakes(self, writers_wait: bool) -> Wake<'a> {
        match self {
            Announcement::Proclaimed => Wake {
                fair: None,
                rule: None,
            },
            Announcement::Head(waiter) => Wake {
                fair: Some(FairWake::Named(waiter)),
                rule: None,
            },
            Announcement::Release => Wake {
                fair: Some(FairWake::Any),
                rule: Some(if writers_wait {
                    WakeRule::OnePerRelease
                } else {
                    WakeRule::AllReaders
                }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_reads_as_what_its_script_published() {
        assert_eq!(Announcement::parse(b"e:42"), Announcement::Proclaimed);
        assert_eq!(Announcement::parse(b"f:0a1b"), Announcement::Head("0a1b"));
        assert_eq!(Announcement::parse(b""), Announcement::Release);
        assert_eq!(Announcement::parse(b"1"), Announcement::Release);
    }

    #[test]
    fn a_release_wakes_one_writer_else_every_reader_and_one_fair_waiter() {
        let release = Announcement::Release;
        assert_eq!(release.wakes(true).rule, Some(WakeRule::OnePerRelease));
        assert_eq!(release.wakes(false).rule, Some(WakeRule::AllReaders));
        assert_eq!(release.wakes(true).fair, Some(FairWake::Any));
        let head = Announcement::Head("0a1b").wakes(true);
        assert_eq!(
            (head.fair, head.rule),
            (Some(FairWake::Named("0a1b")), None)
        );
        let proclaimed = Announcement::Proclaimed.wakes(true);
        assert_eq!((proclaimed.fair, proclaimed.rule), (None, None));
    }
}
