//! Reading the Redis URLs of a [`Config`](crate::Config): one URL where one server is meant,
//! lists for Cluster, Sentinel and Redlock, and errors that name the part that cannot work (a
//! missing scheme or host, a port out of range, a path that is not a database number, a query
//! parameter the redis crate would ignore in silence, TLS without the `tls` feature, a list
//! where one URL is expected) without ever showing a password, and a server's address as
//! messages and logs show it ([`server_address`]: no credentials). Neighbours: `config.rs`
//! calls it; `tls.rs` readies TLS for a `rediss://` URL.

use crate::error::LockError;

/// The server a client talks to, as it may appear in messages and logs: only the address and
/// database that the `redis` crate parsed from the URL, never user names or passwords (which may
/// hold any character, so no string surgery on the URL is safe).
pub(crate) fn server_address(client: &redis::Client) -> String {
    let info = client.get_connection_info();
    let tls = if crate::tls::is_tls(client) {
        ", TLS"
    } else {
        ""
    };
    format!("{} (db {}{tls})", info.addr(), info.redis_settings().db())
}

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
    let scheme = scheme.to_ascii_lowercase();
    let tls = match scheme.as_str() {
        "redis" | "valkey" => false,
        "rediss" | "valkeys" => true,
        "redis+unix" | "valkey+unix" | "unix" => false,
        other => {
            // Only the scheme is quoted: the rest may hold a password.
            let shown: String = other.chars().take(20).collect();
            return Err(LockError::Config(format!(
                "{what} has the scheme `{shown}://`, which is not a Redis scheme; expected \
                 `redis://`, `rediss://` or `redis+unix://`"
            )));
        }
    };
    if tls && !cfg!(feature = "tls") {
        return Err(crate::tls::missing_feature(what));
    }
    check_parts(url, what, &scheme)?;
    let client = redis::Client::open(url).map_err(|err| {
        // What `check_parts` lets through and the redis crate refuses (a wildcard address, a
        // user name that is not UTF-8): its messages name the part and quote no secret.
        LockError::Config(format!(
            "{what} is not usable ({err}); expected `{}`",
            expected_form(&scheme)
        ))
    })?;
    crate::tls::prepare(what, &client)?;
    Ok(client)
}

/// The accepted form of a URL with `scheme` (one of the Redis schemes, lowercase), as errors
/// quote it: in the URL's own scheme, so a `redis://` URL is never told to become `rediss://`.
fn expected_form(scheme: &str) -> String {
    if scheme.ends_with("unix") {
        format!("{scheme}:///path/to/redis.sock[?db=N&user=U&pass=P]")
    } else {
        format!("{scheme}://[[user]:password@]host[:port][/db]")
    }
}

/// Checks each part of a URL the redis crate would refuse without saying which, or ignore
/// in silence (a query parameter it does not know, such as `?db=2` on a TCP URL, would leave
/// the client on db 0). Names the part; quotes nothing that may be a secret.
fn check_parts(url: &str, what: &str, scheme: &str) -> Result<(), LockError> {
    let form = expected_form(scheme);
    let bad = |part: String| LockError::Config(format!("{what} {part}; expected `{form}`"));
    let parsed = ::url::Url::parse(url).map_err(|err| {
        bad(match err {
            ::url::ParseError::InvalidPort => {
                "has a port that is not a number from 0 to 65535".to_owned()
            }
            ::url::ParseError::EmptyHost => "has no host after `://`".to_owned(),
            ::url::ParseError::InvalidIpv4Address => {
                "has a host that is not a valid IPv4 address".to_owned()
            }
            ::url::ParseError::InvalidIpv6Address => {
                "has a host that is not a valid IPv6 address (write it in brackets: \
                 `[::1]:6379`)"
                    .to_owned()
            }
            ::url::ParseError::InvalidDomainCharacter | ::url::ParseError::IdnaError => {
                "has a host name with a character a host name cannot hold (a password with \
                 `@`, `/`, `?` or `#` must be percent-encoded: `%40`, `%2F`, `%3F`, `%23`)"
                    .to_owned()
            }
            other => format!("cannot be read as a URL ({other})"),
        })
    })?;
    let unix = scheme.ends_with("unix");
    if !unix {
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(bad("has no host after `://`".to_owned()));
        }
        if parsed.port() == Some(0) {
            return Err(bad(
                "has port 0; give the port the server listens on".to_owned()
            ));
        }
        let db = parsed.path().trim_matches('/');
        if !db.is_empty() && db.parse::<u32>().is_err() {
            return Err(bad(
                "has a path that is not a database number (`/0`, `/1`, …): the path of a \
                 Redis URL selects the database"
                    .to_owned(),
            ));
        }
    }
    let known: &[&str] = if unix {
        &["db", "user", "pass", "protocol"]
    } else {
        &["protocol"]
    };
    for (name, value) in parsed.query_pairs() {
        if !known.contains(&name.as_ref()) {
            let shown: String = name.chars().take(30).collect();
            let hint = match (unix, name.as_ref()) {
                (false, "db") => ": the database is the path, `redis://host:6379/2`",
                (false, "password" | "pass" | "user" | "username") => {
                    ": credentials go before the host, `redis://user:password@host:6379`"
                }
                _ => "",
            };
            return Err(bad(format!(
                "has the query parameter `{shown}`, which a Redis URL does not take (known: \
                 {}){hint}",
                known
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if unix && name == "db" && value.parse::<u32>().is_err() {
            return Err(bad(
                "has a `db` parameter that is not a database number".to_owned()
            ));
        }
        if name == "protocol" && !["2", "3", "resp2", "resp3"].contains(&value.as_ref()) {
            return Err(bad(
                "has a `protocol` parameter other than `resp2` or `resp3`".to_owned(),
            ));
        }
    }
    if parsed.fragment() == Some("insecure") {
        return Err(bad(
            "ends in `#insecure`, which would turn off the certificate check; distlock does \
             not offer that: have the system trust the server's certificate authority, or \
             build a `redis::Client` with `build_with_tls` and its CA for \
             `Config::from_redis_client`"
                .to_owned(),
        ));
    }
    if let Some(fragment) = parsed.fragment() {
        let shown: String = fragment.chars().take(20).collect();
        return Err(bad(format!(
            "ends in the fragment `#{shown}`, which a Redis URL does not take (a password \
             with `#` must be percent-encoded: `%23`)"
        )));
    }
    Ok(())
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
    fn each_bad_part_of_an_address_is_named() {
        let said = |url: &str, part: &str| {
            let message = message(url, UrlFor::Single);
            assert!(message.contains(part), "{url}: {message}");
            assert!(!message.contains("s3cret"), "{url}: {message}");
        };
        said("redis://:s3cret@h:99999", "port that is not a number");
        said("redis://:s3cret@h:63a79", "port that is not a number");
        said("redis://:s3cret@h:0", "port 0");
        said("redis://:s3cret@:6379", "no host");
        said("redis://:s3cret@[::1:6379", "IPv6");
        said("redis://:s3cret@h:6379/one", "not a database number");
        said("redis://:s3cret@h:6379/-1", "not a database number");
        said("redis://h:6379?db=2&pass=s3cret", "query parameter `db`");
        said("redis://h:6379?db=2", "the database is the path");
        said(
            "redis://h:6379?password=s3cret",
            "credentials go before the host",
        );
        said("redis://h:6379?protocol=resp9", "`protocol` parameter");
        said("redis+unix:///tmp/r.sock?db=x", "`db` parameter");
        said("redis://:s3cret@h:6379/0#frag", "fragment `#frag`");
        said("redis://h:6379/#insecure", "certificate check");
        said("redis://0.0.0.0:6379", "wildcard");
        assert!(parse("redis+unix:///tmp/r.sock?db=1&pass=s3cret", UrlFor::Single).is_ok());
        assert!(parse("redis://u:p@h:6379/3?protocol=resp3", UrlFor::Single).is_ok());
    }

    #[test]
    fn the_form_an_error_suggests_keeps_the_urls_scheme() {
        let plain = message("redis://:s3cret@h:637900", UrlFor::Single);
        assert!(
            plain.ends_with("; expected `redis://[[user]:password@]host[:port][/db]`"),
            "{plain}"
        );
        let valkey = message("VALKEY://h:6379/x", UrlFor::Redlock);
        assert!(
            valkey.ends_with("; expected `valkey://[[user]:password@]host[:port][/db]`"),
            "{valkey}"
        );
        let unix = message("redis+unix:///tmp/r.sock?db=x", UrlFor::Single);
        assert!(
            unix.ends_with("; expected `redis+unix:///path/to/redis.sock[?db=N&user=U&pass=P]`"),
            "{unix}"
        );
        if cfg!(feature = "tls") {
            let tls = message("rediss://h:637900", UrlFor::Cluster);
            assert!(
                tls.ends_with("; expected `rediss://[[user]:password@]host[:port][/db]`"),
                "{tls}"
            );
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn a_tls_url_without_the_feature_names_the_feature() {
        for url in ["rediss://h:6379", "valkeys://:s3cret@h:6379/0"] {
            let message = message(url, UrlFor::Single);
            assert!(message.contains("`tls` feature"), "{message}");
            assert!(message.contains(r#"features = ["tls"]"#), "{message}");
            assert!(!message.contains("s3cret"), "{message}");
        }
        let message = message("rediss://h:1", UrlFor::Cluster);
        assert!(
            message
                .starts_with("invalid distlock configuration: a Redis Cluster node URL uses TLS"),
            "{message}"
        );
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_tls_url_with_the_feature_is_accepted() {
        assert!(parse("rediss://h:6379/0", UrlFor::Single).is_ok());
    }

    #[test]
    fn env_lists_split_on_commas() {
        assert_eq!(
            split_env_list(" redis://a:1, redis://b:2 ,"),
            ["redis://a:1", "redis://b:2"]
        );
    }
}
