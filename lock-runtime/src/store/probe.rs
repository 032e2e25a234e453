//! The question a Redlock master that let a request run past its timeout is asked until it
//! answers: a `PING` on its connection, which the master runs only after whatever it has not
//! run yet ([`until_it_answers`]). While it is asked, `redlock.rs` does not wait for it once
//! the other masters have settled an outcome.
//!
//! An ACL that refuses `PING` is an answer too: the refusal comes back in order, after the
//! requests queued before it, so the master has caught up. It ends the asking at once — one
//! refused command in the master's `ACL LOG`, not one per pause — and is told once per master,
//! with the grant that would avoid it (`Client::ping` needs `PING` as well).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::redis::NodeStore;
use super::Store;
use crate::error::LockError;

/// Asks `master` for a `PING` until it answers (an ACL's refusal included), pausing `pause`
/// after each failure (no connection, a timeout). `told` is set once the refusal was warned
/// of, so each master's is told once.
pub(crate) async fn until_it_answers(master: &NodeStore, pause: Duration, told: &AtomicBool) {
    loop {
        match master.ping().await {
            Ok(()) => return,
            Err(LockError::Backend(err)) if err.refused_command() == Some("ping") => {
                if !told.swap(true, Ordering::AcqRel) {
                    tracing::warn!(
                        target: crate::telemetry::LOG_TARGET,
                        error = %err,
                        "a Redlock master's ACL refuses `PING`, which distlock sends to a master \
                         that missed its node timeout to learn that it has caught up (the \
                         refusal counts as that answer) and for `Client::ping`: grant it \
                         (`ACL SETUSER <user> +ping`); told once per master"
                    );
                }
                return;
            }
            Err(_) => tokio::time::sleep(pause).await,
        }
    }
}
