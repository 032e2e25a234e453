//! Where one Redis server's connection (`connection.rs`) and its wake-ups (`wake.rs`) connect:
//! a fixed server, or the primary that Redis Sentinel names, asked for again on every new
//! connection — so after a connection error or a `READONLY` reply (which drop the connection)
//! the next request goes to whichever primary the sentinels name by then. The connection
//! checks the role of what it reached before it sends anything else (`redis-rs`' own sentinel
//! connection does not follow a failover).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::{AsyncConnectionConfig, ConnectionAddr, ErrorKind, RedisError};

use crate::url::server_address;

/// The server a node store connects to.
pub(crate) enum Endpoint {
    /// Always this server.
    Fixed(redis::Client),
    /// The primary these sentinels name.
    Sentinel(Sentinel),
}

/// Sentinels that monitor one primary.
pub(crate) struct Sentinel {
    sentinels: Vec<redis::Client>,
    master: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// The sentinel that answered last: asked first next time, so a sentinel that hangs
    /// (its host died with the primary, say) does not cost every lookup a connect timeout.
    last_answered: AtomicUsize,
    /// The primary the sentinels named last (`host:port`), to tell of a failover.
    last_primary: Mutex<Option<String>>,
    /// How many times the named primary has changed: a connection made before the last
    /// change is to a server that may no longer be the primary (the wake-ups' subscription
    /// follows it: `wake.rs`).
    moves: AtomicU64,
}

impl Endpoint {
    /// The server to connect to now: for Sentinel, the primary the first sentinel that
    /// answers names.
    pub(crate) async fn resolve(&self) -> Result<redis::Client, RedisError> {
        match self {
            Endpoint::Fixed(client) => Ok(client.clone()),
            Endpoint::Sentinel(sentinel) => sentinel.primary().await,
        }
    }

    /// A pub/sub connection to the server.
    pub(crate) async fn pubsub(&self) -> Result<redis::aio::PubSub, RedisError> {
        self.resolve().await?.get_async_pubsub().await
    }

    /// How many times the server this endpoint names has changed (a Sentinel failover seen by
    /// any connection to it); always 0 for the other kinds.
    pub(crate) fn moves(&self) -> u64 {
        match self {
            Endpoint::Sentinel(sentinel) => sentinel.moves.load(Ordering::Acquire),
            _ => 0,
        }
    }

    /// Whether what [`resolve`](Self::resolve) names must be checked to be a primary before
    /// it is used: a sentinel's answer may be stale during a failover.
    pub(crate) fn is_sentinel(&self) -> bool {
        matches!(self, Endpoint::Sentinel(_))
    }

    /// For logs and messages: the address (never credentials).
    pub(crate) fn describe(&self) -> String {
        match self {
            Endpoint::Fixed(client) => server_address(client),
            Endpoint::Sentinel(sentinel) => format!(
                "primary `{}` of the sentinels at {}",
                sentinel.master,
                sentinel
                    .sentinels
                    .iter()
                    .map(server_address)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

impl Sentinel {
    pub(crate) fn new(
        sentinels: Vec<redis::Client>,
        master: String,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Self {
            sentinels,
            master,
            connect_timeout,
            response_timeout,
            last_answered: AtomicUsize::new(0),
            last_primary: Mutex::new(None),
            moves: AtomicU64::new(0),
        }
    }

    /// Asks the sentinels in turn for the primary's address; the primary is reached with the
    /// credentials and db of the first sentinel URL, and over TLS when it is a `rediss://` one.
    async fn primary(&self) -> Result<redis::Client, RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout));
        let mut failures = Vec::new();
        // Whether every sentinel failed by running out of time: up but frozen, or silent.
        let mut all_timed_out = true;
        let count = self.sentinels.len();
        let first = self.last_answered.load(Ordering::Relaxed);
        for at in (0..count).map(|i| (first + i) % count) {
            let sentinel = &self.sentinels[at];
            let asked = async {
                let mut connection = sentinel
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.master)
                    .query_async::<Option<(String, u16)>>(&mut connection)
                    .await
            };
            match asked.await {
                Ok(Some((host, port))) => {
                    self.last_answered.store(at, Ordering::Relaxed);
                    self.note_primary(&host, port);
                    let first = self.sentinels[0].get_connection_info();
                    let info = first
                        .clone()
                        .set_addr(primary_addr(first.addr(), host, port));
                    return redis::Client::open(info);
                }
                Ok(None) => {
                    all_timed_out = false;
                    failures.push(format!(
                        "{} does not monitor a master named `{}`",
                        server_address(sentinel),
                        self.master
                    ));
                }
                Err(err) => {
                    all_timed_out &= err.is_timeout();
                    failures.push(format!("{}: {err}", server_address(sentinel)));
                }
            }
        }
        if all_timed_out {
            // A timeout still, so that the error gives the advice for a frozen server.
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no sentinel named the primary: {}", failures.join("; ")),
            )));
        }
        Err(RedisError::from((
            ErrorKind::Io,
            "no sentinel named the primary",
            failures.join("; "),
        )))
    }

    /// Remembers the primary the sentinels named, and tells of a failover when it changed.
    fn note_primary(&self, host: &str, port: u16) {
        let now = format!("{host}:{port}");
        let mut last = self
            .last_primary
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match last.as_deref() {
            Some(before) if before != now => {
                tracing::info!(
                    target: crate::telemetry::LOG_TARGET,
                    master = %self.master,
                    from = before,
                    to = %now,
                    "Sentinel failover: the primary has moved"
                );
                self.moves.fetch_add(1, Ordering::AcqRel);
            }
            Some(_) => return,
            None => {}
        }
        *last = Some(now);
    }
}

/// The address of the primary a sentinel named: over TLS (with the sentinel's certificate
/// settings) when the sentinel is reached over TLS, as a TLS deployment serves both that way.
fn primary_addr(sentinel: &ConnectionAddr, host: String, port: u16) -> ConnectionAddr {
    match sentinel {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_primary_is_reached_over_tls_when_the_sentinels_are() {
        let plain = ConnectionAddr::Tcp("s".to_owned(), 26379);
        assert!(matches!(
            primary_addr(&plain, "p".to_owned(), 6379),
            ConnectionAddr::Tcp(host, 6379) if host == "p"
        ));
        let tls = ConnectionAddr::TcpTls {
            host: "s".to_owned(),
            port: 26379,
            insecure: false,
            tls_params: None,
        };
        assert!(matches!(
            primary_addr(&tls, "p".to_owned(), 6380),
            ConnectionAddr::TcpTls { host, port: 6380, insecure: false, .. } if host == "p"
        ));
    }
}
