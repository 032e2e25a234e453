//! The readiness check (`Client::ping`, `distlock::ping`): every store answers it while up —
//! the node, Sentinel's primary, every Cluster primary, a majority of Redlock masters, the
//! in-process store. Failing servers are `tests/deployments/redis_faults.rs`'s and
//! `redlock.rs`'s.

use crate::support::stores::Harness;

crate::support::stores::on_every_store!(a_store_that_is_up_answers_a_ping);

async fn a_store_that_is_up_answers_a_ping(h: Harness) {
    let client = h.client();
    client.ping().await.expect("the store is up");
    // And again on the connections the first one made.
    client.ping().await.expect("still up");
}
