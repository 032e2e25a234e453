//! The configuration the environment names ([`Config::from_env`], [`Config::from_env_or`]):
//! the variables read, which deployment they name, and the errors when they name none or
//! several. Neighbours: `config.rs` has the type and its setters, `url.rs` reads the URLs.

use crate::error::LockError;
use crate::url;

use super::Config;

/// Environment variable with the single server's URL ([`Config::from_env`]).
pub const ENV_REDIS_URL: &str = "REDIS_URL";
/// Environment variable with a PostgreSQL URL ([`Config::postgres`]).
pub const ENV_POSTGRES_URL: &str = "DISTLOCK_POSTGRES_URL";
/// Environment variable with etcd endpoints, comma-separated ([`Config::etcd`]).
pub const ENV_ETCD_ENDPOINTS: &str = "DISTLOCK_ETCD_ENDPOINTS";
/// Environment variable with a Redis Cluster's node URLs, comma-separated.
pub const ENV_CLUSTER_URLS: &str = "DISTLOCK_CLUSTER_URLS";
/// Environment variable with the Sentinel URLs, comma-separated (with [`ENV_SENTINEL_MASTER`]).
pub const ENV_SENTINEL_URLS: &str = "DISTLOCK_SENTINEL_URLS";
/// Environment variable with the name Sentinel knows the primary by.
pub const ENV_SENTINEL_MASTER: &str = "DISTLOCK_SENTINEL_MASTER";
/// Environment variable with the Redlock masters' URLs, comma-separated.
pub const ENV_REDLOCK_URLS: &str = "DISTLOCK_REDLOCK_URLS";
/// Environment variable with the application name of holder records ([`Config::from_env`],
/// [`Config::app_name`]).
pub const ENV_APP_NAME: &str = "DISTLOCK_APP_NAME";

impl Config {
    /// The deployment named by the environment, with every other setting at its default:
    ///
    /// | variable | deployment |
    /// |---|---|
    /// | `DISTLOCK_CLUSTER_URLS` | [`Config::cluster`], comma-separated node URLs |
    /// | `DISTLOCK_SENTINEL_URLS` and `DISTLOCK_SENTINEL_MASTER` | [`Config::sentinel`] |
    /// | `DISTLOCK_REDLOCK_URLS` | [`Config::redlock`], comma-separated master URLs |
    /// | `REDIS_URL` | [`Config::from_url`], one server |
    /// | `DISTLOCK_POSTGRES_URL` | [`Config::postgres`] (the `postgres` feature) |
    /// | `DISTLOCK_ETCD_ENDPOINTS` | [`Config::etcd`], comma-separated endpoints (the `etcd` feature) |
    ///
    /// `DISTLOCK_APP_NAME` sets [`Config::app_name`]. Setting more than one deployment is an
    /// error that names them, and so is setting none: a service deployed without its variable
    /// must not lock against whatever answers on its own localhost. A program that means a
    /// local server when nothing is set says so with [`Config::from_env_or`].
    ///
    /// ```no_run
    /// distlock::init(distlock::Config::from_env()?)?;
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    pub fn from_env() -> Result<Self, LockError> {
        Self::read_env()?.ok_or_else(|| {
            LockError::Config(format!(
                "none of {ENV_REDIS_URL}, {ENV_CLUSTER_URLS}, {ENV_SENTINEL_URLS} (with \
                 {ENV_SENTINEL_MASTER}), {ENV_REDLOCK_URLS}, {ENV_POSTGRES_URL} or {ENV_ETCD_ENDPOINTS} is set, so \
                 the environment names no store: set {ENV_REDIS_URL} to a URL like \
                 `redis://host:6379` (or one of the others), or use `Config::from_env_or(url)` \
                 to fall back to a given server on purpose"
            ))
        })
    }

    /// The deployment named by the environment, as [`Config::from_env`] reads it, or else the
    /// single server at `default_url` (read as [`Config::from_url`] reads it): for examples,
    /// tests and tools that mean a local server when nothing is set. `DISTLOCK_APP_NAME` is
    /// read either way. Errors as `from_env` does when the variables are at odds, and as
    /// `from_url` does when `default_url` is needed and cannot work.
    ///
    /// ```
    /// // With none of the variables set this is the local server; with REDIS_URL (or a
    /// // Cluster, Sentinel or Redlock variable) set, that deployment.
    /// let config = distlock::Config::from_env_or(distlock::DEFAULT_REDIS_URL)?;
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    pub fn from_env_or(default_url: &str) -> Result<Self, LockError> {
        match Self::read_env()? {
            Some(config) => Ok(config),
            None => {
                let config = Self::from_url(default_url)?;
                Ok(match Self::env_var(ENV_APP_NAME)? {
                    Some(app) => config.app_name(app),
                    None => config,
                })
            }
        }
    }

    /// An environment variable that is set to something other than blanks.
    fn env_var(name: &str) -> Result<Option<String>, LockError> {
        match std::env::var(name) {
            Ok(value) if value.trim().is_empty() => Ok(None),
            Ok(value) => Ok(Some(value)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(LockError::Config(format!(
                "{name} is not valid UTF-8; set it to URLs like `redis://127.0.0.1:6379`"
            ))),
        }
    }

    /// The deployment the environment names, `None` when it names none.
    fn read_env() -> Result<Option<Self>, LockError> {
        let var = Self::env_var;
        let cluster = var(ENV_CLUSTER_URLS)?;
        let sentinel = var(ENV_SENTINEL_URLS)?;
        let master = var(ENV_SENTINEL_MASTER)?;
        let redlock = var(ENV_REDLOCK_URLS)?;
        let single = var(ENV_REDIS_URL)?;
        let postgres = var(ENV_POSTGRES_URL)?;
        let etcd = var(ENV_ETCD_ENDPOINTS)?;
        let set: Vec<&str> = [
            (ENV_POSTGRES_URL, postgres.is_some()),
            (ENV_ETCD_ENDPOINTS, etcd.is_some()),
            (ENV_CLUSTER_URLS, cluster.is_some()),
            (ENV_SENTINEL_URLS, sentinel.is_some()),
            (ENV_REDLOCK_URLS, redlock.is_some()),
            (ENV_REDIS_URL, single.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        if set.len() > 1 {
            return Err(LockError::Config(format!(
                "{} are all set, but they name different deployments; set only one",
                set.join(", ")
            )));
        }
        let app_name = var(ENV_APP_NAME)?;
        let deployment = match (postgres, etcd) {
            (Some(url), _) => Some(Self::postgres(&url)?),
            (_, Some(endpoints)) => Some(Self::etcd(endpoints.split(','))?),
            _ => Self::from_env_deployment(cluster, sentinel, master, redlock, single)?,
        };
        let Some(config) = deployment else {
            return Ok(None);
        };
        Ok(Some(match app_name {
            Some(app) => config.app_name(app),
            None => config,
        }))
    }

    /// The deployment part of [`Config::from_env`], from the variables it read; `None` when
    /// they name none.
    fn from_env_deployment(
        cluster: Option<String>,
        sentinel: Option<String>,
        master: Option<String>,
        redlock: Option<String>,
        single: Option<String>,
    ) -> Result<Option<Self>, LockError> {
        if let Some(urls) = cluster {
            return Self::cluster(url::split_env_list(&urls)).map(Some);
        }
        if let Some(urls) = sentinel {
            let master = master.ok_or_else(|| {
                LockError::Config(format!(
                    "{ENV_SENTINEL_URLS} is set but {ENV_SENTINEL_MASTER} is not; set it to the \
                     master name the sentinels monitor"
                ))
            })?;
            return Self::sentinel(url::split_env_list(&urls), &master).map(Some);
        }
        if master.is_some() {
            return Err(LockError::Config(format!(
                "{ENV_SENTINEL_MASTER} is set but {ENV_SENTINEL_URLS} is not; set it to the \
                 sentinels' URLs, comma-separated"
            )));
        }
        if let Some(urls) = redlock {
            return Self::redlock(url::split_env_list(&urls)).map(Some);
        }
        single.map(|url| Self::from_url(&url)).transpose()
    }
}
