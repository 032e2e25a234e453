//! A server that takes connections and never answers: it listens on a free loopback port,
//! accepts every connection, reads (and throws away) whatever is sent, and writes nothing —
//! what a client sees of a frozen process behind a live socket or of a proxy whose backend
//! is gone. Unlike a SIGSTOPped `redis-server` (whose kernel stops accepting once its backlog
//! is full), it never refuses a connection. It runs on its own thread with its own small
//! tokio runtime, so the test's runtime cannot slow it down, and stops (closing every
//! connection) when the [`SilentServer`] is dropped.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A running silent server; see the [module documentation](self).
pub struct SilentServer {
    port: u16,
    accepted: Arc<AtomicU64>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl SilentServer {
    /// Starts one on a free `127.0.0.1` port, claimed for the rest of the process
    /// ([`claim_port`](super::claim_port)). Panics (with a message) only when the machine
    /// cannot give it a port, a runtime or a thread.
    pub fn start() -> Self {
        let (listener, port) = loop {
            let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .expect("bind a free loopback port for the silent server");
            let port = listener
                .local_addr()
                .expect("the silent server's address")
                .port();
            if super::claim_port(port) {
                break (listener, port);
            }
        };
        listener
            .set_nonblocking(true)
            .expect("make the silent server's listener non-blocking");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("build the silent server's runtime");
        let accepted = Arc::new(AtomicU64::new(0));
        let counter = accepted.clone();
        let (shutdown, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("test-silent-{port}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::select! {
                        () = swallow(listener, counter) => {}
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime cancels every reader, which closes its socket.
                drop(runtime);
            })
            .expect("spawn the silent server's thread");
        Self {
            port,
            accepted,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, for a client that should take it for a Redis server.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// How many connections it has accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Accepts connections until cancelled, reading each to its end on a task of its own.
async fn swallow(listener: TcpListener, accepted: Arc<AtomicU64>) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        accepted.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let mut buffer = [0_u8; 4096];
            while matches!(socket.read(&mut buffer).await, Ok(read) if read > 0) {}
        });
    }
}
