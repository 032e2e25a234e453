//! The PostgreSQL store's wake-ups: one connection of its own per client `LISTEN`s on the
//! store's channel (the schema's name), and every notification — `<payload> <lock channel>`,
//! sent by the statement that changed a key (`statements.rs`, at its commit) — is delivered to
//! this client's waiters ([`Waiters::wake`]), which apply the kinds' rule of whom it wakes.
//! A notification is a hint: one lost while the connection is down (or to a server restart)
//! costs a waiter one backoff step, and the connection is made again after a pause. The
//! listener's task and the waiters' feed are `store/every_key.rs`'s (one channel for every
//! key, so nothing is subscribed per key). Its connection speaks TLS as the pool's do
//! (`tls.rs`). Neighbours: `wake.rs` (the waiters), `connections.rs` (how a connection is
//! made).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::runtime::Handle;
use tokio_postgres::{AsyncMessage, Config};

use super::tls::Connector;

use crate::store::every_key::{EveryKey, Subscription};
use crate::wake::Waiters;

/// The listener of one client, shared by its feed and its store.
pub(crate) struct Listener {
    config: Config,
    /// TLS as the pool's connections have it (`tls.rs`).
    connector: Connector,
    /// The channel: the schema's name.
    channel: String,
    waiters: Waiters,
    connect_timeout: Duration,
    every_key: EveryKey,
}

impl Listener {
    pub(crate) fn new(
        config: Config,
        connector: Connector,
        io: Handle,
        channel: String,
        waiters: Waiters,
        connect_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            config,
            connector,
            channel,
            waiters,
            connect_timeout,
            every_key: EveryKey::new(io, connect_timeout),
        })
    }

    /// One connection's life: connect, `LISTEN`, deliver until it breaks.
    async fn listen_once(&self) {
        let connecting = tokio::time::timeout(
            self.connect_timeout,
            self.config.connect(self.connector.clone()),
        );
        let Ok(Ok((client, mut connection))) = connecting.await else {
            return;
        };
        let waiters = self.waiters.clone();
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        let deliver = async move {
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(note) = message {
                    let (payload, channel) = note
                        .payload()
                        .split_once(' ')
                        .unwrap_or(("", note.payload()));
                    waiters.wake(channel, payload.as_bytes());
                }
            }
        };
        tokio::pin!(deliver);
        let statement = format!("LISTEN \"{}\"", self.channel);
        let listen = client.batch_execute(&statement);
        tokio::select! {
            () = &mut deliver => return,
            listened = listen => if listened.is_err() { return },
        }
        self.every_key.set_up(true);
        // Releases announced while nobody listened were not heard: every waiter tries again.
        self.waiters.wake_all();
        deliver.await;
    }

    /// Stops listening (the store is gone).
    pub(crate) fn stop(&self) {
        self.every_key.stop();
    }
}

impl Subscription for Listener {
    fn every_key(&self) -> &EveryKey {
        &self.every_key
    }

    /// Starts listening, once.
    fn start(self: &Arc<Self>) {
        EveryKey::start(
            self,
            |this: Arc<Self>| async move { this.listen_once().await },
        );
    }
}
