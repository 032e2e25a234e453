//! The attribute's `permits = N` (issue 12) on the in-process store: never more than N calls
//! inside, a count given as an expression, a count of zero refused at run time naming the
//! argument, a nested call on the same semaphore joining its permit, and a nested lock on a key
//! the task holds as a permit refused at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{distributed_lock, Client, Config, LockError, LockMode};

struct Api {
    locks: Client,
    limit: u32,
    inside: AtomicUsize,
    most: AtomicUsize,
}

impl Api {
    fn new(limit: u32) -> Arc<Self> {
        Arc::new(Self {
            locks: Client::new(Config::in_memory()).expect("client"),
            limit,
            inside: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        })
    }

    #[distributed_lock(key = "partner-api", permits = 2, client = self.locks, wait = "20s")]
    async fn call(&self) -> Result<(), LockError> {
        let info = distlock::current().expect("inside the permit");
        assert_eq!(info.mode(), LockMode::Semaphore);
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    #[distributed_lock(key = "exports", permits = self.limit, client = self.locks)]
    async fn export(&self) -> Result<(), LockError> {
        // Nested on the same semaphore: joins this call's permit (one permit for both), so
        // it cannot wait on itself when every permit is taken.
        self.export_part().await
    }

    #[distributed_lock(key = "exports", permits = self.limit, client = self.locks, wait = "0s")]
    async fn export_part(&self) -> Result<(), LockError> {
        Ok(())
    }

    #[distributed_lock(key = "exports", permits = 1, client = self.locks)]
    async fn export_then_lock(&self) -> Result<(), LockError> {
        self.lock_exports().await
    }

    #[distributed_lock(key = "exports", client = self.locks, wait = "0s")]
    async fn lock_exports(&self) -> Result<(), LockError> {
        Ok(())
    }
}

/// Six calls of a fn with `permits = 2`: two inside at once, never more. An expansion that
/// took an exclusive lock instead would let one in (`most` 1), one that took none all six.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fn_with_permits_runs_at_most_that_many_at_once() {
    let api = Api::new(1);
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let api = api.clone();
            tokio::spawn(async move { api.call().await })
        })
        .collect();
    for call in calls {
        call.await.expect("task").expect("a permit");
    }
    assert_eq!(
        api.most.load(Ordering::SeqCst),
        2,
        "at most 2 inside, and 2 at once"
    );
}

#[tokio::test]
async fn a_count_from_an_expression_is_used_and_zero_is_refused_naming_it() {
    let api = Api::new(1);
    api.export().await.expect("a nested call joins the permit");
    let zero = Api::new(0);
    let err = zero.export().await.expect_err("zero permits");
    assert!(
        matches!(&err, LockError::Config(msg) if msg.contains("permits = self.limit")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_nested_lock_on_a_key_held_as_a_permit_is_refused_at_once() {
    let api = Api::new(1);
    let err = tokio::time::timeout(Duration::from_secs(5), api.export_then_lock())
        .await
        .expect("refused at once, not a wait on itself")
        .expect_err("a lock inside a permit of the same key");
    assert!(
        matches!(&err, LockError::Config(msg) if msg.contains("semaphore or a lock")),
        "{err:?}"
    );
}

// ---- `keys = [..]` --------------------------------------------------------------------------

struct Bank {
    locks: Client,
    inside: [AtomicUsize; 2],
    overlaps: AtomicUsize,
}

impl Bank {
    #[distributed_lock(keys = ["acct:{from}", "acct:{to}"], client = self.locks, wait = "20s")]
    async fn transfer(&self, from: usize, to: usize) -> Result<(), LockError> {
        for account in [from, to] {
            if self.inside[account].fetch_add(1, Ordering::SeqCst) != 0 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
        }
        // A nested single-key call on a key of the grant joins it.
        self.audit(from).await?;
        tokio::task::yield_now().await;
        for account in [from, to] {
            self.inside[account].fetch_sub(1, Ordering::SeqCst);
        }
        Ok(())
    }

    #[distributed_lock(key = "acct:{account}", client = self.locks, wait = "0s")]
    async fn audit(&self, account: usize) -> Result<(), LockError> {
        let info = distlock::current().expect("inside the grant");
        assert_eq!(info.key(), format!("acct:{account}"));
        Ok(())
    }

    #[distributed_lock(key = "acct:{from}", client = self.locks)]
    async fn transfer_inside_a_lock(&self, from: usize, to: usize) -> Result<(), LockError> {
        self.transfer(from, to).await
    }
}

/// Two tasks transfer in opposite directions 200 times each through the attribute: no
/// deadlock (each call takes both keys or none), no account held twice, and a nested call on
/// one of the keys joins the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fn_with_keys_takes_them_all_at_once_in_either_order() {
    let bank = Arc::new(Bank {
        locks: Client::new(Config::in_memory()).expect("client"),
        inside: [AtomicUsize::new(0), AtomicUsize::new(0)],
        overlaps: AtomicUsize::new(0),
    });
    let tasks: Vec<_> = [(0, 1), (1, 0)]
        .into_iter()
        .map(|(from, to)| {
            let bank = bank.clone();
            tokio::spawn(async move {
                for _ in 0..200 {
                    bank.transfer(from, to).await.expect("both accounts");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(bank.overlaps.load(Ordering::SeqCst), 0);
    let err = bank
        .transfer_inside_a_lock(0, 1)
        .await
        .expect_err("a multi-key call inside a lock on one of its keys");
    assert!(
        matches!(&err, LockError::Config(msg) if msg.contains("already holds `acct:0`")),
        "{err:?}"
    );
}
