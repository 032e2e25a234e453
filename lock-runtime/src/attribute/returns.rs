//! The return types an annotated fn may have, as the expansion checks them: a `Result` whose
//! error can carry a [`LockError`] ([`LockResult`], [`LockErrorInto`]), and with
//! `on_busy = "skip"` one with a value that says "skipped" ([`Skipped`]); each with the
//! compiler message that says what to change. Neighbours: the macro's expansion
//! (`lock-macros/src/expand.rs`) emits the checks; `attribute.rs` runs the call.

use crate::error::LockError;

/// The error types an annotated fn's `Result<T, E>` may carry: those with
/// `From<LockError>`. Checked on `E` itself, so the compiler reports this message, once, and
/// not every `From` impl of `E` ("required for `Result<T, E>`…" would name them all).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` cannot return a lock error as `{Self}`: `{Self}` does not implement `From<distlock::LockError>`",
    label = "the error type of this fn cannot carry a `distlock::LockError`",
    note = "implement `From<distlock::LockError>` for the error type (for a type of your own: `impl From<distlock::LockError> for MyError`), or return `anyhow::Result<T>`; a foreign type such as `String` cannot take the impl: wrap it in an error type of your own"
)]
pub trait LockErrorInto {
    /// Makes this error from a lock failure.
    fn from_lock_error(err: LockError) -> Self;
}

impl<E: From<LockError>> LockErrorInto for E {
    fn from_lock_error(err: LockError) -> Self {
        E::from(err)
    }
}

/// The return types an annotated fn may have: `Result<T, E>`; its `E` must also implement
/// [`LockErrorInto`].
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` needs the fn to return `Result<T, E>` where `E: From<distlock::LockError>`; `{Self}` cannot carry a lock error",
    label = "this return type cannot carry `distlock::LockError`",
    note = "return `Result<T, E>` and implement `From<distlock::LockError>` for `E` (or return `anyhow::Result<T>`)"
)]
pub trait LockResult {
    /// The error type.
    type Error;
    /// The result that is this error.
    fn from_error(err: Self::Error) -> Self;
}

impl<T, E> LockResult for Result<T, E> {
    type Error = E;
    fn from_error(err: E) -> Self {
        Err(err)
    }
}

/// The return types an annotated fn with `on_busy = "skip"` may have: those with a value that
/// says "skipped" — `Result<(), E>` (`Ok(())`) and `Result<Option<T>, E>` (`Ok(None)`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`on_busy = \"skip\"` needs the fn to return `Result<(), E>` or `Result<Option<T>, E>`: `{Self}` has no value that says the call was skipped",
    label = "a skipped call would have nothing to return as `{Self}`",
    note = "return `Result<(), E>` (a skipped call returns `Ok(())`) or `Result<Option<T>, E>` (it returns `Ok(None)`), or drop `on_busy = \"skip\"` to wait for the lock"
)]
pub trait Skipped {
    /// The value a skipped call returns.
    fn skipped() -> Self;
}

impl<E> Skipped for Result<(), E> {
    fn skipped() -> Self {
        Ok(())
    }
}

impl<T, E> Skipped for Result<Option<T>, E> {
    fn skipped() -> Self {
        Ok(None)
    }
}

/// What a call skipped by `on_busy = "skip"` returns, for the fn's return type `R`: the
/// expansion's check that `R` has such a value, emitted at the `on_busy` argument.
#[doc(hidden)]
pub fn skipped_value<R: Skipped>() -> fn() -> R {
    R::skipped
}

/// How a lock failure becomes the fn's return type `R`. The expansion's one check of `R`,
/// emitted at the return type; [`run_locked`] itself puts no bound on `R`, so a return type
/// that cannot carry a lock error is reported once.
#[doc(hidden)]
pub fn lock_error_into<R>() -> fn(LockError) -> R
where
    R: LockResult,
    R::Error: LockErrorInto,
{
    |err| R::from_error(R::Error::from_lock_error(err))
}
