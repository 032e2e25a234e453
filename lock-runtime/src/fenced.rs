//! Fenced writes: the resource side of [fencing tokens](crate::FencingToken). A lock alone
//! cannot stop a holder that was paused past its lease (a GC pause, a stalled VM, a slow
//! network) from writing after the next holder; the resource can, if every write carries the
//! writer's token and the resource refuses a token lower than one it has already accepted
//! (Kleppmann's fencing). This module gives both halves a Redis user needs; the lock side is
//! [`LockGuard::fencing_token`](crate::LockGuard::fencing_token) and
//! [`current`](crate::current).
//!
//! ## In Redis: [`set`] and [`write`]
//!
//! One Lua script checks and writes atomically: the highest token accepted for a resource is
//! kept in its *fence key* (by default the data key plus `:fence`, [`fence_key`]); a write
//! carrying a token lower than that changes nothing and returns [`FencedWrite::Stale`]; an
//! equal or greater one is applied and recorded. Equal is accepted so one holder can write
//! several times with its token. The fence key never expires: it is part of the resource.
//!
//! ```no_run
//! # async fn f(conn: &mut redis::aio::MultiplexedConnection) -> Result<(), Box<dyn std::error::Error>> {
//! use distlock::fenced::{self, FencedWrite};
//!
//! let guard = distlock::lock("stock:42").acquire().await?;
//! let token = guard.fencing_token().expect("fencing is on by default");
//! match fenced::set(conn, "stock:42", 17, token).await? {
//!     FencedWrite::Applied => {}
//!     FencedWrite::Stale { highest } => eprintln!("a later holder (token {highest}) wrote first"),
//! }
//! // Any write command, fenced the same way (the fence key names the resource):
//! let mut push = redis::cmd("LPUSH");
//! push.arg("orders:42").arg("order-9");
//! fenced::write(conn, &fenced::fence_key("orders:42"), token, &push).await?;
//! # Ok(()) }
//! ```
//!
//! **Redis Cluster:** a script's keys must share a hash slot. Give the data key a hash tag
//! (`{stock:42}`): its fence key `{stock:42}:fence` then lands in the same slot, and so do the
//! keys a [`write`] command touches if they carry the same tag.
//!
//! ## In SQL: a fence column
//!
//! Keep the highest token in a column of the row it guards and make it part of the update's
//! condition; zero rows updated means the write was stale. Bind the token with
//! `i64::try_from(token)` (tokens are server-clock microseconds or Redlock counters, far
//! below `i64::MAX`; the conversion is checked, never wrapped):
//!
//! ```sql
//! -- once: ALTER TABLE stock ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
//! UPDATE stock SET quantity = $1, fence = $2 WHERE sku = $3 AND fence <= $2;
//! -- PostgreSQL: $1.. as above; SQLite: ?1..; MySQL: ? in order (bind the token twice)
//! ```
//!
//! `examples/fenced_sqlite.rs` runs this against SQLite with a holder paused past its lease.

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script, ToRedisArgs};

use crate::FencingToken;

/// The suffix [`fence_key`] adds to a data key.
pub const FENCE_SUFFIX: &str = ":fence";

/// The key that holds the highest token accepted for `key`: `key` + [`FENCE_SUFFIX`].
pub fn fence_key(key: &str) -> String {
    format!("{key}{FENCE_SUFFIX}")
}

/// What a fenced write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedWrite {
    /// The token was current (not below the highest accepted): the write was applied and the
    /// token recorded.
    Applied,
    /// A greater token was accepted before: nothing was written. The writer has lost its lock
    /// to a later holder and should stop.
    Stale {
        /// The highest token the resource has accepted.
        highest: u64,
    },
}

impl FencedWrite {
    /// Whether the write was applied.
    pub fn is_applied(self) -> bool {
        self == FencedWrite::Applied
    }
}

/// KEYS[1]: the fence key. ARGV[1]: the token; ARGV[2..]: the command to run if it is current.
/// Tokens are compared as integers (exact in Lua's doubles below 2^53: server-clock
/// microseconds stay below that until the year 2255). Returns {1} or {0, highest}.
const FENCED_WRITE: &str = r"
local highest = redis.call('GET', KEYS[1])
local token = tonumber(ARGV[1])
if highest and tonumber(highest) > token then
  return {0, highest}
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call(unpack(ARGV, 2))
return {1}
";

fn script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(FENCED_WRITE))
}

/// `SET key value`, only if `token` is not below the highest token accepted for `key` (kept in
/// [`fence_key`]`(key)`). See the [module docs](self).
pub async fn set<C, V>(
    conn: &mut C,
    key: &str,
    value: V,
    token: FencingToken,
) -> RedisResult<FencedWrite>
where
    C: ConnectionLike + Send,
    V: ToRedisArgs,
{
    let mut command = redis::cmd("SET");
    command.arg(key).arg(value);
    write(conn, &fence_key(key), token, &command).await
}

/// Runs `command` (any write: `SET`, `HSET`, `LPUSH`, `INCRBY`, …) only if `token` is not below
/// the highest token accepted in `fence_key`, and records `token` there — atomically, in one
/// script. Its reply is not returned. See the [module docs](self) (and for Cluster: the
/// command's keys must share `fence_key`'s slot).
pub async fn write<C>(
    conn: &mut C,
    fence_key: &str,
    token: FencingToken,
    command: &redis::Cmd,
) -> RedisResult<FencedWrite>
where
    C: ConnectionLike + Send,
{
    let mut invocation = script().key(fence_key);
    invocation.arg(token.get());
    for arg in command.args_iter() {
        match arg {
            redis::Arg::Simple(bytes) => {
                invocation.arg(bytes);
            }
            // Only SCAN-like commands have a cursor argument, and they write nothing.
            _ => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "a fenced write takes a write command, not an iterating one",
                )))
            }
        }
    }
    let reply: Vec<redis::Value> = invocation.invoke_async(conn).await?;
    match reply.as_slice() {
        [redis::Value::Int(1)] => Ok(FencedWrite::Applied),
        [redis::Value::Int(0), highest] => {
            let highest: String = redis::from_redis_value_ref(highest)?;
            Ok(FencedWrite::Stale {
                highest: highest.parse().map_err(|_| {
                    redis::RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "the fence key does not hold a token",
                        highest,
                    ))
                })?,
            })
        }
        other => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply from the fenced write",
            format!("{other:?}"),
        ))),
    }
}
