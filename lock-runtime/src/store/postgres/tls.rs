//! TLS for the PostgreSQL store's connections: [`Connector`], tokio-postgres' `MakeTlsConnect`
//! over tokio-rustls (the rustls the redis crate's TLS already builds), given to the pool's
//! connections and the listener's alike, and the SSL mode that makes them use it
//! ([`connector`]). Written here rather than taken from a crate: a connector crate could only
//! be switched on by the `postgres` feature (building rustls into every PostgreSQL build) or
//! by `tls` (building tokio-postgres into every Redis TLS build). It offers no channel binding
//! (SCRAM-SHA-256-PLUS): the server's certificate is always checked, host name included.
//! Neighbours: `config/tls_settings.rs` makes the rustls configuration; `connections.rs` and
//! `listener.rs` connect with it.

use tokio_postgres::config::SslMode;
use tokio_postgres::Config;

use crate::config::PostgresOptions;
use crate::error::LockError;

#[cfg(feature = "tls")]
pub(crate) use self::rustls_connect::Connector;

/// Without the `tls` feature, connections are plaintext (`Config::postgres` and
/// `Config::validate` refused every setting that asks for TLS): tokio-postgres' `NoTls`.
#[cfg(not(feature = "tls"))]
#[derive(Clone)]
pub(crate) struct Connector;

#[cfg(not(feature = "tls"))]
impl<S> tokio_postgres::tls::MakeTlsConnect<S> for Connector {
    type Stream = tokio_postgres::tls::NoTlsStream;
    type TlsConnect = tokio_postgres::NoTls;
    type Error = tokio_postgres::tls::NoTlsError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        <tokio_postgres::NoTls as tokio_postgres::tls::MakeTlsConnect<S>>::make_tls_connect(
            &mut tokio_postgres::NoTls,
            domain,
        )
    }
}

/// The connector of a store with `options`, and `config` set to use it: SSL mode `require`
/// (no plaintext fallback) when it speaks TLS, else `disable`.
pub(crate) fn connector(
    config: &mut Config,
    options: &PostgresOptions,
) -> Result<Connector, LockError> {
    if !options.uses_tls() {
        config.ssl_mode(SslMode::Disable);
        #[cfg(feature = "tls")]
        return Ok(Connector::plaintext());
        #[cfg(not(feature = "tls"))]
        return Ok(Connector);
    }
    config.ssl_mode(SslMode::Require);
    #[cfg(feature = "tls")]
    {
        let mut tls = options.tls.client_config("postgres", true)?;
        // What libpq (17) sends, and what a server taking direct TLS connections requires.
        tls.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(Connector::new(tls))
    }
    #[cfg(not(feature = "tls"))]
    Err(LockError::Config(
        "TLS to PostgreSQL needs distlock's `tls` feature".to_owned(),
    ))
}

#[cfg(feature = "tls")]
mod rustls_connect {
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use futures_util::future::BoxFuture;
    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

    /// Makes a TLS session for each connection, checked against the configuration's roots
    /// and the host tokio-postgres connects to. Without a configuration (a plaintext store,
    /// whose SSL mode is `disable`) no session is ever made.
    #[derive(Clone)]
    pub(crate) struct Connector(Option<Arc<rustls::ClientConfig>>);

    impl Connector {
        pub(crate) fn new(config: rustls::ClientConfig) -> Self {
            Self(Some(Arc::new(config)))
        }

        pub(crate) fn plaintext() -> Self {
            Self(None)
        }
    }

    /// One connection's handshake to come; none for a plaintext store, whose connections
    /// tokio-postgres still asks for one (it never uses it under SSL mode `disable`).
    pub(crate) struct Handshake(Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>);

    impl<S> MakeTlsConnect<S> for Connector
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = Stream<S>;
        type TlsConnect = Handshake;
        type Error = io::Error;

        fn make_tls_connect(&mut self, host: &str) -> io::Result<Handshake> {
            let Some(config) = self.0.clone() else {
                return Ok(Handshake(None));
            };
            let server = ServerName::try_from(host.to_owned()).map_err(|err| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("`{host}` cannot be checked against a certificate: {err}"),
                )
            })?;
            Ok(Handshake(Some((config, server))))
        }
    }

    impl<S> TlsConnect<S> for Handshake
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = Stream<S>;
        type Error = io::Error;
        type Future = BoxFuture<'static, io::Result<Stream<S>>>;

        fn connect(self, stream: S) -> Self::Future {
            Box::pin(async move {
                let Some((config, server)) = self.0 else {
                    return Err(io::Error::other(
                        "TLS is not configured for this PostgreSQL store",
                    ));
                };
                let connector = tokio_rustls::TlsConnector::from(config);
                Ok(Stream(connector.connect(server, stream).await?))
            })
        }
    }

    /// A connection's TLS stream.
    pub(crate) struct Stream<S>(tokio_rustls::client::TlsStream<S>);

    impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for Stream<S> {
        fn channel_binding(&self) -> ChannelBinding {
            ChannelBinding::none()
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
        }

        fn is_write_vectored(&self) -> bool {
            self.0.is_write_vectored()
        }
    }
}
