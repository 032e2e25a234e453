//! `keys = [..]` with placeholders from parameters and `self`, beside other arguments.

struct Bank {
    branch: u32,
    locks: distlock::Client,
}

impl Bank {
    #[distlock::distributed_lock(keys = ["acct:{self.branch}:{from}", "acct:{self.branch}:{to}"], client = self.locks, lease = "10s", wait = "5s")]
    async fn transfer(&self, from: u64, to: u64, amount: u64) -> Result<u64, distlock::LockError> {
        let _ = (from, to);
        Ok(amount)
    }
}

#[distlock::distributed_lock(keys = ["sku:{a}", "sku:{b}", "sku:{c}"], fencing = false)]
async fn order(a: &str, b: &str, c: &str) -> Result<(), distlock::LockError> {
    let _ = (a, b, c);
    Ok(())
}

pub(crate) fn run() {
    let bank = Bank {
        branch: 1,
        locks: distlock::Client::new(distlock::Config::in_memory()).unwrap(),
    };
    drop(bank.transfer(1, 2, 3));
    drop(order("x", "y", "z"));
}
