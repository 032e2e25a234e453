//! How a kind's rules are encoded for Redis, where they run as scripts: the text every lock
//! script starts with (`scripts/lock_key.lua`), the keys a script is given ([`lock_keys`]),
//! the arguments every acquire script takes alike, and where the store's fencing tokens come
//! from ([`Tokens`], which the scripts are told). Neighbours: each kind's file makes its
//! scripts with [`script`]; `operator_scripts.rs` and `election_scripts.rs` use the same
//! helpers; the Redis stores (`store/redis.rs`, `store/redlock.rs`) choose the [`Tokens`].

use std::time::Duration;

use super::attempt::Try;
use super::write;
use crate::protocol::{FencingToken, LockKey};
use crate::script::{LuaScript, ScriptCall};

/// Where a store's fencing tokens come from (the request may want none: [`Try::fencing`]).
/// The store's choice (`store/open.rs`), which the kind's scripts are told, since they read
/// or check the token: it lives beside them, as a kind does not know the stores above it.
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
pub(super) fn acquire_invocation(
    script: &'static LuaScript,
    attempt: &Try<'_>,
    tokens: Tokens,
) -> ScriptCall {
    let mut call = script.prepare_invoke();
    lock_keys(&mut call, attempt.key, tokens);
    call.arg(attempt.owner).arg(millis(attempt.lease));
    call
}

/// A duration in whole milliseconds for a script, at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The two arguments every writer's acquire script takes after its token source (write, fair
/// and multi-key: `scripts/write/acquire.lua`, `scripts/fair/acquire.lua`,
/// `scripts/multi/acquire.lua`): how long a writer that finds the lock held keeps new readers
/// out, in ms (zero, no mark, on its last try), and whether an earlier try of the request was
/// refused (`1`), so that a grant takes the mark away.
pub(crate) fn writer_waiting_args(
    call: &mut ScriptCall,
    writer_waiting: Duration,
    refused_before: bool,
) {
    call.arg(u64::try_from(writer_waiting.as_millis()).unwrap_or(u64::MAX))
        .arg(if refused_before { "1" } else { "0" });
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
