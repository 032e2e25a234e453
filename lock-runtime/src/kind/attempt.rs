//! A try and a renewal, as the acquire loop and the watchdog hand them to a store: what a try
//! asks for ([`Try`]: its kind, key, owner, lease, fencing, a fair seat, and the inputs a store
//! adds to it), the script call that makes it and its twin, and the renewal of many grants in
//! one call ([`Renewal`], [`extend_many_call`]). Neighbours: each kind's file (`write.rs`,
//! `read.rs`, `semaphore.rs`, `fair.rs`) builds its call; `reply.rs` reads the answer; the
//! stores (`store/`) send them.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use super::entry::{TwinEntry, TwinReply};
use super::lua::{millis, Tokens};
use super::{fair, read, semaphore, write, Holding, Kind};
use crate::protocol::{Announce, FencingToken, LockKey};
use crate::script::{LuaScript, ScriptCall};

/// One try to take a grant, as the acquire loop sends it to a store.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Try<'a> {
    pub(crate) kind: Kind,
    pub(crate) key: &'a LockKey,
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
    /// How long a writer that finds the lock held keeps new readers out: longer than the pause
    /// before its next try, so readers cannot slip in between two tries; zero on its last try.
    pub(crate) writer_waiting: Duration,
    /// An earlier try of the same request found the lock held, so it may have set the
    /// writer-waiting mark; a write grant then takes the mark away (a first try does not look,
    /// which keeps an uncontended grant as cheap as without readers). A fair try refused
    /// behind other waiters sets no mark, and does not count (on Redlock the masters' replies
    /// are tallied: a mark set where the waiter was the head while too few masters had it so
    /// expires on its own).
    pub(crate) refused_before: bool,
    /// The grant carries a fencing token. Without one (efficiency mode) no token is read or
    /// written, and a writer's first try may be a bare claim of the key
    /// ([`Try::bare_claim_allowed`]; on Redis `SET NX PX`: `store/redis/first_try.rs`).
    pub(crate) fencing: bool,
    /// A fair try's seat in the key's queue (`None`: not fair). Only a write try has one: the
    /// request builder refuses the others.
    pub(crate) seat: Option<fair::Seat>,
    /// The token a fenced write grant takes where tokens come from a counter
    /// ([`Tokens::Counter`]: Redlock, which proposes the same to every master of a round); a
    /// server whose counter or clock is not below it refuses it
    /// ([`AcquireReply::TooLow`](crate::protocol::AcquireReply::TooLow)). `None` elsewhere,
    /// and from the acquire loop. A store's input, which the try only carries: the store that
    /// proposes sets it on its copy of the try, and the kind's scripts take it as an argument
    /// ([`token_source`](super::token_source)); no rule of a kind depends on it.
    pub(crate) proposed: Option<FencingToken>,
    /// When the request's wait ends, on the real clock (`None`: not within reach, or a try
    /// from outside the acquire loop). The acquire loop cuts the try off at it (a request that
    /// waits: `acquire/mod.rs`, [`Try::cut`]); a store that may answer a try with more than
    /// one round (Redlock's second round) starts none after it. The request's, which the try
    /// carries to the store: no kind reads it.
    pub(crate) deadline: Option<Instant>,
    /// When the acquire loop cuts this try off, on the real clock (`None`: never, or a try
    /// from outside the acquire loop) — where the store can, by its own timers (a server's or
    /// a Sentinel primary's connection: `AnyStore::cuts_tries`); the failover guard's `WAIT`
    /// gives up in time for its
    /// reply to come back before it ([`ReplicaGuard::by`](crate::config::ReplicaGuard::by)).
    pub(crate) cut: Option<Instant>,
}

impl Try<'_> {
    /// The script call of this try, on a store whose tokens come from `tokens` and which
    /// announces as `announce` (a fair try may wake its queue's head).
    pub(crate) fn call(&self, tokens: Tokens, announce: Announce) -> ScriptCall {
        if self.seat.is_some() {
            return fair::acquire_call(self, tokens, announce);
        }
        match self.kind {
            Kind::Write => write::acquire_call(self, tokens),
            Kind::Read => read::acquire_call(self, tokens),
            Kind::Semaphore(permits) => semaphore::acquire_call(self, permits, tokens),
        }
    }

    /// Takes this try's grant in the in-process store.
    pub(crate) fn take_twin(&self, entry: &mut TwinEntry, now: Instant) -> TwinReply {
        if self.seat.is_some() {
            return fair::acquire_twin(entry, self, now);
        }
        match self.kind {
            Kind::Write => write::acquire_twin(entry, self, now),
            Kind::Read => read::acquire_twin(entry, self, now),
            Kind::Semaphore(permits) => semaphore::acquire_twin(entry, self, permits, now),
        }
    }

    /// Whether this try may be made without the kind's script, by a bare claim of the lock key
    /// (set to the owner if nothing is there): a write try, not fair (a fair try is the
    /// queue's script: a first try that skipped it would jump the queue), of a request not
    /// refused before (a claim neither looks at nor sets the writer-waiting mark). A store
    /// that can claim a key so (Redis' `SET NX`: `store/redis/first_try.rs`) may send that
    /// instead, and the script after a refusal.
    pub(crate) fn bare_claim_allowed(&self) -> bool {
        !self.refused_before && self.kind == Kind::Write && self.seat.is_none()
    }

    /// What a grant this try may have made holds, as the store gives it back when the try is
    /// undone: the grant alone — a fair try's write grant is undone without taking the waiter
    /// out of the queue (the request goes on waiting, in its place).
    pub(crate) fn grant(&self) -> Holding {
        Holding::Grant(self.kind)
    }
}

/// One lease to renew: its kind, key, owner token and lease.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) kind: Kind,
    pub(crate) key: &'a LockKey,
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
}

/// The renewal of many grants of any kinds in one script call (one slot's worth on Cluster).
pub(crate) fn extend_many_call(renewals: &[Renewal<'_>]) -> ScriptCall {
    static SCRIPT: LazyLock<LuaScript> =
        LazyLock::new(|| LuaScript::new(include_str!("../../scripts/extend_many.lua")));
    let mut call = SCRIPT.prepare_invoke();
    for renewal in renewals {
        call.key(&renewal.key.lock);
    }
    for renewal in renewals {
        call.arg(renewal.kind.tag())
            .arg(renewal.owner)
            .arg(millis(renewal.lease));
    }
    call
}
