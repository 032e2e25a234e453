//! The operator's tools on every store — a single `redis-server`, a primary found through
//! Sentinel, a Redis Cluster, Redlock over three masters, and the in-process store: who holds
//! a lock (`Client::inspect`, `is_locked`), freeing it by force (`Client::force_unlock`) and
//! finding the locks held (`Client::list`). The same test bodies run on every store (the
//! store list of `behaviour.rs`); the Sentinel setup, the Cluster and the Redlock
//! masters are shared by the tests of this binary, each test under a key prefix of its own.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use crate::support::stores::Harness;
use crate::support::RedisServer;
use distlock::{Client, Config, LockError, LockMode};
use tokio::time::Instant;

macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod store {
            use super::*;
            macro_rules! one_store {
                ($store:ident, $harness:ident) => {
                    mod $store {
                        use super::*;
                        $(
                            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                            async fn $name() {
                                super::super::$name(Harness::$harness()).await;
                            }
                        )*
                    }
                };
            }
            one_store!(redis_store, redis);
            one_store!(sentinel_store, sentinel);
            one_store!(cluster_store, cluster);
            one_store!(redlock_store, redlock);
            one_store!(in_memory_store, in_memory);
        }
    };
}

on_every_store!(
    a_writer_is_shown_with_its_app_host_pid_and_since,
    readers_are_each_shown_and_a_waiting_writer_is_seen,
    force_unlock_frees_the_lock_wakes_a_waiter_and_outdates_the_evicted_token,
    force_unlock_evicts_every_reader,
    list_finds_the_held_locks_matching_a_pattern_and_no_companion_key,
);

async fn a_writer_is_shown_with_its_app_host_pid_and_since(h: Harness) {
    let client = h.app_client("inspect-test");
    let before = SystemTime::now() - Duration::from_secs(1);
    let lease = Duration::from_secs(20);
    let guard = client.lock("order:1").lease(lease).acquire().await.unwrap();
    let state = client.inspect("order:1").await.unwrap();
    assert!(state.is_locked());
    assert!(client.is_locked("order:1").await.unwrap());
    assert_eq!(state.key, "order:1");
    assert_eq!(state.mode, Some(LockMode::Write));
    assert_eq!(state.holders.len(), 1, "{state:?}");
    let holder = &state.holders[0];
    assert_eq!(holder.app.as_deref(), Some("inspect-test"));
    assert_eq!(holder.pid, Some(std::process::id()));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("a Linux host name");
    assert_eq!(holder.host.as_deref(), Some(host.trim()), "{holder:?}");
    let since = holder.since.expect("since");
    assert!(since >= before && since <= SystemTime::now(), "{holder:?}");
    let remaining = holder.remaining.expect("a lease");
    assert!(remaining <= lease && remaining > lease / 2, "{remaining:?}");
    assert_eq!(state.remaining, Some(remaining));
    assert!(!state.writer_waiting);
    let token = guard.fencing_token().expect("fenced");
    assert!(state.token_ceiling >= token, "{state:?} {token}");

    assert!(guard.release().await.unwrap());
    let state = client.inspect("order:1").await.unwrap();
    assert!(!state.is_locked(), "{state:?}");
    assert_eq!(state.mode, None);
    assert!(!client.is_locked("order:1").await.unwrap());
    // Nothing that was never locked is locked.
    assert!(!client.is_locked("never:taken").await.unwrap());
}

async fn readers_are_each_shown_and_a_waiting_writer_is_seen(h: Harness) {
    let (one, two, writer) = (
        h.app_client("reader-one"),
        h.app_client("reader-two"),
        h.app_client("writer"),
    );
    let r1 = one.read_lock("catalog").acquire().await.unwrap();
    let r2 = two.read_lock("catalog").acquire().await.unwrap();
    let state = one.inspect("catalog").await.unwrap();
    assert_eq!(state.mode, Some(LockMode::Read));
    let mut apps: Vec<_> = state
        .holders
        .iter()
        .map(|h| h.app.clone().unwrap_or_default())
        .collect();
    apps.sort();
    assert_eq!(apps, ["reader-one", "reader-two"], "{state:?}");
    assert!(!state.writer_waiting);

    let waiting = tokio::spawn(async move {
        writer
            .lock("catalog")
            .wait(Duration::from_secs(20))
            .acquire()
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = loop {
        let state = one.inspect("catalog").await.unwrap();
        let listening = !h.pub_sub || state.waiting_processes >= 1;
        if (state.writer_waiting && listening) || Instant::now() > deadline {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(seen.writer_waiting, "{seen:?}");
    if h.pub_sub {
        assert!(seen.waiting_processes >= 1, "{seen:?}");
    }
    drop((r1, r2));
    let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the writer got in")
        .unwrap()
        .unwrap();
    let state = one.inspect("catalog").await.unwrap();
    assert_eq!(state.mode, Some(LockMode::Write));
    assert_eq!(state.holders[0].app.as_deref(), Some("writer"));
    drop(guard);
}

async fn force_unlock_frees_the_lock_wakes_a_waiter_and_outdates_the_evicted_token(h: Harness) {
    let (hung, waiter, operator) = (
        h.app_client("hung"),
        h.app_client("waiter"),
        h.app_client("ops"),
    );
    let lease = Duration::from_millis(900);
    let held = hung.lock("report").lease(lease).acquire().await.unwrap();
    let evicted_token = held.fencing_token().expect("fenced");
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let guard = waiter
            .lock("report")
            .wait(Duration::from_secs(30))
            .acquire()
            .await;
        (guard, started.elapsed())
    });
    // The waiter waits on the holder, which the watchdog keeps renewing.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished());

    let forced = operator.force_unlock("report").await.unwrap();
    assert_eq!(forced.key, "report");
    assert_eq!(forced.evicted.len(), 1, "{forced:?}");
    assert_eq!(forced.evicted[0].app.as_deref(), Some("hung"));
    assert!(forced.token > evicted_token, "{forced:?} {evicted_token}");

    // Woken (or at its next backoff step): well before the hung holder's lease would end.
    let (next, waited) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter got in")
        .unwrap();
    let next = next.expect("granted");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert!(
        next.fencing_token().expect("fenced") > forced.token,
        "every later grant's token is above the forced one"
    );
    // The evicted holder learns it at its next renewal (a third of the lease).
    tokio::time::timeout(lease * 3, held.lost())
        .await
        .expect("the evicted holder's lease is reported lost");
    assert!(!held.is_held());
    // Its release does not free the next holder's lock.
    assert!(!held.release().await.unwrap());
    assert!(operator.is_locked("report").await.unwrap());
    drop(next);

    // A free lock: nothing evicted, still a token above the last.
    let again = operator.force_unlock("never:held").await.unwrap();
    assert!(again.evicted.is_empty());
}

async fn force_unlock_evicts_every_reader(h: Harness) {
    let (one, two, operator) = (h.app_client("r1"), h.app_client("r2"), h.app_client("ops"));
    let lease = Duration::from_millis(900);
    let r1 = one.read_lock("shelf").lease(lease).acquire().await.unwrap();
    let r2 = two.read_lock("shelf").lease(lease).acquire().await.unwrap();
    let forced = operator.force_unlock("shelf").await.unwrap();
    assert_eq!(forced.evicted.len(), 2, "{forced:?}");
    assert!(!operator.is_locked("shelf").await.unwrap());
    for reader in [&r1, &r2] {
        tokio::time::timeout(lease * 3, reader.lost())
            .await
            .expect("every evicted reader's lease is reported lost");
    }
    // A writer gets in at once.
    let writer = operator
        .lock("shelf")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .unwrap();
    assert!(writer.fencing_token().expect("fenced") > forced.token);
}

async fn list_finds_the_held_locks_matching_a_pattern_and_no_companion_key(h: Harness) {
    let client = h.app_client("lister");
    // Redlock keeps fencing counters beside the lock keys; a waiting writer leaves its mark.
    let _o1 = client.lock("order:1").acquire().await.unwrap();
    let o2 = client.lock("order:2").acquire().await.unwrap();
    let _u = client.read_lock("user:7").acquire().await.unwrap();
    let _odd = client.lock("}odd{").acquire().await.unwrap();
    let refused = client
        .lock("order:2")
        .wait(Duration::from_millis(30))
        .acquire()
        .await;
    assert!(matches!(refused, Err(LockError::Timeout { .. })));

    assert_eq!(
        client.list("order:*", 100).await.unwrap(),
        ["order:1", "order:2"]
    );
    assert_eq!(
        client.list("*", 100).await.unwrap(),
        ["order:1", "order:2", "user:7", "}odd{"]
    );
    assert_eq!(client.list("*", 2).await.unwrap(), ["order:1", "order:2"]);
    assert_eq!(client.list("}*", 100).await.unwrap(), ["}odd{"]);
    assert!(client.list("nothing:*", 100).await.unwrap().is_empty());
    o2.release().await.unwrap();
    assert_eq!(client.list("order:*", 100).await.unwrap(), ["order:1"]);
}

// ---- the evicted holder's annotated fn is cancelled (on_lost = "abort") -------------------

/// The global client, on a server of its own, for the annotated fn below.
fn global_server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let server = RedisServer::start();
        distlock::try_init(
            Config::from_url(&server.url())
                .expect("valid url")
                .app_name("annotated"),
        )
        .expect("global client");
        server
    })
}

#[distlock::distributed_lock(key = "job:{n}", lease = "600ms", on_lost = "abort")]
async fn long_job(n: u32, started: tokio::sync::oneshot::Sender<()>) -> Result<u32, LockError> {
    let _ = started.send(());
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlocked_annotated_fn_is_cancelled_at_its_next_renewal() {
    let server = global_server();
    let operator = Client::new(Config::from_url(&server.url()).unwrap()).unwrap();
    let (started, running) = tokio::sync::oneshot::channel();
    let job = tokio::spawn(long_job(1, started));
    running.await.expect("the body started");
    let state = distlock::inspect("job:1").await.unwrap();
    assert_eq!(state.holders[0].app.as_deref(), Some("annotated"));
    let begun = Instant::now();
    operator.force_unlock("job:1").await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(5), job)
        .await
        .expect("cancelled, not run to its end")
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::LeaseLost { .. })),
        "{outcome:?}"
    );
    // Within about a renewal interval (a third of the lease), with margin.
    assert!(
        begun.elapsed() < Duration::from_secs(3),
        "{:?}",
        begun.elapsed()
    );
}

// ---- force_unlock announces the release: a waiter that would sleep long is woken -----------

/// One test per Redis store (the in-process store has no release channel; its waiters poll).
macro_rules! on_every_redis_store {
    ($name:ident) => {
        mod woken {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis_store() {
                $name(Harness::redis()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sentinel_store() {
                $name(Harness::sentinel()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cluster_store() {
                $name(Harness::cluster()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redlock_store() {
                $name(Harness::redlock()).await;
            }
        }
    };
}

on_every_redis_store!(force_unlock_wakes_a_waiter_at_once);

/// The waiter's backoff is seconds long and the holder's lease is renewed, so only the
/// release announced by `force_unlock` (`PUBLISH`, `SPUBLISH` on Cluster) lets it in within a
/// second. Shown to fail with the announcement taken out of `force_unlock.lua`.
async fn force_unlock_wakes_a_waiter_at_once(h: Harness) {
    assert!(h.pub_sub);
    let (hung, operator) = (h.app_client("hung"), h.app_client("ops"));
    let waiter = Client::new(
        h.config
            .clone()
            .app_name("waiter")
            .backoff(Duration::from_secs(8), Duration::from_secs(8)),
    )
    .expect("valid config");
    let lease = Duration::from_secs(10);
    let _held = hung.lock("wake").lease(lease).acquire().await.unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .lock("wake")
            .wait(Duration::from_secs(60))
            .acquire()
            .await;
        (guard, Instant::now())
    });
    // The waiter is counted once it listens for the release.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = operator.inspect("wake").await.unwrap();
        if state.waiting_processes >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter never listened: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let forced_at = Instant::now();
    operator.force_unlock("wake").await.unwrap();
    let (guard, granted_at) = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiter got in")
        .unwrap();
    let _next = guard.expect("granted");
    let waited = granted_at - forced_at;
    assert!(
        waited < Duration::from_secs(1),
        "not woken: in after {waited:?}"
    );
}

// ---- the application name: from the environment, else the executable's name ---------------

/// `Config::from_env` reads `DISTLOCK_APP_NAME` (sanitized into the record), and a config
/// without a name records the executable's file name. Only this test of the binary reads the
/// environment, so setting it here disturbs no other test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_name_comes_from_the_environment_or_else_the_executable() {
    let server = RedisServer::start();
    std::env::set_var(distlock::ENV_REDIS_URL, server.url());
    std::env::set_var(distlock::ENV_APP_NAME, "nightly report:eu");
    let from_env = Client::new(Config::from_env().expect("config")).expect("client");
    let unnamed = Client::new(Config::from_url(&server.url()).unwrap()).unwrap();
    std::env::remove_var(distlock::ENV_APP_NAME);
    std::env::remove_var(distlock::ENV_REDIS_URL);

    let guard = from_env.lock("env:named").acquire().await.unwrap();
    let state = unnamed.inspect("env:named").await.unwrap();
    assert_eq!(state.holders[0].app.as_deref(), Some("nightly_report_eu"));
    guard.release().await.unwrap();

    let guard = unnamed.lock("env:unnamed").acquire().await.unwrap();
    let state = from_env.inspect("env:unnamed").await.unwrap();
    let exe = std::env::current_exe().unwrap();
    let stem = exe.file_stem().unwrap().to_string_lossy();
    assert_eq!(state.holders[0].app.as_deref(), Some(&*stem));
    guard.release().await.unwrap();
}

// ---- a key that is no lock: a clear error, and force_unlock leaves it alone ----------------

/// Another application's hash under distlock's prefix: `inspect` and `force_unlock` say so and
/// name the fix (another key prefix) instead of misreading or deleting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_no_lock_is_reported_and_left_alone() {
    let server = RedisServer::start();
    let mut raw = server.connection();
    let key = format!("{}{{profile}}", distlock::DEFAULT_KEY_PREFIX);
    redis::cmd("HSET")
        .arg(&key)
        .arg("name")
        .arg("ada")
        .exec(&mut raw)
        .unwrap();
    let client = Client::new(Config::from_url(&server.url()).unwrap()).unwrap();
    for result in [
        client.inspect("profile").await.map(|_| ()),
        client.force_unlock("profile").await.map(|_| ()),
    ] {
        let err = result.expect_err("no lock");
        assert!(
            matches!(&err, LockError::NotALock { holds, .. } if holds == "hash"),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains("hash"), "{text}");
    }
    let text = client.inspect("profile").await.unwrap_err().to_string();
    assert!(text.contains("key_prefix"), "{text}");
    let kept: String = redis::cmd("HGET")
        .arg(&key)
        .arg("name")
        .query(&mut raw)
        .unwrap();
    assert_eq!(kept, "ada");
}
