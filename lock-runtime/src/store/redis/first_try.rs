//! A write try's first request on Redis when it needs no script ([`FirstTry`]): `SET NX PX GET`,
//! with `TIME` in `MULTI`/`EXEC` when the token is the server clock. Redis' command for the
//! kind's bare claim of a key (`Try::bare_claim_allowed`). Neighbours: `store/redis.rs` sends it
//! and, on a refusal, the kind's script; its reply reads as the script's would
//! (`kind::ScriptReply`).

use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::kind::{millis, Tokens, Try};
use crate::protocol::Call;

/// The first try of a write grant, when it needs no script: a bare `SET key owner NX PX lease
/// GET` without a fencing token, and on a store with [`Tokens::Clock`] that `SET` and `TIME`
/// in one `MULTI`/`EXEC` — about a microsecond of server time more than the `SET`, where a
/// script call costs several. It neither looks at nor sets the writer-waiting mark, and a
/// refusal does not say how long the holder keeps the lock: so a refused first try is
/// followed at once by the script, which sets the mark (keeping new readers out, and asking
/// the last reader's release to wake this writer) and says how long to wait. `GET` makes the
/// same try sent again (after a lost reply) a grant, as the script does, but without
/// restarting the lease: the caller's deadline runs from before the first send, so it ends
/// before the key's.
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
        if !attempt.bare_claim_allowed() {
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
