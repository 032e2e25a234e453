//! Our Lua scripts as they are sent. A [`LuaScript`] is a script's source and SHA1, made once
//! per process; a [`ScriptCall`] is one call of it with its keys and arguments, built by the
//! kinds (`kind/`), the operator's scripts and the fenced writes, and carried to the stores
//! by `protocol.rs`'s `Call`. A call is sent by SHA (`EVALSHA`); when the server does not have
//! the script (`NOSCRIPT`: after a restart, a `SCRIPT FLUSH`, a failover to a replica that
//! never ran it) it is sent once more with its source (`EVAL`), which runs it and leaves it in
//! that server's script cache for the next `EVALSHA`. On a Cluster both route by the call's
//! first key, so a missing script is recovered on the node that answered alone — a
//! `SCRIPT LOAD` through the cluster connection goes to every primary and fails while any one
//! of them is down.

use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, ServerErrorKind, ToRedisArgs};

/// A Lua script: its source, and the SHA1 `EVALSHA` names it by.
pub(crate) struct LuaScript {
    source: String,
    hash: String,
}

impl LuaScript {
    pub(crate) fn new(source: &str) -> Self {
        Self {
            hash: redis::Script::new(source).get_hash().to_owned(),
            source: source.to_owned(),
        }
    }

    /// A call of the script, with no keys and no arguments yet.
    pub(crate) fn prepare_invoke(&'static self) -> ScriptCall {
        ScriptCall {
            script: self,
            keys: 0,
            body: Cmd::with_capacity(8, 256),
        }
    }
}

/// One call of a [`LuaScript`]: its keys (`KEYS`), then its arguments (`ARGV`), written once
/// into one buffer (no allocation per argument), copied behind `EVALSHA sha numkeys` when
/// sent.
pub(crate) struct ScriptCall {
    script: &'static LuaScript,
    /// How many of the body's first arguments are keys.
    keys: usize,
    body: Cmd,
}

impl ScriptCall {
    /// Adds a key (`KEYS[n]`). Keys come before every argument (checked in debug builds, which
    /// the tests run: a key after an argument would be sent as an argument).
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        debug_assert_eq!(
            self.keys,
            self.body.args_iter().len(),
            "a script call's keys come before its arguments"
        );
        key.write_redis_args(&mut self.body);
        self.keys = self.body.args_iter().len();
        self
    }

    /// Adds an argument (`ARGV[n]`).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.body);
        self
    }

    /// The call's first key (`KEYS[1]`), by which a Cluster routes it.
    pub(crate) fn first_key(&self) -> Option<&[u8]> {
        if self.keys == 0 {
            return None;
        }
        match self.body.args_iter().next() {
            Some(redis::Arg::Simple(key)) => Some(key),
            _ => None,
        }
    }

    /// The call by SHA: `EVALSHA sha numkeys keys… args…`.
    pub(crate) fn by_hash(&self) -> Cmd {
        self.command("EVALSHA", &self.script.hash)
    }

    /// The call with the script's source: `EVAL source numkeys keys… args…`.
    pub(crate) fn with_source(&self) -> Cmd {
        self.command("EVAL", &self.script.source)
    }

    fn command(&self, name: &str, script: &str) -> Cmd {
        let body = self.body.args_iter();
        let bytes: usize = body
            .clone()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.len(),
                _ => 0,
            })
            .sum();
        let mut cmd = Cmd::with_capacity(3 + body.len(), name.len() + script.len() + 20 + bytes);
        cmd.arg(name).arg(script).arg(self.keys);
        for arg in body {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        cmd
    }

    /// Sends the call by SHA, and with the source when the server does not have the script.
    pub(crate) async fn invoke_async<T: FromRedisValue>(
        &self,
        connection: &mut impl redis::aio::ConnectionLike,
    ) -> RedisResult<T> {
        match self.by_hash().query_async(connection).await {
            Err(err) if is_noscript(&err) => self.with_source().query_async(connection).await,
            replied => replied,
        }
    }
}

impl ScriptCall {
    /// [`invoke_async`](Self::invoke_async) on a multiplexed connection, each request awaited
    /// in place (see [`Call::query_multiplexed`](crate::protocol::Call::query_multiplexed)).
    pub(crate) async fn invoke_multiplexed<T: FromRedisValue>(
        &self,
        connection: &mut redis::aio::MultiplexedConnection,
    ) -> RedisResult<T> {
        let sent = async |cmd: Cmd, connection: &mut redis::aio::MultiplexedConnection| {
            let reply = connection
                .send_packed_command(&cmd)
                .await?
                .extract_error()?;
            Ok(T::from_redis_value(reply)?)
        };
        match sent(self.by_hash(), connection).await {
            Err(err) if is_noscript(&err) => sent(self.with_source(), connection).await,
            replied => replied,
        }
    }
}

/// Whether the server answered that it does not have the script.
pub(crate) fn is_noscript(err: &redis::RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::LazyLock;

    static SCRIPT: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new("return KEYS[1]"));

    #[test]
    fn a_call_names_the_script_by_sha_or_by_source_with_its_keys_then_its_arguments() {
        let mut call = SCRIPT.prepare_invoke();
        call.key("k").arg(7).arg("x");
        let sha = redis::Script::new("return KEYS[1]").get_hash().to_owned();
        let packed = |cmd: Cmd| String::from_utf8(cmd.get_packed_command()).expect("utf-8");
        assert_eq!(
            packed(call.by_hash()),
            packed(
                redis::cmd("EVALSHA")
                    .arg(&sha)
                    .arg(1)
                    .arg("k")
                    .arg(7)
                    .arg("x")
                    .clone()
            )
        );
        assert_eq!(
            packed(call.with_source()),
            packed(
                redis::cmd("EVAL")
                    .arg("return KEYS[1]")
                    .arg(1)
                    .arg("k")
                    .arg(7)
                    .arg("x")
                    .clone()
            )
        );
    }
}
