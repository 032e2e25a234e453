//! etcd in a [`Config`]: [`Config::etcd`] reads one or more `http://host:port` (or, with the
//! `tls` feature, `https://host:port`) endpoints of one etcd cluster, [`Config::etcd_user`] the
//! credentials of an etcd user, [`Config::etcd_ca_pem`] and [`Config::etcd_client_cert`] the
//! certificates of TLS. Without the `etcd` feature, `Config::etcd` is an error that names the
//! feature. Neighbours: `config/store.rs` keeps what this makes; the etcd store
//! (`store/etcd.rs`) opens it; `config/env.rs` reads `DISTLOCK_ETCD_ENDPOINTS` through it;
//! `config/tls_settings.rs` checks the certificates.

use crate::error::LockError;

use super::Config;
#[cfg(feature = "etcd")]
use super::{EtcdTarget, StoreConfig, TlsSettings};

impl Config {
    /// An etcd cluster (v3 API, etcd 3.4 or later), reached through any of `endpoints`, each
    /// `http://host:port` (or `host:port`); the client moves to another when one fails. The
    /// locks live under the [key prefix](Self::key_prefix), each grant an etcd key on an etcd
    /// lease of its own, kept alive by the watchdog; a grant's fencing token is the create
    /// revision of its key (`docs/etcd.md`). etcd leases are whole seconds: a lease is rounded
    /// up to the next second, and the server raises it to its minimum (2 s at etcd's
    /// default election timeout). Needs distlock's `etcd` feature; without it this is a
    /// [`LockError::Config`] naming it. Nothing connects yet.
    ///
    /// `https://host:port` endpoints speak TLS (with distlock's `tls` feature: else a
    /// [`LockError::Config`] naming it); the members' certificates must name the host and
    /// chain to a root the system trusts, or to the CA given by
    /// [`etcd_ca_pem`](Self::etcd_ca_pem). Every endpoint has the same scheme: a list that
    /// mixes `http://` and `https://` is refused.
    ///
    /// ```
    /// # #[cfg(feature = "etcd")] {
    /// let config = distlock::Config::etcd(["http://127.0.0.1:2379", "http://127.0.0.1:22379"])?;
    /// assert!(distlock::Config::etcd(["redis://127.0.0.1"]).is_err());
    /// # }
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    pub fn etcd<S: AsRef<str>>(endpoints: impl IntoIterator<Item = S>) -> Result<Self, LockError> {
        let endpoints: Vec<String> = endpoints
            .into_iter()
            .map(|e| e.as_ref().trim().to_owned())
            .collect();
        #[cfg(feature = "etcd")]
        {
            if endpoints.is_empty() || endpoints.iter().all(String::is_empty) {
                return Err(LockError::Config(
                    "no etcd endpoint given: name at least one, like `http://127.0.0.1:2379`"
                        .to_owned(),
                ));
            }
            let endpoints = endpoints
                .iter()
                .map(|endpoint| parse_endpoint(endpoint))
                .collect::<Result<Vec<_>, _>>()?;
            let https = endpoints
                .iter()
                .filter(|endpoint| endpoint.starts_with("https://"))
                .count();
            if https != 0 && https != endpoints.len() {
                return Err(LockError::Config(format!(
                    "the etcd endpoints mix `http://` and `https://` ({}): a cluster's members \
                     serve their clients one way, so give every endpoint the same scheme",
                    endpoints.join(", ")
                )));
            }
            if https != 0 {
                #[cfg(feature = "tls")]
                super::tls_settings::install_provider();
                #[cfg(not(feature = "tls"))]
                return Err(super::tls_settings::missing_feature(&format!(
                    "the etcd endpoint `{}`",
                    endpoints[0]
                )));
            }
            Ok(Self::with_store(StoreConfig::Etcd(Box::new(EtcdTarget {
                endpoints,
                user: None,
                tls: TlsSettings::default(),
            }))))
        }
        #[cfg(not(feature = "etcd"))]
        {
            let _ = endpoints;
            Err(LockError::Config(
                "distlock was built without its `etcd` feature, so it cannot use etcd: enable \
                 it (`distlock = { version = \"…\", features = [\"etcd\"] }`; its build needs \
                 `protoc`, Debian's `protobuf-compiler`)"
                    .to_owned(),
            ))
        }
    }

    /// Authenticates to etcd as `user` (etcd's own users, `etcdctl user add`): the role it
    /// needs is read and write on the [key prefix](Self::key_prefix) alone (`docs/etcd.md`).
    /// No effect on other stores.
    #[cfg(feature = "etcd")]
    pub fn etcd_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        if let StoreConfig::Etcd(target) = &mut self.store {
            target.user = Some((user.into(), password.into()));
        }
        self
    }

    /// Trusts the certificate authority in `pem` (one or more PEM certificates: what etcd's
    /// `--trusted-ca-file` or etcdctl's `--cacert` names) for the members' certificates,
    /// instead of the system's roots. For `https://` endpoints: with `http://` ones,
    /// [`Client::new`](crate::Client::new) refuses the config, as it does a `pem` that holds
    /// no certificate. No effect on other stores.
    ///
    /// ```no_run
    /// # #[cfg(feature = "etcd")] {
    /// let config = distlock::Config::etcd(["https://etcd-1.internal:2379"])?
    ///     .etcd_ca_pem(std::fs::read("/etc/etcd/ca.pem")?);
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "etcd")]
    pub fn etcd_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        if let StoreConfig::Etcd(target) = &mut self.store {
            target.tls.ca_pem = Some(pem.into());
        }
        self
    }

    /// Shows the members this client certificate (`cert_pem`, PEM, with any intermediates
    /// after it) and proves it with its private key (`key_pem`, PEM): what a cluster started
    /// with `--client-cert-auth` asks for (etcdctl's `--cert` and `--key`). For `https://`
    /// endpoints; [`Client::new`](crate::Client::new) refuses a certificate and key that do
    /// not read as PEM or do not go together. No effect on other stores.
    ///
    /// ```no_run
    /// # #[cfg(feature = "etcd")] {
    /// let config = distlock::Config::etcd(["https://etcd-1.internal:2379"])?
    ///     .etcd_ca_pem(std::fs::read("/etc/etcd/ca.pem")?)
    ///     .etcd_client_cert(
    ///         std::fs::read("/etc/distlock/client.pem")?,
    ///         std::fs::read("/etc/distlock/client-key.pem")?,
    ///     );
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "etcd")]
    pub fn etcd_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        if let StoreConfig::Etcd(target) = &mut self.store {
            target.tls.client_cert = Some((cert_pem.into(), key_pem.into()));
        }
        self
    }
}

#[cfg(feature = "etcd")]
impl EtcdTarget {
    /// Whether its endpoints speak TLS (`https://`; [`Config::etcd`] refuses a mix).
    pub(crate) fn is_tls(&self) -> bool {
        self.endpoints
            .first()
            .is_some_and(|endpoint| endpoint.starts_with("https://"))
    }

    /// Rejects TLS settings that cannot work: certificates for `http://` endpoints, or ones
    /// that do not read as PEM (`Config::validate`).
    pub(crate) fn check(&self) -> Result<(), LockError> {
        if !self.tls.is_empty() && !self.is_tls() {
            return Err(LockError::Config(format!(
                "{} given for `http://` etcd endpoints ({}): certificates are for TLS; use \
                 `https://` endpoints",
                self.tls.setters("etcd"),
                self.endpoints.join(", ")
            )));
        }
        self.tls.check("etcd")
    }
}

/// An endpoint as the client takes it (`http://host:port` or `https://host:port`), or why it
/// cannot be one.
#[cfg(feature = "etcd")]
fn parse_endpoint(endpoint: &str) -> Result<String, LockError> {
    let bad = |why: &str| {
        LockError::Config(format!(
            "`{endpoint}` is not an etcd endpoint distlock can use: {why}"
        ))
    };
    let (scheme, rest) = match endpoint.split_once("://") {
        Some((scheme, rest)) => (scheme, rest),
        None => ("http", endpoint),
    };
    if scheme != "http" && scheme != "https" {
        return Err(bad(
            "it must be `http://host:port`, or `https://host:port` for TLS (like \
             `http://127.0.0.1:2379`)",
        ));
    }
    let rest = rest.trim_end_matches('/');
    let parsed =
        ::url::Url::parse(&format!("http://{rest}")).map_err(|err| bad(&err.to_string()))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad(
            "credentials do not go in the endpoint: use `Config::etcd_user(user, password)`",
        ));
    }
    if parsed.path() != "/" || parsed.query().is_some() {
        return Err(bad("it must name a host and a port only"));
    }
    let Some(host) = parsed.host_str() else {
        return Err(bad("it names no host"));
    };
    let Some(port) = parsed.port_or_known_default() else {
        return Err(bad("it names no port"));
    };
    if !rest.contains(':') || rest.ends_with(':') {
        return Err(bad("it names no port (etcd's is usually 2379)"));
    }
    Ok(format!("{scheme}://{host}:{port}"))
}

#[cfg(all(test, feature = "etcd"))]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_http_or_https_to_a_host_and_port() {
        assert_eq!(
            parse_endpoint("127.0.0.1:2379").unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(
            parse_endpoint("http://localhost:23790/").unwrap(),
            "http://localhost:23790"
        );
        assert_eq!(
            parse_endpoint("https://localhost:2379").unwrap(),
            "https://localhost:2379"
        );
        for bad in [
            "unix://127.0.0.1:2379",
            "redis://127.0.0.1:6379",
            "http://u:p@127.0.0.1:2379",
            "http://127.0.0.1",
            "http://127.0.0.1:2379/v3",
            "127.0.0.1:",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad} was taken");
        }
    }
}
