//! Which store the tool talks to: the `--url`, `--cluster`, `--sentinel`/`--master`,
//! `--redlock`, `--postgres` or `--etcd` options, else the environment exactly as
//! `distlock::Config::from_env` reads it (`REDIS_URL`, `DISTLOCK_CLUSTER_URLS`,
//! `DISTLOCK_POSTGRES_URL`, `DISTLOCK_ETCD_ENDPOINTS`, …; none of them is an error). Neighbours: `main.rs` parses the options,
//! `output.rs` prints what the client finds.

use clap::Args;
use distlock::{Config, LockError};

/// The store options shared by every command.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// One Redis server, e.g. `redis://127.0.0.1:6379/0`.
    #[arg(long, global = true, value_name = "URL", conflicts_with_all = ["cluster", "sentinel", "redlock", "postgres", "etcd"])]
    url: Option<String>,
    /// Redis Cluster: seed node URLs, comma-separated.
    #[arg(long, global = true, value_name = "URL,URL", value_delimiter = ',', conflicts_with_all = ["sentinel", "redlock", "postgres", "etcd"])]
    cluster: Option<Vec<String>>,
    /// Sentinel: the sentinels' URLs, comma-separated (with `--master`).
    #[arg(
        long,
        global = true,
        value_name = "URL,URL",
        value_delimiter = ',',
        requires = "master",
        conflicts_with_all = ["redlock", "postgres", "etcd"]
    )]
    sentinel: Option<Vec<String>>,
    /// Sentinel: the name of the master the sentinels monitor.
    #[arg(long, global = true, value_name = "NAME", requires = "sentinel")]
    master: Option<String>,
    /// Redlock: the independent masters' URLs, comma-separated (an odd number, at least 3).
    #[arg(
        long,
        global = true,
        value_name = "URL,URL,URL",
        value_delimiter = ',',
        conflicts_with_all = ["postgres", "etcd"]
    )]
    redlock: Option<Vec<String>>,
    /// PostgreSQL, e.g. `postgres://app@db.internal:5432/app`.
    #[arg(long, global = true, value_name = "URL", conflicts_with = "etcd")]
    postgres: Option<String>,
    /// etcd: the endpoints, comma-separated, e.g. `http://etcd-1:2379,http://etcd-2:2379`.
    #[arg(long, global = true, value_name = "URL,URL", value_delimiter = ',')]
    etcd: Option<Vec<String>>,
    /// The schema of distlock's objects on PostgreSQL (`Config::postgres_schema`). Defaults
    /// to `distlock`; `schema` prints the SQL for it.
    #[arg(long, global = true, value_name = "NAME")]
    pub postgres_schema: Option<String>,
    /// The key prefix of the application's locks (`Config::key_prefix`). Defaults to
    /// `distlock:`.
    #[arg(long, global = true, value_name = "PREFIX")]
    prefix: Option<String>,
}

impl StoreArgs {
    /// The config these options (or the environment) name.
    pub fn config(&self) -> Result<Config, LockError> {
        let config = if let Some(url) = &self.url {
            Config::from_url(url)?
        } else if let Some(nodes) = &self.cluster {
            Config::cluster(nodes)?
        } else if let (Some(sentinels), Some(master)) = (&self.sentinel, &self.master) {
            Config::sentinel(sentinels, master)?
        } else if let Some(masters) = &self.redlock {
            Config::redlock(masters)?
        } else if let Some(url) = &self.postgres {
            Config::postgres(url)?
        } else if let Some(endpoints) = &self.etcd {
            Config::etcd(endpoints)?
        } else {
            // No fallback to a local server: an operator whose variable is missing learns
            // so, rather than reading (or unlocking) whatever answers on this machine.
            Config::from_env().map_err(|err| match err {
                LockError::Config(why) => LockError::Config(format!(
                    "{why} (or name the store with --url, --cluster, --sentinel with --master, \
                     --redlock, --postgres or --etcd)"
                )),
                other => other,
            })?
        };
        let config = config.app_name("distlock-cli");
        let config = match &self.postgres_schema {
            Some(schema) => config.postgres_schema(schema),
            None => config,
        };
        Ok(match &self.prefix {
            Some(prefix) => config.key_prefix(prefix),
            None => config,
        })
    }
}
