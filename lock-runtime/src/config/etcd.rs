//! etcd in a [`Config`]: [`Config::etcd`] reads one or more `http://host:port` endpoints of
//! one etcd cluster, [`Config::etcd_user`] the credentials of an etcd user. Without the `etcd`
//! feature, `Config::etcd` is an error that names the feature. Neighbours: `config/store.rs`
//! keeps what this makes; the etcd store (`store/etcd.rs`) opens it; `config/env.rs` reads
//! `DISTLOCK_ETCD_ENDPOINTS` through it.

use crate::error::LockError;

use super::Config;
#[cfg(feature = "etcd")]
use super::{EtcdTarget, StoreConfig};

impl Config {
    /// An etcd cluster (v3 API, etcd 3.4 or later), reached through any of `endpoints`, each
    /// `http://host:port` (or `host:port`); the client moves to another when one fails. The
    /// locks live under the [key prefix](Self::key_prefix), each grant an etcd key on an etcd
    /// lease of its own, kept alive by the watchdog; a grant's fencing token is the create
    /// revision of its key (`docs/etcd.md`). etcd leases are whole seconds: a lease is rounded
    /// up to the next second, and the server raises it to its minimum (2 s at etcd's
    /// default election timeout). Needs distlock's `etcd` feature; without it this is a
    /// [`LockError::Config`] naming it. TLS is not supported yet: an `https://` endpoint is
    /// refused. Nothing connects yet.
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
            Ok(Self::with_store(StoreConfig::Etcd(Box::new(EtcdTarget {
                endpoints,
                user: None,
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
}

/// An endpoint as the client takes it (`http://host:port`), or why it cannot be one.
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
    match scheme {
        "http" => {}
        "https" => {
            return Err(bad(
                "TLS to etcd is not supported yet; use an `http://` endpoint (on a network \
                 the cluster trusts)",
            ))
        }
        _ => {
            return Err(bad(
                "it must be `http://host:port` (like `http://127.0.0.1:2379`)",
            ))
        }
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
    Ok(format!("http://{host}:{port}"))
}

#[cfg(all(test, feature = "etcd"))]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_plain_http_to_a_host_and_port() {
        assert_eq!(
            parse_endpoint("127.0.0.1:2379").unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(
            parse_endpoint("http://localhost:23790/").unwrap(),
            "http://localhost:23790"
        );
        for bad in [
            "https://127.0.0.1:2379",
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
