//! distlock's metrics (feature `metrics`), read back from the text a Prometheus exporter
//! renders: acquire latency and wait histograms, timeouts, leases lost, locks held, renewals
//! and wake-ups, labelled by store, and an election's leader gauge and its changes by cause —
//! against a real `redis-server` and the in-process store.
//!
//! One recorder per process, so one test: the steps run in order and each reads the deltas
//! it caused.

mod support;

use std::time::Duration;

use distlock::{Client, Config, LockError};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use support::RedisServer;

/// The value of the sample `name` whose labels include all of `labels` (0 when absent).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            (metric == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

fn render(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    handle.render()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_exported_per_store() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder in this binary");
    let server = RedisServer::start();
    let client = Client::new(
        Config::from_url(&server.url())
            .expect("url")
            .backoff(Duration::from_millis(5), Duration::from_millis(50)),
    )
    .expect("client");
    let redis = [("store", "redis")];

    // A grant: one acquire, one lock held while the guard lives, renewals while held long.
    let guard = client
        .lock("m:held")
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .expect("a free lock");
    let text = render(&handle);
    assert_eq!(
        sample(
            &text,
            "distlock_locks_held",
            &[("store", "redis"), ("mode", "write")]
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "distlock_acquire_seconds_count",
            &[
                ("store", "redis"),
                ("mode", "write"),
                ("outcome", "acquired")
            ]
        ),
        1.0,
        "{text}"
    );
    assert!(text.contains("# HELP distlock_acquire_seconds"), "{text}");

    // A request that waits in vain: a timeout, with its wait recorded.
    let err = client
        .lock("m:held")
        .wait(Duration::from_millis(100))
        .acquire()
        .await
        .expect_err("held");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    // Held for three leases: the watchdog renews it.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(guard.release().await.expect("release"));
    let text = render(&handle);
    assert_eq!(
        sample(&text, "distlock_acquire_timeouts_total", &redis),
        1.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "distlock_wait_seconds_count",
            &[("store", "redis"), ("outcome", "timeout")]
        ),
        1.0,
        "{text}"
    );
    assert!(
        sample(&text, "distlock_renewals_total", &redis) >= 2.0,
        "{text}"
    );
    assert_eq!(sample(&text, "distlock_locks_held", &redis), 0.0, "{text}");
    assert_eq!(
        sample(
            &text,
            "distlock_hold_seconds_count",
            &[("store", "redis"), ("ended", "released")]
        ),
        1.0,
        "{text}"
    );

    // A waiter woken by the holder's release. Its backoff is a minute, so only the release's
    // wake-up can grant it within the test (a waiter that polled its way in, right after the
    // release, counted no wake-up: the count was racy).
    let holder = client.lock("m:wake").acquire().await.expect("free");
    let patient = Client::new(
        Config::from_url(&server.url())
            .expect("url")
            .backoff(Duration::from_secs(60), Duration::from_secs(60)),
    )
    .expect("client");
    let waiter = {
        let client = patient.clone();
        tokio::spawn(async move {
            client
                .lock("m:wake")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        })
    };
    // The waiter has been refused once when its writer-waiting mark is there.
    support::wait_until_async("the waiter to be refused", Duration::from_secs(5), || {
        let marked: bool = redis::cmd("EXISTS")
            .arg("distlock:{m:wake}:writer-waiting")
            .query(&mut server.connection())
            .map_err(|e| e.to_string())?;
        marked.then_some(()).ok_or_else(|| "no mark yet".to_owned())
    })
    .await;
    // And it listens for the release: a release published before its subscription is made
    // would reach nobody, and the waiter would get the lock by its backoff instead.
    support::wait_until_async("the waiter to subscribe", Duration::from_secs(5), || {
        let (_, listeners): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("distlock:{m:wake}:released")
            .query(&mut server.connection())
            .map_err(|e| e.to_string())?;
        (listeners > 0)
            .then_some(())
            .ok_or_else(|| "no subscriber yet".to_owned())
    })
    .await;
    holder.release().await.expect("release");
    let woken = waiter
        .await
        .expect("join")
        .expect("granted after the release");
    woken.release().await.expect("release");
    let text = render(&handle);
    assert!(
        sample(&text, "distlock_wakeups_total", &redis) >= 1.0,
        "{text}"
    );

    // A busy lock found by try_acquire: counted as busy, not as a timeout.
    let held = client.lock("m:busy").acquire().await.expect("free");
    let timeouts_before = sample(&render(&handle), "distlock_acquire_timeouts_total", &redis);
    assert!(client
        .lock("m:busy")
        .try_acquire()
        .await
        .expect("busy is no error")
        .is_none());
    let text = render(&handle);
    assert_eq!(
        sample(&text, "distlock_acquire_busy_total", &redis),
        1.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "distlock_acquire_timeouts_total", &redis),
        timeouts_before,
        "{text}"
    );
    held.release().await.expect("release");

    // A lease lost: the lock deleted behind the holder's back.
    let lost = client
        .lock("m:lost")
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .expect("free");
    let _: i64 = redis::cmd("DEL")
        .arg("distlock:{m:lost}")
        .query(&mut server.connection())
        .expect("DEL");
    tokio::time::timeout(Duration::from_secs(5), lost.lost())
        .await
        .expect("noticed within a lease");
    drop(lost);
    let text = render(&handle);
    assert_eq!(
        sample(&text, "distlock_leases_lost_total", &redis),
        1.0,
        "{text}"
    );

    // Leadership: `distlock_leader` is 1 while this process leads and 0 after; each change is
    // counted by its cause.
    let election = client
        .election("m:leader")
        .lease(Duration::from_millis(300));
    let leader = [("election", "m:leader")];
    let changes = |text: &str, cause: &str| {
        sample(
            text,
            "distlock_leadership_changes_total",
            &[("election", "m:leader"), ("cause", cause)],
        )
    };
    let leading = election.campaign().await.expect("leads");
    let text = render(&handle);
    assert_eq!(sample(&text, "distlock_leader", &leader), 1.0, "{text}");
    assert_eq!(changes(&text, "gained"), 1.0, "{text}");
    assert!(leading.resign().await.expect("resign"));
    let text = render(&handle);
    assert_eq!(sample(&text, "distlock_leader", &leader), 0.0, "{text}");
    assert_eq!(changes(&text, "resigned"), 1.0, "{text}");
    // Lost: the election's lock deleted behind the leader's back.
    let leading = election.campaign().await.expect("leads again");
    assert_eq!(sample(&render(&handle), "distlock_leader", &leader), 1.0);
    let _: i64 = redis::cmd("DEL")
        .arg("distlock:{m:leader}")
        .query(&mut server.connection())
        .expect("DEL");
    tokio::time::timeout(Duration::from_secs(5), leading.lost())
        .await
        .expect("noticed within a lease");
    // Counted when the lease is lost, before `lost()` completes.
    let text = render(&handle);
    assert_eq!(sample(&text, "distlock_leader", &leader), 0.0, "{text}");
    assert_eq!(changes(&text, "lost"), 1.0, "{text}");
    assert_eq!(changes(&text, "gained"), 2.0, "{text}");
    drop(leading);
    assert_eq!(
        changes(&render(&handle), "resigned"),
        1.0,
        "a lost leadership dropped is not also resigned"
    );
    assert!(text.contains("# HELP distlock_leader "), "{text}");

    // Another store has its own label.
    let memory = Client::new(Config::in_memory()).expect("client");
    let read = memory.read_lock("m:mem").acquire().await.expect("free");
    let text = render(&handle);
    assert_eq!(
        sample(
            &text,
            "distlock_locks_held",
            &[("store", "memory"), ("mode", "read")]
        ),
        1.0,
        "{text}"
    );
    read.release().await.expect("release");
}
