//! Lock kinds: what a grant means, written once for every store. The kinds are the two sides of
//! a key's read/write lock: [`write`] (the exclusive lock) and [`read`]; and [`semaphore`] (one
//! of N permits). [`multi`] takes the write side of several keys at once. Fairness is not a kind
//! but a property of a try: a write try with a [`fair::Seat`] in the key's queue ([`fair`]) is
//! granted in request order, and its grant is given back by leaving the queue
//! ([`Holding::Seat`]).
//!
//! A kind is stated twice. Its twin (a function per operation in the kind's file, on a
//! [`TwinEntry`]) is the reference statement of its rules: a change of one key's state, which
//! the in-process store runs under its mutex and an engine without scripts (a SQL database, a
//! consensus store) runs inside its own transaction. Its Lua scripts are Redis' encoding of the
//! same rules in one round trip (single node, Sentinel, Cluster, each Redlock master). The
//! conformance suite, which runs every test on every store, is the proof that the two agree
//! (`docs/how-it-works.md`, "A kind on an engine without scripts").
//!
//! Here: the rules every store asks about ([`Kind`], [`Holding`], [`TokenRule`]); a try and a
//! renewal ([`attempt`]); the scripts' common part ([`lua`]) and how their replies read
//! ([`reply`]); a key's in-process state ([`entry`]). Neighbours: the stores in `store/` run
//! what this module describes and never match on a kind; the acquire loop (`acquire/`), the
//! watchdog and the guard pass a [`Kind`] and a [`Holding`] along and never look inside them
//! (Redlock asks the kind for its quorum).

mod attempt;
mod entry;
pub(crate) mod fair;
mod lua;
pub(crate) mod multi;
pub(crate) mod read;
mod reply;
pub(crate) mod semaphore;
pub(crate) mod twins;
mod wake_rule;
pub(crate) mod write;

use std::time::{Duration, Instant};

use crate::protocol::{Announce, LockKey, LockMode};
use crate::script::{LuaScript, ScriptCall};

pub(crate) use attempt::{extend_many_call, Renewal, Try};
pub(crate) use entry::{TwinEntry, TwinReply};
use lua::acquire_invocation;
pub(crate) use lua::{lock_keys, millis, script, token_source, writer_waiting_args, Tokens};
pub(crate) use reply::{read_acquire_reply, read_extend_many_reply, ScriptReply};
pub(crate) use wake_rule::{Announcement, FairWake, WakeRule};

/// What a grant is: which side of the key's read/write lock it holds, or a semaphore permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// The exclusive lock: one writer, no reader.
    Write,
    /// Shared among readers, excluding writers.
    Read,
    /// One of this many permits (a semaphore); the count travels with every operation, since
    /// Redlock's quorum depends on it.
    Semaphore(u32),
}

/// What a grant holds, as its release gives it back: a grant of a [`Kind`], or a seat in the
/// key's fair queue ([`fair`]) with the write grant it may have got. A seat is given back by
/// leaving the queue, which also gives back that grant and wakes the queue's new head by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holding {
    /// A grant of this kind, taken without a seat.
    Grant(Kind),
    /// A seat in the key's queue, and the write grant its try may have got.
    Seat,
    /// A write grant held at least until a moment (`hold_at_least`), given back before it:
    /// kept, not renewed, for this much longer, then it expires (`scripts/write/keep.lua`).
    KeptFor(Duration),
}

impl From<Kind> for LockMode {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::Write => LockMode::Write,
            Kind::Read => LockMode::Read,
            Kind::Semaphore(_) => LockMode::Semaphore,
        }
    }
}

/// Which fencing token a grant takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenRule {
    /// A token of its own, above every earlier one (a write grant: exclusive or fair). On
    /// Redlock the token is proposed to the masters, and each that grants sets its counter to
    /// it ([`Try::proposed`]).
    Fresh,
    /// The latest token handed out (or the clock), between the write tokens around it (a read
    /// grant, a semaphore permit): nothing is written for it.
    Latest,
}

impl Holding {
    /// The kind of the grant: a seat's is a write grant.
    pub(crate) fn kind(self) -> Kind {
        match self {
            Holding::Grant(kind) => kind,
            Holding::Seat | Holding::KeptFor(_) => Kind::Write,
        }
    }

    /// The script call that gives `owner`'s grant (or seat) at `key` back, announcing it as
    /// `announce` says: as the store does, or (`None`) to nobody.
    pub(crate) fn release_call(
        self,
        key: &LockKey,
        owner: &str,
        announce: Option<Announce>,
    ) -> ScriptCall {
        let script: &'static LuaScript = match self {
            Holding::Grant(Kind::Write) => &write::RELEASE,
            Holding::Grant(Kind::Read) => &read::RELEASE,
            Holding::Grant(Kind::Semaphore(_)) => &semaphore::RELEASE,
            Holding::Seat => &fair::LEAVE,
            Holding::KeptFor(_) => &write::KEEP,
        };
        // Every release script takes the lock key, the owner token and how the store
        // announces, then the keys it reaches beside the lock (arguments: `lock_key.lua`).
        let mut call = script.prepare_invoke();
        call.key(&key.lock)
            .arg(owner)
            .arg(Announce::argument(announce));
        match self {
            Holding::Grant(Kind::Write | Kind::Semaphore(_)) => call.arg(key.channel()),
            Holding::Grant(Kind::Read) => call.arg(key.writer_waiting()).arg(key.channel()),
            Holding::KeptFor(keep) => call.arg(millis(keep)),
            Holding::Seat => call
                .arg(key.channel())
                .arg(key.queue())
                .arg(key.queue_deadlines()),
        };
        call
    }

    /// The slot of a grant whose give-back, on a key whose state is its holders alone, removes
    /// that one grant and changes nothing else: a write or a read grant (`release_twin` of
    /// `write.rs` and `read.rs`; what else a purge drops is grants whose leases ran out). A
    /// store that keeps each grant as a key of its own (etcd) may then delete the key alone,
    /// provided the key still holds this grant and the key keeps no other state. `None` for a
    /// seat (it leaves a queue), a permit (its key is a seat, not named by its owner) and a
    /// kept write grant (it is renewed, not removed).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn removes_alone(self) -> Option<HolderSlot> {
        match self {
            Holding::Grant(kind @ (Kind::Write | Kind::Read)) => Some(kind.holder_slot()),
            Holding::Grant(Kind::Semaphore(_)) | Holding::Seat | Holding::KeptFor(_) => None,
        }
    }

    /// Gives a grant (or seat) back in the in-process store: whether a grant was ours.
    pub(crate) fn release_twin(self, entry: &mut TwinEntry, owner: &str, now: Instant) -> bool {
        match self {
            Holding::Grant(Kind::Write) => write::release_twin(entry, owner, now),
            Holding::Grant(Kind::Read) => read::release_twin(entry, owner, now),
            Holding::Grant(Kind::Semaphore(_)) => semaphore::release_twin(entry, owner, now),
            Holding::Seat => fair::leave_twin(entry, owner, now),
            Holding::KeptFor(keep) => entry.extend(Kind::Write, owner, keep, now),
        }
    }
}

/// Where a key's state keeps a grant of a kind ([`TwinEntry`]'s parts): what a store that
/// keeps the entry in its own form renews in place (PostgreSQL's one-statement renewal), or
/// keeps as keys of their own (etcd, which asks [`HolderSlot::excludes`] what a new grant's
/// transaction must find unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HolderSlot {
    /// The writer (`TwinEntry::writer`).
    Writer,
    /// One of the readers (`TwinEntry::readers`).
    Reader,
    /// One of the permit holders (`TwinEntry::permits`).
    Permit,
}

impl HolderSlot {
    /// Every slot.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) const ALL: [HolderSlot; 3] =
        [HolderSlot::Writer, HolderSlot::Reader, HolderSlot::Permit];

    /// Whether a grant in this slot cannot coexist with any grant in `other`, whatever their
    /// number — the rule the twins apply: a writer excludes every grant; a reader the writer
    /// and the permits; a permit the writer and the readers (permits exclude each other only
    /// past the semaphore's count, which the twin counts).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn excludes(self, other: HolderSlot) -> bool {
        match self {
            HolderSlot::Writer => true,
            HolderSlot::Reader => other != HolderSlot::Reader,
            HolderSlot::Permit => other != HolderSlot::Permit,
        }
    }
}

impl Kind {
    /// Where a grant of this kind is kept in a key's state ([`HolderSlot`]), as
    /// [`TwinEntry::extend`] finds it.
    #[cfg_attr(not(any(feature = "postgres", feature = "etcd")), allow(dead_code))]
    pub(crate) fn holder_slot(self) -> HolderSlot {
        match self {
            Kind::Write => HolderSlot::Writer,
            Kind::Read => HolderSlot::Reader,
            Kind::Semaphore(_) => HolderSlot::Permit,
        }
    }

    /// Which fencing token a grant of this kind takes ([`TokenRule`]): the one rule every
    /// store follows (the scripts follow it too).
    pub(crate) fn token_rule(self) -> TokenRule {
        match self {
            Kind::Write => TokenRule::Fresh,
            Kind::Read | Kind::Semaphore(_) => TokenRule::Latest,
        }
    }

    /// The permits a try of this kind asks for: a semaphore's count, 0 for the other kinds.
    pub(crate) fn permits(self) -> u32 {
        match self {
            Kind::Semaphore(permits) => permits,
            _ => 0,
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Kind::Write => "w",
            // A permit is renewed as a reader is: its member's score in the key's sorted set.
            Kind::Read | Kind::Semaphore(_) => "r",
        }
    }

    /// How many of `masters` Redlock masters must grant (or renew) a grant of this kind: a
    /// majority, and for a semaphore more ([`semaphore::quorum`]).
    pub(crate) fn quorum(self, masters: usize) -> usize {
        match self {
            Kind::Write | Kind::Read => masters / 2 + 1,
            Kind::Semaphore(permits) => semaphore::quorum(permits, masters),
        }
    }
}
