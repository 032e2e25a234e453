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
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// One call of a [`LuaScript`]: its keys (`KEYS`) and arguments (`ARGV`).
pub(crate) struct ScriptCall {
    script: &'static LuaScript,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl ScriptCall {
    /// Adds a key (`KEYS[n]`).
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Adds an argument (`ARGV[n]`).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
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
        let mut cmd = redis::cmd(name);
        cmd.arg(script)
            .arg(self.keys.len())
            .arg(&*self.keys)
            .arg(&*self.args);
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
