//! Redlock store: a lock over N independent Redis masters (N odd, at least 3), each a Redis
//! store on one server (`redis.rs` over `connection.rs`, which refuses a master that reports
//! itself a replica). Every operation goes to all masters at once with a per-master timeout far
//! below the lease ([`Config::node_timeout`](crate::Config::node_timeout)); a grant stands only
//! when a majority (N/2+1) granted it within its validity (lease − elapsed − drift), and a try
//! that falls short is undone on every master: one tally (`tally.rs`) for one key and for
//! several. Renewals need a majority too (a semaphore's permit more: the kind's `quorum`). The
//! kinds' scripts run unchanged on each master; a write grant's fencing token is proposed by
//! the client, the same to every master, and stands without a second round — the argument is
//! in `docs/how-it-works.md` ("Redlock: fencing tokens over independent masters"). Wake-ups come
//! from a subscription on every master that answers: each master that held a grant announces
//! its release (`wake.rs`).
//!
//! This file holds the store and the contract's entry points; the rest is in `redlock/`:
//! `masters.rs` (connects in the background, the slow master), `answers.rs` (a request on
//! every master, what each said), `quorum.rs` (a try as the quorum sees it, its undo),
//! `tally.rs` (the rounds of a try), `fencing.rs` (the proposed token, the forced release),
//! `leases.rs` (renewals and releases on a quorum) and `operator.rs` (the key operations,
//! the scan, the ping).
mod answers;
mod fencing;
mod leases;
mod masters;
mod operator;
mod quorum;
mod tally;

mod refusals;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use super::endpoint::Endpoint;
use super::redis::{NodeOptions, NodeStore};
use super::{Found, Store};
use crate::clock::Clock;
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::key_operation::KeyOperation;
use crate::kind::multi::{MultiReply, MultiTry};
use crate::kind::{Holding, Renewal, Tokens, Try};
use crate::operator_scripts::RawHolder;
use crate::protocol::{AcquireReply, LockKey, Renewed};
use crate::store::pubsub::{Announcer, PubSub};
use crate::wake::ReleaseListener;
use fencing::{first_lead, micros};
use masters::MasterConnect;

pub(crate) struct RedlockStore {
    masters: Vec<Arc<NodeStore>>,
    /// Per master: whether a connect runs in the background, and its end.
    connecting: Vec<Arc<MasterConnect>>,
    /// Per master: a request to it ran past its timeout, and it is asked in the background
    /// until it answers ([`ask_until_it_answers`](Self::ask_until_it_answers)); meanwhile no
    /// request waits for it once the other masters have settled the outcome.
    slow: Vec<Arc<AtomicBool>>,
    /// Per master: its ACL's refusal of that `PING` was told ([`super::probe`]).
    ping_refusal_told: Vec<Arc<AtomicBool>>,
    node_timeout: Duration,
    connect_timeout: Duration,
    /// No try has warmed up yet: the first waits for every master (up to the connect
    /// timeout), so a replica among them is refused from the start.
    first_use: AtomicBool,
    /// Wake-ups from every master that answers: each announces a release.
    waker: ReleaseListener,
    /// How far ahead of this client's clock a write grant's token is proposed, in
    /// microseconds ([`propose`](Self::propose)): the node timeout, raised by refusals, never
    /// past [`MAX_TOKEN_LEAD`](crate::config::MAX_TOKEN_LEAD).
    lead: AtomicU64,
    io: Handle,
}

/// A master that did not answer within `timeout`: the request may still run there.
fn node_timed_out(timeout: Duration) -> LockError {
    BackendError::new(
        "reach a Redlock master",
        BackendErrorKind::Timeout,
        format!("no answer within the node timeout of {timeout:?}"),
    )
    .maybe_applied(true)
    .into()
}

impl RedlockStore {
    pub(crate) fn new(
        masters: &[redis::Client],
        options: NodeOptions,
        node_timeout: Duration,
        io: Handle,
    ) -> Self {
        let options = NodeOptions {
            require_primary: true,
            guard: None,
            wake_ups: false,
            tokens: Tokens::Counter,
            ..options
        };
        Self {
            masters: masters
                .iter()
                .map(|master| {
                    Arc::new(
                        NodeStore::new(Endpoint::Fixed(master.clone()), options, io.clone())
                            .not_cutting_tries(),
                    )
                })
                .collect(),
            connecting: masters.iter().map(|_| Arc::default()).collect(),
            slow: masters.iter().map(|_| Arc::default()).collect(),
            ping_refusal_told: masters.iter().map(|_| Arc::default()).collect(),
            node_timeout,
            connect_timeout: options.connect_timeout,
            first_use: AtomicBool::new(true),
            lead: AtomicU64::new(micros(first_lead(node_timeout))),
            waker: PubSub::listener(
                masters
                    .iter()
                    .map(|master| Announcer::Node(Arc::new(Endpoint::Fixed(master.clone()))))
                    .collect(),
                io.clone(),
                options.connect_timeout,
                options.response_timeout,
            ),
            io,
        }
    }

    fn quorum(&self) -> usize {
        self.masters.len() / 2 + 1
    }

    /// How long one master may take for one request of a grant with this lease.
    fn timeout_for(&self, lease: Duration) -> Duration {
        self.node_timeout
            .min(lease / 10)
            .max(Duration::from_millis(1))
    }

    fn quorum_unavailable(&self, key: &LockKey, answered: usize, granted: usize) -> LockError {
        self.quorum_unavailable_needing(key, answered, granted, self.quorum())
    }

    /// [`quorum_unavailable`](Self::quorum_unavailable) for a grant that needs `needed`
    /// masters (the kind's `quorum`).
    fn quorum_unavailable_needing(
        &self,
        key: &LockKey,
        answered: usize,
        granted: usize,
        needed: usize,
    ) -> LockError {
        tracing::warn!(
            target: crate::telemetry::LOG_TARGET,
            key = %key.name,
            answered,
            granted,
            needed,
            nodes = self.masters.len(),
            "Redlock quorum unavailable: too few masters answered"
        );
        LockError::QuorumUnavailable {
            key: key.name.clone(),
            answered,
            granted,
            needed,
            nodes: self.masters.len(),
        }
    }
}

/// Each operation as the module that holds it does it.
impl Store for RedlockStore {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        self.tally(attempt).await
    }

    /// Given back on every master; it was ours when the kind's quorum said so.
    async fn release(
        &self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
    ) -> Result<bool, LockError> {
        let quorum = holding.kind().quorum(self.masters.len());
        // Owned: a release not waited for finishes in the background.
        let (shared_key, shared_owner) = (Arc::new(key.clone()), Arc::<str>::from(owner));
        self.give_back_on_quorum(key, quorum, |master| {
            let (key, owner) = (shared_key.clone(), shared_owner.clone());
            async move { master.release(holding, &key, &owner).await }
        })
        .await
    }

    /// A lease is renewed when a majority renewed it, lost when so many masters said it is not
    /// theirs that a majority no longer can, and unknown otherwise (the watchdog tries again:
    /// a master that missed the node timeout once must not cost a lease that is held).
    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        self.renew(leases).await
    }

    /// As [`acquire`](Self::acquire) for every key at once: each master runs the multi-key
    /// script, and counts towards the quorum when it granted every key. Every key takes the
    /// proposed token, as a write grant does (checked against each key's counter).
    async fn acquire_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        if attempt.keys.is_empty() {
            return Ok(MultiReply::Acquired(Vec::new()));
        }
        self.tally(attempt).await
    }

    /// Given back on every master; every key was ours when a majority said so.
    async fn release_all(&self, keys: &[&LockKey], owner: &str) -> Result<bool, LockError> {
        let Some(first_key) = keys.first() else {
            return Ok(true);
        };
        // Owned: a release not waited for finishes in the background.
        let shared_keys = Arc::new(keys.iter().map(|&key| key.clone()).collect::<Vec<_>>());
        let shared_owner = Arc::<str>::from(owner);
        self.give_back_on_quorum(first_key, self.quorum(), |master| {
            let (keys, owner) = (shared_keys.clone(), shared_owner.clone());
            async move {
                let keys: Vec<&LockKey> = keys.iter().collect();
                master.release_all(&keys, &owner).await
            }
        })
        .await
    }

    async fn run<O: KeyOperation>(&self, operation: &O) -> Result<O::Output, LockError> {
        self.run_on_masters(operation).await
    }

    async fn force_unlock(&self, key: &LockKey) -> Result<(Vec<RawHolder>, u64), LockError> {
        self.force_unlock_fenced(key).await
    }

    async fn scan_into(&self, pattern: &str, found: &mut Found) -> Result<(), LockError> {
        self.scan_masters(pattern, found).await
    }

    async fn ping(&self) -> Result<(), LockError> {
        self.ping_masters().await
    }

    /// From every master that answers: each announces a release.
    fn waker(&self) -> Option<&ReleaseListener> {
        Some(&self.waker)
    }

    /// The masters expire keys in real time.
    fn clock(&self) -> Clock {
        Clock::Real
    }

    /// Never: the acquire loop cuts a try off; a round decides what a late master means.
    fn cuts_tries(&self) -> bool {
        false
    }
}
