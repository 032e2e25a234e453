//! The acquire loop of a multi-key lock ([`lock_all`](crate::lock_all)): the keys in a fixed
//! order, every try taking all of them or none through the store's
//! [`acquire_all`](crate::backend::LockBackend::acquire_all) (the scripts and the in-process
//! twin are `kind/multi.rs`), the same backoff, wake-ups and wait deadline as one key's loop
//! (`client.rs`). A grant becomes one [`Lease`] per key, all under the grant's one owner token
//! and send time, watched by the watchdog like any other and held by one [`LockGuard`]; so
//! renewals, releases, `inspect` and `force_unlock` see each key as an ordinary write lock.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use redis::cluster_routing::Slot;

use crate::backend::{is_ambiguous, Kind, LockBackend, LockKey, MultiReply, MultiTry};
use crate::client::{new_owner, writer_waiting_mark, Attempt, Backoff, Client, LockRequest};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lease::{drift, Lease};
use crate::telemetry::Acquire;

impl LockRequest {
    /// Takes every key of a [`lock_all`](crate::lock_all) request, waiting as configured.
    pub(crate) async fn acquire_all(self, client: &Client) -> Result<LockGuard, LockError> {
        let names = self.all_keys.clone().unwrap_or_default();
        let label = names.join(",");
        let mut observed = Acquire::start(&label, Kind::Write.into(), client.inner.store);
        let outcome = self.acquire_all_on(client, names, &mut observed).await;
        if let Err(err) = &outcome {
            match err {
                LockError::Timeout { .. } => observed.timed_out(),
                err => observed.failed(err),
            }
        }
        outcome
    }

    async fn acquire_all_on(
        self,
        client: &Client,
        names: Vec<String>,
        observed: &mut Acquire,
    ) -> Result<LockGuard, LockError> {
        let inner = &client.inner;
        let config = &inner.config;
        if names.is_empty() {
            return Err(LockError::Config(
                "`lock_all` was given no key: name at least one".to_owned(),
            ));
        }
        let keys = ordered_keys(&config.key_prefix, names)?;
        let label = keys
            .iter()
            .map(|key| key.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let lease = self.checked_lease(config, &label)?;
        let wait = self.wait.unwrap_or(config.default_wait);
        observed.try_once = wait.is_zero();
        let started = Instant::now();
        let deadline = started
            .checked_add(wait)
            .unwrap_or_else(|| started + Duration::from_secs(100 * 365 * 24 * 3600));
        let mut backoff = Backoff::new(config.backoff_min, config.backoff_max);
        let waker = inner.backend.waker();
        // The interest in the release of the key found held last, and that key's position.
        let mut interest = None;
        let fencing = self.fencing.unwrap_or(config.fencing);
        let mut refused_before = false;
        loop {
            if inner.shut_down.load(Ordering::Relaxed) {
                return Err(Client::shut_down_error());
            }
            let sent = inner.clock.now();
            let writer_waiting =
                writer_waiting_mark(config.backoff_max, deadline - Instant::now().min(deadline));
            let attempt = Attempt {
                releaser: &inner.releaser,
                kind: Kind::Write,
                keys: &keys,
                owner: new_owner(&inner.holder),
                expires: sent + lease,
                settled: false,
            };
            observed.tried();
            let reply = inner
                .clock
                .send(
                    &inner.io,
                    inner.backend.acquire_all(&MultiTry {
                        keys: &keys,
                        owner: &attempt.owner,
                        lease,
                        writer_waiting,
                        refused_before,
                        fencing,
                    }),
                )
                .await;
            let (remaining, held_at) = match reply {
                Ok(MultiReply::Acquired(_)) if inner.clock.now() >= sent + lease - drift(lease) => {
                    // Too late to leave any of the lease: given back by the drop.
                    drop(attempt);
                    (None, None)
                }
                Ok(MultiReply::Acquired(tokens)) => {
                    let owner = attempt.settle();
                    let hold = observed.granted(&label, tokens.first().copied().flatten(), lease);
                    let mut leases = Vec::with_capacity(keys.len());
                    let mut hold = Some(hold);
                    for (key, token) in keys.iter().zip(tokens) {
                        let hold = hold
                            .take()
                            .unwrap_or_else(|| observed.granted(&key.name, token, lease));
                        let lease = Arc::new(Lease::new(
                            Kind::Write,
                            key.clone(),
                            owner.clone(),
                            token,
                            lease,
                            self.watchdog,
                            self.max_hold,
                            sent,
                            inner.clock,
                            hold,
                        ));
                        inner.watchdog.watch(lease.clone());
                        leases.push(lease);
                    }
                    let guard = LockGuard::of_all(leases, inner.releaser.clone());
                    if inner.shut_down.load(Ordering::SeqCst) {
                        let _ = guard.release().await;
                        return Err(Client::shut_down_error());
                    }
                    return Ok(guard);
                }
                Ok(MultiReply::Held(remaining, at)) => {
                    attempt.settle();
                    observed.refused();
                    refused_before = true;
                    (remaining, Some(at))
                }
                Err(err) => {
                    if !is_ambiguous(&err) {
                        attempt.settle();
                    }
                    return Err(err);
                }
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::Timeout {
                    key: label,
                    waited: now - started,
                });
            }
            let mut delay = backoff.next_delay().min(deadline - now);
            if let Some(remaining) = remaining {
                delay = delay.min(remaining);
            }
            match waker {
                // Woken by the release of the key found held, or after the backoff step.
                Some(waker) => {
                    let at = held_at.unwrap_or(0).min(keys.len() - 1);
                    let (_, interest) = match &mut interest {
                        Some((held, _)) if *held != at => interest
                            .insert((at, waker.interest(&keys[at].channel, Kind::Write, ""))),
                        Some(current) => current,
                        None => interest
                            .insert((at, waker.interest(&keys[at].channel, Kind::Write, ""))),
                    };
                    observed.waited(waker.wait(interest, delay).await);
                }
                None => tokio::time::sleep(delay).await,
            }
        }
    }
}

/// The keys of a multi-key request in the order every request takes them: sorted by lock
/// key, duplicates once, then the keys of one Cluster slot moved next to the first of them (so
/// each slot's keys go in one script; the slots' order follows from the sorted keys, the same
/// for every request).
fn ordered_keys(prefix: &str, names: Vec<String>) -> Result<Vec<LockKey>, LockError> {
    let mut keys = names
        .into_iter()
        .map(|name| LockKey::new(prefix, name))
        .collect::<Result<Vec<_>, _>>()?;
    keys.sort_by(|a, b| a.lock.cmp(&b.lock));
    keys.dedup_by(|a, b| a.lock == b.lock);
    let mut slots: Vec<(Slot, Vec<LockKey>)> = Vec::new();
    for key in keys {
        let slot = Slot::for_key(&key.lock);
        match slots.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(key),
            None => slots.push((slot, vec![key])),
        }
    }
    Ok(slots.into_iter().flat_map(|(_, group)| group).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_taken_in_one_order_whatever_order_they_are_given_in() {
        let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let a = ordered_keys("p:", names(&["b", "a", "c", "a"])).unwrap();
        let b = ordered_keys("p:", names(&["c", "a", "b"])).unwrap();
        let locks = |keys: &[LockKey]| keys.iter().map(|k| k.lock.clone()).collect::<Vec<_>>();
        assert_eq!(locks(&a), locks(&b));
        assert_eq!(a.len(), 3, "duplicates are taken once");
        assert!(matches!(
            ordered_keys("p:", names(&["a", ""])),
            Err(LockError::InvalidKey { .. })
        ));
    }
}
