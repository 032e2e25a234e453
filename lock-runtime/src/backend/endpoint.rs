//! Where a Redis node store (`redis.rs`) and its wake-ups (`wake.rs`) connect: a fixed server,
//! or the primary that Redis Sentinel names, asked for again on every new connection — so
//! after a connection error or a `READONLY` reply (which drop the connection) the next request
//! goes to whichever primary the sentinels name by then. The store checks the role of what it
//! reached before it sends anything else (`redis-rs`' own sentinel connection does not follow
//! a failover).

use std::time::Duration;

use redis::{AsyncConnectionConfig, ConnectionAddr, ErrorKind, RedisError};

use crate::error::server_address;

/// The server a node store connects to.
pub(crate) enum Endpoint {
    /// Always this server.
    Fixed(redis::Client),
    /// The primary these sentinels name.
    Sentinel(Sentinel),
}

/// Sentinels that monitor one primary.
pub(crate) struct Sentinel {
    pub(crate) sentinels: Vec<redis::Client>,
    pub(crate) master: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
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
    /// Asks the sentinels in turn for the primary's address; the primary is reached with the
    /// credentials and db of the first sentinel URL.
    async fn primary(&self) -> Result<redis::Client, RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout));
        let mut failures = Vec::new();
        for sentinel in &self.sentinels {
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
                    let info = self.sentinels[0]
                        .get_connection_info()
                        .clone()
                        .set_addr(ConnectionAddr::Tcp(host, port));
                    return redis::Client::open(info);
                }
                Ok(None) => failures.push(format!(
                    "{} does not monitor a master named `{}`",
                    server_address(sentinel),
                    self.master
                )),
                Err(err) => failures.push(format!("{}: {err}", server_address(sentinel))),
            }
        }
        Err(RedisError::from((
            ErrorKind::Io,
            "no sentinel named the primary",
            failures.join("; "),
        )))
    }
}
