//! The certificates a [`Config`](super::Config) gives the etcd and PostgreSQL stores for TLS
//! ([`TlsSettings`]: a private certificate authority, a client certificate), their check
//! when a client is made, and the rustls client configuration made of them. Neighbours:
//! `config/etcd.rs` and `config/postgres.rs` take them from their setters; the etcd store
//! (`store/etcd/client.rs`) hands them to its gRPC client, the PostgreSQL store
//! (`store/postgres/tls.rs`) to its connections; `tls.rs` does the same for `rediss://`, where
//! the redis crate takes the certificates itself.

use std::fmt;

use crate::error::LockError;

/// A private certificate authority and a client certificate, in PEM, for one store's TLS
/// connections. Empty: the system's roots, no client certificate.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    /// The certificates of the authorities to trust instead of the system's roots.
    pub(crate) ca_pem: Option<Vec<u8>>,
    /// The client's certificate (chain) and its private key.
    pub(crate) client_cert: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsSettings {
    // Never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca", &self.ca_pem.is_some())
            .field("client_cert", &self.client_cert.is_some())
            .finish()
    }
}

impl TlsSettings {
    /// Whether anything was given.
    pub(crate) fn is_empty(&self) -> bool {
        self.ca_pem.is_none() && self.client_cert.is_none()
    }

    /// The setters that gave what there is, for messages: "`Config::etcd_ca_pem`".
    pub(crate) fn setters(&self, store: &str) -> String {
        let mut given = Vec::new();
        if self.ca_pem.is_some() {
            given.push(format!("`Config::{store}_ca_pem`"));
        }
        if self.client_cert.is_some() {
            given.push(format!("`Config::{store}_client_cert`"));
        }
        given.join(" and ")
    }

    /// Checks that the certificates and the key read as PEM and fit together, so that a
    /// mistake is a [`LockError::Config`] when the client is made, not a failed connect.
    /// `store` is the setters' prefix (`etcd`, `postgres`). Without the `tls` feature, any
    /// setting is that error, naming the feature.
    pub(crate) fn check(&self, store: &str) -> Result<(), LockError> {
        if self.is_empty() {
            return Ok(());
        }
        #[cfg(feature = "tls")]
        {
            self.client_config(store, false).map(|_| ())
        }
        #[cfg(not(feature = "tls"))]
        {
            Err(missing_feature(&self.setters(store)))
        }
    }

    /// The rustls configuration of a client that trusts the CA given (alone), or the system's
    /// roots when `system_roots` and none was given, and shows the client certificate given.
    /// Uses the process' crypto provider, installing rustls' `ring` provider first when the
    /// application has none (as for `rediss://`).
    #[cfg(feature = "tls")]
    pub(crate) fn client_config(
        &self,
        store: &str,
        system_roots: bool,
    ) -> Result<rustls::ClientConfig, LockError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use std::sync::Arc;

        install_provider();
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let bad = |what: String| LockError::Config(format!("{what}; {}", advice(store)));
        let certificates = |pem: &[u8], setter: &str| {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|err| bad(format!("`Config::{store}_{setter}`: {err}")))?;
            if certs.is_empty() {
                return Err(bad(format!(
                    "`Config::{store}_{setter}` holds no PEM certificate (`-----BEGIN \
                     CERTIFICATE-----`)"
                )));
            }
            Ok(certs)
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|err| bad(format!("the crypto provider: {err}")))?;
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca_pem {
            Some(pem) => {
                for cert in certificates(pem, "ca_pem")? {
                    roots.add(cert).map_err(|err| {
                        bad(format!(
                            "`Config::{store}_ca_pem`: a certificate is not a CA's: {err}"
                        ))
                    })?;
                }
            }
            None if system_roots => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(bad(format!(
                        "no root certificate found on this system ({:?}): install the system's \
                         CA certificates (Debian: `ca-certificates`), point `SSL_CERT_FILE` at \
                         a bundle, or give the CA with `Config::{store}_ca_pem`",
                        found.errors
                    )));
                }
            }
            None => {}
        }
        let builder = builder.with_root_certificates(roots);
        match &self.client_cert {
            Some((cert, key)) => {
                let chain = certificates(cert, "client_cert")?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|err| {
                    bad(format!(
                        "`Config::{store}_client_cert`: the key is not a PEM private key: {err}"
                    ))
                })?;
                builder.with_client_auth_cert(chain, key).map_err(|err| {
                    bad(format!(
                        "`Config::{store}_client_cert`: the certificate and key do not go \
                         together: {err}"
                    ))
                })
            }
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

/// Installs rustls' `ring` provider as the process default, unless the application installed
/// one (which then wins).
#[cfg(feature = "tls")]
pub(crate) fn install_provider() {
    // `Err`: a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// What a bad certificate setting advises.
#[cfg(feature = "tls")]
fn advice(store: &str) -> String {
    format!(
        "`Config::{store}_ca_pem` takes the CA's certificates as PEM, \
         `Config::{store}_client_cert` a certificate (chain) and its private key as PEM \
         (docs/tls.md)"
    )
}

/// The error for TLS to etcd or PostgreSQL (`what`) in a build without the `tls` feature.
#[cfg(not(feature = "tls"))]
pub(crate) fn missing_feature(what: &str) -> LockError {
    LockError::Config(format!(
        "{what} asks for TLS, which this build of distlock cannot speak: enable distlock's \
         `tls` feature (`{}` in Cargo.toml)",
        crate::tls::ENABLE_TLS
    ))
}
