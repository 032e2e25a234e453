//! Leader election on a lock: [`Election`] ([`election`] on the global client,
//! [`Client::election`]) campaigns for the write lock `name`, fenced, renewed by the watchdog;
//! the grant's fencing token is the leader's **epoch**, so every leader's epoch is greater than
//! every earlier leader's, on every store, and a resource fenced with it ([`crate::fenced`])
//! refuses a deposed leader's writes. A new leader writes its record — epoch, owner token and
//! the value it publishes — beside the lock (`election_scripts.rs`), and announces it on the lock's
//! release channel; [`Election::leader`] reads the lock's holder and the record in one
//! request and trusts the record only while its writer holds the lock, and
//! [`Election::observe`] (`observe.rs`) follows the changes, woken by those announcements and
//! by releases; [`Leadership::proclaim`] (`proclaim.rs`) rewrites the record with a new
//! value. Neighbours: the acquire loop and the watchdog do the locking, the stores in
//! `store/` run the record's scripts, `client/operator.rs` shows the record in
//! [`LockState::leader`](crate::LockState::leader).

mod observe;
mod proclaim;

use std::sync::Arc;
use std::time::Duration;

pub use observe::{LeaderChanges, LeaderStates};

use crate::client::Client;
use crate::election_scripts::{Proclaim, Withdraw};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::inspect::LeaderInfo;
use crate::protocol::FencingToken;
use crate::protocol::{LockKey, RawRecord};
use crate::request::{Refusing, Settings};
use crate::store::Store;

/// How long one acquire of an unbounded campaign waits before it starts over (the campaign
/// itself goes on): a bound on a single request's wait, not on the campaign.
const CAMPAIGN_ROUND: Duration = Duration::from_secs(60);
/// The first pause after a failure a campaign outlives (Redis unreachable, a quorum short);
/// it doubles up to [`MAX_FAILURE_PAUSE`].
const FIRST_FAILURE_PAUSE: Duration = Duration::from_millis(100);
const MAX_FAILURE_PAUSE: Duration = Duration::from_secs(2);

/// A leader election on one name: a cheap handle (clone it, move it into tasks) that
/// campaigns for leadership ([`campaign`](Self::campaign)), tells who leads
/// ([`leader`](Self::leader)) and follows the changes ([`observe`](Self::observe)).
///
/// Leadership is the write lock of the election's name, fenced, and renewed by the watchdog
/// for as long as the leader lives; its fencing token is the leader's [epoch](Leadership::epoch),
/// greater than every earlier leader's. The leader writes a record beside the lock — its
/// epoch, its holder record (app, host, pid, since) and an optional [`value`](Self::value),
/// such as its address (etcd's "proclaim") — which [`leader`](Self::leader) and
/// [`observe`](Self::observe) read. The name is a lock name: do not also lock it as a lock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// let client = distlock::Client::in_memory();
/// let election = client.election("scheduler").value("10.0.0.7:8080");
/// let leadership = election.campaign().await?;
/// let leader = election.leader().await?.expect("we lead");
/// assert_eq!(leader.epoch(), leadership.epoch());
/// assert_eq!(leader.value(), Some(&b"10.0.0.7:8080"[..]));
/// leadership.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "an election does nothing until `.campaign()`, `.leader()` or `.observe()`"]
pub struct Election {
    client: Option<Client>,
    name: Arc<str>,
    /// The settings of the campaign's requests: the lease it passes on, and the campaign's
    /// whole wait (each request waits for a round of it).
    settings: Settings,
    value: Option<Arc<[u8]>>,
}

impl Election {
    /// The election `name`, through `client` (`None`: the global client, looked up at each
    /// use; without [`init`](crate::init) every request says so).
    pub(crate) fn new(client: Option<Client>, name: String) -> Self {
        Self {
            client,
            name: name.into(),
            settings: Settings::default(),
            value: None,
        }
    }

    /// The election's name: the name of the lock its leaders hold.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease of a leader's term: how long after a leader dies (or is frozen, or cut off
    /// from Redis) another can take over. The watchdog renews it at a third of its length
    /// while the leader lives. Defaults to the client's
    /// [`Config::default_lease`](crate::Config::default_lease).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = Some(lease);
        self
    }

    /// The longest [`campaign`](Self::campaign) waits to lead before it returns
    /// [`LockError::Timeout`] (or the store's failure, when Redis is down or frozen: the
    /// campaign ends within its wait either way); without it a campaign waits for as long as
    /// it takes, also through Redis being unreachable for a while (it tries again, logging at
    /// WARN).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.settings.wait = Some(wait);
        self
    }

    /// What a leader publishes with its leadership (its address, say), readable through
    /// [`leader`](Self::leader) and [`observe`](Self::observe) as [`LeaderInfo::value`]; the
    /// leader replaces it with [`Leadership::proclaim`].
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = Some(value.into().into());
        self
    }

    /// This election's client; for `distlock::election`, the global client as it is now (an
    /// election built before [`init`](crate::init) works once it has run).
    fn client(&self) -> Result<Client, LockError> {
        self.client
            .clone()
            .or_else(crate::global::global)
            .ok_or(LockError::NotInitialized)
    }

    fn key(&self, client: &Client) -> Result<LockKey, LockError> {
        LockKey::new(&client.engine.config.key_prefix, self.name.to_string())
    }

    /// Waits until this process leads (at most [`wait`](Self::wait), if given), and returns
    /// the [`Leadership`], which lasts until it is [resigned](Leadership::resign) or dropped,
    /// or [lost](Leadership::lost).
    ///
    /// A campaign takes the election's lock like any waiter: it is woken when the leader
    /// resigns, and takes over within a lease of a leader that died. Once it holds the lock it
    /// writes its record and announces it; a lease lost before that starts the campaign over.
    ///
    /// Errors: [`LockError::Timeout`] when [`wait`](Self::wait) passed; what a lock request
    /// fails with otherwise ([`LockError::InvalidKey`], [`LockError::Config`],
    /// [`LockError::ShutDown`], …). Failures that may pass (Redis unreachable, a Redlock
    /// quorum short, a Cluster failover) are tried again until the wait ends; without a wait,
    /// for as long as they last.
    pub async fn campaign(&self) -> Result<Leadership, LockError> {
        let client = &self.client()?;
        let started = tokio::time::Instant::now();
        let deadline = self
            .settings
            .wait
            .and_then(|wait| started.checked_add(wait));
        let mut pause = FIRST_FAILURE_PAUSE;
        let mut first_round = true;
        loop {
            let round = match deadline {
                Some(deadline) => deadline.saturating_duration_since(tokio::time::Instant::now()),
                None => CAMPAIGN_ROUND,
            };
            if round.is_zero() && !first_round {
                // A pause ran to the end of the wait: a round now would be a try that does
                // not wait, with a response timeout of its own past the campaign's wait.
                return Err(LockError::Timeout {
                    key: self.name.to_string(),
                    waited: started.elapsed(),
                });
            }
            first_round = false;
            let mut request = client
                .lock(self.name.to_string())
                .with_settings(self.settings)
                .fencing(true)
                .wait(round);
            // A round that ends with the lock still held elsewhere is a standby's normal state,
            // not a timeout: its span, log and metrics say "busy".
            request.busy_expected = true;
            // A round's wait is what is left of the campaign's: no try outlives it (a campaign
            // that does not wait at all makes one try, as a lock request that does not wait).
            request.strict_wait = deadline.is_some();
            let failure = match request.acquire().await {
                Ok(guard) => match self.proclaim(client, guard).await {
                    Ok(Some(leadership)) => return Ok(leadership),
                    // The lease ran out before the record was written (a lease shorter than
                    // the round trips, a process frozen): start over, after a pause.
                    Ok(None) => {
                        tokio::time::sleep(FIRST_FAILURE_PAUSE).await;
                        continue;
                    }
                    Err(err) => err,
                },
                Err(LockError::Timeout { .. }) if deadline.is_none() => continue,
                Err(err) => err,
            };
            let now = tokio::time::Instant::now();
            let retry = failure.is_transient() && deadline.is_none_or(|d| now + pause < d);
            if !retry {
                return Err(match failure {
                    LockError::Timeout { key, .. } => LockError::Timeout {
                        key,
                        waited: now - started,
                    },
                    other => other,
                });
            }
            tracing::warn!(target: crate::telemetry::LOG_TARGET, election = %self.name, error = %failure,
                "campaign failed; trying again in {pause:?}");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_FAILURE_PAUSE);
        }
    }

    /// Writes this leader's record beside the lock `guard` holds; `None` when the lock was
    /// no longer ours by then.
    async fn proclaim(
        &self,
        client: &Client,
        guard: LockGuard,
    ) -> Result<Option<Leadership>, LockError> {
        let lease = guard.lease.clone();
        let Some(epoch) = lease.token else {
            return Err(LockError::Config(format!(
                "election `{}`: its lock was granted without a fencing token; elections need \
                 fencing, which `fencing(false)` turned off",
                self.name
            )));
        };
        let record = RawRecord {
            epoch: epoch.get(),
            owner: lease.owner.clone(),
            value: self.value.as_deref().map(<[u8]>::to_vec),
            revision: 0,
        };
        let inner = &client.engine;
        let written = inner
            .clock
            .send(&inner.io, inner.store.run(&Proclaim(&lease.key, &record)))
            .await;
        match written {
            Ok(true) => {
                // Leading from here: the gauge, the counter and the INFO event; the grant's end
                // (resigned, dropped, lost) ends the term as the lease leaves its held state.
                let term = crate::telemetry::Term::gained(self.name.clone(), epoch.get());
                lease.hold.lead(term, || lease.is_held());
                Ok(Some(Leadership {
                    guard: Some(guard),
                    client: client.clone(),
                    name: self.name.clone(),
                    epoch,
                    revisions: proclaim::Revisions::after_campaign(),
                }))
            }
            Ok(false) => Ok(None),
            Err(err) => {
                // Not leading after all: the next leader need not wait for the lease.
                let _ = guard.release().await;
                Err(err)
            }
        }
    }

    /// Who leads now: the leader's epoch, holder record and value, or `None` when nobody
    /// leads (or a new leader has its lock but has not written its record yet: it does so
    /// within one round trip). One read-only request (on Redlock, one per master: a leader is
    /// one whose lock and record a majority agree on).
    ///
    /// Errors: [`LockError::NotInitialized`], [`LockError::InvalidKey`],
    /// [`LockError::Backend`], [`LockError::QuorumUnavailable`].
    pub async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        Ok(self.client()?.inspect(self.name.to_string()).await?.leader)
    }

    /// The period at which [`observe`](Self::observe) reads besides its wake-ups: a third of
    /// the election's lease, checked as a campaign checks it.
    fn lease_of(&self, client: &Client) -> Result<Duration, LockError> {
        self.settings
            .checked_lease(&client.engine.config, &Refusing::Election(&self.name))
    }

    /// The changes of leader, as a [`Stream`](futures_util::Stream) of [`LeaderInfo`]: the
    /// leader when it starts (if any), then each new leader once, in epoch order, and each new
    /// value a leader [proclaims](Leadership::proclaim) (same epoch, in order; values
    /// proclaimed in quick succession may coalesce to the latest, never an older after a
    /// newer). It is woken
    /// by the announcements of new leaders and by releases, and reads again at a third of the
    /// election's lease besides (a leader that died is noticed when its lease ends, and a lost
    /// announcement costs at most that); a store without wake-ups (in-process) is read at
    /// that period, at most every 100 ms. A leader that came and went between two reads is
    /// not shown. It yields leaders only; [`LeaderChanges::with_vacancies`] also yields `None`
    /// when the observer sees that nobody leads ([`LeaderStates`]), and each change seen is
    /// logged at INFO. Failures to read are logged at WARN and tried again; the stream ends only
    /// when the election cannot be read at all (no client, an invalid name or lease: logged
    /// at ERROR), and stays ended.
    ///
    /// ```no_run
    /// # async fn f() {
    /// let mut changes = distlock::election("scheduler").observe();
    /// while let Some(leader) = changes.next().await {
    ///     println!("epoch {}: {:?} on {:?}", leader.epoch(), leader.holder().pid, leader.holder().host);
    /// }
    /// # }
    /// ```
    pub fn observe(&self) -> LeaderChanges {
        LeaderChanges::new(self.clone())
    }
}

/// Elections started through a client (here, not in `client/`, because an election is built
/// on a client).
impl Client {
    /// The leader election `name` through this client: see [`Election`].
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election::new(Some(self.clone()), name.into())
    }
}

/// The leader election `name` through the global client set up by [`init`](crate::init) (see
/// [`Election`]). Without [`init`](crate::init), its requests fail with [`LockError::NotInitialized`].
///
/// ```no_run
/// # async fn serve(_: distlock::FencingToken) {}
/// # async fn f() -> Result<(), distlock::LockError> {
/// let leadership = distlock::election("scheduler").campaign().await?;
/// tokio::select! {
///     () = serve(leadership.epoch()) => {}
///     () = leadership.lost() => {}
/// }
/// # Ok(()) }
/// ```
pub fn election(name: impl Into<String>) -> Election {
    Election::new(None, name.into())
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .field("lease", &self.settings.lease)
            .field("wait", &self.settings.wait)
            .field("value", &self.value.as_ref().map(|value| value.len()))
            .finish_non_exhaustive()
    }
}

/// This process's leadership of an [`Election`], from [`Election::campaign`]: the election's
/// lock, renewed by the watchdog, and the epoch that fences the leader's writes.
///
/// It owns what it needs (move it into a task). Dropping it resigns, in the background;
/// [`resign`](Self::resign) does so and waits for it. [`proclaim`](Self::proclaim) replaces
/// the value it publishes while it leads.
#[must_use = "dropping a Leadership resigns at once"]
pub struct Leadership {
    /// `None` once resigned.
    guard: Option<LockGuard>,
    client: Client,
    name: Arc<str>,
    epoch: FencingToken,
    /// The revisions of the values it [proclaims](Self::proclaim).
    revisions: proclaim::Revisions,
}

impl Leadership {
    /// The leader's epoch: its lock's fencing token, greater than every earlier leader's.
    /// Hand it to a fenced store ([`crate::fenced`]) with every write, so that a deposed
    /// leader's late writes are refused.
    pub fn epoch(&self) -> FencingToken {
        self.epoch
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this process still leads, as far as it can tell (its lease is neither lost
    /// nor past its deadline).
    pub fn is_leader(&self) -> bool {
        self.guard.as_ref().is_some_and(LockGuard::is_held)
    }

    /// Completes when the leadership ends for any reason but [`resign`](Self::resign): the
    /// lease could not be renewed in time (Redis unreachable, this process frozen), the lock
    /// was freed by force, or the client shut down. Stop acting as the leader then; the
    /// epoch already fences what comes late.
    pub async fn lost(&self) {
        match &self.guard {
            Some(guard) => guard.lost().await,
            None => std::future::pending().await,
        }
    }

    /// Hands the leadership over at once: deletes this leader's record and gives the lock
    /// back, which wakes the next campaigner. `Ok(false)` when it had been lost already (then
    /// nothing is sent but the release's compare-and-delete, in the background).
    ///
    /// Errors: [`LockError::Backend`] (and the like) when the lock could not be given back;
    /// its lease then runs out by itself. A record that could not be deleted is only logged:
    /// it names nobody once the lock is given back.
    pub async fn resign(mut self) -> Result<bool, LockError> {
        let Some(guard) = self.guard.take() else {
            return Ok(false);
        };
        withdraw_and_release(&self.client, guard).await
    }
}

/// Deletes the record (if still this leader's) and gives the lock back. A lease known lost
/// sends no withdrawal: the record names nobody then, and a frozen server is not waited for.
async fn withdraw_and_release(client: &Client, guard: LockGuard) -> Result<bool, LockError> {
    if guard.is_held() {
        let inner = &client.engine;
        let lease = guard.lease.clone();
        let withdrawn = inner
            .clock
            .send(
                &inner.io,
                inner.store.run(&Withdraw(&lease.key, &lease.owner)),
            )
            .await;
        if let Err(err) = withdrawn {
            tracing::warn!(target: crate::telemetry::LOG_TARGET, election = %lease.key.name, error = %err,
                "deleting the leader record failed; it names nobody once the lock is released");
        }
    }
    guard.release().await
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            let client = self.client.clone();
            // On the client's runtime: the caller's may be ending.
            self.client.engine.io.spawn(async move {
                if let Err(err) = withdraw_and_release(&client, guard).await {
                    tracing::warn!(target: crate::telemetry::LOG_TARGET, error = %err,
                        "resigning a dropped leadership failed; its lease runs out by itself");
                }
            });
        }
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("name", &self.name)
            .field("epoch", &self.epoch)
            .field("leader", &self.is_leader())
            .finish()
    }
}
