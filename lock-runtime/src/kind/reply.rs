//! How the replies of a kind's scripts read: an acquire script's `{granted, value}` and its
//! third element ([`ScriptReply`], [`read_acquire_reply`]), and a batch renewal's one answer
//! per lease ([`read_extend_many_reply`]). Neighbours: `attempt.rs` builds the calls answered
//! here; the Redis stores send them and hand the [`AcquireReply`] on.

use std::time::Duration;

use super::attempt::Try;
use super::{semaphore, Kind};
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::protocol::{AcquireReply, FencingToken, Renewed, TooLow};

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
/// refused proposal ([`Tokens::Counter`](super::Tokens::Counter)), `{2, hint, clock}`
/// ([`AcquireReply::TooLow`]).
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

/// Reads the reply of [`extend_many_call`](super::extend_many_call) for `asked` renewals: one 1
/// (renewed) or 0 (no longer ours) per renewal.
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
