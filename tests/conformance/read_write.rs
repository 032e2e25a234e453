//! Read/write locks on a real `redis-server`, where the in-process store has no counterpart:
//! wake-ups on release (a write release wakes every waiting reader or one writer, the last
//! reader's release wakes a writer), lost replies and repeated scripts that must leave no
//! reader entry behind, the key layout, and fencing across a restart. The semantics shared by
//! every store are in `behaviour.rs`; a killed reader process is in `crash.rs`.

use std::time::{Duration, Instant};

use crate::support;
use crate::support::proxy::{Mode, Proxy};
use crate::support::RedisServer;
use distlock::{Client, Config, LockError};

/// A client that retries only every 10 s: a waiter that gets in sooner was woken.
fn slow_backoff_client(server: &RedisServer) -> Client {
    let config = Config::from_url(&server.url())
        .expect("url")
        .backoff(Duration::from_secs(10), Duration::from_secs(10));
    Client::new(config).expect("client")
}

fn client(server: &RedisServer) -> Client {
    Client::new(Config::from_url(&server.url()).expect("url")).expect("client")
}

fn redis_cmd<T: redis::FromRedisValue>(server: &RedisServer, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut server.connection()).expect("redis command")
}

/// Polls (bounded by `within`) until the lock `name` has no reader entry left.
async fn readers_vanish(server: &RedisServer, name: &str, within: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < within {
        if server.readers(name) == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_release_wakes_every_waiting_reader() {
    let server = RedisServer::start();
    let writer = client(&server)
        .write_lock("wake-readers")
        .acquire()
        .await
        .expect("write");
    // Six readers in two clients, each of which would retry only after up to 10 s.
    let clients = [slow_backoff_client(&server), slow_backoff_client(&server)];
    let mut waiting = Vec::new();
    for i in 0..6 {
        let client = clients[i % 2].clone();
        waiting.push(tokio::spawn(async move {
            let guard = client
                .read_lock("wake-readers")
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .expect("read");
            (Instant::now(), guard)
        }));
    }
    // Every reader has tried once and is waiting (subscribed) before the release.
    wait_for_subscribers(&server, "distlock:{wake-readers}:released", 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(writer.release().await.expect("release"));
    let released = Instant::now();
    let mut guards = Vec::new();
    for task in waiting {
        let (got_at, guard) = task.await.expect("reader task");
        let after = got_at - released;
        assert!(
            after < Duration::from_secs(2),
            "a reader got in {after:?} after the write release: not woken"
        );
        guards.push(guard);
    }
    for guard in guards {
        assert!(guard.release().await.expect("release"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_readers_release_wakes_a_waiting_writer() {
    let server = RedisServer::start();
    let readers_client = client(&server);
    let first = readers_client
        .read_lock("wake-writer")
        .acquire()
        .await
        .expect("read");
    let second = readers_client
        .read_lock("wake-writer")
        .acquire()
        .await
        .expect("read");
    let writers = slow_backoff_client(&server);
    let waiting = tokio::spawn(async move {
        let guard = writers
            .write_lock("wake-writer")
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .expect("write");
        (Instant::now(), guard)
    });
    wait_for_subscribers(&server, "distlock:{wake-writer}:released", 1).await;
    assert!(first.release().await.expect("release"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the writer got in beside a reader");
    assert!(second.release().await.expect("release"));
    let released = Instant::now();
    let (got_at, guard) = waiting.await.expect("writer task");
    let after = got_at - released;
    assert!(
        after < Duration::from_secs(2),
        "the writer got in {after:?} after the last reader left: not woken"
    );
    assert!(guard.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_release_with_a_writer_waiting_wakes_the_writer_first() {
    let server = RedisServer::start();
    let holder = client(&server)
        .write_lock("wake-one")
        .acquire()
        .await
        .expect("write");
    let writers = slow_backoff_client(&server);
    let writer = tokio::spawn(async move {
        let guard = writers
            .write_lock("wake-one")
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .expect("write");
        let at = Instant::now();
        guard.release().await.expect("release");
        at
    });
    wait_for_subscribers(&server, "distlock:{wake-one}:released", 1).await;
    // The writer marked itself waiting: no new reader enters, and the release names a writer.
    let reader = client(&server)
        .read_lock("wake-one")
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(reader, Err(LockError::Timeout { .. })),
        "{reader:?}"
    );
    assert!(holder.release().await.expect("release"));
    let released = Instant::now();
    let got_at = writer.await.expect("writer task");
    assert!(
        got_at - released < Duration::from_secs(2),
        "the waiting writer got in {:?} after the release: not woken",
        got_at - released
    );
}

/// Waits until `channel` has at least `n` subscribers (waiters of `n` clients).
async fn wait_for_subscribers(server: &RedisServer, channel: &str, n: i64) {
    support::wait_until_async("subscribers", Duration::from_secs(10), || {
        let counts: Vec<redis::Value> = redis_cmd(server, &["PUBSUB", "NUMSUB", channel]);
        let count = match counts.get(1) {
            Some(redis::Value::Int(count)) => *count,
            _ => 0,
        };
        (count >= n)
            .then_some(())
            .ok_or(format!("{count} of {channel}, expected {n}"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_grant_whose_reply_was_lost_leaves_no_reader_entry() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let config = Config::from_url(&proxy.url())
        .expect("url")
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300));
    let client = Client::new(config).expect("client");
    let warm = client.read_lock("warm").acquire().await.expect("warm up");
    assert!(warm.release().await.expect("release"));

    // The script runs, its reply is lost with the connection, and the retry cannot connect.
    let scripts_before = server.script_calls();
    proxy.set_mode(Mode::DropReplies);
    let result = client
        .read_lock("lost-reply")
        .lease(Duration::from_secs(30))
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(matches!(&result, Err(LockError::Backend(_))), "{result:?}");
    // The scenario under test: the read script ran on the server. Its entry is there now,
    // unless the give-back in the background (a script call too) has already run: a new
    // connection whose handshake needs no reply gets through the proxy.
    let (readers, scripts) = (
        server.readers("lost-reply"),
        server.script_calls() - scripts_before,
    );
    assert!(
        readers == 1 || (readers == 0 && scripts >= 2),
        "the read script did not run on the server: {readers} readers, {scripts} script calls"
    );
    proxy.set_mode(Mode::Pass);
    assert!(
        readers_vanish(&server, "lost-reply", Duration::from_secs(5)).await,
        "a reader entry nobody holds keeps writers out for its whole 30 s lease"
    );
    let writer = client
        .write_lock("lost-reply")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("no reader left behind");
    assert!(writer.release().await.expect("release"));
}

#[tokio::test]
async fn read_scripts_run_twice_leave_one_entry_and_release_once() {
    let server = RedisServer::start();
    // The scripts as the runtime loads them: after the shared lock_key.lua.
    let script = |body: &str| {
        redis::Script::new(&format!(
            "{}\n{body}",
            include_str!("../../lock-runtime/scripts/lock_key.lua")
        ))
    };
    let acquire = script(include_str!("../../lock-runtime/scripts/read/acquire.lua"));
    let release = script(include_str!("../../lock-runtime/scripts/read/release.lua"));
    // Owner tokens as the runtime makes them (32 hex digits, ms, holder record): a script
    // refuses a sorted set of anything else as someone else's data.
    let owner = |name: &str| format!("{:0>32}:1:{name}", u128::from(name.len() as u8));
    let (reader_a, reader_b) = (owner("reader-a"), owner("reader-bb"));
    let mut redis = server.connection();
    let mut grant = |owner: &str| -> (i64, i64) {
        acquire
            .key("distlock:{twice}")
            .arg(owner)
            .arg(10_000)
            .arg("distlock:{twice}:writer-waiting")
            .invoke(&mut redis)
            .expect("read acquire")
    };
    assert_eq!(grant(&reader_a).0, 1);
    assert_eq!(grant(&reader_a).0, 1, "a repeated try is granted again");
    assert_eq!(grant(&reader_b).0, 1);
    assert_eq!(
        server.readers("twice"),
        2,
        "one entry per reader, not per run"
    );
    let mut redis = server.connection();
    let mut leave = |owner: &str| -> i64 {
        release
            .key("distlock:{twice}")
            .arg(owner)
            .arg("PUBLISH")
            .arg("distlock:{twice}:writer-waiting")
            .arg("distlock:{twice}:released")
            .invoke(&mut redis)
            .expect("read release")
    };
    assert_eq!(leave(&reader_a), 1);
    assert_eq!(leave(&reader_a), 0, "a repeated release frees nothing more");
    assert_eq!(server.readers("twice"), 1, "reader-b is still in");
    assert_eq!(leave(&reader_b), 1);
    let exists: i64 = redis_cmd(&server, &["EXISTS", "distlock:{twice}"]);
    assert_eq!(exists, 0, "the lock key goes with its last reader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keys_of_a_read_write_lock_expire_and_are_documented() {
    let server = RedisServer::start();
    let client = client(&server);
    let reader = client
        .read_lock("layout")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .expect("read");
    let kind: String = redis_cmd(&server, &["TYPE", "distlock:{layout}"]);
    assert_eq!(
        kind, "zset",
        "while readers hold the lock, its key is their sorted set"
    );
    let pttl: i64 = redis_cmd(&server, &["PTTL", "distlock:{layout}"]);
    assert!(
        (1..=5_000).contains(&pttl),
        "the lock key expires with its readers' leases: PTTL {pttl}"
    );
    // A writer's try marks it waiting, for a short while.
    let writer = client
        .write_lock("layout")
        .wait(Duration::from_millis(50))
        .acquire()
        .await;
    assert!(
        matches!(writer, Err(LockError::Timeout { .. })),
        "{writer:?}"
    );
    let mark: i64 = redis_cmd(&server, &["PTTL", "distlock:{layout}:writer-waiting"]);
    assert!(
        (1..=1_000).contains(&mark) || mark == -2,
        "the writer-waiting mark lives briefly: PTTL {mark}"
    );
    assert!(reader.release().await.expect("release"));
    let layout = include_str!("../../docs/keys-and-acls.md");
    for suffix in ["sorted set", ":writer-waiting", ":fence", ":released"] {
        assert!(
            layout.contains(suffix),
            "the key layout (docs/keys-and-acls.md) lacks `{suffix}`"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_tokens_keep_increasing_across_a_restart_and_reads_carry_them() {
    let mut server = RedisServer::start();
    let url = server.url();
    let before = client(&server)
        .write_lock("restart")
        .acquire()
        .await
        .expect("write");
    let token = before.fencing_token().expect("fenced");
    assert!(before.release().await.expect("release"));
    // A Redis without persistence: everything is gone after the restart.
    server.restart();
    let client = Client::new(Config::from_url(&url).expect("url")).expect("client");
    let reader = client.read_lock("restart").acquire().await.expect("read");
    let read = reader.fencing_token().expect("fenced");
    assert!(
        read > token,
        "the counter is gone with the restart: a read carries the clock, above every earlier \
         write token ({read} after {token})"
    );
    assert!(reader.release().await.expect("release"));
    let after = client.write_lock("restart").acquire().await.expect("write");
    assert!(
        after.fencing_token().expect("fenced") > read,
        "{} after {token} and the read's {read} across a restart",
        after.fencing_token().expect("fenced")
    );
    let written = after.fencing_token().expect("fenced");
    assert!(after.release().await.expect("release"));
    let reader = client.read_lock("restart").acquire().await.expect("read");
    assert!(
        reader.fencing_token().expect("fenced") >= written,
        "a read carries a token at least the latest write token"
    );
    assert!(reader.release().await.expect("release"));
}
