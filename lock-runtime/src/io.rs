//! The client's own background runtime: one thread running a current-thread tokio runtime that
//! owns the watchdog, releases spawned from `Drop`, the pub/sub and Cluster connections, and a
//! node's connection when no multi-thread caller runtime made it (`store/connection.rs`).
//!
//! A task that panics there (say, rustls finding no crypto provider while connecting) ends
//! alone: the runtime lets a panicking task go and keeps running the others, and
//! [`connect_task_failed`] turns the panic into an error that says what happened, not "the
//! runtime has shut down".
//!
//! Why not only the caller's runtime: a task spawned on the runtime of the first
//! `#[tokio::test]` dies with it, and the global client would fail in every later test. Work
//! that must outlive whichever runtime the caller happens to be on runs here instead; requests
//! themselves are sent from the caller's task, with their timeouts on this runtime's clock when
//! the caller's may be paused ([`IoRuntime::with_real_timers`]).

use std::future::Future;

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::{JoinError, JoinHandle};

use crate::error::{BackendError, BackendErrorKind, LockError};

/// The caller's runtime, when it is a multi-thread one: there a connection's driver can run
/// beside the requests (no hop to the I/O thread), and its tasks keep running between the
/// caller's awaits — unlike a current-thread runtime's between its `block_on`s.
pub(crate) fn multi_thread_caller() -> Option<Handle> {
    Handle::try_current()
        .ok()
        .filter(|caller| caller.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Handle to the background runtime; the thread ends when this is dropped.
pub(crate) struct IoRuntime {
    handle: Handle,
    _shutdown: oneshot::Sender<()>,
}

impl IoRuntime {
    pub(crate) fn start() -> Result<Self, LockError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|err| {
                LockError::Config(format!("could not start distlock's I/O runtime: {err}"))
            })?;
        let handle = runtime.handle().clone();
        let (shutdown, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("distlock-io".to_owned())
            .spawn(move || {
                // Returns when the owning client is gone (the sender is dropped). Tasks still
                // running are cancelled when the runtime drops here, outside any async context.
                let _ = runtime.block_on(stopped);
            })
            .map_err(|err| {
                LockError::Config(format!("could not start distlock's I/O thread: {err}"))
            })?;
        Ok(Self {
            handle,
            _shutdown: shutdown,
        })
    }

    /// A handle to the background runtime.
    pub(crate) fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Polls `request`, a request to Redis sent from the caller's task, with this runtime's
    /// context entered when the caller is not on a multi-thread runtime: the timeouts it starts
    /// (the `redis` crate's response timeout, Redlock's per-node timeout) then run on this
    /// runtime's clock, which is never paused. On a caller's paused clock (`start_paused`, only
    /// possible on a current-thread runtime) auto-advance would fire them while the reply is on
    /// its way. Connections made meanwhile get their driver here, as they do for such callers
    /// anyway (`store/connection.rs`); a multi-thread caller keeps its own context, where its
    /// connections' drivers run.
    pub(crate) async fn with_real_timers<F: Future>(&self, request: F) -> F::Output {
        if multi_thread_caller().is_some() {
            return request.await;
        }
        let mut request = std::pin::pin!(request);
        std::future::poll_fn(|cx| {
            let _entered = self.handle.enter();
            request.as_mut().poll(cx)
        })
        .await
    }

    /// Runs `future` on the background runtime. Never panics; after shutdown the task is
    /// dropped unrun.
    pub(crate) fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(future)
    }
}

/// The error of a connect whose task did not finish: it panicked (inside the redis crate or
/// rustls: TLS set up without a crypto provider is the known case), or its runtime is gone.
pub(crate) fn connect_task_failed(err: JoinError) -> BackendError {
    if !err.is_panic() {
        return BackendError::new(
            "connect",
            BackendErrorKind::Connection,
            "the client's I/O runtime has shut down",
        );
    }
    let payload = err.into_panic();
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    if message.contains("CryptoProvider") {
        BackendError::new(
            "connect",
            BackendErrorKind::Tls,
            format!(
                "TLS could not be set up: no rustls crypto provider is installed ({message}); \
                 enable distlock's `tls` feature (`{}`), which installs one, or install one \
                 with `rustls::crypto::CryptoProvider::install_default` before connecting",
                crate::tls::ENABLE_TLS
            ),
        )
    } else {
        BackendError::new(
            "connect",
            BackendErrorKind::Connection,
            format!("connecting panicked: {message}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_task_leaves_the_runtime_serving_the_next_ones() {
        let io = IoRuntime::start().unwrap();
        let caller = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        caller.block_on(async {
            let panicked = io
                .spawn(async { panic!("no process-level CryptoProvider available") })
                .await
                .unwrap_err();
            let err = connect_task_failed(panicked);
            assert_eq!(err.kind(), BackendErrorKind::Tls);
            assert!(err.to_string().contains("`tls` feature"), "{err}");
            assert_eq!(io.spawn(async { 7 }).await.unwrap(), 7);
        });
    }
}
