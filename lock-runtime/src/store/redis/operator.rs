//! The operations on a key's lock that are not a try, on the Redis store (`redis.rs`): a
//! [`KeyOperation`]'s script, on its shard in a Cluster (a lock's keys share one slot), under
//! the failover guard when it is a guarded write; and the scan of the keys matching a
//! pattern, on the server or every primary of a Cluster. Neighbours: `operator_scripts.rs`
//! and `election_scripts.rs` hold the operations.

use super::RedisStore;
use crate::error::LockError;
use crate::key_operation::KeyOperation;
use crate::protocol::Call;
use crate::store::transport::Transport;
use crate::store::Found;

/// Keys asked for per `SCAN` step: a hint to the server, which bounds the work of one step.
pub(crate) const SCAN_COUNT: u64 = 1000;

impl<T: Transport> RedisStore<T> {
    /// A lock's keys share one slot, so an operation on it is one script, on its shard in a
    /// Cluster; under the failover guard when the operation is a guarded write.
    pub(super) async fn run_script<O: KeyOperation>(
        &self,
        operation: &O,
    ) -> Result<O::Output, LockError> {
        let call = operation.call(T::ANNOUNCE, self.tokens);
        let (reply, replicated) = if O::GUARDED {
            self.call_guarded(O::NAME, Call::Script(&call), O::wrote)
                .await?
        } else {
            (self.invoke(O::NAME, call).await?, true)
        };
        operation.read(reply, replicated)
    }

    /// `SCAN` on the server, or on every primary of a Cluster; never `KEYS`. Keys that are
    /// not UTF-8 are no lock keys and are skipped.
    pub(super) async fn scan_shards(
        &self,
        pattern: &str,
        found: &mut Found,
    ) -> Result<(), LockError> {
        for shard in self.transport.shards().await? {
            let mut cursor = 0u64;
            loop {
                let mut step = redis::cmd("SCAN");
                step.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let (next, keys) = self.transport.scan_step(&shard, &step).await?;
                found.extend(keys.into_iter().filter_map(|k| String::from_utf8(k).ok()));
                if found.full() {
                    return Ok(());
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(())
    }
}
