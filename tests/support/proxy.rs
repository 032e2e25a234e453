//! A fault-injecting TCP proxy between a client under test and a `redis-server` from
//! [`RedisServer`](super::RedisServer): it listens on a free loopback port, forwards every
//! connection to the target port on loopback, and lets a test switch at run time between
//! forwarding ([`Mode::Pass`]), holding every byte while keeping the connections open
//! ([`Mode::Stall`]), cutting every connection ([`Mode::Drop`]), and letting requests through
//! while losing their replies ([`Mode::DropReplies`]). Apart from the mode, it can hold just
//! the connections open now ([`Proxy::hold_current_connections`]) while new ones pass, send
//! new connections to another server ([`Proxy::retarget`]), and cut any connection that sends
//! a given command ([`Proxy::cut_connections_sending`]), and hold every reply for a while
//! before passing it on ([`Proxy::delay_replies`]): a slow network or server. It runs on its own thread
//! with its own small tokio runtime, so a test's runtime (or a blocking call in it) cannot slow
//! the relay down, and everything it started stops when the [`Proxy`] is dropped.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

/// Size of the buffer each direction of a connection reads into. Bytes read but not yet
/// forwarded when a stall begins wait in it; the rest wait in the kernel's socket buffers.
const CHUNK: usize = 16 * 1024;

/// What the proxy does with connections and the bytes on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways; accept new connections.
    Pass,
    /// Keep every connection open (and accept new ones) but forward nothing in either
    /// direction: a network that has gone silent. Bytes are held, not dropped, and flow again
    /// in order after a switch back to [`Mode::Pass`].
    Stall,
    /// Close every current connection (held bytes are lost) and close new ones as soon as they
    /// are accepted: a cut cable or a crashed middlebox. Switching back to [`Mode::Pass`]
    /// serves new connections normally.
    Drop,
    /// Forward requests to the server, but close a connection as soon as the server answers
    /// on it, losing the answer: the request ran, the client never learns it.
    DropReplies,
}

/// Which way bytes flow through a relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

/// Where a pump is: about to read a chunk, or about to write the chunk it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Read,
    Write,
}

/// Per-connection faults beside the mode: connections numbered up to `held_through` (they
/// are numbered from 1 as accepted) forward nothing until it drops back to 0.
type Hold = watch::Receiver<u64>;

/// Bytes that, seen in a request, make the proxy cut that connection instead of forwarding it.
type CutOn = Arc<Mutex<Option<Vec<u8>>>>;

/// How long each chunk of replies is held before it is passed on, in microseconds (0: none).
type ReplyDelay = Arc<AtomicU64>;

/// A running proxy; see the [module documentation](self). Start it with
/// [`Proxy::start`]`(server.port())`, give the client under test [`Proxy::url`], and switch
/// faults on and off with [`Proxy::set_mode`].
pub struct Proxy {
    port: u16,
    mode: watch::Sender<Mode>,
    held_through: watch::Sender<u64>,
    target: Arc<AtomicU16>,
    cut_on: CutOn,
    reply_delay: ReplyDelay,
    accepted: Arc<AtomicU64>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy on a free `127.0.0.1` port that forwards to `127.0.0.1:target_port`,
    /// in [`Mode::Pass`].
    ///
    /// Panics (with a message) only when the test machine cannot give it a loopback port, a
    /// runtime or a thread; errors on the relayed connections never panic, they close that
    /// connection.
    pub fn start(target_port: u16) -> Self {
        // A port no server of this process had: clients take the proxy for a server.
        let (listener, port) = loop {
            let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .expect("bind a free loopback port for the proxy");
            let port = listener
                .local_addr()
                .expect("the proxy's listening address")
                .port();
            if super::claim_port(port) {
                break (listener, port);
            }
        };
        listener
            .set_nonblocking(true)
            .expect("make the proxy's listener non-blocking");
        let target = Arc::new(AtomicU16::new(target_port));
        let targets = target.clone();
        let cut_on = CutOn::default();
        let cuts = cut_on.clone();
        let reply_delay = ReplyDelay::default();
        let delays = reply_delay.clone();

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("build the proxy's runtime");
        let (mode, modes) = watch::channel(Mode::Pass);
        let (held_through, holds) = watch::channel(0);
        let (shutdown, stopped) = oneshot::channel::<()>();
        let accepted = Arc::new(AtomicU64::new(0));
        let counter = accepted.clone();
        let thread = std::thread::Builder::new()
            .name(format!("test-proxy-{port}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::select! {
                        () = accept(listener, targets, modes, holds, cuts, delays, counter) => {}
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime here cancels every relay task, which closes its sockets.
                drop(runtime);
            })
            .expect("spawn the proxy's thread");

        Self {
            port,
            mode,
            held_through,
            target,
            cut_on,
            reply_delay,
            accepted,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// The loopback port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT` of the proxy, for a client that should go through it.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Switches the proxy to `mode`. Takes effect on every connection at once (the relay
    /// notices within microseconds; a chunk already being written still completes).
    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// Holds every byte on the connections open now, both ways, while new connections pass
    /// (subject to the mode): a request stuck in the network on a connection the client is
    /// about to give up on. [`Proxy::release_held`] lets the held bytes flow again, in order.
    pub fn hold_current_connections(&self) {
        self.held_through
            .send_replace(self.accepted.load(Ordering::SeqCst));
    }

    /// Lets the connections held by [`Proxy::hold_current_connections`] forward again.
    pub fn release_held(&self) {
        self.held_through.send_replace(0);
    }

    /// Sends connections accepted from now on to `127.0.0.1:port` instead; open ones stay
    /// where they are. A failover behind a stable endpoint (a DNS name or a load balancer).
    pub fn retarget(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
    }

    /// Cuts every connection, old or new, on which the client sends a chunk containing
    /// `request` (say `b"SUBSCRIBE"`), instead of forwarding it: a middlebox or server that
    /// drops one kind of request with its connection. Other connections pass as the mode says.
    pub fn cut_connections_sending(&self, request: &[u8]) {
        *self.cut_on.lock().unwrap_or_else(PoisonError::into_inner) = Some(request.to_vec());
    }

    /// Holds every chunk of replies for `delay` before passing it on (zero: none), on every
    /// connection, old or new: a server or network that answers `delay` late. Chunks are
    /// passed on in order, each after its own delay, so replies read together are late
    /// together.
    pub fn delay_replies(&self, delay: std::time::Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.reply_delay.store(micros, Ordering::SeqCst);
    }

    /// How many connections the proxy has accepted so far (in any mode): proof that a client
    /// really goes through it.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Accepts connections until cancelled, relaying each on its own task.
async fn accept(
    listener: TcpListener,
    target: Arc<AtomicU16>,
    modes: watch::Receiver<Mode>,
    holds: Hold,
    cut_on: CutOn,
    reply_delay: ReplyDelay,
    accepted: Arc<AtomicU64>,
) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                // Out of file descriptors and the like: the next accept may work.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let id = accepted.fetch_add(1, Ordering::SeqCst) + 1;
        if *modes.borrow() == Mode::Drop {
            drop(client);
            continue;
        }
        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, target.load(Ordering::SeqCst)));
        let faults = Faults {
            modes: modes.clone(),
            holds: holds.clone(),
            cut_on: cut_on.clone(),
            reply_delay: reply_delay.clone(),
            id,
        };
        tokio::spawn(relay(client, target, faults));
    }
}

/// What one relayed connection watches: the proxy's mode and its hold, and its own number.
#[derive(Clone)]
struct Faults {
    modes: watch::Receiver<Mode>,
    holds: Hold,
    cut_on: CutOn,
    reply_delay: ReplyDelay,
    id: u64,
}

impl Faults {
    /// Whether `chunk` sent by the client is one the proxy cuts the connection on.
    fn cuts(&self, chunk: &[u8]) -> bool {
        let cut_on = self.cut_on.lock().unwrap_or_else(PoisonError::into_inner);
        cut_on.as_deref().is_some_and(|request| {
            !request.is_empty() && chunk.windows(request.len()).any(|w| w == request)
        })
    }
}

/// Connects `client` to the target and pumps both directions until either side closes, an I/O
/// error happens, or the mode turns to [`Mode::Drop`]; then closes both sockets.
async fn relay(client: TcpStream, target: SocketAddr, mut faults: Faults) {
    let server = tokio::select! {
        biased;
        () = cut(&mut faults.modes) => return,
        connected = TcpStream::connect(target) => match connected {
            Ok(server) => server,
            Err(_) => return,
        },
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (from_client, to_client) = client.into_split();
    let (from_server, to_server) = server.into_split();
    tokio::select! {
        () = pump(from_client, to_server, Direction::ToServer, faults.clone()) => {}
        () = pump(from_server, to_client, Direction::ToClient, faults) => {}
    }
}

/// Forwards bytes from `from` to `to` while the mode is [`Mode::Pass`], holds them while it is
/// [`Mode::Stall`] or the connection is held, and returns on [`Mode::Drop`], on a reply under
/// [`Mode::DropReplies`], end of stream or any I/O error.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    direction: Direction,
    mut faults: Faults,
) {
    let mut buffer = vec![0; CHUNK];
    loop {
        if !passing(&mut faults, direction, Step::Read).await {
            return;
        }
        let read = tokio::select! {
            biased;
            () = cut(&mut faults.modes) => return,
            read = from.read(&mut buffer) => match read {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            },
        };
        if direction == Direction::ToServer && faults.cuts(&buffer[..read]) {
            return;
        }
        let delay = faults.reply_delay.load(Ordering::SeqCst);
        if direction == Direction::ToClient && delay > 0 {
            tokio::select! {
                biased;
                () = cut(&mut faults.modes) => return,
                () = tokio::time::sleep(std::time::Duration::from_micros(delay)) => {}
            }
        }
        // A stall that began during the read holds this chunk here.
        if !passing(&mut faults, direction, Step::Write).await {
            return;
        }
        tokio::select! {
            biased;
            () = cut(&mut faults.modes) => return,
            written = to.write_all(&buffer[..read]) => {
                if written.is_err() {
                    return;
                }
            }
        }
    }
}

/// Waits while the proxy is stalled or this connection is held: `true` once bytes may pass
/// this way, `false` if the connection is to be cut (or the proxy is shutting down).
async fn passing(faults: &mut Faults, direction: Direction, step: Step) -> bool {
    let id = faults.id;
    if faults
        .holds
        .wait_for(|held_through| id > *held_through)
        .await
        .is_err()
    {
        return false;
    }
    match faults.modes.wait_for(|mode| *mode != Mode::Stall).await {
        Ok(mode) => match *mode {
            Mode::Pass => true,
            // A reply is read (so that the request it answers has surely run), then lost.
            Mode::DropReplies => direction == Direction::ToServer || step == Step::Read,
            Mode::Stall | Mode::Drop => false,
        },
        Err(_) => false,
    }
}

/// Completes when the proxy cuts connections (or is shutting down).
async fn cut(modes: &mut watch::Receiver<Mode>) {
    let _ = modes.wait_for(|mode| *mode == Mode::Drop).await;
}
