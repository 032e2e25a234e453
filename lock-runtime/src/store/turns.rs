//! One client's requests on a key take turns ([`Turns`]), in the PostgreSQL store, which reads
//! a key's row and writes it back only if nobody changed it meanwhile: the client's own tasks
//! on one hot key (fifty readers, say) would mostly make each other read again and hold its
//! connections waiting for the key's turn in the database; in turn, each read is followed by
//! its write. (The etcd store takes no turns: its grants of one side conflict only where they
//! must — `store/etcd.rs`.) Keys are taken in one order (sorted,
//! once each), so requests on several keys cannot wait on each other in a circle. Other
//! processes still change keys between a read and its write; the store reads again then.
//! Neighbours: `postgres.rs` takes the turns of the keys of each operation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::{Mutex as TurnLock, OwnedMutexGuard};

/// Whose turn it is on each key in use.
#[derive(Default)]
pub(crate) struct Turns {
    keys: Mutex<HashMap<String, Weak<TurnLock<()>>>>,
}

/// The turns of some keys, held until dropped.
pub(crate) struct Turn {
    _held: Vec<OwnedMutexGuard<()>>,
}

impl Turns {
    /// Waits for the turn of each of `names`, in sorted order.
    pub(crate) async fn take(&self, names: &[&str]) -> Turn {
        let mut sorted: Vec<&str> = names.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let locks: Vec<Arc<TurnLock<()>>> = {
            let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
            if keys.len() > 1024 {
                keys.retain(|_, turn| turn.strong_count() > 0);
            }
            sorted
                .iter()
                .map(|name| {
                    let turn = keys.entry((*name).to_owned()).or_default();
                    turn.upgrade().unwrap_or_else(|| {
                        let fresh = Arc::new(TurnLock::new(()));
                        *turn = Arc::downgrade(&fresh);
                        fresh
                    })
                })
                .collect()
        };
        let mut held = Vec::with_capacity(locks.len());
        for lock in locks {
            held.push(lock.lock_owned().await);
        }
        Turn { _held: held }
    }
}
