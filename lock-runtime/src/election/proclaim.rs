//! A leader's new value: [`Leadership::proclaim`] (etcd's `Proclaim`) rewrites the leader
//! record with the value and a revision one above the last, through the same `Proclaim`
//! operation the campaign's first record goes through (`election_scripts.rs`): only while
//! this grant still holds the lock, announced on the lock's channel so that observers
//! (`observe.rs`) read it at once, and on Redlock standing when a majority took it. The
//! revision orders a leader's values: a store keeps a record of the same leader only for a
//! later one, and observers yield only a later one than they yielded last. Neighbours:
//! `mod.rs` (the campaign that writes revision 0, the `Leadership` this extends).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Leadership;
use crate::election_scripts::Proclaim;
use crate::error::LockError;
use crate::protocol::RawRecord;
use crate::store::Store;

/// The revisions a leadership hands out to its proclaims: the campaign's record is revision 0,
/// each proclaim takes the next, in the order the calls start.
#[derive(Debug)]
pub(super) struct Revisions(AtomicU64);

impl Revisions {
    /// Counting from after the campaign's record.
    pub(super) fn after_campaign() -> Self {
        Self(AtomicU64::new(1))
    }

    fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

impl Leadership {
    /// Publishes `value` in place of the one this leader published so far (its campaign's
    /// [`Election::value`](super::Election::value), or an earlier proclaim's), without giving
    /// up leadership: etcd's `Proclaim`. [`Election::leader`](super::Election::leader) returns
    /// it as soon as this returns, and [`Election::observe`](super::Election::observe) yields
    /// it, with the same epoch.
    ///
    /// ## Behavior
    ///
    /// - Written only while this leadership's grant still holds the election's lock, checked
    ///   by the store in the same step as the write: a leader that was deposed (its lease ran
    ///   out, the lock was freed by force, another leads) gets
    ///   [`LockError::LeadershipLost`] and writes nothing. A leadership this process already
    ///   knows lost ([`is_leader`](Self::is_leader) is `false`) sends nothing.
    /// - Each proclaim is announced on the election's channel, as a new leader is, so
    ///   observers read it at once (the in-process store's observers read at their period,
    ///   at most 100 ms). Observers see this leader's values in the order the proclaims were
    ///   made and never an older value after a newer one; values proclaimed in quick
    ///   succession may coalesce, an observer then sees only the latest (as etcd's watchers
    ///   of a leader key may).
    /// - Proclaims made concurrently (the `Leadership` shared between tasks) are ordered by
    ///   when each call started: one that arrives after a later one has been written writes
    ///   nothing and returns `Ok`, as the later value stands.
    /// - On Redlock a proclaim stands when a majority of the masters took it, as the
    ///   campaign's record does; with fewer it fails with [`LockError::QuorumUnavailable`].
    /// - The value's size is limited as [`Election::value`](super::Election::value)'s is: by
    ///   the server's bulk-string limit (`proto-max-bulk-len`, 512 MB by default), not by
    ///   distlock; every observer reads it, so keep it small (an address, a few fields).
    ///
    /// Errors: [`LockError::LeadershipLost`]; what any request fails with
    /// ([`LockError::Backend`], [`LockError::QuorumUnavailable`], [`LockError::ShutDown`],
    /// …). After such a failure the value may have been written or not (on Redlock, on some
    /// masters, where [`leader`](super::Election::leader) may show it): proclaim again.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
    /// let client = distlock::Client::in_memory();
    /// let election = client.election("scheduler").value("10.0.0.7:8080");
    /// let leadership = election.campaign().await?;
    /// leadership.proclaim("10.0.0.7:9090").await?;
    /// let leader = election.leader().await?.expect("we lead");
    /// assert_eq!(leader.epoch(), leadership.epoch());
    /// assert_eq!(leader.value(), Some(&b"10.0.0.7:9090"[..]));
    ///
    /// // Deposed (here by an operator), the leader can publish nothing more.
    /// client.force_unlock("scheduler").await?;
    /// let err = leadership.proclaim("10.0.0.7:7070").await.unwrap_err();
    /// assert!(matches!(err, distlock::LockError::LeadershipLost { .. }), "{err}");
    /// # Ok(()) }
    /// ```
    pub async fn proclaim(&self, value: impl Into<Vec<u8>>) -> Result<(), LockError> {
        let lost = || LockError::LeadershipLost {
            election: self.name.to_string(),
            epoch: self.epoch.get(),
        };
        let Some(guard) = self.guard.as_ref().filter(|guard| guard.is_held()) else {
            return Err(lost());
        };
        let lease = &guard.lease;
        let record = RawRecord {
            epoch: self.epoch.get(),
            owner: lease.owner.clone(),
            value: Some(value.into()),
            revision: self.revisions.next(),
        };
        let inner = &self.client.engine;
        let written = inner
            .clock
            .send(&inner.io, inner.store.run(&Proclaim(&lease.key, &record)))
            .await?;
        if written {
            Ok(())
        } else {
            Err(lost())
        }
    }
}
