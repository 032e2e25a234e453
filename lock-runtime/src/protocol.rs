//! The words the two axes share — the lock kinds (`kind/`) and the stores (`store/`) — and
//! nothing else: a lock's Redis keys ([`LockKey`]), how a release is announced
//! ([`Announce`]), one request as a store sends it ([`Call`]), what a try found
//! ([`AcquireReply`]) and what a renewal learnt ([`Renewed`]). Both axes import this module,
//! and it imports neither, so the imports run one way: these words, then the kinds, then the
//! stores, then the lease, the watchdog and the acquire loop above them.

use std::time::Duration;

use crate::error::LockError;

/// Longest lock key accepted, in bytes: Redis would take more, but a key this long is a bug.
pub const MAX_KEY_LEN: usize = 4096;

/// The Redis keys of one lock. The user's key is wrapped in a hash tag, so the lock key and
/// its companions (fencing counter, writer-waiting mark, release channel) land in the same
/// Redis Cluster slot whatever the key contains: a `{` or `}` inside the key only moves where
/// the tag ends, and the same for every companion (they only add a suffix); a key that starts
/// with `}` (which would make an empty tag, which Redis ignores) is tagged with a hash of the
/// key instead. The prefix may hold neither brace ([`Config::key_prefix`](crate::Config::key_prefix)).
#[derive(Debug, Clone)]
pub(crate) struct LockKey {
    /// The key as the user gave it.
    pub(crate) name: String,
    /// `{prefix}{{name}}`: while a writer holds the lock, a string with its owner token; while
    /// readers hold it, a sorted set of their owner tokens scored by when their leases end.
    /// The keys beside it are made from it when a call needs them ([`LockKey::fence`] and
    /// the others), so a request that needs none (an uncontended write lock) makes none.
    pub(crate) lock: String,
}

impl LockKey {
    pub(crate) fn new(prefix: &str, name: String) -> Result<Self, LockError> {
        let reason = if name.is_empty() {
            Some("a lock key must not be empty".to_owned())
        } else if name.len() > MAX_KEY_LEN {
            Some(format!(
                "a lock key may be at most {MAX_KEY_LEN} bytes, this one has {}; hash long identifiers first",
                name.len()
            ))
        } else {
            None
        };
        if let Some(reason) = reason {
            // An oversized key is kept only in part (120 characters with the ellipsis): the
            // error may well be logged with `{:?}`.
            let key = match name.char_indices().nth(119) {
                Some((cut, _)) if name.len() > MAX_KEY_LEN => format!("{}…", &name[..cut]),
                _ => name,
            };
            return Err(LockError::InvalidKey { key, reason });
        }
        let lock = if name.starts_with('}') {
            // `{}…` would be an empty hash tag, which Redis ignores: the whole key would be
            // hashed and the lock's companion keys could land in other slots. Such a name gets
            // a tag made of a hash of the name instead, and a closing `#`: every other lock key
            // ends with `}`, so no name of the other form can make the same key.
            format!("{prefix}{{#{:016x}}}{name}#", fnv1a(name.as_bytes()))
        } else {
            format!("{prefix}{{{name}}}")
        };
        Ok(Self { name, lock })
    }

    /// The lock key and `suffix`, one allocation.
    fn beside(&self, suffix: &str) -> String {
        let mut key = String::with_capacity(self.lock.len() + suffix.len());
        key.push_str(&self.lock);
        key.push_str(suffix);
        key
    }

    /// `{prefix}{{name}}:fence`: the fencing counter.
    pub(crate) fn fence(&self) -> String {
        self.beside(":fence")
    }

    /// `{prefix}{{name}}:writer-waiting`: set by a writer that found the lock held; while it
    /// lives no new reader enters.
    pub(crate) fn writer_waiting(&self) -> String {
        self.beside(":writer-waiting")
    }

    /// `{prefix}{{name}}:released`: the channel a release is announced on.
    pub(crate) fn channel(&self) -> String {
        self.beside(":released")
    }

    /// `{prefix}{{name}}:leader`: an election's leader record (a hash: epoch, owner, value),
    /// written by the leader beside the lock it leads by (`election/`).
    pub(crate) fn leader(&self) -> String {
        self.beside(":leader")
    }

    /// `{prefix}{{name}}:queue`: the fair waiters in order (a sorted set of waiter ids).
    pub(crate) fn queue(&self) -> String {
        self.beside(":queue")
    }

    /// `{prefix}{{name}}:queue-deadlines`: when each fair waiter is dropped from the queue
    /// unless it tries again.
    pub(crate) fn queue_deadlines(&self) -> String {
        self.beside(":queue-deadlines")
    }
}

/// How an election's new leader announces itself (`e:` and the epoch,
/// `scripts/election/proclaim.lua`), so that the wake-ups
/// (`store/wake.rs`) tell it from a release and wake only observers with it.
pub(crate) const PROCLAIMED_PREFIX: &[u8] = b"e:";

/// An election's leader record as a store keeps it, beside the lock (`LockKey::leader`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawRecord {
    /// The leader's epoch: its grant's fencing token.
    pub(crate) epoch: u64,
    /// The owner token of the leader's grant.
    pub(crate) owner: String,
    /// What the leader publishes with its leadership.
    pub(crate) value: Option<Vec<u8>>,
    /// Which of the leader's values it is: 0 for the campaign's, greater for each later
    /// `Leadership::proclaim` (`election/proclaim.rs`), so that a changed value of one epoch
    /// is told from an older one.
    pub(crate) revision: u64,
}

/// How a store's release scripts announce a release to waiters: plain pub/sub, or sharded
/// pub/sub on Cluster (where the channel lives on the lock's own shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announce {
    /// `PUBLISH`.
    Publish,
    /// `SPUBLISH`.
    ShardedPublish,
}

impl Announce {
    /// The command the scripts run.
    pub(crate) fn command(self) -> &'static str {
        match self {
            Announce::Publish => "PUBLISH",
            Announce::ShardedPublish => "SPUBLISH",
        }
    }

    /// The release scripts' argument for `announce`: its command, or `''` for a give-back
    /// announced to nobody (a Redlock try that fell short: `RedisStore::give_back`).
    pub(crate) fn argument(announce: Option<Announce>) -> &'static str {
        announce.map_or("", Announce::command)
    }
}

/// 64-bit FNV-1a: a hash that stays the same across builds and platforms, for hash tags.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One request of a lock operation as a store sends it: a script call, or (a first try that
/// needs no script, `FirstTry`, `store/redis/first_try.rs`) a command or a pipeline built for it,
/// whose error replies are kept as values (a refusal can be an answer, not a failure): a
/// command's reply is its value, a pipeline's an array of them.
#[derive(Clone, Copy)]
pub(crate) enum Call<'a> {
    Script(&'a crate::script::ScriptCall),
    Command(&'a ::redis::Cmd),
    Pipeline(&'a ::redis::Pipeline),
}

impl Call<'_> {
    /// Whether the request is a transaction (`MULTI` … `EXEC`).
    pub(crate) fn is_transaction(&self) -> bool {
        matches!(self, Call::Pipeline(pipeline) if pipeline.is_transaction())
    }

    /// Sends the request (a script by its SHA, with its source on `NOSCRIPT`: `script.rs`).
    pub(crate) async fn query<T: ::redis::FromRedisValue>(
        self,
        connection: &mut impl ::redis::aio::ConnectionLike,
    ) -> ::redis::RedisResult<T> {
        match self {
            Call::Script(invocation) => invocation.invoke_async(connection).await,
            // The reply as it came, an error reply included (`query_async` would make it an
            // error of the call).
            Call::Command(cmd) => {
                ::redis::FromRedisValue::from_redis_value(connection.req_packed_command(cmd).await?)
                    .map_err(::redis::RedisError::from)
            }
            Call::Pipeline(pipeline) => pipeline.query_async(connection).await,
        }
    }

    /// [`query`](Self::query) on a multiplexed connection (the single-node and Sentinel
    /// stores' connections), each request awaited in place: the `redis` crate's
    /// `ConnectionLike` methods box every request's future — an allocation, and a copy of the
    /// future's state, a large one for a transaction — on the path every lock takes (a
    /// try, a release). What is sent and how the reply reads are the same as [`query`](Self::query)'s.
    pub(crate) async fn query_multiplexed<T: ::redis::FromRedisValue>(
        self,
        connection: &mut ::redis::aio::MultiplexedConnection,
    ) -> ::redis::RedisResult<T> {
        match self {
            Call::Script(invocation) => invocation.invoke_multiplexed(connection).await,
            Call::Command(cmd) => ::redis::FromRedisValue::from_redis_value(
                connection.send_packed_command(cmd).await?,
            )
            .map_err(::redis::RedisError::from),
            // A transaction's one reply is `EXEC`'s, after those of `MULTI` and each queued
            // command: its array of the commands' replies (error replies kept as values, as
            // the first try's pipeline asks), or nil when the transaction was aborted.
            Call::Pipeline(pipeline) if pipeline.is_transaction() => {
                let mut replies = connection
                    .send_packed_commands(pipeline, pipeline.len() + 1, 1)
                    .await?;
                match replies.pop() {
                    Some(reply @ (::redis::Value::Array(_) | ::redis::Value::Nil)) => {
                        ::redis::FromRedisValue::from_redis_value(reply)
                            .map_err(::redis::RedisError::from)
                    }
                    _ => Err(::redis::RedisError::from((
                        ::redis::ErrorKind::UnexpectedReturnType,
                        "no reply to EXEC",
                    ))),
                }
            }
            Call::Pipeline(pipeline) => pipeline.query_async(connection).await,
        }
    }
}

/// What a single try to take a lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// Granted, with this fencing token (`None`: a grant without one, see
    /// [`LockRequest::fencing`](crate::LockRequest::fencing)).
    Acquired(Option<FencingToken>),
    /// Held by another owner, whose lease ends in this much time (`None`: unknown, e.g. the
    /// key has no expiry).
    Held(Option<Duration>),
    /// A fair try (one with a seat in the key's queue) refused: `behind` other waiters (its next try is its
    /// heartbeat, unless the release that makes it the head wakes it first), or the queue's
    /// head while the lock is held (for at most `remaining`, as [`Held`](Self::Held) says).
    /// `place` is the waiter's place in the queue (0: not known), which its later tries ask
    /// for should they have to join again.
    Queued {
        place: u64,
        behind: bool,
        remaining: Option<Duration>,
    },
    /// A write try with a proposed token refused by a server whose fencing counter or clock
    /// is not below it (`Try::proposed`: Redlock's masters; Redlock tallies these and never
    /// hands one on). Nothing was written.
    TooLow(TooLow),
}

/// A server's refusal of a proposed fencing token (Redlock's masters, `store/redlock.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooLow {
    /// The least token the server would take now: one above its live counter and its clock.
    pub(crate) hint: u64,
    /// The server's clock in microseconds when it refused.
    pub(crate) clock: u64,
}

impl TooLow {
    /// From a script's `{2, hint, clock}`.
    pub(crate) fn read(hint: i64, clock: i64) -> Self {
        Self {
            hint: u64::try_from(hint).unwrap_or(0),
            clock: u64::try_from(clock).unwrap_or(0),
        }
    }
}

/// What a store learnt of one renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// The lease was reset: the grant is still ours.
    Yes,
    /// The grant is no longer ours (expired, taken over, deleted): the lease is lost.
    No,
    /// Not known (its shard or too many masters did not answer): try again while the lease
    /// may still be in force.
    Unknown,
}

impl From<bool> for Renewed {
    fn from(still_ours: bool) -> Self {
        if still_ours {
            Renewed::Yes
        } else {
            Renewed::No
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_and_fence_keys_share_a_hash_tag() {
        let key = LockKey::new("app:", "order:42".to_owned()).unwrap();
        assert_eq!(key.lock, "app:{order:42}");
        assert_eq!(key.fence(), "app:{order:42}:fence");
        assert_eq!(key.writer_waiting(), "app:{order:42}:writer-waiting");
        assert_eq!(key.channel(), "app:{order:42}:released");
        assert_eq!(key.queue(), "app:{order:42}:queue");
        assert_eq!(key.queue_deadlines(), "app:{order:42}:queue-deadlines");
    }

    #[test]
    fn empty_and_oversized_keys_are_invalid() {
        assert!(matches!(
            LockKey::new("p:", String::new()),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(matches!(
            LockKey::new("p:", "x".repeat(MAX_KEY_LEN + 1)),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(LockKey::new("p:", "ключ {with} spaces".to_owned()).is_ok());
    }

    #[test]
    fn every_key_of_a_lock_shares_its_slot_whatever_the_name_holds() {
        use ::redis::cluster_routing::Slot;
        for name in [
            "plain", "a{b", "a}b", "}", "}x", "}{x}", "{}", "{a}", "{{", "}}{", "x{}y",
        ] {
            let key = LockKey::new("distlock:", name.to_owned()).unwrap();
            let slot = Slot::for_key(&key.lock);
            for companion in [
                &key.fence(),
                &key.writer_waiting(),
                &key.channel(),
                &key.queue(),
                &key.queue_deadlines(),
            ] {
                assert_eq!(Slot::for_key(companion), slot, "{name:?}: {companion}");
            }
        }
        let tagged = LockKey::new("p:", "}x".to_owned()).unwrap();
        assert!(
            tagged.lock.starts_with("p:{#") && tagged.lock.ends_with("}}x#"),
            "{}",
            tagged.lock
        );
        // A crafted name of the plain form cannot make the same key.
        let hash = &tagged.lock["p:{".len().."p:{#0123456789abcdef".len()];
        let crafted = LockKey::new("p:", format!("{hash}}}x")).unwrap();
        assert_ne!(crafted.lock, tagged.lock);
    }
}

/// What a grant holds: a side of a key's read/write lock, or a semaphore permit.
///
/// A key has one lock with two sides: any number of readers at once, or one writer alone.
/// [`lock`](crate::lock) and [`write_lock`](crate::write_lock) take the write side (the exclusive lock), [`read_lock`](crate::read_lock) the
/// read side; the attribute chooses with `mode = "exclusive" | "write" | "read"`. A key can
/// instead be a semaphore ([`semaphore`](crate::semaphore)): at most N holders at once, each with a permit of
/// its own. A key is one or the other at a time: while permits are held, writers and readers
/// of the key wait, and while a writer or readers hold it, permits wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// Exclusive: no other writer and no reader holds the key meanwhile. Every write grant has
    /// a fencing token of its own, greater than every earlier write token of the key.
    Write,
    /// Shared among readers, excluding writers. A read grant takes no token of its own: its
    /// token sorts between the write tokens of the key around it.
    Read,
    /// One of a semaphore's N permits ([`semaphore`](crate::semaphore)): at most N holders at once. Like a read
    /// grant, a permit takes no token of its own (see [`LockGuard::fencing_token`](crate::LockGuard::fencing_token)).
    Semaphore,
}

/// A fencing token: a number handed out with every grant of a key, strictly greater than every
/// token handed out for that key before (also across a restart of a Redis without persistence,
/// as long as the server's clock does not step back; README, "Guarantees"). Grants taken with
/// [`LockRequest::fencing`](crate::LockRequest::fencing)`(false)` have none.
///
/// A store that remembers the highest token it has accepted and refuses lower ones cannot be
/// corrupted by a holder that was paused past its lease (Kleppmann's argument for fencing).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// let client = distlock::Client::new(distlock::Config::in_memory())?;
/// let first = client.lock("k").acquire().await?;
/// let t1 = first.fencing_token().expect("fencing is on by default");
/// first.release().await?;
/// let second = client.lock("k").acquire().await?;
/// assert!(second.fencing_token() > Some(t1));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub(crate) u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// A token received as a number — by a resource service in another process, say, that
    /// fences its writes with [`fenced`](crate::fenced) — back as a `FencingToken`. Only the lock hands out
    /// tokens; this is for carrying one across a process boundary.
    ///
    /// ```
    /// let token = distlock::FencingToken::from_raw(1_795_468_000_123_456);
    /// assert_eq!(token.get(), 1_795_468_000_123_456);
    /// ```
    pub fn from_raw(token: u64) -> Self {
        Self(token)
    }
}

impl FencingToken {
    /// The token as a SQL integer (`BIGINT`, SQLite's `INTEGER`: signed 64-bit), for the
    /// fence column of a [fenced SQL write](crate::fenced#sql-databases).
    ///
    /// Tokens are the server clock in microseconds at the grant (a Redlock counter starts
    /// there too), which reaches `i64::MAX` in about 292,000 years, so this does not fail in
    /// practice; it is checked anyway, never a silent wrap: a wrapped token would be negative
    /// and every later write would look stale.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = distlock::Client::new(distlock::Config::in_memory())?;
    /// let guard = client.lock("k").acquire().await?;
    /// let token = guard.fencing_token().expect("fencing is on by default");
    /// let fence: i64 = token.as_i64()?;
    /// assert_eq!(fence as u64, token.get());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A token above `i64::MAX`.
    pub fn as_i64(self) -> Result<i64, std::num::TryFromIntError> {
        i64::try_from(self.0)
    }
}

impl TryFrom<FencingToken> for i64 {
    type Error = std::num::TryFromIntError;

    /// [`FencingToken::as_i64`].
    fn try_from(token: FencingToken) -> Result<i64, Self::Error> {
        token.as_i64()
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod token_tests {
    use super::FencingToken;

    #[test]
    fn a_token_above_i64_max_is_an_error_not_a_wrap() {
        assert_eq!(FencingToken(i64::MAX as u64).as_i64(), Ok(i64::MAX));
        assert!(FencingToken(i64::MAX as u64 + 1).as_i64().is_err());
        assert!(i64::try_from(FencingToken(u64::MAX)).is_err());
    }
}
