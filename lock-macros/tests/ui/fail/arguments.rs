// Misused arguments, each refused at the offending token: one function per message.

// An argument the attribute does not know.
#[distlock::distributed_lock(key = "k", timeout = "5s")]
async fn unknown_argument() -> Result<(), distlock::LockError> {
    Ok(())
}

// The same argument twice: lease, client, fair, mode.
#[distlock::distributed_lock(key = "k", lease = "5s", lease = "10s")]
async fn lease_twice() -> Result<(), distlock::LockError> {
    Ok(())
}

fn locks() -> &'static distlock::Client {
    unimplemented!()
}

#[distlock::distributed_lock(key = "k", client = locks(), client = locks())]
async fn client_twice() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", fair = true, fair = false)]
async fn fair_twice() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", mode = "read", mode = "write")]
async fn mode_twice() -> Result<(), distlock::LockError> {
    Ok(())
}

// No key at all.
#[distlock::distributed_lock(lease = "15s")]
async fn no_key() -> Result<(), distlock::LockError> {
    Ok(())
}

// Modes it does not know.
#[distlock::distributed_lock(key = "k", mode = "shared")]
async fn mode_shared() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", mode = "Read")]
async fn mode_capitalised() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", mode = "upgradable")]
async fn mode_unknown() -> Result<(), distlock::LockError> {
    Ok(())
}

// `on_busy` is "skip" or "wait".
#[distlock::distributed_lock(key = "job", on_busy = "ignore")]
async fn on_busy_ignore() -> Result<(), distlock::LockError> {
    Ok(())
}

// Permits with a mode, and no permit at all.
#[distlock::distributed_lock(key = "partner-api", permits = 5, mode = "read")]
async fn permits_with_mode() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "partner-api", permits = 0)]
async fn permits_zero(id: u64) -> Result<(), distlock::LockError> {
    let _ = id;
    Ok(())
}

// A lease of zero, and one too short to renew.
#[distlock::distributed_lock(key = "k", lease = "0s")]
async fn lease_zero() -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "k", lease = "5ms")]
async fn lease_too_short() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}
