//! What an operator sees through `tracing`: every span and event under the target `distlock`
//! (so `RUST_LOG=distlock=debug` shows them), an `acquire` span per request with its
//! attempts, wait, token and outcome, a `hold` span per grant with how long it was held, its
//! renewals and how it ended, the attribute's body running inside that `hold` span, and events
//! for timeouts, lost leases and Redlock quorum failures, a skipped job at INFO, and a release
//! within `hold_at_least` logged as "kept", not "released" — against real `redis-server`s.

use std::time::Duration;

use crate::support::capture::{self, Captured, Record};
use crate::support::masters::start_masters;
use crate::support::{wait_until_async, RedisServer};
use distlock::{Client, Config, LockError};

fn redis(server: &RedisServer) -> Client {
    Client::new(
        Config::from_url(&server.url())
            .expect("url")
            .backoff(Duration::from_millis(5), Duration::from_millis(20)),
    )
    .expect("client")
}

fn spans<'a>(records: &'a [Record], name: &str) -> Vec<&'a Record> {
    records
        .iter()
        .filter(|record| record.kind == "span" && record.name == name)
        .collect()
}

fn events<'a>(records: &'a [Record], message: &str) -> Vec<&'a Record> {
    records
        .iter()
        .filter(|record| record.kind == "event" && record.name.contains(message))
        .collect()
}

/// Waits until the span `name` of `key` has closed (its last handle dropped), and returns it.
async fn closed_span(captured: &Captured, key: &str, name: &str) -> Record {
    wait_until_async("the span to close", Duration::from_secs(10), || {
        spans(&captured.about("key", key), name)
            .first()
            .map(|record| (*record).clone())
            .ok_or_else(|| format!("no closed `{name}` span for {key}"))
    })
    .await
}

fn number(record: &Record, field: &str) -> u64 {
    record
        .field(field)
        .unwrap_or_else(|| panic!("no field `{field}` in {record:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("field `{field}` is not a number in {record:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_and_its_hold_are_spans_under_the_distlock_target() {
    let captured = capture::install();
    let server = RedisServer::start();
    let client = redis(&server);
    let key = "obs:acquire-and-hold";

    let guard = client
        .lock(key)
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .expect("a free lock");
    let token = guard.fencing_token().expect("fenced").get();
    // Held for three leases: the watchdog renews it about every 100 ms.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(guard.release().await.expect("release"));

    let acquire = closed_span(&captured, key, "acquire").await;
    assert_eq!(acquire.target, "distlock");
    assert_eq!(acquire.level, tracing::Level::DEBUG);
    assert_eq!(acquire.field("mode"), Some("write"));
    assert_eq!(acquire.field("store"), Some("redis"));
    assert_eq!(acquire.field("outcome"), Some("acquired"));
    assert_eq!(number(&acquire, "attempts"), 1);
    assert_eq!(number(&acquire, "token"), token);

    let hold = closed_span(&captured, key, "hold").await;
    assert_eq!(hold.target, "distlock");
    assert_eq!(hold.field("ended"), Some("released"));
    assert_eq!(number(&hold, "token"), token);
    assert_eq!(number(&hold, "lease_ms"), 300);
    assert!(number(&hold, "held_ms") >= 900, "{hold:?}");
    assert!(number(&hold, "renewals") >= 2, "{hold:?}");

    let records = captured.about("key", key);
    let acquired = events(&records, "lock acquired");
    assert_eq!(acquired.len(), 1, "{records:#?}");
    assert_eq!(
        acquired[0].parent.as_ref().map(|p| p.0.as_str()),
        Some("acquire")
    );
    assert!(
        records.iter().all(|record| record.target == "distlock"),
        "every record about the lock has the target `distlock`: {records:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_in_vain_records_its_attempts_and_an_info_event() {
    let captured = capture::install();
    let server = RedisServer::start();
    let client = redis(&server);
    let key = "obs:timeout";

    let holder = client.lock(key).acquire().await.expect("a free lock");
    let err = client
        .lock(key)
        .wait(Duration::from_millis(200))
        .acquire()
        .await
        .expect_err("held elsewhere");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    holder.release().await.expect("release");

    let records = captured.about("key", key);
    let acquires: Vec<_> = spans(&records, "acquire")
        .into_iter()
        .filter(|span| span.field("outcome") == Some("timeout"))
        .collect();
    assert_eq!(acquires.len(), 1, "{records:#?}");
    assert!(number(acquires[0], "attempts") >= 2, "{:?}", acquires[0]);
    assert!(number(acquires[0], "waited_ms") >= 200, "{:?}", acquires[0]);
    let timeouts = events(&records, "timed out waiting for the lock");
    assert_eq!(timeouts.len(), 1, "{records:#?}");
    assert_eq!(timeouts[0].level, tracing::Level::INFO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_a_warning_inside_its_hold_span() {
    let captured = capture::install();
    let server = RedisServer::start();
    let client = redis(&server);
    let key = "obs:lost";

    let guard = client
        .lock(key)
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .expect("a free lock");
    // Someone deletes the lock behind the holder's back: its next renewal finds it gone.
    let _: i64 = redis::cmd("DEL")
        .arg(format!("distlock:{{{key}}}"))
        .query(&mut server.connection())
        .expect("DEL");
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the watchdog notices within a lease");
    let _ = guard.release().await;

    let records = captured.about("key", key);
    let lost = events(&records, "lease lost");
    assert_eq!(lost.len(), 1, "{records:#?}");
    assert_eq!(lost[0].level, tracing::Level::WARN);
    assert_eq!(lost[0].parent.as_ref().map(|p| p.0.as_str()), Some("hold"));
    let hold = closed_span(&captured, key, "hold").await;
    assert_eq!(hold.field("ended"), Some("lost"), "{hold:?}");
}

#[distlock::distributed_lock(key = "obs:attribute:{n}", lease = "5s")]
async fn annotated(n: u32) -> Result<(), LockError> {
    tracing::info!(target: "app", n, "work under the lock");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_body_runs_inside_the_hold_span() {
    let captured = capture::install();
    let server = RedisServer::start();
    distlock::init(Config::from_url(&server.url()).expect("url")).expect("the only init here");
    annotated(7).await.expect("a free lock");

    let records = captured.records();
    let work: Vec<_> = events(&records, "work under the lock");
    assert_eq!(work.len(), 1, "{records:#?}");
    let (parent, fields) = work[0].parent.clone().expect("in a span");
    assert_eq!(parent, "hold");
    assert_eq!(
        fields.get("key").map(String::as_str),
        Some("obs:attribute:7")
    );
    assert_eq!(work[0].target, "app");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_quorum_failure_is_a_warning() {
    let captured = capture::install();
    let mut masters = start_masters(3);
    let client = Client::new(
        Config::redlock(masters.iter().map(RedisServer::url))
            .expect("urls")
            .node_timeout(Duration::from_millis(200)),
    )
    .expect("client");
    masters[1].stop();
    masters[2].stop();
    let key = "obs:quorum";
    let err = client
        .lock(key)
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect_err("one master of three is no majority");
    assert!(
        matches!(err, LockError::QuorumUnavailable { .. }),
        "{err:?}"
    );

    let records = captured.about("key", key);
    let warnings = events(&records, "quorum unavailable");
    assert!(!warnings.is_empty(), "{records:#?}");
    assert_eq!(warnings[0].level, tracing::Level::WARN);
    assert_eq!(warnings[0].field("needed"), Some("2"));
    let acquire = spans(&records, "acquire");
    assert_eq!(
        acquire.first().and_then(|s| s.field("outcome")),
        Some("error")
    );
    assert_eq!(
        acquire.first().and_then(|s| s.field("store")),
        Some("redlock")
    );
}

/// A client says at INFO which Redis it locks on, without credentials: a configuration that
/// fell back to the default address shows in the log (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_logs_the_servers_it_uses_without_the_password() {
    let captured = capture::install();
    let server = RedisServer::start();
    let address = format!("127.0.0.1:{}", server.port());
    let url = format!("redis://:created-SECRET@{address}");
    let _client = Client::new(Config::from_url(&url).expect("url")).expect("client");
    let created: Vec<Record> = captured
        .records()
        .into_iter()
        .filter(|record| {
            record.kind == "event"
                && record.name == "distlock client created"
                && record
                    .field("servers")
                    .is_some_and(|servers| servers.starts_with(&address))
        })
        .collect();
    assert_eq!(created.len(), 1, "{:#?}", captured.records());
    assert_eq!(created[0].level, tracing::Level::INFO);
    assert_eq!(created[0].field("store"), Some("redis"));
    assert!(!format!("{created:?}").contains("SECRET"));
}

/// A call of a run-once job skipped because another process holds its lock, as an operator
/// reading INFO sees it (issue 37): no DEBUG subscriber needed.
#[distlock::distributed_lock(key = "obs:job:{name}", client = client, on_busy = "skip")]
async fn run_once(client: &Client, name: &str) -> Result<(), LockError> {
    let _ = name;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_job_is_an_info_event() {
    let captured = capture::install();
    let server = RedisServer::start();
    let client = redis(&server);
    let key = "obs:job:nightly";
    let elsewhere = client.lock(key).acquire().await.expect("a free lock");
    run_once(&client, "nightly")
        .await
        .expect("skipped, no error");
    elsewhere.release().await.expect("release");

    let records = captured.about("key", key);
    let skipped = events(&records, "job skipped: the lock is held elsewhere");
    assert_eq!(skipped.len(), 1, "{records:#?}");
    assert_eq!(skipped[0].level, tracing::Level::INFO);
}

/// A release within `hold_at_least` keeps the lock to the end of the window: the log says
/// "kept until …", never "released" (issue 37), and the hold span's `ended` is `kept`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_within_hold_at_least_is_logged_as_kept_not_released() {
    let captured = capture::install();
    let server = RedisServer::start();
    let client = redis(&server);
    let key = "obs:kept";
    let guard = client
        .lock(key)
        .hold_at_least(Duration::from_secs(5))
        .acquire()
        .await
        .expect("a free lock");
    assert!(guard.release().await.expect("release"));
    assert!(client.is_locked(key).await.expect("read"), "kept");

    let hold = closed_span(&captured, key, "hold").await;
    assert_eq!(hold.field("ended"), Some("kept"), "{hold:?}");
    let records = captured.about("key", key);
    let kept = events(&records, "lock kept until its hold_at_least window ends");
    assert_eq!(kept.len(), 1, "{records:#?}");
    assert!(number(kept[0], "kept_ms") > 4_000, "{:?}", kept[0]);
    assert!(
        events(&records, "released").is_empty(),
        "nothing says released while the lock is kept: {records:#?}"
    );
}
