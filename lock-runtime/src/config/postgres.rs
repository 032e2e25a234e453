//! PostgreSQL in a [`Config`]: [`Config::postgres`] reads a `postgres://` URL (its `sslmode`
//! as distlock honours it, [`ssl_mode`]), the store's schema ([`Config::postgres_schema`],
//! [`Config::postgres_create_schema`]) and the certificates of TLS
//! ([`Config::postgres_ca_pem`], [`Config::postgres_client_cert`]). Without the `postgres`
//! feature, `Config::postgres` is an error that names the feature. Neighbours:
//! `config/store.rs` keeps what this makes; the PostgreSQL store (`store/postgres.rs`) opens
//! it; `config/env.rs` reads `DISTLOCK_POSTGRES_URL` through it; `config/tls_settings.rs`
//! checks the certificates.

use crate::error::LockError;

use super::Config;
#[cfg(feature = "postgres")]
use super::{PostgresOptions, PostgresSslMode, PostgresTarget, StoreConfig};

/// The schema the PostgreSQL store keeps its objects in unless
/// [`Config::postgres_schema`] says otherwise.
pub const DEFAULT_POSTGRES_SCHEMA: &str = "distlock";

impl Config {
    /// A PostgreSQL server: a URL like `postgres://user:password@host:5432/database` (or the
    /// `key=value` form libpq takes). The locks live in a schema of their own
    /// ([`DEFAULT_POSTGRES_SCHEMA`] unless [`postgres_schema`](Self::postgres_schema) says
    /// otherwise), created on first use if missing. Leases run on the database's clock,
    /// fencing tokens come from a sequence (`docs/postgres.md`). Needs distlock's `postgres`
    /// feature; without it this is a [`LockError::Config`] naming it. Nothing connects yet.
    ///
    /// TLS (with distlock's `tls` feature; else a [`LockError::Config`] naming it): every
    /// connection, the pool's and the one that `LISTEN`s, speaks TLS when the URL says
    /// `sslmode=verify-full` or `sslmode=require`, or when it names no `sslmode` and
    /// [`postgres_ca_pem`](Self::postgres_ca_pem) or
    /// [`postgres_client_cert`](Self::postgres_client_cert) gave certificates; the server's
    /// certificate is always checked, against the system's roots or the CA given, and must
    /// name the host of the URL (`require` is as strict as `verify-full`). A server that
    /// does not offer TLS is then an error, never a plaintext connection. `sslmode=disable`
    /// or no `sslmode` (without certificates) connects without TLS. Refused, with what to use
    /// instead: `allow` and `prefer` (they fall back to plaintext without a word and check
    /// no certificate), `verify-ca` (distlock always checks the host name), and the
    /// certificate files libpq reads (`sslrootcert`, `sslcert`, `sslkey`: pass their
    /// contents to the setters). `docs/tls.md` has the table.
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
            let (rest, ssl_mode, files) = split_ssl_settings(url);
            if let Some(key) = files.first() {
                let setter = if key == "sslrootcert" {
                    "`Config::postgres_ca_pem`"
                } else {
                    "`Config::postgres_client_cert`"
                };
                return Err(bad(format!(
                    "distlock reads no certificate file named in the URL (`{key}`); read the \
                     file and pass its contents to {setter}"
                )));
            }
            let ssl_mode = ssl_mode
                .map(|mode| self::ssl_mode(&mode))
                .transpose()
                .map_err(bad)?
                .unwrap_or_default();
            let mut connect: tokio_postgres::Config =
                rest.parse().map_err(|err| bad(format!("{err}")))?;
            if connect.get_hosts().is_empty() {
                return Err(bad("it names no host".to_owned()));
            }
            // What the store sets when it opens (`PostgresOptions::uses_tls`); plaintext
            // until then, never tokio-postgres' `prefer`.
            connect.ssl_mode(SslMode::Disable);
            Ok(Self::with_store(StoreConfig::Postgres(Box::new(
                PostgresTarget {
                    connect,
                    options: PostgresOptions {
                        ssl_mode,
                        ..PostgresOptions::default()
                    },
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

    /// Trusts the certificate authority in `pem` (one or more PEM certificates: what libpq's
    /// `sslrootcert` names) for the server's certificate, instead of the system's roots, and
    /// asks for TLS when the URL names no `sslmode`. With `sslmode=disable`,
    /// [`Client::new`](crate::Client::new) refuses the config, as it does a `pem` that holds
    /// no certificate. No effect on other stores.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")] {
    /// let config = distlock::Config::postgres("postgres://app@db.internal/app?sslmode=verify-full")?
    ///     .postgres_ca_pem(std::fs::read("/etc/distlock/db-ca.pem")?);
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        if let StoreConfig::Postgres(target) = &mut self.store {
            target.options.tls.ca_pem = Some(pem.into());
        }
        self
    }

    /// Shows the server this client certificate (`cert_pem`, PEM, with any intermediates
    /// after it) and proves it with its private key (`key_pem`, PEM): libpq's `sslcert` and
    /// `sslkey`, for `pg_hba.conf`'s `cert` method or `clientcert=verify-full`. Asks for TLS
    /// when the URL names no `sslmode`; [`Client::new`](crate::Client::new) refuses a
    /// certificate and key that do not read as PEM or do not go together. No effect on other
    /// stores.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")] {
    /// let config = distlock::Config::postgres("postgres://app@db.internal/app?sslmode=verify-full")?
    ///     .postgres_client_cert(
    ///         std::fs::read("/etc/distlock/app.crt")?,
    ///         std::fs::read("/etc/distlock/app.key")?,
    ///     );
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        if let StoreConfig::Postgres(target) = &mut self.store {
            target.options.tls.client_cert = Some((cert_pem.into(), key_pem.into()));
        }
        self
    }
}

#[cfg(feature = "postgres")]
impl PostgresOptions {
    /// Whether the store's connections speak TLS: `sslmode=require` or `verify-full`, or no
    /// `sslmode` and certificates given.
    pub(crate) fn uses_tls(&self) -> bool {
        match self.ssl_mode {
            PostgresSslMode::VerifyFull => true,
            PostgresSslMode::Disable => false,
            PostgresSslMode::Unset => !self.tls.is_empty(),
        }
    }

    /// Rejects TLS settings that cannot work: certificates with `sslmode=disable`, or ones
    /// that do not read as PEM (`Config::validate`).
    pub(crate) fn check_tls(&self) -> Result<(), LockError> {
        if self.ssl_mode == PostgresSslMode::Disable && !self.tls.is_empty() {
            return Err(LockError::Config(format!(
                "{} given with `sslmode=disable`: certificates are for TLS; drop \
                 `sslmode=disable` (or say `sslmode=verify-full`)",
                self.tls.setters("postgres")
            )));
        }
        self.tls.check("postgres")
    }
}

/// The TLS files libpq reads that distlock takes through setters instead.
#[cfg(feature = "postgres")]
const FILE_KEYS: [&str; 6] = [
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcrl",
    "sslcrldir",
];

/// What `sslmode=mode` means to distlock, or why it is refused (tokio-postgres knows
/// `disable`, `prefer` and `require`, and would fall back to plaintext under `prefer`).
#[cfg(feature = "postgres")]
fn ssl_mode(mode: &str) -> Result<PostgresSslMode, String> {
    match mode {
        "disable" => Ok(PostgresSslMode::Disable),
        "require" | "verify-full" if cfg!(feature = "tls") => Ok(PostgresSslMode::VerifyFull),
        "require" | "verify-full" => Err(format!(
            "`sslmode={mode}` asks for TLS, which this build of distlock cannot speak: enable \
             distlock's `tls` feature (`{}` in Cargo.toml)",
            crate::tls::ENABLE_TLS
        )),
        "allow" | "prefer" => Err(format!(
            "`sslmode={mode}` falls back to plaintext without a word and checks no \
             certificate, which distlock does not do: say `sslmode=verify-full` for TLS (with \
             the `tls` feature) or `sslmode=disable` for none"
        )),
        "verify-ca" => Err(
            "`sslmode=verify-ca` checks the certificate but not the host name, and distlock \
             always checks both: say `sslmode=verify-full`, with a host in the URL that the \
             server's certificate names"
                .to_owned(),
        ),
        _ => Err(format!(
            "`sslmode={mode}` is not a mode: say `disable` or `verify-full` (`require` is \
             taken as `verify-full`)"
        )),
    }
}

/// `url` without its `sslmode` (which [`ssl_mode`] reads, since tokio-postgres refuses
/// `verify-full`), that `sslmode`, and the [`FILE_KEYS`] it names; in the URL form
/// (`?sslmode=…&…`) or libpq's `key=value` form. A `key=value` string it cannot read is
/// given back whole, for tokio-postgres to say what is wrong with it.
#[cfg(feature = "postgres")]
fn split_ssl_settings(url: &str) -> (String, Option<String>, Vec<String>) {
    let mut mode = None;
    let mut files = Vec::new();
    let mut note = |key: &str, value: &str| {
        if key == "sslmode" {
            mode = Some(value.to_owned());
            return false;
        }
        if FILE_KEYS.contains(&key) {
            files.push(key.to_owned());
        }
        true
    };
    if url.contains("://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_owned(), None, files);
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                let value = ::url::form_urlencoded::parse(format!("v={value}").as_bytes())
                    .next()
                    .map(|(_, value)| value.into_owned())
                    .unwrap_or_default();
                note(key, &value)
            })
            .collect();
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return (rest, mode, files);
    }
    let Some(pairs) = key_value_pairs(url) else {
        return (url.to_owned(), None, files);
    };
    let kept: Vec<&str> = pairs
        .into_iter()
        .filter(|(key, value, _)| note(key, value))
        .map(|(_, _, text)| text)
        .collect();
    (kept.join(" "), mode, files)
}

/// The pairs of libpq's `key = value` form: each key, its value (unquoted, unescaped) and
/// the pair's text; `None` if it does not read as that form.
#[cfg(feature = "postgres")]
fn key_value_pairs(text: &str) -> Option<Vec<(&str, String, &str)>> {
    let mut pairs = Vec::new();
    let mut chars = text.char_indices().peekable();
    let skip_spaces = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_spaces(&mut chars);
        let Some(&(start, _)) = chars.peek() else {
            return Some(pairs);
        };
        let mut key_end = start;
        while let Some((at, c)) = chars.next_if(|(_, c)| *c != '=' && !c.is_whitespace()) {
            key_end = at + c.len_utf8();
        }
        skip_spaces(&mut chars);
        chars.next_if(|(_, c)| *c == '=')?;
        skip_spaces(&mut chars);
        let mut value = String::new();
        let quoted = chars.next_if(|(_, c)| *c == '\'').is_some();
        let end = loop {
            let Some((at, c)) = chars.next() else {
                if quoted {
                    return None;
                }
                break text.len();
            };
            match c {
                '\\' => value.push(chars.next()?.1),
                '\'' if quoted => break at + 1,
                c if c.is_whitespace() && !quoted => break at,
                c => value.push(c),
            }
        };
        if key_end == start {
            return None;
        }
        pairs.push((&text[start..key_end], value, &text[start..end]));
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
    fn sslmode_is_taken_out_of_either_form_and_the_rest_kept() {
        let (rest, mode, files) =
            split_ssl_settings("postgres://u@h:5432/db?sslmode=verify-full&application_name=a");
        assert_eq!(rest, "postgres://u@h:5432/db?application_name=a");
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert!(files.is_empty());
        let (rest, mode, _) = split_ssl_settings("postgres://u@h/db?sslmode=disable");
        assert_eq!(
            (rest.as_str(), mode.as_deref()),
            ("postgres://u@h/db", Some("disable"))
        );
        let (rest, mode, files) = split_ssl_settings(
            "host=h port=5432 sslmode = 'verify-full' password='a b\\'c' sslrootcert=/ca.pem",
        );
        assert_eq!(
            rest,
            "host=h port=5432 password='a b\\'c' sslrootcert=/ca.pem"
        );
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(files, ["sslrootcert"]);
        assert_eq!(
            split_ssl_settings("host=h user=").0,
            "host=h user=",
            "an empty value is a value"
        );
        assert_eq!(
            split_ssl_settings("host='h").0,
            "host='h",
            "unreadable: kept whole"
        );
    }

    #[test]
    fn the_modes_distlock_cannot_honour_are_refused_with_what_to_say() {
        assert_eq!(ssl_mode("disable"), Ok(PostgresSslMode::Disable));
        for refused in ["allow", "prefer", "verify-ca", "on"] {
            let why = ssl_mode(refused).unwrap_err();
            assert!(why.contains("verify-full"), "{refused}: {why}");
        }
        for verified in ["require", "verify-full"] {
            match ssl_mode(verified) {
                Ok(mode) => assert_eq!(mode, PostgresSslMode::VerifyFull),
                Err(why) => assert!(
                    !cfg!(feature = "tls") && why.contains("`tls` feature"),
                    "{why}"
                ),
            }
        }
    }

    #[test]
    fn a_schema_is_a_plain_lower_case_identifier() {
        assert!(valid_schema("distlock"));
        assert!(valid_schema("_locks_2"));
        for bad in ["", "Distlock", "1x", "a-b", "a\"b", &"x".repeat(64)] {
            assert!(!valid_schema(bad), "{bad:?} was taken as a schema");
        }
    }
}
