//! Lock kinds: what a grant means, written once for every store. A kind is its Lua scripts
//! (run by every Redis store: single node, Sentinel, Cluster, and each Redlock master), how their
//! replies read, and its in-process twin (run by the in-process store on a [`TwinEntry`]).
//! The kinds are the two sides of a key's read/write lock: [`write`] (the exclusive lock) and
//! [`read`]; and [`semaphore`] (one of N permits). [`multi`] takes the write side of several
//! keys at once. Fairness is not a kind but a property of a try: a write try with a [`fair::Seat`]
//! in the key's queue ([`fair`]) is granted in request order, and its grant is given back by
//! leaving the queue ([`Holding::Seat`]). Neighbours: the stores in `store/` run what this
//! module describes; the acquire loop (`acquire/`), the watchdog and the guard pass a [`Kind`]
//! and a [`Holding`] along and never look inside them (Redlock asks the kind for its quorum).

pub(crate) mod fair;
pub(crate) mod multi;
pub(crate) mod read;
pub(crate) mod semaphore;
pub(crate) mod twins;
pub(crate) mod write;

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use crate::script::{LuaScript, ScriptCall};

use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::protocol::{AcquireReply, Announce, Call, LockKey, Renewed, TooLow};
use crate::protocol::{FencingToken, LockMode};

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

/// Whom a release announcement wakes, for a waiter of a kind (`store/wake.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WakeRule {
    /// One waiter of each client per announced release (a writer, a permit waiter); a wake-up
    /// with nobody waiting is kept for the next.
    OnePerRelease,
    /// Every reader of each client.
    AllReaders,
}

/// Where a store's fencing tokens come from (the request may want none: [`Try::fencing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tokens {
    /// The server clock in microseconds at the grant, read in the same transaction or script
    /// (one node: single, Sentinel, Cluster). Two grants of a key are at least a round trip
    /// apart, so the clock has moved on between them; no key is written for it.
    Clock,
    /// A token proposed by the caller ([`Try::proposed`]), which the server grants only above
    /// the key's live counter and not below its clock, and which it then keeps in the
    /// counter until its clock has passed the token by [`write::fence_ttl`]. Redlock: the same
    /// token goes to every master of a round (`store/redlock.rs`).
    Counter,
}

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
    /// written, and a writer's first try is a bare `SET NX PX` ([`FirstTry`]).
    pub(crate) fencing: bool,
    /// A fair try's seat in the key's queue (`None`: not fair). Only a write try has one: the
    /// request builder refuses the others.
    pub(crate) seat: Option<fair::Seat>,
    /// The token a fenced write grant takes where tokens come from a counter
    /// ([`Tokens::Counter`]: Redlock, which proposes the same to every master of a round); a
    /// server whose counter or clock is not below it refuses it ([`AcquireReply::TooLow`]).
    /// `None` elsewhere, and from the acquire loop.
    pub(crate) proposed: Option<FencingToken>,
    /// When the request's wait ends, on the real clock (`None`: not within reach, or a try
    /// from outside the acquire loop). The acquire loop cuts the try off at it (a request that
    /// waits: `acquire/mod.rs`, [`Try::cut`]); a store that may answer a try with more than
    /// one round (Redlock's second round) starts none after it.
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

    /// What a grant this try may have made holds, as the store gives it back when the try is
    /// undone: the grant alone — a fair try's write grant is undone without taking the waiter
    /// out of the queue (the request goes on waiting, in its place).
    pub(crate) fn grant(&self) -> Holding {
        Holding::Grant(self.kind)
    }
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

impl Kind {
    /// Which fencing token a grant of this kind takes ([`TokenRule`]): the one rule every
    /// store follows (the scripts follow it too).
    pub(crate) fn token_rule(self) -> TokenRule {
        match self {
            Kind::Write => TokenRule::Fresh,
            Kind::Read | Kind::Semaphore(_) => TokenRule::Latest,
        }
    }

    /// How a waiter for a grant of this kind is woken by a release announcement
    /// ([`WakeRule`]); a fair waiter is woken by name instead (`store/wake.rs`).
    pub(crate) fn wake_rule(self) -> WakeRule {
        match self {
            // A semaphore waiter is woken as a writer is: one per announced release (one freed
            // permit) per client.
            Kind::Write | Kind::Semaphore(_) => WakeRule::OnePerRelease,
            Kind::Read => WakeRule::AllReaders,
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

/// The first try of a write grant, when it needs no script: a bare `SET key owner NX PX lease
/// GET` without a fencing token, and on a store with [`Tokens::Clock`] that `SET` and `TIME`
/// in one `MULTI`/`EXEC` — about a microsecond of server time more than the `SET`, where a
/// script call costs several. It neither looks at nor sets the writer-waiting mark, and a
/// refusal does not say how long the holder keeps the lock: so a refused first try is
/// followed at once by the script, which sets the mark (keeping new readers out, and asking
/// the last reader's release to wake this writer) and says how long to wait. `GET` makes the same try sent again
/// (after a lost reply) a grant, as the script does, but without restarting the lease: the
/// caller's deadline runs from before the first send, so it ends before the key's.
pub(crate) struct FirstTry {
    request: FirstRequest,
}

/// The request of a [`FirstTry`].
enum FirstRequest {
    /// `SET … NX PX … GET` alone: the grant has no token.
    Bare(redis::Cmd),
    /// That `SET` and `TIME` after it in one `MULTI`/`EXEC`: the token is the clock.
    Clock(redis::Pipeline),
}

impl FirstTry {
    /// The try's first request, if it can be one without a script: a store that reads tokens
    /// from a counter, or cannot run a transaction (`transactions` false: Cluster, where
    /// `TIME` has no key to route by), sends the script.
    pub(crate) fn of(attempt: &Try<'_>, tokens: Tokens, transactions: bool) -> Option<Self> {
        // A fair try is the queue's script: a first try that skipped it would jump the queue.
        if attempt.refused_before || attempt.kind != Kind::Write || attempt.seat.is_some() {
            return None;
        }
        let clock = match (attempt.fencing, tokens) {
            (false, _) => false,
            (true, Tokens::Clock) if transactions => true,
            (true, _) => return None,
        };
        // Sized up front: one allocation for the command's bytes and one for its argument
        // offsets, none while it grows (this is every uncontended write lock's request).
        let mut set =
            redis::Cmd::with_capacity(7, attempt.key.lock.len() + attempt.owner.len() + 40);
        set.arg("SET")
            .arg(&attempt.key.lock)
            .arg(attempt.owner)
            .arg("NX")
            .arg("PX")
            .arg(millis(attempt.lease))
            .arg("GET");
        if !clock {
            return Some(Self {
                request: FirstRequest::Bare(set),
            });
        }
        let mut pipeline = redis::Pipeline::with_capacity(2);
        pipeline.atomic();
        pipeline.add_command(set);
        let mut time = redis::Cmd::with_capacity(1, 4);
        time.arg("TIME");
        pipeline.add_command(time);
        pipeline.ignore_errors();
        Some(Self {
            request: FirstRequest::Clock(pipeline),
        })
    }

    /// The request to send.
    pub(crate) fn call(&self) -> Call<'_> {
        match &self.request {
            FirstRequest::Bare(set) => Call::Command(set),
            FirstRequest::Clock(pipeline) => Call::Pipeline(pipeline),
        }
    }

    /// Reads the reply as an acquire script's `{granted, value}`: `{1, token}` (`{1, -1}`
    /// without a token), or `{0, -2}` when held ("try again at once", through the script).
    pub(crate) fn read(&self, owner: &str, reply: &redis::Value) -> Result<(i64, i64), LockError> {
        let unexpected = || {
            LockError::from(BackendError::new(
                "acquire",
                BackendErrorKind::Server,
                format!("unexpected reply to the first try: {reply:?}"),
            ))
        };
        // The `SET`'s reply, and `TIME`'s after it in the transaction's.
        let (set, clock) = match (reply, &self.request) {
            (set, FirstRequest::Bare(_)) => (set, None),
            (redis::Value::Array(items), FirstRequest::Clock(_)) if items.len() == 2 => {
                (&items[0], Some(&items[1]))
            }
            _ => return Err(unexpected()),
        };
        let granted = match set {
            // Nothing was there: set.
            redis::Value::Nil => true,
            // Our own try, sent again after its reply was lost.
            redis::Value::BulkString(held) => held == owner.as_bytes(),
            // Readers hold the lock (a sorted set): `GET` refuses, nothing was set.
            redis::Value::ServerError(err) if err.code() == "WRONGTYPE" => false,
            _ => return Err(unexpected()),
        };
        if !granted {
            return Ok((0, -2));
        }
        let Some(clock) = clock else {
            return Ok((1, -1));
        };
        let (seconds, micros): (i64, i64) =
            redis::from_redis_value_ref(clock).map_err(|_| unexpected())?;
        Ok((1, seconds.saturating_mul(1_000_000).saturating_add(micros)))
    }
}

/// An acquire script's reply as [`read_acquire_reply`] reads it: `{granted, value}`, and a
/// third element after them: a fair refusal's place, or a refused proposal's server clock
/// (`{2, hint, clock}`). Read without allocating (the acquire's hot path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScriptReply {
    pub(crate) granted: i64,
    pub(crate) value: i64,
    /// The third element: a fair refusal's place, a refused proposal's server clock.
    pub(crate) third: Option<i64>,
}

impl From<(i64, i64)> for ScriptReply {
    fn from((granted, value): (i64, i64)) -> Self {
        Self {
            granted,
            value,
            third: None,
        }
    }
}

impl redis::FromRedisValue for ScriptReply {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        if let redis::Value::Array(items) = &v {
            if let [granted, value, third] = items.as_slice() {
                return Ok(Self {
                    granted: i64::from_redis_value_ref(granted)?,
                    value: i64::from_redis_value_ref(value)?,
                    third: Some(i64::from_redis_value_ref(third)?),
                });
            }
        }
        // Two elements, or the pair's own error for anything else.
        <(i64, i64)>::from_redis_value(v).map(Self::from)
    }
}

/// Reads the `{granted, value}` reply every acquire script gives: `{1, token}` or
/// `{0, remaining ms}` (-1: no expiry; -2: vanished meanwhile, try again at once). A grant
/// without fencing (`attempt.fencing` false) carries no token, whatever the script said.
/// A semaphore's `{-1, permits}`: the key is a semaphore of another count, in use. A fair
/// refusal, `{0, ms or -3, place}` ([`AcquireReply::Queued`]): -3 when waiters are ahead. A
/// refused proposal ([`Tokens::Counter`]), `{2, hint, clock}` ([`AcquireReply::TooLow`]).
pub(crate) fn read_acquire_reply(
    attempt: &Try<'_>,
    reply: ScriptReply,
) -> Result<AcquireReply, LockError> {
    let key = attempt.key;
    let ScriptReply {
        granted,
        value,
        third,
    } = reply;
    if let (-1, Kind::Semaphore(asked)) = (granted, attempt.kind) {
        return Err(semaphore::count_mismatch(key, asked, value));
    }
    if granted == 2 {
        return Ok(AcquireReply::TooLow(TooLow::read(
            value,
            third.unwrap_or(0),
        )));
    }
    if granted == 1 && !attempt.fencing {
        return Ok(AcquireReply::Acquired(None));
    }
    if granted == 1 {
        let token = u64::try_from(value).map_err(|_| {
            BackendError::new(
                "acquire",
                BackendErrorKind::Server,
                format!(
                    "the fencing counter of `{}` holds a negative value",
                    key.name
                ),
            )
        })?;
        return Ok(AcquireReply::Acquired(Some(FencingToken(token))));
    }
    let remaining = match value {
        -2 => Some(Duration::ZERO),
        ms if ms >= 0 => Some(Duration::from_millis(ms.unsigned_abs())),
        _ => None,
    };
    if attempt.seat.is_some() {
        return Ok(AcquireReply::Queued {
            place: third.and_then(|p| u64::try_from(p).ok()).unwrap_or(0),
            behind: value == -3,
            remaining,
        });
    }
    Ok(AcquireReply::Held(remaining))
}

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
mod refusals_tests {
    use super::*;

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

/// Reads the reply of [`extend_many_call`] for `asked` renewals: one 1 (renewed) or 0 (no
/// longer ours) per renewal.
pub(crate) fn read_extend_many_reply(
    asked: usize,
    extended: Vec<i64>,
) -> Result<Vec<Renewed>, LockError> {
    if extended.len() != asked {
        return Err(BackendError::new(
            "renew",
            BackendErrorKind::Server,
            format!(
                "asked to renew {asked} leases, got {} answers",
                extended.len()
            ),
        )
        .into());
    }
    Ok(extended
        .into_iter()
        .map(|e| Renewed::from(e == 1))
        .collect())
}

/// The text every script of a lock starts with (`scripts/lock_key.lua`): how a script tells a
/// lock's own structures from anything else at its key (NOTALOCK), and how it reaches the keys
/// beside the lock, which it is given as arguments ([`lock_keys`]).
const LOCK_KEY_LUA: &str = include_str!("../../scripts/lock_key.lua");

/// A script of a lock that reads its lock key or a key beside it: `body` after
/// [`LOCK_KEY_LUA`]. (Releases and renewals, which only compare a key with the caller's own
/// owner token, are made with `Script::new` and cost nothing more.)
pub(crate) fn script(body: &str) -> LuaScript {
    LuaScript::new(&format!("{LOCK_KEY_LUA}\n{body}"))
}

/// The keys a script of `key`'s lock is given — the one place that decides them: the lock key,
/// and the fencing counter where tokens come from one (Redlock). Nothing else: on Cluster a key
/// a call names that is missing on the node it reaches makes the call fail while the slot
/// migrates (`ASK`, then `TRYAGAIN` until the response timeout), and only the lock key (and a
/// Redlock master's counter, which lives as long as a grant) exists whenever the call matters.
/// The keys beside the lock — the writer-waiting mark, the fair queue, the release channel —
/// go as arguments (`scripts/lock_key.lua`).
pub(crate) fn lock_keys(call: &mut ScriptCall, key: &LockKey, tokens: Tokens) {
    call.key(&key.lock);
    if tokens == Tokens::Counter {
        call.key(key.fence());
    }
}

/// A try's call of `script`, which every acquire script takes alike: [`lock_keys`], the owner
/// token and the lease in ms.
fn acquire_invocation(script: &'static LuaScript, attempt: &Try<'_>, tokens: Tokens) -> ScriptCall {
    let mut call = script.prepare_invoke();
    lock_keys(&mut call, attempt.key, tokens);
    call.arg(attempt.owner).arg(millis(attempt.lease));
    call
}

/// A duration in whole milliseconds for a script, at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The argument that says where a write grant's fencing token comes from, which every write
/// acquire script takes alike (`scripts/write/acquire.lua`, ARGV[3]): `0` (no token), `clock`,
/// or with counter tokens the proposed token and the counter's time to live beyond it, `T:ms`
/// (without a proposal, 0: refused with the least token the server would take).
pub(crate) fn token_source(
    call: &mut ScriptCall,
    fencing: bool,
    tokens: Tokens,
    lease: Duration,
    proposed: Option<FencingToken>,
) {
    match (fencing, tokens) {
        (false, _) => call.arg("0"),
        (true, Tokens::Clock) => call.arg("clock"),
        (true, Tokens::Counter) => call.arg(format!(
            "{}:{}",
            proposed.map_or(0, |token| token.0),
            millis(write::fence_ttl(lease))
        )),
    };
}

/// The in-process state of one key, which every kind's twin reads and changes: the in-process
/// counterpart of the lock key (its writer or its readers) and the writer-waiting mark.
#[derive(Debug, Default)]
pub(crate) struct TwinEntry {
    /// The writer and when its lease ends.
    pub(crate) writer: Option<(String, Instant)>,
    /// Every reader and when its lease ends.
    pub(crate) readers: HashMap<String, Instant>,
    /// Until when a waiting writer keeps new readers out.
    pub(crate) writer_waiting: Option<Instant>,
    /// The count and the holders while the key is a semaphore with permits held.
    pub(crate) permits: Option<semaphore::Permits>,
    /// The fair waiters, while any waits.
    pub(crate) queue: Option<fair::FairQueue>,
}

impl TwinEntry {
    /// Drops every holder and mark whose time has run out.
    pub(crate) fn purge(&mut self, now: Instant) {
        if self.writer.as_ref().is_some_and(|&(_, until)| until <= now) {
            self.writer = None;
        }
        self.readers.retain(|_, &mut until| until > now);
        if self.writer_waiting.is_some_and(|until| until <= now) {
            self.writer_waiting = None;
        }
        if let Some(permits) = &mut self.permits {
            permits.holders.retain(|_, &mut until| until > now);
            if permits.holders.is_empty() {
                self.permits = None;
            }
        }
        if let Some(queue) = &mut self.queue {
            queue.purge(now);
            if queue.is_empty() {
                self.queue = None;
            }
        }
    }

    /// What keeps a writer out of this key — the one rule for every grant of the write side
    /// (the exclusive lock, a fair grant, each key of `lock_all`): another writer, readers, or
    /// semaphore permits. When the last of them ends; `None` when the key is free for `owner`
    /// (free, or `owner`'s own write grant: the same try sent again). Purge first.
    pub(crate) fn writer_blocked_until(&self, owner: &str) -> Option<Instant> {
        let writer = match &self.writer {
            Some((holder, until)) if holder != owner => Some(*until),
            _ => None,
        };
        [
            writer,
            self.readers.values().max().copied(),
            self.permits_until(),
        ]
        .into_iter()
        .flatten()
        .max()
    }

    /// A writer's try found the key held: keep new readers out for `mark` (zero: the writer's
    /// last try, no mark), as the scripts' writer-waiting mark does.
    pub(crate) fn mark_writer_waiting(&mut self, mark: Duration, now: Instant) {
        if !mark.is_zero() {
            self.writer_waiting = Some(now + mark);
        }
    }

    /// Nothing left in it: the store may forget the key (its fencing counter is kept apart).
    pub(crate) fn is_empty(&self) -> bool {
        self.writer.is_none()
            && self.readers.is_empty()
            && self.writer_waiting.is_none()
            && self.permits.is_none()
            && self.queue.is_none()
    }
}

/// What a twin's try found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TwinReply {
    /// Granted: a write grant takes the next fencing token, a read grant shows the latest.
    Granted,
    /// Held, for at most this long.
    Held(Duration),
    /// A fair try refused: behind other waiters, or the head while the lock is held (for at
    /// most `remaining`); its place in the queue.
    Queued {
        place: u64,
        behind: bool,
        remaining: Duration,
    },
    /// The key is a semaphore of this many permits, some held, not the count asked for.
    Mismatch(u32),
}
