//! What the macro hands the attribute's runtime: the target of an annotated fn ([`LockTarget`])
//! and its settings ([`LockSpec`]), turned into a lock request, with the checks the compiler
//! could not make (arguments written as expressions) — made by the request's one check
//! (`request.rs`), naming the argument as written. Neighbours: the macro (`lock-macros`)
//! builds both; `attribute.rs` runs the call.

use std::time::Duration;

use crate::client::Client;
use crate::error::LockError;
use crate::protocol::LockMode;
use crate::request::{settings_refusal, LockRequest, Refusing};

/// What to do with the body when the lease is lost.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// Cancel the body at its next await and return `LockError::LeaseLost`.
    Abort,
    /// Let the body finish; the loss is logged.
    Continue,
}

/// What an annotated fn locks: the macro's checked target (`Target` in
/// `lock-macros/src/validate.rs`, the same three cases), with its keys built from the fn's
/// arguments.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub enum LockTarget {
    /// `key = "…"` (with `mode`): the write (exclusive) or read side of one key's lock.
    Key {
        key: String,
        mode: crate::protocol::LockMode,
    },
    /// `key = "…", permits = N`: one of `permits` permits of the semaphore `key`; `written` is
    /// `permits = <expr>` as written, for errors (`None` for a literal, checked at compile
    /// time).
    Permits {
        key: String,
        permits: u32,
        written: Option<&'static str>,
    },
    /// `keys = [..]`: the write locks of every key at once, in the order written.
    Keys(Vec<String>),
}

impl LockTarget {
    /// How errors and logs name the target: its key, or its keys joined by `, `.
    pub(super) fn label(&self) -> String {
        match self {
            LockTarget::Key { key, .. } | LockTarget::Permits { key, .. } => key.clone(),
            LockTarget::Keys(keys) => keys.join(", "),
        }
    }

    /// The mode a grant of this target holds each key in.
    pub(super) fn mode(&self) -> LockMode {
        match self {
            LockTarget::Key { mode, .. } => *mode,
            LockTarget::Permits { .. } => LockMode::Semaphore,
            LockTarget::Keys(_) => LockMode::Write,
        }
    }

    /// The request for this target through `client`, before the attribute's settings.
    pub(super) fn request(&self, client: &Client) -> LockRequest {
        match self {
            LockTarget::Key {
                key,
                mode: LockMode::Read,
            } => client.read_lock(key.clone()),
            LockTarget::Key { key, .. } => client.write_lock(key.clone()),
            // `permits = 0` written as an expression was refused by `LockSpec::check`; a
            // literal 0 does not compile.
            LockTarget::Permits { key, permits, .. } => client.semaphore(key.clone(), *permits),
            LockTarget::Keys(keys) => client.lock_all(keys.iter().cloned()),
        }
    }
}

/// The attribute's settings, as the macro parsed them.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct LockSpec {
    pub lease: Option<Duration>,
    pub wait: Option<Duration>,
    pub max_hold: Option<Duration>,
    pub watchdog: bool,
    pub on_lost: OnLost,
    /// `Some(false)`: no fencing token (`fencing = false`); `None`: the client's default.
    pub fencing: Option<bool>,
    /// `lease = <expr>` as written, for errors; `None` for a literal (checked at compile time).
    pub lease_expr: Option<&'static str>,
    /// `max_hold = <expr>` as written, for errors; `None` for a literal.
    pub max_hold_expr: Option<&'static str>,
    /// `fair = true`: granted in request order among the key's fair waiters.
    pub fair: bool,
    /// `hold_at_least`: a release before the grant plus this keeps the lock to then.
    pub hold_at_least: Option<Duration>,
    /// Set by `on_busy = "skip"` (not by the expansion): a lock held elsewhere is reported as
    /// busy, not as a timeout.
    #[doc(hidden)]
    pub busy_expected: bool,
}

impl LockSpec {
    /// `request` with the attribute's settings: the watchdog, fencing, lease, wait and
    /// max_hold it was given (the client's defaults for those it was not).
    pub(super) fn settings_of(&self, mut request: LockRequest) -> LockRequest {
        request = request.watchdog(self.watchdog);
        if let Some(fencing) = self.fencing {
            request = request.fencing(fencing);
        }
        if let Some(lease) = self.lease {
            request = request.lease(lease);
        }
        if let Some(wait) = self.wait {
            request = request.wait(wait);
        }
        if let Some(max_hold) = self.max_hold {
            request = request.max_hold(max_hold);
        }
        if self.fair {
            request = request.fair();
        }
        if let Some(min_hold) = self.hold_at_least {
            request = request.hold_at_least(min_hold);
        }
        request.busy_expected = self.busy_expected;
        request
    }

    /// What the compiler could not check: a lease, max_hold or permit count given as an
    /// expression. The error names the argument as written; a request would only name the lock.
    pub(super) fn check(&self, target: &LockTarget, key: &str) -> Result<(), LockError> {
        let invalid = |what: String| {
            Err(LockError::Config(format!(
                "`#[distributed_lock]` on lock `{key}`: {what}"
            )))
        };
        if let LockTarget::Permits {
            permits: 0,
            written: Some(written),
            ..
        } = target
        {
            return invalid(format!(
                "`permits = {written}` is 0: a semaphore of zero permits could never be taken"
            ));
        }
        // A lease and max_hold written as literals were checked by the compiler; the request
        // checks a default lease itself.
        let Some(lease) = self.lease else {
            return Ok(());
        };
        if self.lease_expr.is_none() && self.max_hold_expr.is_none() {
            return Ok(());
        }
        let refusing = Refusing::Attribute {
            lock: key,
            lease: self.lease_expr,
            max_hold: self.max_hold_expr,
        };
        match settings_refusal(lease, self.max_hold, &refusing) {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}
