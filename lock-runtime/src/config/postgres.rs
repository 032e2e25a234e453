//! PostgreSQL in a [`Config`]: [`Config::postgres`] reads a `postgres://` URL, and the store's
//! schema ([`Config::postgres_schema`], [`Config::postgres_create_schema`]). Without the
//! `postgres` feature, `Config::postgres` is an error that names the feature. Neighbours:
//! `config/store.rs` keeps what this makes; the PostgreSQL store (`store/postgres.rs`)
//! opens it; `config/env.rs` reads `DISTLOCK_POSTGRES_URL` through it.

use crate::error::LockError;

use super::Config;
#[cfg(feature = "postgres")]
use super::{PostgresOptions, PostgresTarget, StoreConfig};

/// The schema the PostgreSQL store keeps its objects in unless
/// [`Config::postgres_schema`] says otherwise.
pub const DEFAULT_POSTGRES_SCHEMA: &str = "distlock";

impl Config {
    /// A PostgreSQL server: a URL like `postgres://user:password@host:5432/database` (or the
    /// `key=value` form libpq takes). The locks live in a schema of their own
    /// ([`DEFAULT_POSTGRES_SCHEMA`] unless [`postgres_schema`](Self::postgres_schema) says
    /// otherwise), created on first use if missing. Leases run on the database's clock,
    /// fencing tokens come from a sequence (`docs/postgres.md`). Needs distlock's `postgres`
    /// feature; without it this is a [`LockError::Config`] naming it. TLS is not supported
    /// yet: a URL with `sslmode=require` is refused. Nothing connects yet.
    ///
    /// ```
    /// # #[cfg(feature = "postgres")] {
    /// let config = distlock::Config::postgres("postgres://app@127.0.0.1:5432/app")?;
    /// assert!(distlock::Config::postgres("redis://127.0.0.1").is_err());
    /// # }
    /// # Ok::<(), distlock::LockError>(())
    /// ```
    pub fn postgres(url: &str) -> Result<Self, LockError> {
        #[cfg(feature = "postgres")]
        {
            use tokio_postgres::config::SslMode;
            let bad = |why: String| {
                LockError::Config(format!(
                    "`{}` is not a PostgreSQL URL distlock can use: {why}",
                    shown(url)
                ))
            };
            if url.contains("://")
                && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
            {
                return Err(bad("it must start with `postgres://` or `postgresql://` \
                     (like `postgres://user@host:5432/database`)"
                    .to_owned()));
            }
            let connect: tokio_postgres::Config =
                url.parse().map_err(|err| bad(format!("{err}")))?;
            if connect.get_hosts().is_empty() {
                return Err(bad("it names no host".to_owned()));
            }
            if matches!(connect.get_ssl_mode(), SslMode::Require) {
                return Err(bad(
                    "TLS to PostgreSQL is not supported yet; use `sslmode=disable` (or a \
                     network the database trusts)"
                        .to_owned(),
                ));
            }
            Ok(Self::with_store(StoreConfig::Postgres(Box::new(
                PostgresTarget {
                    connect,
                    options: PostgresOptions::default(),
                },
            ))))
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = url;
            Err(LockError::Config(
                "distlock was built without its `postgres` feature, so it cannot use \
                 PostgreSQL: enable it (`distlock = { version = \"…\", features = \
                 [\"postgres\"] }`)"
                    .to_owned(),
            ))
        }
    }

    /// The schema the PostgreSQL store keeps its table, sequence and function in (default
    /// [`DEFAULT_POSTGRES_SCHEMA`]): a lower-case SQL identifier of at most 63 characters,
    /// else [`Client::new`](crate::Client::new) refuses the config. No effect on other stores.
    #[cfg(feature = "postgres")]
    pub fn postgres_schema(mut self, schema: impl Into<String>) -> Self {
        if let StoreConfig::Postgres(target) = &mut self.store {
            target.options.schema = schema.into();
        }
        self
    }

    /// Whether the PostgreSQL store creates its schema's objects when they are missing (the
    /// default), or only checks them, for teams that run their own migrations (`distlock
    /// schema` prints the SQL). Either way a table of the same name with another shape is an
    /// error. No effect on other stores.
    #[cfg(feature = "postgres")]
    pub fn postgres_create_schema(mut self, create: bool) -> Self {
        if let StoreConfig::Postgres(target) = &mut self.store {
            target.options.create = create;
        }
        self
    }
}

/// `url` without its password, for an error message.
#[cfg(feature = "postgres")]
fn shown(url: &str) -> String {
    match ::url::Url::parse(url) {
        Ok(mut parsed) => {
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Err(_) if url.contains("password") => "the connection string given".to_owned(),
        Err(_) => url.to_owned(),
    }
}

/// Whether `name` can be the PostgreSQL store's schema: a lower-case identifier PostgreSQL
/// takes unquoted.
#[cfg(feature = "postgres")]
pub(crate) fn valid_schema(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 63
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::*;

    #[test]
    fn a_schema_is_a_plain_lower_case_identifier() {
        assert!(valid_schema("distlock"));
        assert!(valid_schema("_locks_2"));
        for bad in ["", "Distlock", "1x", "a-b", "a\"b", &"x".repeat(64)] {
            assert!(!valid_schema(bad), "{bad:?} was taken as a schema");
        }
    }
}
