//! TLS (`rediss://`) setup: whether a server is reached over TLS, whether this build can do it
//! (the `tls` cargo feature), and the rustls crypto provider installed for the application
//! when it has none. Neighbours: `url.rs` and `config.rs` call it when a TLS server is
//! configured, so a missing feature is a [`LockError::Config`] before anything connects; `io.rs`
//! turns a panic in a connect (rustls panics when no provider can be chosen) into an error.

use redis::ConnectionAddr;

use crate::error::LockError;

/// What a user adds to `Cargo.toml` to get TLS, as messages quote it.
pub(crate) const ENABLE_TLS: &str = "distlock = { version = \"…\", features = [\"tls\"] }";

/// Whether `client` reaches its server over TLS.
pub(crate) fn is_tls(client: &redis::Client) -> bool {
    matches!(
        client.get_connection_info().addr(),
        ConnectionAddr::TcpTls { .. }
    )
}

/// Readies this process for a TLS server: with the `tls` feature, installs rustls' `ring`
/// provider as the process default unless the application installed one (which then wins).
/// Without the feature, TLS works only if the application enabled the redis crate's own TLS
/// support (and installed a provider); otherwise this says which feature to enable.
pub(crate) fn prepare(what: &str, client: &redis::Client) -> Result<(), LockError> {
    if !is_tls(client) {
        return Ok(());
    }
    #[cfg(feature = "tls")]
    {
        // `Err` means a provider is installed already: the application's choice stands.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let _ = what;
        Ok(())
    }
    #[cfg(not(feature = "tls"))]
    {
        if client.get_connection_info().addr().is_supported() {
            // The application enabled the redis crate's TLS itself; it owns the provider.
            return Ok(());
        }
        Err(missing_feature(what))
    }
}

/// Whether a failed connect failed in TLS (a certificate refused, a handshake broken) rather
/// than in reaching the server. Read from the message: the redis crate keeps rustls' error
/// behind an `Arc<dyn Error>` inside an I/O error, where no downcast reaches it.
pub(crate) fn is_handshake_failure(err: &redis::RedisError) -> bool {
    let text = err.to_string();
    // rustls' `Display` of its errors, and the redis crate's for a bad server name.
    [
        "peer certificate",
        "peer is incompatible",
        "peer misbehaved",
        "received corrupt message",
        "received fatal alert",
        "invalid dns name",
        "CryptoProvider",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// The error for a TLS server in a build without TLS support.
pub(crate) fn missing_feature(what: &str) -> LockError {
    LockError::Config(format!(
        "{what} uses TLS (`rediss://`), which this build of distlock cannot speak: enable \
         distlock's `tls` feature (`{ENABLE_TLS}` in Cargo.toml), or use `redis://`"
    ))
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    #[test]
    fn a_provider_is_installed_for_a_tls_server_and_an_installed_one_is_kept() {
        let client = redis::Client::open("rediss://127.0.0.1:6380").unwrap();
        super::prepare("the Redis URL", &client).unwrap();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
        // A second call (another config, another client) is no error.
        super::prepare("the Redis URL", &client).unwrap();
    }
}
