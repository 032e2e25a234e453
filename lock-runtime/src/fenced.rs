//! Fenced writes: the resource side of [`FencingToken`]s. A lock's lease can run out while its
//! holder is paused (a GC pause, a stalled VM, SIGSTOP); the holder then wakes believing it
//! still holds the lock and writes. A store that remembers the highest token it has accepted
//! and refuses lower ones turns that late write into a refusal. This module is that check for
//! data kept in Redis ([`set`], and [`pipe`] for any write commands: one Lua script,
//! `scripts/fenced/write.lua`), the operator's [`raise`] of a fence after a forced unlock
//! (`scripts/fenced/raise.lua`), and, in these docs, the same patterns for SQL databases. Tokens
//! come from the lock side: [`LockGuard::fencing_token`](crate::LockGuard::fencing_token) or,
//! inside an annotated fn, [`current`](crate::current).
//!
//! # Redis
//!
//! Send fenced writes on a [`redis::aio::ConnectionManager`] (the `redis` crate's
//! `connection-manager` feature): it reconnects by itself when the data's Redis restarts or the
//! connection drops, where a `MultiplexedConnection` stays broken until the application makes a
//! new one.
//!
//! ```no_run
//! use distlock::fenced::{self, FencedWrite};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! // Once, at start-up; clones share the connection.
//! let mut conn = redis::Client::open("redis://data.internal:6379")?
//!     .get_connection_manager()
//!     .await?;
//! let guard = distlock::lock("order:42").acquire().await?;
//! let token = guard.fencing_token().expect("fencing is on by default");
//! // … a long pause here may let the lease run out and another holder write …
//! match fenced::set(&mut conn, "order:42:status", "paid", token).await? {
//!     FencedWrite::Applied(()) => {}
//!     FencedWrite::Stale { highest } => {
//!         // Someone with a newer grant (token `highest`) wrote since: nothing was changed.
//!         return Err(format!("lost the lock; {highest} wrote after us").into());
//!     }
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Behavior
//!
//! - **Where the token is kept:** in a companion string key, [`fence_key`]`(key)`: `{key}:fence`,
//!   or `key:fence` when `key` already has a Cluster hash tag such as `{user:1}:balance`. A
//!   companion key works whatever type the data is (string, hash, list, stream …) and leaves
//!   the data exactly as a plain write would. Both keys share a hash slot, so the script runs on
//!   Redis Cluster as on a single node. (The one exception: a key holding a `}` that does not
//!   close a hash tag, such as `a}b`, has no companion in its slot; on Cluster the script then
//!   fails with `CROSSSLOT`: give such a key a hash tag or choose a fence key with
//!   [`FencedPipeline::fence_key`].)
//! - **Which tokens pass:** a token at least the highest accepted one. Equal passes, so one grant
//!   may write as often as it likes; lower is refused with [`FencedWrite::Stale`] and nothing is
//!   changed. The check, the commands and raising the fence are one script: atomic.
//! - **Its lifetime:** the fence key takes the data key's time to live after each write, so an
//!   expiring value takes its fence along (after that, a stale holder's write is accepted as a
//!   first write would be). A value without a TTL, or deleted by the write, keeps its fence
//!   for good, so a stale holder cannot write it back. The fence is as durable as the data: a
//!   Redis that restarts empty has lost both.
//! - **Use one lock per fenced key.** Tokens increase per lock name; two locks guarding one key
//!   would compare unrelated tokens.
//! - **Failures:** a command that fails (e.g. `WRONGTYPE`) is a [`redis::RedisError`]; as in
//!   `MULTI`/`EXEC`, commands that ran before it are not undone. A fence key that holds no
//!   token is an error naming it.
//! - **When the data's Redis restarts** (or the connection drops): the write in flight fails
//!   with the connection's error, and may or may not have run (as any Redis command). On a
//!   `ConnectionManager` the next writes reconnect by themselves — one or a few fail while it
//!   does — and the script, gone from the restarted server's cache, is sent again with its
//!   source. Retrying a failed write with the same token is safe for the fence (an equal token
//!   passes); retry only writes that are safe to run twice (a `SET`, not an `INCR`).
//! - **Any connection:** every function takes a [`FencedConnection`]: any
//!   [`redis::aio::ConnectionLike`] of the `redis` crate distlock uses (1.x) — a
//!   `ConnectionManager` (recommended), a multiplexed connection, a Cluster connection (which
//!   follows failovers itself). A connection of another major version of `redis` is refused at
//!   compile time with a message that says so. It is a separate connection from distlock's:
//!   the data may live on another Redis than the locks.
//!
//! ## After a forced unlock
//!
//! [`Client::force_unlock`](crate::Client::force_unlock) (`distlock unlock --force`) frees a
//! lock whose holders may still be running; it returns a token above every one they hold.
//! Until something writes with a newer token, their late writes still pass the fence. [`raise`]
//! the fence of each key the lock guards to that token (`distlock fence raise KEY TOKEN
//! --data-url URL`): from then on their writes are [`FencedWrite::Stale`], and the next holder's
//! (whose token is higher still) pass.
//!
//! # PostgreSQL
//!
//! With the `postgres` feature, `fenced::postgres` has two helpers on `tokio-postgres`. When
//! the locks are kept in PostgreSQL ([`Config::postgres`](crate::Config::postgres)) and the
//! data lives in the same database, `postgres::begin(&guard, &mut client)` opens a
//! transaction that holds the lock itself: it takes the key's turn for its length and
//! confirms the grant still holds the lock, so its writes commit while the lock is held or
//! not at all. For data in another database, `postgres::update(table, token)` is the fence
//! column below as one call, telling a refused row from a missing one.
//!
//! # SQL databases
//!
//! Keep the highest accepted token in a column of the row it guards, and make the check part of
//! the write's own `WHERE`: one statement, so the database's row lock makes check and write
//! atomic (never a `SELECT` of the fence followed by an `UPDATE`). Bind the token with
//! [`FencingToken::as_i64`] (SQL integers are signed 64-bit). **0 rows updated means refused**:
//! a newer holder has written (or the row does not exist).
//!
//! ```sql
//! ALTER TABLE stock ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
//!
//! -- PostgreSQL
//! UPDATE stock SET quantity = $1, fence = $2 WHERE sku = $3 AND fence <= $2;
//! -- SQLite
//! UPDATE stock SET quantity = ?1, fence = ?2 WHERE sku = ?3 AND fence <= ?2;
//! -- MySQL / MariaDB (positional: the token is bound twice)
//! UPDATE stock SET quantity = ?, fence = ? WHERE sku = ? AND fence <= ?;
//!
//! -- Insert or update (PostgreSQL, and SQLite 3.24+ with ?N placeholders)
//! INSERT INTO stock (sku, quantity, fence) VALUES ($3, $1, $2)
//! ON CONFLICT (sku) DO UPDATE SET quantity = excluded.quantity, fence = excluded.fence
//! WHERE stock.fence <= excluded.fence;
//! ```
//!
//! `examples/fenced_sqlite.rs` runs this on SQLite (rusqlite) with a holder paused past its
//! lease, whose late `UPDATE` finds 0 rows.
//!
//! The counterpart of [`raise`], after a forced unlock: raise the fence column to the returned
//! token, never lower it. 0 rows updated means the fence already held that token or a higher
//! one (or the row does not exist).
//!
//! ```sql
//! UPDATE stock SET fence = $1 WHERE sku = $2 AND fence < $1;  -- PostgreSQL
//! UPDATE stock SET fence = ?1 WHERE sku = ?2 AND fence < ?1;  -- SQLite
//! UPDATE stock SET fence = ? WHERE sku = ? AND fence < ?;     -- MySQL (token twice)
//! ```

use std::sync::LazyLock;

use redis::{Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, ToRedisArgs, Value};

use crate::script::LuaScript;

use crate::protocol::FencingToken;

#[cfg(feature = "postgres")]
#[path = "fenced_postgres.rs"]
pub mod postgres;

static WRITE: LazyLock<LuaScript> =
    LazyLock::new(|| fenced_script(include_str!("../scripts/fenced/write.lua")));

static RAISE: LazyLock<LuaScript> =
    LazyLock::new(|| fenced_script(include_str!("../scripts/fenced/raise.lua")));

/// A fenced script: its body after what a token is (`scripts/fenced/token.lua`).
fn fenced_script(body: &str) -> LuaScript {
    LuaScript::new(&format!(
        "{}\n{body}",
        include_str!("../scripts/fenced/token.lua")
    ))
}

/// What became of a fenced write.
///
/// `#[must_use]`: ignoring a [`Stale`](FencedWrite::Stale) outcome is exactly the bug fencing
/// exists to catch.
///
/// ```no_run
/// # async fn example(conn: &mut redis::aio::ConnectionManager, token: distlock::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
/// use distlock::fenced::{self, FencedWrite};
///
/// let outcome = fenced::pipe("counter", token)
///     .cmd(redis::cmd("INCR").arg("counter"))
///     .query_async::<(i64,)>(conn)
///     .await?;
/// match outcome {
///     FencedWrite::Applied((value,)) => println!("counter is {value}"),
///     FencedWrite::Stale { highest } => println!("refused: token {highest} wrote since"),
/// }
/// # Ok(()) }
/// ```
#[must_use = "a stale write was refused and changed nothing; handle `FencedWrite::Stale`"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FencedWrite<T = ()> {
    /// The token was current (at least the highest accepted one): the commands ran and the
    /// fence now holds the token. Carries the commands' replies.
    Applied(T),
    /// The token was below `highest`, the token of a newer grant that has written since: the
    /// lock was lost (its lease ran out) and taken by someone else. Nothing was changed.
    Stale {
        /// The highest token the resource has accepted.
        highest: FencingToken,
    },
}

impl<T> FencedWrite<T> {
    /// Whether the write was applied.
    pub fn is_applied(&self) -> bool {
        matches!(self, FencedWrite::Applied(_))
    }

    /// The replies of an applied write, `None` if it was refused.
    pub fn applied(self) -> Option<T> {
        match self {
            FencedWrite::Applied(replies) => Some(replies),
            FencedWrite::Stale { .. } => None,
        }
    }
}

/// The companion key that keeps the highest token accepted for `key`: `{key}:fence`, or
/// `key:fence` when `key` already has a Cluster hash tag (`{user:1}:balance` gives
/// `{user:1}:balance:fence`). Either way it lands in `key`'s hash slot — except for a key
/// holding a `}` outside a hash tag (`a}b`, `a{}b`), which gets `key:fence` (fine on a single
/// node; on Cluster choose a fence key yourself, see [`FencedPipeline::fence_key`]).
///
/// ```
/// assert_eq!(distlock::fenced::fence_key("order:42"), "{order:42}:fence");
/// assert_eq!(distlock::fenced::fence_key("{user:1}:balance"), "{user:1}:balance:fence");
/// ```
pub fn fence_key(key: &str) -> String {
    if has_hash_tag(key) || key.contains('}') {
        format!("{key}:fence")
    } else {
        // No `}`: the first `}` of the result is the one added, so the tag is the whole key,
        // and a key without a tag hashes as a whole.
        format!("{{{key}}}:fence")
    }
}

/// Whether Redis Cluster would hash only part of `key`: a `{` followed later by a `}` with at
/// least one byte between them.
fn has_hash_tag(key: &str) -> bool {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|len| len > 0)
}

/// A connection a fenced write can be sent on: any [`redis::aio::ConnectionLike`] of the
/// `redis` crate distlock uses, major version 1. A connection of another major version
/// (`redis` 0.27, say) is another type, and the compiler says so in these words.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a connection of the `redis` crate distlock uses (major version 1)",
    label = "not a `redis` 1.x connection",
    note = "fenced writes take a connection of the `redis` major version distlock depends on: \
            depend on `redis = \"1\"` (two major versions of `redis` in one build are two \
            different crates, and their connections are different types)"
)]
pub trait FencedConnection: redis::aio::ConnectionLike {}

impl<C: redis::aio::ConnectionLike> FencedConnection for C {}

/// `SET key value`, only if `token` is current for `key` (see the module's "Behavior").
///
/// ```no_run
/// # async fn example(conn: &mut redis::aio::ConnectionManager, token: distlock::FencingToken) -> redis::RedisResult<()> {
/// let outcome = distlock::fenced::set(conn, "inventory:apples", 41, token).await?;
/// assert!(outcome.is_applied(), "lost the lock while selling");
/// # Ok(()) }
/// ```
pub async fn set<C, V>(
    conn: &mut C,
    key: &str,
    value: V,
    token: FencingToken,
) -> RedisResult<FencedWrite>
where
    C: FencedConnection,
    V: ToRedisArgs,
{
    let outcome = pipe(key, token)
        .cmd(redis::cmd("SET").arg(key).arg(value))
        .query_async::<Value>(conn)
        .await?;
    Ok(match outcome {
        FencedWrite::Applied(_) => FencedWrite::Applied(()),
        FencedWrite::Stale { highest } => FencedWrite::Stale { highest },
    })
}

/// What [`raise`] found, and did.
#[must_use = "a fence already at least the token was left as it was; say what was found"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceRaise {
    /// The fence was below the token, or absent (`previous` is `None`), and now holds the
    /// token: every lower token is stale from now on.
    Raised {
        /// The token the fence held before, if any.
        previous: Option<FencingToken>,
    },
    /// The fence already held the token or a higher one, and was left as it was (a fence is
    /// never lowered). Lower tokens were stale already.
    AlreadyAtLeast {
        /// The token the fence holds.
        highest: FencingToken,
    },
}

impl FenceRaise {
    /// The token the fence holds now: the one raised to, or the higher one it held.
    pub fn highest(&self, token: FencingToken) -> FencingToken {
        match *self {
            FenceRaise::Raised { .. } => token,
            FenceRaise::AlreadyAtLeast { highest } => highest,
        }
    }
}

/// Raises the fence of `key` ([`fence_key`]`(key)`) to `token` if it is lower or absent,
/// so every fenced write of `key` with a lower token is refused from then on; a fence at
/// `token` or higher is left as it was (never lowered). The operator's move after
/// [`Client::force_unlock`](crate::Client::force_unlock), with the token it returned (see the
/// module's "After a forced unlock"). The fence then lives as after a fenced write: with the
/// data's time to live, or for good when the data has none.
///
/// # Errors
///
/// The connection's errors, and a fence key that holds something other than a fencing token
/// (another type, or a string that is no decimal number): an error naming the key, and
/// nothing is changed.
///
/// ```no_run
/// # async fn example(conn: &mut redis::aio::ConnectionManager) -> Result<(), Box<dyn std::error::Error>> {
/// use distlock::fenced::{self, FenceRaise};
///
/// let forced = distlock::Client::new(distlock::Config::from_env()?)?
///     .force_unlock("order:42")
///     .await?;
/// match fenced::raise(conn, "order:42", forced.token).await? {
///     FenceRaise::Raised { previous } => println!("fence raised from {previous:?}"),
///     FenceRaise::AlreadyAtLeast { highest } => println!("fence already at {highest}"),
/// }
/// # Ok(()) }
/// ```
pub async fn raise<C: FencedConnection>(
    conn: &mut C,
    key: &str,
    token: FencingToken,
) -> RedisResult<FenceRaise> {
    let mut call = RAISE.prepare_invoke();
    call.key(fence_key(key)).key(key).arg(token.get());
    let reply: Value = call.invoke_async(conn).await?;
    read_raise_reply(reply)
}

/// Reads `raise.lua`'s reply: `{1, previous or nil}` raised, `{0, highest}` left.
fn read_raise_reply(reply: Value) -> RedisResult<FenceRaise> {
    let unexpected = |what: String| {
        RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "fence raise: unexpected reply from the script",
            what,
        ))
    };
    let Value::Array(items) = reply else {
        return Err(unexpected(format!("{reply:?}")));
    };
    let mut items = items.into_iter();
    let (Some(done), found) = (items.next(), items.next()) else {
        return Err(unexpected("an empty array".to_owned()));
    };
    let found = match found {
        None | Some(Value::Nil) => None,
        Some(value) => Some(parse_token(redis::from_redis_value::<String>(value)?)?),
    };
    match (done, found) {
        (Value::Int(1), previous) => Ok(FenceRaise::Raised { previous }),
        (Value::Int(0), Some(highest)) => Ok(FenceRaise::AlreadyAtLeast { highest }),
        (other, found) => Err(unexpected(format!("{other:?} with {found:?}"))),
    }
}

/// A token as the scripts return it: a decimal u64 string.
fn parse_token(text: String) -> RedisResult<FencingToken> {
    text.parse::<u64>().map(FencingToken).map_err(|_| {
        RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "fenced write: unexpected reply from the script",
            format!("a token out of the u64 range: {text}"),
        ))
    })
}

/// Starts a [`FencedPipeline`]: write commands on `key` (and keys in its hash slot) that run
/// only if `token` is current for `key`.
///
/// ```no_run
/// # async fn example(conn: &mut redis::aio::ConnectionManager, token: distlock::FencingToken) -> redis::RedisResult<()> {
/// use distlock::fenced::{self, FencedWrite};
///
/// let outcome = fenced::pipe("order:42", token)
///     .cmd(redis::cmd("HSET").arg("order:42").arg("status").arg("paid"))
///     .cmd(redis::cmd("HINCRBY").arg("order:42").arg("version").arg(1))
///     .query_async::<(i64, i64)>(conn)
///     .await?;
/// if let FencedWrite::Stale { highest } = outcome {
///     eprintln!("not written: the lock was lost, token {highest} wrote since");
/// }
/// # Ok(()) }
/// ```
pub fn pipe(key: &str, token: FencingToken) -> FencedPipeline {
    FencedPipeline {
        key: key.to_owned(),
        fence_key: fence_key(key),
        token,
        commands: Vec::new(),
        unsupported_arg: false,
    }
}

/// Write commands that run atomically, and only if a fencing token is current for the key they
/// guard; made by [`pipe`].
///
/// Reads like [`redis::Pipeline`]: [`cmd`](Self::cmd) adds a command, and
/// [`query_async`](Self::query_async) returns the replies as one value, a tuple or `Vec` with
/// one element per command (`(T,)` for a single command). Unlike a pipeline, the commands run
/// as one Lua script: nothing else runs between the check and the last command.
///
/// ## Behavior
///
/// - The commands must touch only the guarded key and keys in its hash slot (on Cluster the
///   script runs on the guarded key's node; on a single node any key works, but keep to the
///   rule so the code survives a move to Cluster).
/// - No commands: the fence alone is raised to the token (when current), which makes every
///   lower token stale from then on without writing data.
/// - The rest as for the module: equal tokens pass, lower ones change nothing, the fence key
///   mirrors the guarded key's TTL.
///
/// ```no_run
/// # async fn example(conn: &mut redis::aio::ConnectionManager, token: distlock::FencingToken) -> redis::RedisResult<()> {
/// // An expiring value: the fence key takes the same time to live.
/// let outcome = distlock::fenced::pipe("session:7", token)
///     .cmd(redis::cmd("SET").arg("session:7").arg("data").arg("EX").arg(3600))
///     .query_async::<()>(conn)
///     .await?;
/// assert!(outcome.is_applied());
/// # Ok(()) }
/// ```
#[must_use = "a fenced pipeline does nothing until `query_async`"]
#[derive(Clone)]
pub struct FencedPipeline {
    key: String,
    fence_key: String,
    token: FencingToken,
    /// Each command's arguments, its name first.
    commands: Vec<Vec<Vec<u8>>>,
    /// A command had an argument that is not plain bytes (a `cursor_arg`, which only
    /// `SCAN`-like iteration fills in).
    unsupported_arg: bool,
}

impl std::fmt::Debug for FencedPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The commands' arguments are the user's data and may hold secrets: only their count.
        f.debug_struct("FencedPipeline")
            .field("key", &self.key)
            .field("fence_key", &self.fence_key)
            .field("token", &self.token)
            .field("commands", &self.commands.len())
            .finish()
    }
}

impl FencedPipeline {
    /// Adds a write command (built as usual: `redis::cmd("HSET").arg(…)`).
    pub fn cmd(mut self, cmd: &Cmd) -> Self {
        let mut args = Vec::new();
        for arg in cmd.args_iter() {
            match arg {
                redis::Arg::Simple(bytes) => args.push(bytes.to_vec()),
                // A cursor, or whatever a later redis version adds: nothing a write passes.
                _ => self.unsupported_arg = true,
            }
        }
        self.commands.push(args);
        self
    }

    /// Keeps the highest accepted token in `fence_key` instead of [`fence_key`]`(key)`, e.g. a
    /// key chosen for Cluster (it must share the guarded key's hash slot). Use the same fence
    /// key for every write of the guarded key. Defaults to [`fence_key`]`(key)`.
    pub fn fence_key(mut self, fence_key: &str) -> Self {
        self.fence_key = fence_key.to_owned();
        self
    }

    /// Runs the commands if the token is current, returning their replies as `T` (a tuple or
    /// `Vec` with one element per command), or [`FencedWrite::Stale`] with the highest token
    /// accepted so far.
    ///
    /// # Errors
    ///
    /// The connection's errors, a command's error reply (commands before it stay applied), a
    /// fence key that does not hold a token, and replies that do not convert to
    /// `T`.
    pub async fn query_async<T: FromRedisValue>(
        &self,
        conn: &mut impl FencedConnection,
    ) -> RedisResult<FencedWrite<T>> {
        if self.unsupported_arg {
            return Err(RedisError::from((
                ErrorKind::Client,
                "fenced write",
                "a command has a cursor argument (`cursor_arg`), which only SCAN-like iteration \
                 fills in; pass the cursor as a plain argument"
                    .to_owned(),
            )));
        }
        if let Some(long) = self
            .commands
            .iter()
            .find(|command| command.len() > MAX_COMMAND_ARGS)
        {
            return Err(RedisError::from((
                ErrorKind::Client,
                "fenced write",
                format!(
                    "a command of {} arguments is more than the script can pass on (at most \
                     {MAX_COMMAND_ARGS}: Lua's `unpack` limit); split it into several commands \
                     of one fenced pipeline",
                    long.len()
                ),
            )));
        }
        let mut call = WRITE.prepare_invoke();
        call.key(&self.fence_key)
            .key(&self.key)
            .arg(self.token.get())
            .arg(self.commands.len());
        for command in &self.commands {
            call.arg(command.len());
            for arg in command {
                call.arg(arg.as_slice());
            }
        }
        let reply: Value = call.invoke_async(conn).await?;
        read_reply(reply)
    }
}

/// The most arguments (the command's name included) one fenced command may have: the script
/// passes them on with Lua's `unpack`, whose limit is Redis's Lua stack (about 8,000).
const MAX_COMMAND_ARGS: usize = 7_000;

/// Reads the script's reply: `{1, reply, …}` applied, `{0, highest}` refused.
fn read_reply<T: FromRedisValue>(reply: Value) -> RedisResult<FencedWrite<T>> {
    let unexpected = |what: String| {
        RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "fenced write: unexpected reply from the script",
            what,
        ))
    };
    let Value::Array(mut items) = reply else {
        return Err(unexpected(format!("{reply:?}")));
    };
    if items.is_empty() {
        return Err(unexpected("an empty array".to_owned()));
    }
    let replies = items.split_off(1);
    match &items[0] {
        Value::Int(1) => Ok(FencedWrite::Applied(redis::from_redis_value(
            Value::Array(replies),
        )?)),
        Value::Int(0) => {
            let highest: String = match replies.into_iter().next() {
                Some(value) => redis::from_redis_value(value)?,
                None => return Err(unexpected("a refusal without the highest token".to_owned())),
            };
            Ok(FencedWrite::Stale {
                highest: parse_token(highest)?,
            })
        }
        other => Err(unexpected(format!("{other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_without_braces_is_its_fence_keys_hash_tag() {
        assert_eq!(fence_key("inventory:apples"), "{inventory:apples}:fence");
        // A `{` alone opens no tag; wrapped, the whole key becomes the tag.
        assert_eq!(fence_key("a{b"), "{a{b}:fence");
    }

    #[test]
    fn a_key_with_a_hash_tag_keeps_it() {
        assert_eq!(fence_key("{user:1}:balance"), "{user:1}:balance:fence");
        assert_eq!(fence_key("x{a}{b}"), "x{a}{b}:fence");
    }

    #[test]
    fn a_key_with_a_stray_closing_brace_gets_a_plain_suffix() {
        assert_eq!(fence_key("a{}b"), "a{}b:fence");
        assert_eq!(fence_key("a}b"), "a}b:fence");
    }

    #[test]
    fn replies_read_as_applied_or_stale() {
        let applied: FencedWrite<(String,)> =
            read_reply(Value::Array(vec![Value::Int(1), Value::Okay])).expect("applied");
        assert_eq!(applied, FencedWrite::Applied(("OK".to_owned(),)));
        let stale: FencedWrite<()> = read_reply(Value::Array(vec![
            Value::Int(0),
            Value::BulkString(b"18446744073709551615".to_vec()),
        ]))
        .expect("stale");
        assert_eq!(
            stale,
            FencedWrite::Stale {
                highest: FencingToken(u64::MAX)
            }
        );
        assert!(read_reply::<()>(Value::Array(vec![
            Value::Int(0),
            Value::BulkString(b"18446744073709551616".to_vec()),
        ]))
        .is_err());
        assert!(read_reply::<()>(Value::Nil).is_err());
    }

    #[test]
    fn raise_replies_read_as_raised_or_already_at_least() {
        let token = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        assert_eq!(
            read_raise_reply(Value::Array(vec![Value::Int(1), Value::Nil])).expect("raised"),
            FenceRaise::Raised { previous: None }
        );
        assert_eq!(
            read_raise_reply(Value::Array(vec![Value::Int(1), token("7")])).expect("raised"),
            FenceRaise::Raised {
                previous: Some(FencingToken(7))
            }
        );
        let kept = read_raise_reply(Value::Array(vec![Value::Int(0), token("9")])).expect("kept");
        assert_eq!(
            kept,
            FenceRaise::AlreadyAtLeast {
                highest: FencingToken(9)
            }
        );
        assert_eq!(kept.highest(FencingToken(8)), FencingToken(9));
        assert!(read_raise_reply(Value::Array(vec![Value::Int(0), Value::Nil])).is_err());
        assert!(read_raise_reply(Value::Array(vec![])).is_err());
    }
}
