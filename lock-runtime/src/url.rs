//! Reading the Redis URLs of a [`Config`](crate::Config): one URL where one server is meant,
//! lists for Cluster, Sentinel and Redlock, and errors that name the part that cannot work
//! (a missing scheme, a scheme that needs a cargo feature, a list where one URL is expected)
//! without ever showing a password. Neighbours: `config.rs` calls it; `error.rs` redacts.

use crate::error::LockError;

/// The deployment a URL is read for, as errors name it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum UrlFor {
    Single,
    Cluster,
    Sentinel,
    Redlock,
}

impl UrlFor {
    fn what(self) -> &'static str {
        match self {
            UrlFor::Single => "the Redis URL",
            UrlFor::Cluster => "a Redis Cluster node URL",
            UrlFor::Sentinel => "a Sentinel URL",
            UrlFor::Redlock => "a Redlock master URL",
        }
    }
}

/// Parses one URL into a client, naming what is wrong when it cannot work.
pub(crate) fn parse(url: &str, purpose: UrlFor) -> Result<redis::Client, LockError> {
    let what = purpose.what();
    let url = url.trim();
    if url.is_empty() {
        return Err(LockError::Config(format!(
            "{what} is empty; expected `redis://[[user]:password@]host[:port][/db]`"
        )));
    }
    if url.contains(',') || url.contains(char::is_whitespace) {
        let hint = match purpose {
            UrlFor::Single => {
                "; for several servers use `Config::cluster`, `Config::sentinel` or \
                 `Config::redlock` (each takes a list)"
            }
            _ => "; give each server as its own element of the list",
        };
        return Err(LockError::Config(format!(
            "{what} holds a list of URLs (or blanks) where one URL like \
             `redis://host:6379` is expected{hint}"
        )));
    }
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(LockError::Config(format!(
            "{what} has no scheme; write it as `redis://host:port` (or `rediss://` for TLS, \
             `redis+unix:///path` for a socket)"
        )));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "redis" | "redis+unix" | "unix" | "valkey" => {}
        "rediss" | "valkeys" => {
            return Err(LockError::Config(format!(
                "{what} uses the TLS scheme `{scheme}://`, which needs TLS support that this \
                 build of distlock lacks: enable the `redis` crate's `tokio-rustls-comp` feature \
                 (with a rustls crypto provider) or use `redis://`"
            )))
        }
        other => {
            // Only the scheme is quoted: the rest may hold a password.
            let shown: String = other.chars().take(20).collect();
            return Err(LockError::Config(format!(
                "{what} has the scheme `{shown}://`, which is not a Redis scheme; expected \
                 `redis://`, `rediss://` or `redis+unix://`"
            )));
        }
    }
    redis::Client::open(url).map_err(|err| {
        LockError::Config(format!(
            "{what} is not usable ({}); expected `redis://[[user]:password@]host[:port][/db]`",
            err.category()
        ))
    })
}

/// Parses a list of URLs; the caller checks how many a deployment needs.
pub(crate) fn parse_list<S: AsRef<str>>(
    urls: impl IntoIterator<Item = S>,
    purpose: UrlFor,
) -> Result<Vec<redis::Client>, LockError> {
    urls.into_iter()
        .map(|url| parse(url.as_ref(), purpose))
        .collect()
}

/// Splits an environment variable's comma-separated list.
pub(crate) fn split_env_list(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(url: &str, purpose: UrlFor) -> String {
        parse(url, purpose).unwrap_err().to_string()
    }

    #[test]
    fn each_wrong_part_is_named() {
        assert!(message("127.0.0.1:6379", UrlFor::Single).contains("no scheme"));
        assert!(message("rediss://h:6379", UrlFor::Single).contains("tokio-rustls-comp"));
        assert!(message("http://u:s3cret@h", UrlFor::Single).contains("`http://`"));
        let list = message("redis://a:1,redis://b:2", UrlFor::Single);
        assert!(
            list.contains("list of URLs") && list.contains("Config::cluster"),
            "{list}"
        );
        assert!(message("", UrlFor::Redlock).contains("Redlock master URL is empty"));
        assert!(!message("http://u:s3cret@h", UrlFor::Single).contains("s3cret"));
        assert!(parse("redis://127.0.0.1:6379/0", UrlFor::Single).is_ok());
    }

    #[test]
    fn env_lists_split_on_commas() {
        assert_eq!(
            split_env_list(" redis://a:1, redis://b:2 ,"),
            ["redis://a:1", "redis://b:2"]
        );
    }
}
