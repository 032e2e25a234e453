//! The write side of a key's lock, which is also the exclusive lock ([`lock`](crate::lock) and
//! [`write_lock`](crate::write_lock) take it): one owner at a time and no reader meanwhile.
//! A writer that finds the lock held sets the writer-waiting mark, which keeps new readers out
//! (writer preference). Every grant takes the next fencing token. Scripts:
//! `scripts/write/{acquire,release,keep}.lua` (`keep`: a release within `hold_at_least`); renewals share `scripts/extend_many.lua`.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use crate::script::{LuaScript, ScriptCall};

use super::{acquire_invocation, Tokens, Try, TwinEntry, TwinReply};

static ACQUIRE: LazyLock<LuaScript> =
    LazyLock::new(|| super::script(include_str!("../../scripts/write/acquire.lua")));
pub(super) static RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("../../scripts/write/release.lua")));
pub(super) static KEEP: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("../../scripts/write/keep.lua")));

/// How long a fencing counter ([`Tokens::Counter`]) lives, after the server's clock has
/// passed its token, following a grant with this lease: the lease, so that no key outlives
/// its lock by much more than one lease. Safe to let it lapse: no token below the server
/// clock in microseconds is granted, and by then the clock has passed the counter's value
/// (`scripts/write/acquire.lua`, `store/redlock.rs`).
pub(crate) fn fence_ttl(lease: Duration) -> Duration {
    lease
}

pub(super) fn acquire_call(attempt: &Try<'_>, tokens: Tokens) -> ScriptCall {
    let mut call = acquire_invocation(&ACQUIRE, attempt, tokens);
    super::token_source(
        &mut call,
        attempt.fencing,
        tokens,
        attempt.lease,
        attempt.proposed,
    );
    super::writer_waiting_args(&mut call, attempt.writer_waiting, attempt.refused_before);
    call.arg(attempt.key.writer_waiting());
    call
}

pub(super) fn acquire_twin(entry: &mut TwinEntry, attempt: &Try<'_>, now: Instant) -> TwinReply {
    entry.purge(now);
    if let Some(until) = entry.writer_blocked_until(attempt.owner) {
        entry.mark_writer_waiting(attempt.writer_waiting, now);
        return TwinReply::Held(until - now);
    }
    entry.writer = Some((attempt.owner.to_owned(), now + attempt.lease));
    if attempt.refused_before {
        entry.writer_waiting = None;
    }
    TwinReply::Granted
}

pub(super) fn release_twin(entry: &mut TwinEntry, owner: &str, now: Instant) -> bool {
    entry.purge(now);
    let ours = entry.writer.as_ref().is_some_and(|(o, _)| o == owner);
    if ours {
        entry.writer = None;
    }
    ours
}
