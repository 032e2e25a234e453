//! The operations on a key's lock that are not a try, over Redlock's masters (`redlock.rs`):
//! a [`KeyOperation`] runs on every master and the operation's own rule makes one answer of
//! theirs; a scan is the union of the masters' keys; a ping needs a majority. Neighbours:
//! `fencing.rs` (the forced release, which raises the fencing counters around its operation).

use super::RedlockStore;
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::key_operation::{KeyOperation, NoAgreement};
use crate::store::{Found, Store};

impl RedlockStore {
    /// On every master, with one answer made of theirs by the operation's rule; a majority
    /// must answer.
    pub(super) async fn run_on_masters<O: KeyOperation>(
        &self,
        operation: &O,
    ) -> Result<O::Output, LockError> {
        self.reconnect_missing();
        let answers = self
            .on_all(self.node_timeout, |master| master.run(operation))
            .await;
        operation
            .agree(answers, self.quorum())
            .map_err(|no| match no {
                NoAgreement::Refused(err) => err,
                NoAgreement::TooFew { answered, granted } => {
                    self.quorum_unavailable(operation.key(), answered, granted)
                }
            })
    }

    /// The union of the keys on the masters (a key on any master); an error when fewer than
    /// a majority answered.
    pub(super) async fn scan_masters(
        &self,
        pattern: &str,
        found: &mut Found,
    ) -> Result<(), LockError> {
        self.reconnect_missing();
        let mut answered = 0;
        let mut error = None;
        for master in &self.masters {
            match master.scan_into(pattern, found).await {
                Ok(()) => answered += 1,
                Err(err) => error = Some(err),
            }
            if found.full() {
                return Ok(());
            }
        }
        match error {
            Some(err) if answered < self.quorum() => Err(err),
            _ => Ok(()),
        }
    }

    /// Whether a majority of the masters answer a `PING` (each within the connect timeout,
    /// connecting where needed); the error names every master that did not, and why.
    pub(super) async fn ping_masters(&self) -> Result<(), LockError> {
        let answers = self
            .on_all(self.connect_timeout, |master| master.ping())
            .await;
        let failures: Vec<String> = answers
            .iter()
            .filter_map(|answer| answer.as_ref().err().map(ToString::to_string))
            .collect();
        let answered = answers.len() - failures.len();
        if answered >= self.quorum() {
            return Ok(());
        }
        let backend_errors = || {
            answers.iter().filter_map(|answer| match answer {
                Err(LockError::Backend(err)) => Some(err),
                _ => None,
            })
        };
        let kind = backend_errors()
            .next()
            .map_or(BackendErrorKind::Connection, BackendError::kind);
        // A master's ACL that refused the `PING` is named, with how to grant it.
        let refused = backend_errors().find(|err| err.refused_command().is_some());
        let summed = BackendError::new(
            "ping",
            kind,
            format!(
                "{answered} of {} Redlock masters answered, {} needed: {}",
                self.masters.len(),
                self.quorum(),
                failures.join("; ")
            ),
        );
        Err(match refused {
            Some(refused) => summed.refused_as(refused),
            None => summed,
        }
        .into())
    }
}
