//! The eviction check is "sent beside the first request, never in front of it"
//! (guarantees.md): the first request to a server is sent without waiting for the
//! `CONFIG GET` reply. A relay between the client and the server passes every reply on
//! [`REPLY_DELAY`] late (each on its own clock, so replies are not held behind one another)
//! and notes when each request reaches it: the first request's bytes come before the check's
//! reply could have reached the client. (`MONITOR` does not show `CONFIG`, an admin command.)
//! `eviction_warning.rs` checks what the check says.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::masters::start_masters;
use crate::support::RedisServer;
use distlock::{Client, Config};

/// How late the relay passes every reply on.
const REPLY_DELAY: Duration = Duration::from_millis(500);

/// Requests as they reached the relay: when, and their bytes.
type Sent = Arc<Mutex<Vec<(Instant, Vec<u8>)>>>;

/// Relays one loopback port to `target`, replies [`REPLY_DELAY`] late, requests noted.
struct SlowRelay {
    port: u16,
    sent: Sent,
}

impl SlowRelay {
    fn start(target: u16) -> Self {
        let (listener, port) = loop {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
            let port = listener.local_addr().expect("address").port();
            if crate::support::claim_port(port) {
                break (listener, port);
            }
        };
        let sent: Sent = Arc::default();
        let log = sent.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect((Ipv4Addr::LOCALHOST, target)) else {
                    return;
                };
                relay(client, server, log.clone());
            }
        });
        Self { port, sent }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// When the first request holding `needle` reached the relay.
    fn first_sent(&self, needle: &[u8]) -> Option<Instant> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .find(|(_, bytes)| bytes.windows(needle.len()).any(|w| w == needle))
            .map(|(at, _)| *at)
    }
}

/// Passes requests on at once (noting them) and each chunk of replies `REPLY_DELAY` after
/// it came, on threads of its own; ends when either side closes.
fn relay(mut client: TcpStream, mut server: TcpStream, sent: Sent) {
    let (mut client_in, mut server_out) = (
        client.try_clone().expect("clone"),
        server.try_clone().expect("clone"),
    );
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = client_in.read(&mut buffer) {
            sent.lock()
                .unwrap()
                .push((Instant::now(), buffer[..n].to_vec()));
            if server_out.write_all(&buffer[..n]).is_err() {
                break;
            }
        }
    });
    let (replies, delayed) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = server.read(&mut buffer) {
            if replies
                .send((Instant::now() + REPLY_DELAY, buffer[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for (due, bytes) in delayed {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if client.write_all(&bytes).is_err() {
                break;
            }
        }
    });
}

/// Takes a lock through `client` (the first request to the server behind `relay`) and
/// asserts that the grant's bytes reached the relay before `CONFIG GET`'s reply could have
/// reached the client (its request's arrival plus [`REPLY_DELAY`]).
async fn assert_first_request_beside_the_check(client: &Client, relay: &SlowRelay) {
    let guard = client.lock("first").acquire().await.expect("granted");
    assert!(guard.release().await.expect("release"));
    let config_get = relay.first_sent(b"CONFIG").expect("the eviction check ran");
    let grant = relay.first_sent(b"{first}").expect("the grant ran");
    let after = grant.saturating_duration_since(config_get);
    assert!(
        after < REPLY_DELAY / 2,
        "the first request was sent {after:?} after CONFIG GET, whose reply took \
         {REPLY_DELAY:?}: the request waited for the check"
    );
}

/// A single server at the defaults (response timeout 1 s, connect timeout 2 s). Seen: `CONFIG
/// GET` and the grant in one write (0 ms apart). Shown to fail (the grant sent 0.50 s after
/// it, here and on Redlock) with `connection.rs` awaiting `eviction::check_node` before
/// handing the connection out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_single_server_the_first_request_does_not_wait_for_the_eviction_check() {
    let server = RedisServer::start();
    let relay = SlowRelay::start(server.port());
    let client = Client::new(Config::from_url(&relay.url()).expect("valid url")).expect("client");
    assert_first_request_beside_the_check(&client, &relay).await;
}

/// Redlock at the defaults, one master of three behind the slow relay: its check, too, is
/// beside the first request sent to it (the grant stands on the other two; the slow
/// master's request still reaches it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_a_masters_first_request_does_not_wait_for_its_eviction_check() {
    let masters = start_masters(3);
    let relay = SlowRelay::start(masters[0].port());
    let urls = [relay.url(), masters[1].url(), masters[2].url()];
    let client = Client::new(Config::redlock(urls).expect("valid urls")).expect("client");
    assert_first_request_beside_the_check(&client, &relay).await;
}
