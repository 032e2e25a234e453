//! A try on the Redis store (`redis.rs`): one key's, as its kind's first try without a
//! script ([`FirstTry`]) where the transport allows it, else its kind's script; several
//! keys', one call per hash slot in the order of the try's keys, the slots already taken
//! given back when a later one is held; and under the failover guard, a grant that too few
//! replicas acknowledged given back and reported as held. Neighbours: `releases.rs` gives
//! back; `kind/` builds the calls and reads their replies.

use redis::{FromRedisValue, RedisError};

use super::first_try::FirstTry;
use super::RedisStore;
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::kind::multi::{self, MultiReply, MultiTry};
use crate::kind::{self, ScriptReply, Try};
use crate::protocol::{AcquireReply, Call, LockKey};
use crate::store::transport::Transport;
use crate::store::Store;

impl<T: Transport> RedisStore<T> {
    pub(super) async fn try_one(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        let transactions = self
            .transport
            .transactions_by(attempt.cut.filter(|_| self.cuts_tries))
            .await?;
        // Under the failover guard, a transport whose `WAIT` rides only behind a script sends
        // the script, whatever the try.
        let first = FirstTry::of(attempt, self.tokens, transactions)
            .filter(|_| T::WAITS_AFTER_ANY_REQUEST || self.guard.is_none());
        let tried = match &first {
            Some(first) => self.first_try(attempt, first).await?,
            None => None,
        };
        let (reply, replicated) = match tried {
            Some(tried) => tried,
            None => self.script_try(attempt).await?,
        };
        let reply = kind::read_acquire_reply(attempt, reply)?;
        self.count_only_replicated(attempt, reply, replicated).await
    }

    /// The keys one call may name in one script (every key on a server; a slot's on a
    /// Cluster), the calls one after another in the order of the try's keys (which keeps a
    /// slot's keys together: `crate::multi`). When a later call's keys are held, the keys
    /// already taken are given back before the answer, so a waiting request holds nothing; so
    /// are they when too few replicas acknowledged a call. A failed call that may have run is
    /// reported as such: the acquire loop then gives back every key in the background.
    pub(super) async fn try_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        let keys = attempt.keys;
        let mut tokens = Vec::new();
        let mut start = 0;
        while start < keys.len() {
            let end = Self::one_call_until(keys, start);
            let part = attempt.part(&keys[start..end]);
            let call = multi::acquire_call(&part, self.tokens);
            let (reply, replicated): (Vec<i64>, bool) = match self
                .send_try(Call::Script(&call), attempt.cut, |reply: &Vec<i64>| {
                    reply.first() == Some(&1)
                })
                .await
            {
                Ok(reply) => reply,
                // The earlier calls' grants are given back here; an ambiguous try's clean-up
                // (the acquire loop's) gives back every key.
                Err(err) => {
                    if start > 0 && !crate::store::is_ambiguous(&err) {
                        let taken: Vec<&LockKey> = keys[..start].iter().collect();
                        if let Err(undo) = self.release_all(&taken, attempt.owner).await {
                            // The request's own error is the answer; the grants given back
                            // here expire with their lease at the latest.
                            tracing::warn!(target: crate::telemetry::LOG_TARGET, "could not give back the keys of a refused multi-key try: {undo}");
                        }
                    }
                    return Err(err);
                }
            };
            let (undo, held) = match multi::read_acquire_reply(&part, &reply)
                .map_err(Self::unseen_retries)?
            {
                MultiReply::Acquired(part_tokens) if replicated => {
                    if tokens.is_empty() {
                        tokens = part_tokens;
                    } else {
                        tokens.extend(part_tokens);
                    }
                    start = end;
                    continue;
                }
                // Too few replicas acknowledged: this call's grant is given back too.
                MultiReply::Acquired(_) => (end, MultiReply::Held(None, start)),
                MultiReply::Held(remaining, at) => (start, MultiReply::Held(remaining, start + at)),
                MultiReply::TooLow(too_low) => (start, MultiReply::TooLow(too_low)),
            };
            if undo > 0 {
                let taken: Vec<&LockKey> = keys[..undo].iter().collect();
                self.release_all(&taken, attempt.owner)
                    .await
                    .map_err(crate::store::ambiguous)?;
            }
            return Ok(held);
        }
        Ok(MultiReply::Acquired(tokens))
    }

    /// Sends a try's request under the failover guard. A transport that hides its own retries
    /// may have run a try that failed: its failure says so, and the acquire loop cleans up.
    async fn send_try<R: FromRedisValue + Send>(
        &self,
        call: Call<'_>,
        deadline: Option<std::time::Instant>,
        needs_wait: impl Fn(&R) -> bool + Send,
    ) -> Result<(R, bool), LockError> {
        self.call_guarded_by("acquire", call, deadline, needs_wait)
            .await
            .map_err(Self::unseen_retries)
    }

    /// A try's failure as the acquire loop must take it: one that may have run, where the
    /// transport retries unseen.
    fn unseen_retries(err: LockError) -> LockError {
        if T::RETRIES_UNSEEN {
            crate::store::ambiguous(err)
        } else {
            err
        }
    }
}

/// The two forms of a try (`acquire` picks one).
impl<T: Transport> RedisStore<T> {
    /// A try as its [`FirstTry`] request; `None` when it was not sent because the connection
    /// made for it may not run a transaction (its user lost the right since the last one): the
    /// script takes over.
    async fn first_try(
        &self,
        attempt: &Try<'_>,
        first: &FirstTry,
    ) -> Result<Option<(ScriptReply, bool)>, LockError> {
        // A `WAIT` only after a grant; a reply that does not read is no grant.
        let granted = |reply: &redis::Value| {
            first
                .read(attempt.owner, reply)
                .is_ok_and(|(granted, _)| granted == 1)
        };
        let (reply, replicated) = match self.send_try(first.call(), attempt.cut, granted).await {
            Ok(replied) => replied,
            Err(LockError::Backend(err)) if err.refused_command() == Some("multi") => {
                return Ok(None)
            }
            Err(err) => return Err(err),
        };
        if let Some(refused) = refusal_in(&reply) {
            return Err(BackendError::new("acquire", BackendErrorKind::Server, refused).into());
        }
        let (granted, value) = first.read(attempt.owner, &reply)?;
        Ok(Some((ScriptReply::from((granted, value)), replicated)))
    }

    /// A try as its kind's acquire script.
    async fn script_try(&self, attempt: &Try<'_>) -> Result<(ScriptReply, bool), LockError> {
        let call = attempt.call(self.tokens, T::ANNOUNCE);
        self.send_try(Call::Script(&call), attempt.cut, |reply: &ScriptReply| {
            reply.granted == 1
        })
        .await
    }
}

/// The first refusal among a pipeline's replies (sent with `ignore_errors`, so that a refused
/// command is a reply, not the pipeline's error), or a command's own: it did not run.
fn refusal_in(reply: &redis::Value) -> Option<RedisError> {
    let refusal = |item: &redis::Value| match item {
        redis::Value::ServerError(err) if err.code() == "NOPERM" => {
            Some(RedisError::from(err.clone()))
        }
        _ => None,
    };
    match reply {
        redis::Value::Array(items) => items.iter().find_map(refusal),
        // A command's reply, sent alone.
        reply => refusal(reply),
    }
}

/// The failover guard's rule: a write counts only once enough replicas have it.
impl<T: Transport> RedisStore<T> {
    /// A try's reply under the failover guard: a grant that too few replicas acknowledged is
    /// given back (a failover now could hand the lock out again) and reported as held, so the
    /// acquire loop tries again within its wait.
    async fn count_only_replicated(
        &self,
        attempt: &Try<'_>,
        reply: AcquireReply,
        replicated: bool,
    ) -> Result<AcquireReply, LockError> {
        if replicated || !matches!(reply, AcquireReply::Acquired(_)) {
            return Ok(reply);
        }
        // The grant exists: if giving it back fails, the acquire loop must clean it up.
        self.release(attempt.grant(), attempt.key, attempt.owner)
            .await
            .map_err(crate::store::ambiguous)?;
        Ok(AcquireReply::Held(None))
    }
}
