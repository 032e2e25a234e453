//! Properties that only a real Redis can show: script cache flushes, restarts of a server that
//! keeps nothing on disk, keys deleted behind the holder's back, what goes over the wire
//! (MONITOR), bad credentials, and ACL users that lack a command of the list
//! docs/keys-and-acls.md documents (the documented user itself is `acl.rs`'s).

use std::time::Duration;

use crate::support;
use crate::support::monitor::Monitor;
use crate::support::RedisServer;
use distlock::{BackendErrorKind, Client, Config, LockError};
use tokio::time::Instant;

fn client_for(server: &RedisServer) -> Client {
    let config = Config::from_url(&server.url())
        .expect("valid url")
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300));
    Client::new(config).expect("valid config")
}

fn redis_cmd<T: redis::FromRedisValue>(server: &RedisServer, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut server.connection()).expect("redis command")
}

#[tokio::test]
async fn script_flush_in_the_middle_of_a_run_changes_nothing() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let mut last = None;
    for round in 0..6 {
        if round == 3 {
            let () = redis_cmd(&server, &["SCRIPT", "FLUSH"]);
        }
        let guard = client.lock("flushed").acquire().await.expect("acquire");
        assert!(last < Some(guard.fencing_token().expect("fenced")));
        last = Some(guard.fencing_token().expect("fenced"));
        assert!(guard.release().await.expect("release"));
    }
}

#[tokio::test]
async fn fencing_tokens_keep_increasing_across_a_restart_of_redis_without_persistence() {
    let mut server = RedisServer::start();
    let client = client_for(&server);
    let before = client.lock("restart").acquire().await.expect("acquire");
    let token_before = before.fencing_token().expect("fenced");
    assert!(before.release().await.expect("release"));

    server.restart();
    let exists: i64 = redis_cmd(&server, &["EXISTS", "distlock:{restart}:fence"]);
    assert_eq!(exists, 0, "the restarted server kept nothing");

    let after = acquire_soon(&client, "restart").await;
    assert!(
        after.fencing_token().expect("fenced") > token_before,
        "token went backwards across the restart: {} then {}",
        token_before,
        after.fencing_token().expect("fenced")
    );
}

/// Acquires `key`, tolerating the one error a client may see on its first request after the
/// server went away (its old connection is found broken and replaced).
async fn acquire_soon(client: &Client, key: &str) -> distlock::LockGuard {
    let started = Instant::now();
    loop {
        match client.lock(key).acquire().await {
            Ok(guard) => return guard,
            Err(err @ LockError::Backend(_)) if started.elapsed() < Duration::from_secs(5) => {
                eprintln!("while Redis comes back: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("locks did not work again within 5 s: {err}"),
        }
    }
}

#[tokio::test]
async fn deleting_the_key_behind_the_holders_back_fires_lost_within_about_a_third_of_the_lease() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let lease = Duration::from_millis(1500);
    let guard = client
        .lock("stolen")
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");
    let deleted: i64 = redis_cmd(&server, &["DEL", "distlock:{stolen}"]);
    assert_eq!(deleted, 1);
    let started = Instant::now();
    tokio::time::timeout(lease, guard.lost())
        .await
        .expect("lost() fires once the watchdog finds the key gone");
    let after = started.elapsed();
    // The next renewal is due lease/3 = 500 ms after the grant; the local deadline would only
    // fire at ~1.5 s, so firing well before that proves the "not owner" reply was heard.
    assert!(after < Duration::from_millis(1100), "lost after {after:?}");
    assert!(!guard.is_held());
    assert!(
        !guard.release().await.expect("release"),
        "the key was not ours any more"
    );
}

/// Holds `key` for a few renewal periods, ends the guard with `end`, and checks on the wire that
/// renewals happened before and none after.
async fn no_renewal_after<F, Fut>(key: &str, end: F)
where
    F: FnOnce(distlock::LockGuard) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let server = RedisServer::start();
    let monitor = Monitor::start(&server);
    let client = client_for(&server);
    let lease = Duration::from_millis(300);
    let guard = client
        .lock(key)
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");
    tokio::time::sleep(lease * 2).await; // the holder works; the watchdog renews
    end(guard).await;
    let lock_key = format!("\"distlock:{{{key}}}\"");
    let renewal = format!("\"PEXPIRE\" {lock_key}");
    let released_at = monitor.wait_for(&format!("\"DEL\" {lock_key}")).await;
    // Give a stray renewal three renewal periods to show up.
    tokio::time::sleep(lease).await;
    let lines = monitor.lines();
    let renewals_before = lines[..released_at]
        .iter()
        .filter(|l| l.contains(&renewal))
        .count();
    assert!(
        renewals_before >= 3,
        "the watchdog renewed {renewals_before} times"
    );
    let late: Vec<_> = lines[released_at..]
        .iter()
        .filter(|l| l.contains(&lock_key) && !l.contains("\"DEL\""))
        .collect();
    assert!(
        late.is_empty(),
        "commands on the key after its release: {late:#?}"
    );
}

#[tokio::test]
async fn renewal_stops_the_moment_the_guard_is_released() {
    no_renewal_after("released", |guard| async move {
        assert!(guard.release().await.expect("release"));
    })
    .await;
}

#[tokio::test]
async fn renewal_stops_the_moment_the_guard_is_dropped() {
    no_renewal_after("dropped", |guard| async move { drop(guard) }).await;
}

#[tokio::test]
async fn redis_stopped_and_restarted_gives_clear_errors_then_locks_work_again() {
    let mut server = RedisServer::start();
    let client = client_for(&server);
    let lease = Duration::from_millis(900);
    let held = client
        .lock("outage-held")
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");

    server.stop();
    for _ in 0..3 {
        match client
            .lock("outage")
            .wait(Duration::from_secs(1))
            .acquire()
            .await
        {
            Err(LockError::Backend(err)) => {
                assert_ne!(err.kind(), BackendErrorKind::Server, "{err}");
                assert!(err.to_string().contains("Redis"), "{err}");
            }
            other => panic!("expected a backend error while Redis is down, got {other:?}"),
        }
    }
    // The readiness check says so, naming the server.
    let down = client.ping().await.expect_err("Redis is down");
    assert!(
        down.to_string()
            .contains(&format!("127.0.0.1:{}", server.port())),
        "{down}"
    );
    // The held lease cannot be renewed: the guard must say so before its lease is over.
    tokio::time::timeout(lease * 2, held.lost())
        .await
        .expect("a lease that cannot be renewed is reported lost");
    assert!(!held.is_held());
    // Its release does not wait for a Redis that is down (issue 25): nothing of the holder's
    // is known to be left, and one compare-and-delete goes in the background.
    assert!(
        matches!(held.release().await, Ok(false)),
        "the release of a lost lease says it was not ours, at once"
    );

    server.restart();
    let started = Instant::now();
    let guard = acquire_soon(&client, "outage").await;
    eprintln!(
        "locks worked again {:?} after the restart",
        started.elapsed()
    );
    assert!(guard.release().await.expect("release"));
    client.ping().await.expect("up again");
}

/// Freezes the server while `key` is being acquired (the acquire times out, its grant
/// pending), keeps it frozen for `stall`, thaws it, and checks that the grant the server then
/// makes (its second `SET`, the first try's, run by its `EXEC`, proves it) is deleted by the
/// clean-up. (`SET`, not `EXEC`: each new connection also sends `EXEC` to learn whether its
/// user may run a transaction.)
async fn a_timed_out_acquire_is_cleaned_up_after(key: &str, stall: Duration) {
    let server = RedisServer::start();
    let client = client_for(&server);
    // Warm the connection so the acquire below is sent on it.
    let warm = client.lock("warm").acquire().await.expect("acquire");
    assert!(warm.release().await.expect("release"));
    server.signal("STOP");
    let result = client.lock(key).acquire().await;
    assert!(
        matches!(&result, Err(LockError::Backend(e)) if e.kind() == BackendErrorKind::Timeout),
        "{result:?}"
    );
    tokio::time::sleep(stall).await;
    server.signal("CONT");
    let lock_key = format!("distlock:{{{key}}}");
    let started = Instant::now();
    loop {
        let granted = server.command_calls(&["set"]);
        let lock: i64 = redis_cmd(&server, &["EXISTS", &lock_key]);
        if granted == 2 && lock == 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "grants run: {granted} of 2, orphaned lock exists: {lock}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_timed_out_acquire_is_cleaned_up_with_a_compare_and_delete() {
    a_timed_out_acquire_is_cleaned_up_after("ambiguous", Duration::ZERO).await;
}

#[tokio::test]
async fn the_clean_up_of_a_timed_out_acquire_outlasts_a_long_stall() {
    // Stalled well past the connect and response timeouts (300 ms each).
    a_timed_out_acquire_is_cleaned_up_after("stalled", Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_wrong_password_is_a_clear_error_that_never_shows_the_secret() {
    let server = RedisServer::start_with(&["--requirepass", "right-horse-battery"]);
    let url = format!("redis://:wrong-staple-secret@127.0.0.1:{}", server.port());
    let client = Client::new(Config::from_url(&url).expect("valid url")).expect("client");
    let err = client
        .lock("guarded")
        .acquire()
        .await
        .expect_err("wrong password");
    let shown = format!("{err} / {err:?}");
    assert!(
        matches!(&err, LockError::Backend(e) if e.kind() == BackendErrorKind::Authentication),
        "{shown}"
    );
    assert!(
        err.to_string()
            .contains("check the user name and password in the URL"),
        "the advice names the credentials, not the server's log: {shown}"
    );
    assert!(!shown.contains("wrong-staple-secret"), "{shown}");
    assert!(!format!("{client:?}").contains("wrong-staple-secret"));

    let right = format!("redis://:right-horse-battery@127.0.0.1:{}", server.port());
    let client = Client::new(Config::from_url(&right).expect("valid url")).expect("client");
    let guard = client
        .lock("guarded")
        .acquire()
        .await
        .expect("right password");
    assert!(guard.release().await.expect("release"));
}

#[tokio::test]
async fn an_unreachable_server_is_a_backend_error_not_a_panic() {
    let port = {
        let server = RedisServer::start();
        server.port()
    }; // stopped: nothing listens there now
    let config = Config::from_url(&format!("redis://127.0.0.1:{port}")).expect("valid url");
    let client = Client::new(config).expect("client");
    let err = client
        .lock("nowhere")
        .acquire()
        .await
        .expect_err("no server");
    match err {
        LockError::Backend(err) => {
            assert_eq!(err.kind(), BackendErrorKind::Connection);
            assert_eq!(err.operation(), "connect");
            assert!(err.to_string().contains("reachable"), "{err}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_release_cancelled_while_a_renewal_is_in_flight_still_frees_the_lock() {
    let server = RedisServer::start();
    // Default response timeout (1 s): the renewal below stays blocked for a while.
    let client = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
    let lease = Duration::from_secs(6);
    let started = Instant::now();
    let guard = client
        .lock("cancelled")
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");
    // Block writes just before the first renewal (due at lease/3 = 2 s), so that the renewal
    // is in flight and holds the lease's gate when the release comes.
    tokio::time::sleep(Duration::from_millis(1900)).await;
    let () = redis_cmd(&server, &["CLIENT", "PAUSE", "1500", "WRITE"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cancelled = tokio::time::timeout(Duration::from_millis(200), guard.release()).await;
    assert!(
        cancelled.is_err(),
        "the release should still be waiting: {cancelled:?}"
    );

    // The rival's requests wait out the pause too: give them time.
    let rival = Client::new(
        Config::from_url(&server.url())
            .expect("url")
            .response_timeout(Duration::from_secs(5)),
    )
    .expect("client");
    let next = rival
        .lock("cancelled")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire after the cancelled release");
    let freed_after = started.elapsed();
    // Writes resume at ~3.4 s and the release goes out then; a release lost with the cancelled
    // future leaves the lock to expire with its lease, at 6 s or later.
    assert!(
        freed_after < Duration::from_secs(5),
        "freed after {freed_after:?}"
    );
    assert!(next.release().await.expect("release"));
}

#[tokio::test]
async fn callers_queued_behind_a_hanging_connect_fail_together() {
    // A server that accepts connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    let config = Config::from_url(&format!("redis://127.0.0.1:{port}"))
        .expect("url")
        .connect_timeout(Duration::from_millis(300));
    let client = Client::new(config).expect("client");
    let started = Instant::now();
    let tries: Vec<_> = (0..8)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .lock(format!("hang:{i}"))
                    .wait(Duration::from_millis(200))
                    .acquire()
                    .await
            })
        })
        .collect();
    for attempt in tries {
        let result = attempt.await.expect("task");
        assert!(matches!(result, Err(LockError::Backend(_))), "{result:?}");
    }
    let took = started.elapsed();
    // One shared connect timeout (300 ms), not eight of them in a row (2.4 s).
    assert!(took < Duration::from_millis(1200), "took {took:?}");
}

#[tokio::test]
async fn a_connection_the_server_closed_while_idle_is_replaced_without_an_error() {
    let server = RedisServer::start();
    let () = redis_cmd(&server, &["CONFIG", "SET", "timeout", "1"]);
    let client = client_for(&server);
    let guard = client.lock("idle").acquire().await.expect("acquire");
    assert!(guard.release().await.expect("release"));
    // Stay idle past the server's 1 s idle timeout: it closes our connection.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let guard = client
        .lock("idle")
        .acquire()
        .await
        .expect("acquire after idling");
    assert!(guard.release().await.expect("release"));
}

#[tokio::test]
async fn fencing_tokens_keep_increasing_when_the_counter_comes_back_stale() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let first = client.lock("stale").acquire().await.expect("acquire");
    let before = first.fencing_token().expect("fenced");
    assert!(first.release().await.expect("release"));
    // As after a restart from an old snapshot, or a failover to a lagging replica.
    let () = redis_cmd(&server, &["SET", "distlock:{stale}:fence", "5"]);
    let second = client.lock("stale").acquire().await.expect("acquire");
    assert!(
        second.fencing_token().expect("fenced") > before,
        "{} after {before}",
        second.fencing_token().expect("fenced")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_held_leases_are_renewed_in_a_few_batched_requests() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let lease = Duration::from_millis(600);
    let mut guards = Vec::new();
    for i in 0..200 {
        guards.push(
            client
                .lock(format!("batch:{i}"))
                .lease(lease)
                .acquire()
                .await
                .expect("acquire"),
        );
    }
    let before = server.script_calls();
    let held_for = Duration::from_secs(2);
    tokio::time::sleep(held_for).await;
    let renewal_requests = server.script_calls() - before;
    assert!(guards.iter().all(|g| g.is_held()), "every lease was kept");
    // One renewal per lock per third of a lease would be 200 * 10 = 2000 requests.
    let unbatched = 200 * (held_for.as_millis() / (lease / 3).as_millis()) as u64;
    assert!(
        renewal_requests * 20 <= unbatched,
        "{renewal_requests} renewal requests for 200 locks (unbatched: {unbatched})"
    );
    for guard in guards {
        assert!(guard.release().await.expect("release"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_not_by_its_backoff() {
    let server = RedisServer::start();
    // A backoff so slow that only the release's announcement can explain a fast handoff.
    let slow = Config::from_url(&server.url())
        .expect("url")
        .backoff(Duration::from_secs(2), Duration::from_secs(2));
    let holder = client_for(&server);
    let waiter = Client::new(slow).expect("client");
    for round in 0..5 {
        // A lock per round: the subscription a round leaves behind (kept a while after its
        // last waiter) must not pass for this round's waiter's.
        let name = format!("handoff-{round}");
        let guard = holder.lock(&name).acquire().await.expect("acquire");
        let waiting = tokio::spawn({
            let (waiter, name) = (waiter.clone(), name.clone());
            async move {
                let guard = waiter
                    .lock(&name)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .expect("waiter acquires");
                (Instant::now(), guard)
            }
        });
        // The waiter subscribes once its first try is refused, then sleeps its 2 s backoff.
        let channel = format!("distlock:{{{name}}}:released");
        support::wait_until_async("the waiter subscribed", Duration::from_secs(10), || {
            let counts: Vec<redis::Value> = redis_cmd(&server, &["PUBSUB", "NUMSUB", &channel]);
            match counts.get(1) {
                Some(redis::Value::Int(count)) if *count >= 1 => Ok(()),
                other => Err(format!("{channel}: {other:?}")),
            }
        })
        .await;
        assert!(guard.release().await.expect("release"));
        let released = Instant::now();
        let (granted, next) = waiting.await.expect("task");
        let handoff = granted.saturating_duration_since(released);
        assert!(
            handoff < Duration::from_millis(500),
            "round {round}: the waiter took {handoff:?} after the release"
        );
        assert!(next.release().await.expect("release"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter_of_a_client_not_all_of_them() {
    let server = RedisServer::start();
    let slow = Config::from_url(&server.url())
        .expect("url")
        .backoff(Duration::from_secs(3), Duration::from_secs(3));
    let holder = client_for(&server);
    let waiters = Client::new(slow).expect("client");
    let guard = holder.lock("herd").acquire().await.expect("acquire");
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let waiters = waiters.clone();
            tokio::spawn(async move {
                let guard = waiters
                    .lock("herd")
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .expect("acquire");
                guard.release().await.expect("release");
            })
        })
        .collect();
    // All 20 have tried once and sleep on their 3 s backoff.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = server.script_calls();
    assert!(guard.release().await.expect("release"));
    // Each release wakes one waiter, which takes the lock and releases it, waking the next:
    // 20 handoffs in a chain, far faster than one backoff step.
    let started = Instant::now();
    for task in tasks {
        task.await.expect("task");
    }
    let took = started.elapsed();
    let calls = server.script_calls() - before;
    assert!(took < Duration::from_secs(2), "20 handoffs took {took:?}");
    // 20 acquires + 20 releases, plus a few wasted tries; waking all 20 on every release
    // would be hundreds.
    assert!(calls < 80, "{calls} script calls for 20 handoffs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_channel_permissions_still_releases_and_waits() {
    let server = RedisServer::start();
    // Redis 7 gives new ACL users no channel permissions: PUBLISH and SUBSCRIBE are refused.
    let () = redis_cmd(
        &server,
        &["ACL", "SETUSER", "locker", "on", ">pw", "~*", "+@all"],
    );
    let url = format!("redis://locker:pw@127.0.0.1:{}", server.port());
    let config = Config::from_url(&url)
        .expect("url")
        .backoff(Duration::from_millis(5), Duration::from_millis(50));
    let holder = Client::new(config.clone()).expect("client");
    let waiter = Client::new(config).expect("client");
    for _ in 0..20 {
        let guard = holder.lock("acl").acquire().await.expect("acquire");
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                waiter
                    .lock("acl")
                    .wait(Duration::from_secs(5))
                    .acquire()
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(guard.release().await.expect("the release itself succeeds"));
        let next = waiting
            .await
            .expect("task")
            .expect("the waiter gets it by backoff");
        assert!(next.release().await.expect("release"));
    }
    // Refused subscriptions must not leave pub/sub connections behind.
    let clients: String = redis_cmd(&server, &["CLIENT", "LIST"]);
    let connections = clients.lines().count();
    assert!(connections <= 6, "{connections} connections:\n{clients}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_waits_on_many_keys_leave_no_subscription_behind() {
    let server = RedisServer::start();
    let holder = client_for(&server);
    let waiter = client_for(&server);
    // Warm the waiter's pub/sub connection, so SUBSCRIBEs really go out below.
    let warm = holder.lock("brief:warm").acquire().await.expect("acquire");
    let result = waiter
        .lock("brief:warm")
        .wait(Duration::from_millis(200))
        .acquire()
        .await;
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{result:?}"
    );
    assert!(warm.release().await.expect("release"));
    for i in 0..1000 {
        let key = format!("brief:{i}");
        let guard = holder.lock(key.as_str()).acquire().await.expect("acquire");
        // A wait so short that it usually ends while the subscription is under way.
        let result = waiter
            .lock(key.as_str())
            .wait(Duration::from_millis(1))
            .acquire()
            .await;
        assert!(
            matches!(result, Err(LockError::Timeout { .. })),
            "{result:?}"
        );
        assert!(guard.release().await.expect("release"));
    }
    let started = Instant::now();
    loop {
        let channels: Vec<String> = redis_cmd(&server, &["PUBSUB", "CHANNELS"]);
        if channels.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{} channels still subscribed: {channels:?}",
            channels.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_replayed_acquire_restarts_the_lease_and_takes_a_fresh_token() {
    // The same try sent twice (its first reply lost, the request repeated on a new
    // connection): the second run must not hand out what is left of the first grant.
    let server = RedisServer::start();
    // The script as the runtime loads it: after the shared lock_key.lua.
    let script = redis::Script::new(&format!(
        "{}\n{}",
        include_str!("../../lock-runtime/scripts/lock_key.lua"),
        include_str!("../../lock-runtime/scripts/write/acquire.lua")
    ));
    // An owner token as the runtime makes one (32 hex digits, ms, holder record).
    let owner = format!("{:032x}:1:replay", 7);
    let mut redis = server.connection();
    let mut run = || -> (i64, i64) {
        script
            .key("distlock:{replay}")
            .arg(&owner)
            .arg(1_000)
            .arg("clock")
            .arg(500)
            .arg(0)
            .arg("distlock:{replay}:writer-waiting")
            .invoke(&mut redis)
            .expect("acquire script")
    };
    let (granted, first_token) = run();
    assert_eq!(granted, 1);
    // Let a good part of the lease pass before the replay arrives.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (granted, second_token) = run();
    assert_eq!(
        granted, 1,
        "the replay is granted: the owner already holds the lock"
    );
    assert!(
        second_token > first_token,
        "a replay hands out a fresh token ({second_token} after {first_token})"
    );
    let pttl: i64 = redis_cmd(&server, &["PTTL", "distlock:{replay}"]);
    assert!(
        pttl > 900,
        "the replay restarts the lease; {pttl} ms were left"
    );
}

// ACL users that lack a command of the documented list (docs/keys-and-acls.md; the documented
// user itself, per deployment, is `acl.rs`'s).

/// Makes `name` an ACL user with the documented commands but those in `without`, on the default
/// key prefix's keys and channels; returns its URL.
fn documented_user(server: &RedisServer, name: &str, without: &[&str]) -> String {
    let rules = support::acl::documented_rules(support::acl::Deployment::Single, without);
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg(name).arg(&rules);
    let () = setuser
        .query(&mut server.connection())
        .unwrap_or_else(|err| panic!("ACL SETUSER {name} {rules:?}: {err}"));
    format!("redis://{name}:pw@127.0.0.1:{}", server.port())
}

/// What the server's ACL refused since the last `ACL LOG RESET`: `(command or key, reason)`.
fn acl_denials(server: &RedisServer) -> Vec<(String, String)> {
    let entries: Vec<std::collections::HashMap<String, redis::Value>> =
        redis_cmd(server, &["ACL", "LOG"]);
    let text = |entry: &std::collections::HashMap<String, redis::Value>, field: &str| {
        entry
            .get(field)
            .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
            .unwrap_or_default()
    };
    entries
        .iter()
        .map(|entry| (text(entry, "object"), text(entry, "reason")))
        .collect()
}

/// A client as `url`'s user, with short backoff and timeouts.
fn acl_client(url: &str) -> Client {
    let config = Config::from_url(url)
        .expect("url")
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .response_timeout(Duration::from_secs(2));
    Client::new(config).expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_multi_or_exec_locks_with_the_script_and_no_set_runs_alone() {
    let panics = support::panics::redis_crate_panics();
    for refused in ["MULTI", "EXEC"] {
        let server = RedisServer::start();
        let url = documented_user(&server, "no-transactions", &[refused]);
        let (a, b) = (acl_client(&url), acl_client(&url));
        for round in 0..3 {
            let guard = a
                .lock("t")
                .acquire()
                .await
                .unwrap_or_else(|err| panic!("without {refused}, round {round}: {err}"));
            assert!(guard.fencing_token().is_some());
            let exists: i64 = redis_cmd(&server, &["EXISTS", "distlock:{t}"]);
            assert_eq!(exists, 1, "without {refused}: held while the guard lives");
            let other = b.lock("t").wait(Duration::ZERO).acquire().await;
            assert!(
                matches!(other, Err(LockError::Timeout { .. })),
                "without {refused}: {other:?}"
            );
            assert!(guard.release().await.expect("release"));
            let exists: i64 = redis_cmd(&server, &["EXISTS", "distlock:{t}"]);
            assert_eq!(exists, 0, "without {refused}: freed by the release");
        }
        // No transaction was ever begun: no `SET` ran outside one.
        assert_eq!(server.command_calls(&["multi"]), 0, "without {refused}");
        let denied = acl_denials(&server);
        assert!(
            denied
                .iter()
                .all(|(object, _)| object == &refused.to_ascii_lowercase()),
            "without {refused}, the ACL refused {denied:?}"
        );
    }
    assert_eq!(
        support::panics::redis_crate_panics(),
        panics,
        "the redis crate panicked"
    );
}

#[tokio::test]
async fn a_refused_command_is_a_server_error_that_names_it_and_the_acl() {
    let panics = support::panics::redis_crate_panics();
    let server = RedisServer::start();
    let url = documented_user(&server, "no-evalsha", &["EVALSHA"]);
    let client = acl_client(&url);
    let err = client
        .read_lock("r")
        .acquire()
        .await
        .expect_err("EVALSHA is refused");
    let LockError::Backend(backend) = &err else {
        panic!("a backend error: {err:?}");
    };
    assert_eq!(backend.kind(), BackendErrorKind::Server, "{err}");
    let message = err.to_string();
    assert!(message.contains("`EVALSHA`"), "{message}");
    assert!(message.contains("ACL SETUSER <user> +evalsha"), "{message}");
    let exists: i64 = redis_cmd(&server, &["EXISTS", "distlock:{r}"]);
    assert_eq!(exists, 0, "nothing granted");
    assert_eq!(
        support::panics::redis_crate_panics(),
        panics,
        "the redis crate panicked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_that_loses_multi_while_connected_goes_on_locking_with_the_script() {
    let panics = support::panics::redis_crate_panics();
    let server = RedisServer::start();
    let url = documented_user(&server, "revoked", &[]);
    let client = acl_client(&url);
    let guard = client.lock("t").acquire().await.expect("acquire");
    assert!(guard.release().await.expect("release"));
    let transactions = server.command_calls(&["multi"]);
    assert!(transactions >= 2, "the probe's and the first try's MULTI");
    // The operator takes MULTI away and closes the user's connections: the client's first try
    // was picked as a transaction, and meets a connection that may not send one.
    let () = redis_cmd(&server, &["ACL", "SETUSER", "revoked", "-multi"]);
    let _: i64 = redis_cmd(&server, &["CLIENT", "KILL", "USER", "revoked"]);
    for round in 0..3 {
        let guard = client
            .lock("t")
            .acquire()
            .await
            .unwrap_or_else(|err| panic!("round {round}: {err}"));
        let exists: i64 = redis_cmd(&server, &["EXISTS", "distlock:{t}"]);
        assert_eq!(exists, 1, "round {round}: held while the guard lives");
        assert!(guard.release().await.expect("release"));
        let exists: i64 = redis_cmd(&server, &["EXISTS", "distlock:{t}"]);
        assert_eq!(exists, 0, "round {round}: freed by the release");
    }
    assert_eq!(
        server.command_calls(&["multi"]),
        transactions,
        "no MULTI ran after it was taken away"
    );
    assert_eq!(
        support::panics::redis_crate_panics(),
        panics,
        "the redis crate panicked"
    );
}
