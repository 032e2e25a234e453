//! Leader elections on every store (issue 27): a campaign leads with an epoch that the next
//! leader's exceeds; `leader()` names the leader (epoch, holder record, value) and nobody once
//! it resigned; a dropped leadership resigns; `observe()` yields each leader once, in epoch
//! order, and on the Redis stores is woken by the new leader's announcement (well within its
//! polling period); a record whose writer no longer holds the lock is not the leader; a record key
//! holding someone else's data is refused, not overwritten. A leader's `proclaim` (issue 37)
//! replaces its value at once, same epoch; observers see the values in order (woken by the
//! proclaim's announcement on the Redis stores); a deposed leader's proclaim fails and writes
//! nothing.

use std::time::Duration;

use crate::support::stores::Harness;
use distlock::LockError;
use tokio::time::Instant;

mod every_store {
    use super::*;

    crate::support::stores::on_every_store!(
        a_leader_is_named_with_its_epoch_and_value_until_it_resigns,
        a_dropped_leadership_hands_over,
        observers_see_each_leader_once_in_epoch_order,
        a_record_whose_writer_lost_the_lock_is_not_the_leader,
        a_bounded_campaign_times_out_while_another_leads,
        a_deposed_leader_learns_it_and_its_resignation_says_so,
        a_proclaimed_value_is_the_leaders_at_once_with_the_same_epoch,
        observers_see_each_proclaimed_value_in_order_and_never_an_older_one,
        a_deposed_leaders_proclaim_fails_and_writes_nothing,
    );
}

mod redis_stores {
    use super::*;

    crate::support::stores::on_every_redis_store!(
        a_foreign_record_key_is_refused_untouched,
        an_observer_is_woken_by_the_new_leaders_announcement,
        a_proclaim_behind_the_leaders_record_writes_nothing,
    );
}

/// The handles move into spawned tasks: `Election` is a cheap shared handle, `Leadership`
/// owns what it needs.
#[test]
fn elections_and_leaderships_are_send_sync_and_static() {
    fn shared<T: Clone + Send + Sync + 'static>() {}
    fn owned<T: Send + Sync + 'static>() {}
    shared::<distlock::Election>();
    owned::<distlock::Leadership>();
    owned::<distlock::LeaderInfo>();
    fn stream<T: futures_util::Stream<Item = distlock::LeaderInfo> + Send + 'static>() {}
    stream::<distlock::LeaderChanges>();
}

#[tokio::test]
async fn an_observer_with_an_impossible_lease_ends_and_stays_ended() {
    let client = distlock::Client::in_memory();
    let mut changes = client.election("never").lease(Duration::MAX).observe();
    assert!(
        changes.next().await.is_none(),
        "ended: the lease is refused"
    );
    assert!(changes.next().await.is_none(), "and stays ended");
}

/// A lease long enough that nothing in these tests waits for it: every handover is a
/// resignation, and observers' polling period (a third of it) is far longer than the test.
const LONG_LEASE: Duration = Duration::from_secs(30);

async fn a_leader_is_named_with_its_epoch_and_value_until_it_resigns(h: Harness) {
    let (a, b) = (h.app_client("alpha"), h.app_client("beta"));
    let first = a
        .election("scheduler")
        .lease(LONG_LEASE)
        .value("127.0.0.1:8080");
    let second = b
        .election("scheduler")
        .lease(LONG_LEASE)
        .value(vec![0xff, 0x00]);
    assert!(first.leader().await.expect("read").is_none(), "nobody yet");

    let leading = first.campaign().await.expect("leads");
    assert!(leading.is_leader());
    let leader = second.leader().await.expect("read").expect("a leader");
    assert_eq!(leader.epoch(), leading.epoch());
    assert_eq!(leader.value(), Some(&b"127.0.0.1:8080"[..]));
    assert_eq!(leader.holder().app.as_deref(), Some("alpha"));
    assert_eq!(leader.holder().pid, Some(std::process::id()));
    assert!(leader.since().is_some());
    let state = b.inspect("scheduler").await.expect("inspect");
    let shown = state.leader.expect("status shows the leader");
    assert_eq!(shown.epoch(), leader.epoch());
    assert_eq!(shown.holder().owner, leader.holder().owner);

    let waiting = tokio::spawn(async move { second.campaign().await });
    let epoch = leading.epoch();
    assert!(leading.resign().await.expect("resign"), "it was ours");
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting campaign leads at once")
        .expect("task")
        .expect("leads");
    assert!(next.epoch() > epoch, "{} after {}", next.epoch(), epoch);
    let leader = first.leader().await.expect("read").expect("a leader");
    assert_eq!(leader.epoch(), next.epoch());
    assert_eq!(leader.value(), Some(&[0xff, 0x00][..]));
    assert_eq!(leader.holder().app.as_deref(), Some("beta"));
    assert!(next.resign().await.expect("resign"));
    assert!(
        first.leader().await.expect("read").is_none(),
        "nobody leads"
    );
}

async fn a_dropped_leadership_hands_over(h: Harness) {
    let (a, b) = (h.client(), h.client());
    let leading = a
        .election("dropped")
        .lease(LONG_LEASE)
        .campaign()
        .await
        .expect("leads");
    let epoch = leading.epoch();
    let started = Instant::now();
    drop(leading);
    let next = b
        .election("dropped")
        .lease(LONG_LEASE)
        .wait(LONG_LEASE)
        .campaign()
        .await
        .expect("the next leads once the dropped one resigned");
    assert!(next.epoch() > epoch);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "handed over by the drop, not by the lease running out: {:?}",
        started.elapsed()
    );
}

async fn observers_see_each_leader_once_in_epoch_order(h: Harness) {
    let (a, b, watcher) = (h.client(), h.client(), h.client());
    let mut changes = watcher.election("observed").lease(LONG_LEASE).observe();
    let mut epochs = Vec::new();
    for (round, client) in [&a, &b, &a].into_iter().enumerate() {
        let leading = client
            .election("observed")
            .lease(LONG_LEASE)
            .value(format!("round {round}"))
            .campaign()
            .await
            .expect("leads");
        let seen = tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .expect("the new leader is seen")
            .expect("the stream goes on");
        assert_eq!(seen.epoch(), leading.epoch(), "round {round}");
        assert_eq!(seen.value(), Some(format!("round {round}").as_bytes()));
        epochs.push(seen.epoch());
        leading.resign().await.expect("resign");
    }
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "{epochs:?}");
    // Nothing more: no leader now, and the last one is not yielded twice.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), changes.next())
            .await
            .is_err(),
        "no change without a new leader"
    );
}

async fn a_record_whose_writer_lost_the_lock_is_not_the_leader(h: Harness) {
    let (a, operator) = (h.client(), h.client());
    let leading = a
        .election("deposed")
        .lease(LONG_LEASE)
        .campaign()
        .await
        .expect("leads");
    let forced = operator.force_unlock("deposed").await.expect("force");
    assert_eq!(forced.evicted.len(), 1);
    assert!(forced.token > leading.epoch());
    // Its record is still there, but it no longer holds the lock: no leader.
    assert!(operator
        .election("deposed")
        .leader()
        .await
        .expect("read")
        .is_none());
    // A plain lock of the name is no leader either.
    let plain = operator.lock("deposed").acquire().await.expect("lock");
    assert!(operator
        .election("deposed")
        .leader()
        .await
        .expect("read")
        .is_none());
    plain.release().await.expect("release");
    // The deposed leader learns it at its next renewal; its release changes nothing.
    drop(leading);
}

async fn a_deposed_leader_learns_it_and_its_resignation_says_so(h: Harness) {
    let (a, operator) = (h.client(), h.client());
    let lease = Duration::from_millis(900);
    let leading = a
        .election("ousted")
        .lease(lease)
        .campaign()
        .await
        .expect("leads");
    operator.force_unlock("ousted").await.expect("force");
    tokio::time::timeout(lease * 3, leading.lost())
        .await
        .expect("lost() completes at the next renewal, a third of the lease later");
    assert!(!leading.is_leader());
    assert!(
        !leading.resign().await.expect("resign"),
        "it was no longer ours"
    );
}

async fn a_bounded_campaign_times_out_while_another_leads(h: Harness) {
    let (a, b) = (h.client(), h.client());
    let _leading = a
        .election("busy")
        .lease(LONG_LEASE)
        .campaign()
        .await
        .expect("leads");
    let started = Instant::now();
    let err = b
        .election("busy")
        .wait(Duration::from_millis(200))
        .campaign()
        .await
        .expect_err("someone else leads");
    assert!(
        matches!(err, LockError::Timeout { ref key, waited } if key == "busy" && waited >= Duration::from_millis(200)),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

async fn a_foreign_record_key_is_refused_untouched(h: Harness) {
    let client = h.client();
    let record = format!("{}:leader", h.lock_key("taken"));
    h.raw(redis::cmd("SET").arg(&record).arg("someone else's"));
    let err = client
        .election("taken")
        .wait(Duration::from_secs(1))
        .campaign()
        .await
        .expect_err("the record key holds something else");
    assert!(
        matches!(err, LockError::NotALock { ref redis_key, .. } if *redis_key == record),
        "{err:?}"
    );
    for reply in h.raw(redis::cmd("GET").arg(&record)) {
        assert_eq!(
            reply,
            redis::Value::BulkString(b"someone else's".to_vec()),
            "untouched"
        );
    }
    assert!(
        !client.is_locked("taken").await.expect("inspect"),
        "the lock was given back"
    );
}

/// The lock freed behind the store's back (as by an expiry: nothing is announced), the next
/// leader's announcement is what wakes the observer: without it (its `PUBLISH` taken out of
/// `proclaim.lua`) the observer sees the new leader only at its next read, a third of the
/// lease later, and this fails.
async fn an_observer_is_woken_by_the_new_leaders_announcement(h: Harness) {
    let (a, b, watcher) = (h.client(), h.client(), h.client());
    let first = a
        .election("woken")
        .lease(LONG_LEASE)
        .campaign()
        .await
        .expect("leads");
    let mut changes = watcher.election("woken").lease(LONG_LEASE).observe();
    let seen = changes.next().await.expect("the first leader");
    assert_eq!(seen.epoch(), first.epoch());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let observer = tokio::spawn(async move {
        while let Some(change) = changes.next().await {
            let _ = tx.send(change);
        }
    });
    // The observer listens once its client has subscribed to the lock's channel.
    let started = Instant::now();
    while watcher
        .inspect("woken")
        .await
        .expect("inspect")
        .waiting_processes
        == 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    h.raw(redis::cmd("DEL").arg(h.lock_key("woken")));
    let second = b
        .election("woken")
        .lease(LONG_LEASE)
        .campaign()
        .await
        .expect("leads");
    let seen = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("woken by the announcement, not by its polling a third of the lease later")
        .expect("the observer goes on");
    assert_eq!(seen.epoch(), second.epoch());
    observer.abort();
    drop(first);
}

async fn a_proclaimed_value_is_the_leaders_at_once_with_the_same_epoch(h: Harness) {
    let (a, b) = (h.app_client("alpha"), h.app_client("beta"));
    let election = a
        .election("proclaimed")
        .lease(LONG_LEASE)
        .value("10.0.0.7:8080");
    let reader = b.election("proclaimed").lease(LONG_LEASE);
    let leading = election.campaign().await.expect("leads");
    for value in ["10.0.0.7:9090", "", "10.0.0.7:7070"] {
        leading.proclaim(value).await.expect("proclaim");
        let leader = reader.leader().await.expect("read").expect("a leader");
        assert_eq!(leader.epoch(), leading.epoch(), "leadership kept");
        assert_eq!(leader.value(), Some(value.as_bytes()));
        assert_eq!(leader.holder().app.as_deref(), Some("alpha"));
        let shown = b.inspect("proclaimed").await.expect("inspect").leader;
        assert_eq!(
            shown.and_then(|l| l.value().map(<[u8]>::to_vec)),
            Some(value.into())
        );
    }
    assert!(leading.is_leader());
    let bytes = vec![0u8, 0xff, b'\n', 0x80];
    leading.proclaim(bytes.clone()).await.expect("any bytes");
    let leader = reader.leader().await.expect("read").expect("a leader");
    assert_eq!(leader.value(), Some(&bytes[..]));

    // The next leader's record (its campaign's) replaces one of many proclaims.
    let next = tokio::spawn({
        let next = b.election("proclaimed").lease(LONG_LEASE).value("beta's");
        async move { next.campaign().await }
    });
    let epoch = leading.epoch();
    assert!(leading.resign().await.expect("resign"));
    let next = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the waiting campaign leads at once")
        .expect("task")
        .expect("leads");
    let leader = election.leader().await.expect("read").expect("a leader");
    assert!(leader.epoch() > epoch);
    assert_eq!(leader.epoch(), next.epoch());
    assert_eq!(leader.value(), Some(&b"beta's"[..]));
    next.proclaim("beta's second").await.expect("proclaim");
    let leader = election.leader().await.expect("read").expect("a leader");
    assert_eq!(leader.value(), Some(&b"beta's second"[..]));
    assert!(next.resign().await.expect("resign"));
}

async fn observers_see_each_proclaimed_value_in_order_and_never_an_older_one(h: Harness) {
    let (a, watcher) = (h.client(), h.client());
    let leading = a
        .election("announced")
        .lease(LONG_LEASE)
        .value("v0")
        .campaign()
        .await
        .expect("leads");
    // With a 30 s lease the observers' own reads are 10 s apart: on the Redis stores, only
    // the proclaim's announcement makes them see a value within the 5 s below.
    let mut changes = watcher.election("announced").lease(LONG_LEASE).observe();
    let seen = changes.next().await.expect("the leader");
    assert_eq!(seen.value(), Some(&b"v0"[..]));
    for round in 1..=3 {
        let value = format!("v{round}");
        leading.proclaim(value.clone()).await.expect("proclaim");
        let seen = tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .expect("the new value is seen")
            .expect("the stream goes on");
        assert_eq!(seen.epoch(), leading.epoch(), "the same leader");
        assert_eq!(seen.value(), Some(value.as_bytes()), "round {round}");
    }

    // Back to back: the observer may skip values, never goes back, and ends on the last.
    let burst: Vec<String> = (0..20).map(|i| format!("burst {i}")).collect();
    for value in &burst {
        leading.proclaim(value.clone()).await.expect("proclaim");
    }
    let mut seen_at = Vec::new();
    while seen_at.last() != Some(&(burst.len() - 1)) {
        let seen = tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .expect("the last value is seen")
            .expect("the stream goes on");
        assert_eq!(seen.epoch(), leading.epoch());
        let value = seen.value().expect("a value");
        let at = burst
            .iter()
            .position(|v| v.as_bytes() == value)
            .unwrap_or_else(|| panic!("an earlier value: {:?}", String::from_utf8_lossy(value)));
        seen_at.push(at);
    }
    assert!(
        seen_at.windows(2).all(|w| w[0] < w[1]),
        "in order: {seen_at:?}"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), changes.next())
            .await
            .is_err(),
        "no change without a new value"
    );

    // Concurrent proclaims: whichever lands, the record ends on one of them and the observer
    // sees it.
    let (x, y) = tokio::join!(leading.proclaim("x"), leading.proclaim("y"));
    x.expect("proclaim x");
    y.expect("proclaim y");
    let last = a
        .election("announced")
        .leader()
        .await
        .expect("read")
        .expect("a leader");
    assert!(matches!(last.value(), Some(b"x" | b"y")), "{last:?}");
    let seen = loop {
        let seen = tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .expect("the concurrent values are seen")
            .expect("the stream goes on");
        if seen.value() == last.value() {
            break seen;
        }
    };
    assert_eq!(seen.epoch(), leading.epoch());
    leading.resign().await.expect("resign");
}

async fn a_deposed_leaders_proclaim_fails_and_writes_nothing(h: Harness) {
    let (a, b, operator) = (h.client(), h.client(), h.client());
    let leading = a
        .election("overthrown")
        .lease(LONG_LEASE)
        .value("first")
        .campaign()
        .await
        .expect("leads");
    operator.force_unlock("overthrown").await.expect("force");

    // Nobody leads: the deposed leader's record stays as it was, and names nobody.
    let err = leading.proclaim("late").await.expect_err("deposed");
    assert!(
        matches!(err, LockError::LeadershipLost { ref election, epoch }
            if election == "overthrown" && epoch == leading.epoch().get()),
        "{err:?}"
    );
    assert!(err.to_string().contains("no longer leads"), "{err}");
    assert!(!err.is_transient());
    let record = format!("{}:leader", h.lock_key("overthrown"));
    for reply in h.raw(redis::cmd("HGET").arg(&record).arg("value")) {
        assert_eq!(
            reply,
            redis::Value::BulkString(b"first".to_vec()),
            "untouched"
        );
    }
    assert!(operator
        .election("overthrown")
        .leader()
        .await
        .expect("read")
        .is_none());

    // Another leads: its value stands.
    let next = b
        .election("overthrown")
        .lease(LONG_LEASE)
        .value("second")
        .wait(Duration::from_secs(5))
        .campaign()
        .await
        .expect("leads");
    let err = leading.proclaim("later").await.expect_err("deposed");
    assert!(matches!(err, LockError::LeadershipLost { .. }), "{err:?}");
    let leader = operator
        .election("overthrown")
        .leader()
        .await
        .expect("read")
        .expect("a leader");
    assert_eq!(leader.epoch(), next.epoch());
    assert_eq!(leader.value(), Some(&b"second"[..]));
    for reply in h.raw(redis::cmd("HGET").arg(&record).arg("value")) {
        assert_eq!(
            reply,
            redis::Value::BulkString(b"second".to_vec()),
            "untouched"
        );
    }
    assert!(!leading.resign().await.expect("resign"), "no longer ours");
    assert!(next.resign().await.expect("resign"));
}

/// Two proclaims that crossed on their way (the later one written first): the earlier one
/// finds a later revision of the same leader's record and writes nothing, so the later value
/// stands. Made here by raising the record's revision behind the leader's back.
async fn a_proclaim_behind_the_leaders_record_writes_nothing(h: Harness) {
    let client = h.client();
    let election = client.election("crossed").lease(LONG_LEASE).value("v0");
    let leading = election.campaign().await.expect("leads");
    let record = format!("{}:leader", h.lock_key("crossed"));
    h.raw(
        redis::cmd("HSET")
            .arg(&record)
            .arg("value")
            .arg("later")
            .arg("revision")
            .arg(1000),
    );
    leading
        .proclaim("earlier")
        .await
        .expect("a later value of this leader stands: no error");
    let leader = election.leader().await.expect("read").expect("a leader");
    assert_eq!(leader.value(), Some(&b"later"[..]));
    assert!(leading.resign().await.expect("resign"));
}
