//! The read side of a key's lock ([`read_lock`](crate::read_lock)): any number of readers at
//! once, no writer meanwhile. Every reader has its own owner token and lease — while readers
//! hold the lock, its key is a sorted set of their tokens, each scored by when its lease ends —
//! so no reader's release, crash or expiry frees another. A reader does not enter while a writer holds the lock or waits for it
//! (writer preference), and its grant takes no token of its own: the server clock (or, where a
//! counter lives, the latest write token), which sorts between the write tokens around it.
//! Scripts: `scripts/read/{acquire,release}.lua`; renewals share `scripts/extend_many.lua`.

use std::sync::LazyLock;
use std::time::Instant;

use crate::script::{LuaScript, ScriptCall};

use super::{acquire_invocation, Tokens, Try, TwinEntry, TwinReply};

static ACQUIRE: LazyLock<LuaScript> =
    LazyLock::new(|| super::script(include_str!("../../scripts/read/acquire.lua")));
pub(super) static RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| super::script(include_str!("../../scripts/read/release.lua")));

pub(super) fn acquire_call(attempt: &Try<'_>, tokens: Tokens) -> ScriptCall {
    let mut call = acquire_invocation(&ACQUIRE, attempt, tokens);
    call.arg(attempt.key.writer_waiting());
    call
}

pub(super) fn acquire_twin(entry: &mut TwinEntry, attempt: &Try<'_>, now: Instant) -> TwinReply {
    entry.purge(now);
    if let Some((_, until)) = &entry.writer {
        return TwinReply::Held(*until - now);
    }
    // A semaphore's permits keep a reader out as a writer does.
    if let Some(until) = entry.permits_until() {
        return TwinReply::Held(until - now);
    }
    if let Some(until) = entry.writer_waiting {
        if !entry.readers.contains_key(attempt.owner) {
            return TwinReply::Held(until - now);
        }
    }
    entry
        .readers
        .insert(attempt.owner.to_owned(), now + attempt.lease);
    TwinReply::Granted
}

pub(super) fn release_twin(entry: &mut TwinEntry, owner: &str, now: Instant) -> bool {
    entry.purge(now);
    entry.readers.remove(owner).is_some()
}
