//! What a server's ACL refused, read from its error reply ([`Refused`]), and the message
//! that says what to grant. Neighbours: a [`BackendError`](super::BackendError) keeps it
//! (`backend.rs`); `docs/keys-and-acls.md` lists what a user needs.

use std::fmt;

/// What a server's ACL refused this connection's user, read from the error reply: Redis says
/// `NOPERM this user has no permissions to run the 'zcard' command` (or `… to access one of
/// the keys …`), and inside a script `The user executing the script can't run this command or
/// subcommand` without naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// This command, as the ACL names it: `zcard`, `script|load`.
    Command(String),
    /// A command one of distlock's scripts runs (Redis does not say which).
    ScriptCommand,
    /// A key (`~pattern`).
    Keys,
    /// A pub/sub channel (`&pattern`).
    Channels,
}

impl Refused {
    /// Reads the refusal from an error's text, if it is one.
    pub(crate) fn of(message: &str) -> Option<Self> {
        if let Some((_, rest)) = message.split_once("no permissions to run the '") {
            let command = rest.split_once('\'').map_or(rest, |(command, _)| command);
            return Some(Self::Command(command.to_ascii_lowercase()));
        }
        if message.contains("no permissions to access one of the keys") {
            return Some(Self::Keys);
        }
        if message.contains("no permissions to access one of the channels") {
            return Some(Self::Channels);
        }
        let (_, in_script) = message.split_once("The user executing the script can't")?;
        Some(if in_script.contains("channel") {
            Self::Channels
        } else if in_script.contains("key") {
            Self::Keys
        } else {
            Self::ScriptCommand
        })
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const LIST: &str = "docs/keys-and-acls.md (\"Keys in Redis and the ACL a user needs\") \
                            lists every command, key and channel distlock needs, per deployment";
        match self {
            Self::Command(command) => write!(
                f,
                "the server's ACL does not allow this connection's user the command `{}`: grant \
                 it in the user's ACL (`ACL SETUSER <user> +{command}`); {LIST}",
                command.replace('|', " ").to_ascii_uppercase()
            ),
            Self::ScriptCommand => write!(
                f,
                "the server's ACL does not allow this connection's user a command one of \
                 distlock's scripts runs (Redis does not say which): grant the user's ACL the \
                 commands {LIST}"
            ),
            Self::Keys => write!(
                f,
                "the server's ACL does not allow this connection's user the lock keys: grant \
                 the key prefix in the user's ACL (`~distlock:*` for the default prefix); {LIST}"
            ),
            Self::Channels => write!(
                f,
                "the server's ACL does not allow this connection's user the lock channels: \
                 grant them in the user's ACL (`&distlock:*` for the default prefix); {LIST}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{BackendError, BackendErrorKind};

    #[test]
    fn an_acl_refusal_names_what_to_grant() {
        let refusals = [
            (
                "NOPERM this user has no permissions to run the 'zcard' command",
                Some(Refused::Command("zcard".into())),
            ),
            (
                "EXECABORT Transaction discarded because of: NOPERM this user has no \
                 permissions to run the 'exec' command",
                Some(Refused::Command("exec".into())),
            ),
            (
                "NOPERM this user has no permissions to run the 'script|load' command",
                Some(Refused::Command("script|load".into())),
            ),
            (
                "NOPERM this user has no permissions to access one of the keys used as arguments",
                Some(Refused::Keys),
            ),
            (
                "NOPERM this user has no permissions to access one of the channels used as \
                 arguments",
                Some(Refused::Channels),
            ),
            (
                "ERR The user executing the script can't run this command or subcommand \
                 script: 0690, on @user_script:1.",
                Some(Refused::ScriptCommand),
            ),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                None,
            ),
        ];
        for (reply, expected) in refusals {
            assert_eq!(Refused::of(reply), expected, "{reply}");
        }
        let err = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
            "NOPERM",
            "this user has no permissions to run the 'script|load' command".to_owned(),
        ));
        let message = BackendError::new("acquire", BackendErrorKind::Server, err).to_string();
        assert!(message.contains("`SCRIPT LOAD`"), "{message}");
        assert!(message.contains("+script|load"), "{message}");
        assert!(message.contains("Keys in Redis"), "{message}");
        // Our own words quoting a refusal are no refusal of the server's.
        let ours = BackendError::new(
            "acquire",
            BackendErrorKind::Server,
            "no permissions to run the 'zcard' command",
        );
        assert!(ours.to_string().contains("check its log and ACLs"));
    }
}
