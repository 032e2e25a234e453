//! Redlock's fencing tokens (`redlock.rs`; the argument is in `docs/how-it-works.md`): the
//! token a write try proposes to every master ([`propose`](RedlockStore::propose)), the lead
//! it keeps ahead of this client's clock and raises after refusals, never past
//! [`MAX_TOKEN_LEAD`] ([`learn`](RedlockStore::learn)), and a forced release, which raises a
//! majority's counters above every token handed out before and after it frees the lock
//! ([`force_unlock_fenced`](RedlockStore::force_unlock_fenced)). Neighbours: `tally.rs`
//! proposes and learns; `scripts/redlock/raise_fence.lua` raises a counter.

use std::sync::atomic::Ordering;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::answers::{not_awaited, MasterAnswer};
use super::RedlockStore;
use crate::config::MAX_TOKEN_LEAD;
use crate::error::LockError;
use crate::kind::{self, write::fence_ttl};
use crate::operator_scripts::{ForceUnlock, Inspect, RawHolder, FORCED_FENCE_TTL};
use crate::protocol::{FencingToken, LockKey, TooLow};
use crate::script::LuaScript;
use crate::store::Store;

static RAISE_FENCE: LazyLock<LuaScript> =
    LazyLock::new(|| kind::script(include_str!("../../../scripts/redlock/raise_fence.lua")));

/// A duration in whole microseconds.
pub(super) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// This client's clock in microseconds since the Unix epoch (0 before it).
fn clock_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, micros)
}

/// The lead a client starts with: its node timeout (a master whose clock agrees and that
/// answers within it takes the token), which `Config` keeps within [`MAX_TOKEN_LEAD`]
/// ([`MAX_NODE_TIMEOUT`](crate::MAX_NODE_TIMEOUT)); capped here as well.
pub(super) fn first_lead(node_timeout: Duration) -> Duration {
    node_timeout.min(MAX_TOKEN_LEAD)
}

impl RedlockStore {
    /// A write grant's token: this client's clock in microseconds plus its lead, and at
    /// least `floor` (a refused round's hint). The lead starts at the node timeout, so a
    /// master whose clock agrees with this client's takes the token when it answers in time,
    /// and never exceeds [`MAX_TOKEN_LEAD`].
    pub(super) fn propose(&self, floor: u64) -> FencingToken {
        let lead = self.lead.load(Ordering::Relaxed);
        FencingToken(clock_micros().saturating_add(lead).max(floor))
    }

    /// Raises the lead after refusals of proposed tokens: up to the refusing master's clock
    /// plus the node timeout (this client's clock lags it), or up to its hint (its counter is
    /// ahead: another client's lead, which is matched, not exceeded, so that two clients'
    /// leads do not climb over each other).
    ///
    /// Never above [`MAX_TOKEN_LEAD`], whatever the settings: a lead makes every counter this
    /// client sets live that much longer, a read token exceed a later write token by up to as
    /// much, and a master restarted empty wait that much longer; so a master or client whose
    /// clock is further off costs a second round on each grant (the hint is that round's
    /// floor) instead of raising every later token.
    pub(super) fn learn(&self, refusals: impl Iterator<Item = TooLow>) {
        let now = clock_micros();
        let margin = micros(first_lead(self.node_timeout));
        let cap = micros(MAX_TOKEN_LEAD);
        for TooLow { hint, clock } in refusals {
            let needed = hint.max(clock.saturating_add(margin)).saturating_sub(now);
            if needed > cap {
                tracing::warn!(target: crate::telemetry::LOG_TARGET, lead_us = needed, cap_us = cap,
                    "a Redlock master's clock or fencing counter is ahead of this client's clock \
                     by more than the lead it keeps; grants take a second round until the clocks \
                     agree (check NTP on the masters and clients)");
            }
            self.lead.fetch_max(needed.min(cap), Ordering::Relaxed);
        }
    }

    /// Raises a majority's fencing counters above every token handed out for the lock, then
    /// frees it on every master; returns the evicted holders and that token. Raised first:
    /// every grant after a master freed the lock then takes a token above it (the largest of
    /// a quorum, which shares a master with the raised majority). Freeing first and raising
    /// after left a window in which a waiter granted by the masters already freed — whose
    /// clocks had not reached the token the last master's clock gave — got a smaller token
    /// than the one returned (`tests/inspect.rs` saw it about once in ten runs).
    pub(super) async fn force_unlock_fenced(
        &self,
        key: &LockKey,
    ) -> Result<(Vec<RawHolder>, u64), LockError> {
        let token = self
            .run(&Inspect(key))
            .await?
            .token_ceiling
            .saturating_add(1);
        self.raise_fence_on_quorum(key, token).await?;
        let (evicted, answered_token) = self.run(&ForceUnlock(key)).await?;
        // A grant that landed between the view and the raise proposed a token of its own,
        // which may be above `token`; the masters' own answers are above their counters, so
        // the largest of them is above that grant's token. It is raised on a majority too,
        // so that every later grant's token stays above the one returned.
        if answered_token <= token {
            return Ok((evicted, token));
        }
        self.raise_fence_on_quorum(key, answered_token).await?;
        Ok((evicted, answered_token))
    }

    /// `force_unlock`'s first round: the counters raised to `token` on as many masters as
    /// answer; how many are at least at it now. A master that refuses for good (a counter of
    /// another application's, or one or a token at 2^53 or more: nothing written there) is
    /// the error, preferring a master that names its own counter's value to one that names
    /// `token`.
    async fn raise_fence(
        &self,
        key: &LockKey,
        token: FencingToken,
        lease: Duration,
        timeout: Duration,
    ) -> Result<usize, LockError> {
        let quorum = self.quorum();
        let raised = |answers: &[MasterAnswer<i64>]| {
            answers
                .iter()
                .filter(|answer| matches!(answer, MasterAnswer::Said(1)))
                .count()
        };
        let (answers, _) = self
            .until_decided(
                timeout,
                |_, master| {
                    let mut call = RAISE_FENCE.prepare_invoke();
                    call.key(key.fence())
                        .arg(token.0)
                        .arg(kind::millis(fence_ttl(lease)));
                    master.invoke::<i64>("raise the fencing counter", call)
                },
                |answers| {
                    raised(answers) >= quorum || raised(answers) + not_awaited(answers) < quorum
                },
            )
            .await;
        let count = raised(&answers);
        let token_named = token.0.to_string();
        let mut refusals: Vec<LockError> = answers
            .into_iter()
            .filter_map(|answer| match answer {
                MasterAnswer::Failed(err) if err.is_final_refusal() => Some(err),
                _ => None,
            })
            .collect();
        refusals.sort_by_key(|err| {
            matches!(err, LockError::FencingCounterTooLarge { value, .. } if *value == token_named)
        });
        match refusals.into_iter().next() {
            Some(err) => Err(err),
            None => Ok(count),
        }
    }

    /// [`raise_fence`](Self::raise_fence) to `token` for a forced release, which must reach a
    /// majority.
    async fn raise_fence_on_quorum(&self, key: &LockKey, token: u64) -> Result<(), LockError> {
        let raised = self
            .raise_fence(
                key,
                FencingToken(token),
                FORCED_FENCE_TTL,
                self.node_timeout,
            )
            .await?;
        if raised < self.quorum() {
            return Err(self.quorum_unavailable(key, raised, 0));
        }
        Ok(())
    }
}
