//! Leadership an operator can see, on every store (issue 37): an observer turned into
//! `LeaderStates` (`observe().with_vacancies()`) yields `None` when nobody leads — at its start,
//! and after each leader resigned — and each new leader once, while the plain `observe()`
//! stream still yields leaders only; and the INFO events of the leader's process ("leadership
//! gained", "leadership resigned") and of the observer's ("observed a new leader", "observed
//! that nobody leads") name the election and the epoch. The gauge and the counter are read back
//! in `tests/metrics.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::capture::{self, Record};
use crate::support::stores::Harness;
use distlock::{LeaderInfo, LeaderStates};

mod every_store {
    use super::*;

    crate::support::stores::on_every_store!(
        an_observer_with_vacancies_sees_nobody_leading_between_leaders,
    );
}

/// Longer than the tests: every handover is a resignation. Observers read at a third of it
/// besides their wake-ups, so a wait of [`CHANGE`] outlasts even a lost wake-up.
const LONG_LEASE: Duration = Duration::from_secs(30);
const CHANGE: Duration = Duration::from_secs(20);

async fn next_state(states: &mut LeaderStates) -> Option<LeaderInfo> {
    tokio::time::timeout(CHANGE, states.next())
        .await
        .expect("a change within a polling period")
        .expect("the stream goes on")
}

async fn an_observer_with_vacancies_sees_nobody_leading_between_leaders(h: Harness) {
    let captured = capture::install();
    // The events are found by the election's name: one of its own for each store's run.
    static RUN: AtomicUsize = AtomicUsize::new(0);
    let name = format!("vacancies-{}", RUN.fetch_add(1, Ordering::Relaxed));
    let (a, b, watcher) = (h.client(), h.client(), h.client());
    let election = |client: &distlock::Client| client.election(name.clone()).lease(LONG_LEASE);
    let mut states = election(&watcher).observe().with_vacancies();
    let mut leaders = election(&watcher).observe();

    assert!(
        next_state(&mut states).await.is_none(),
        "nobody leads at the start"
    );
    let first = election(&a).campaign().await.expect("leads");
    let seen = next_state(&mut states).await.expect("a leader");
    assert_eq!(seen.epoch(), first.epoch());
    let first_epoch = first.epoch();
    assert!(first.resign().await.expect("resign"));
    assert!(
        next_state(&mut states).await.is_none(),
        "nobody leads once the leader resigned"
    );
    let second = election(&b).campaign().await.expect("leads");
    let seen = next_state(&mut states).await.expect("a leader");
    assert_eq!(seen.epoch(), second.epoch());
    assert!(second.epoch() > first_epoch);

    // The plain stream yields leaders only: read now, it yields the leader of now.
    let leader = tokio::time::timeout(CHANGE, leaders.next())
        .await
        .expect("a leader")
        .expect("the stream goes on");
    assert_eq!(leader.epoch(), second.epoch());
    let second_epoch = second.epoch();
    assert!(second.resign().await.expect("resign"));
    assert!(
        next_state(&mut states).await.is_none(),
        "nobody leads again"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), leaders.next())
            .await
            .is_err(),
        "a vacancy is no item of the plain stream"
    );

    let records = captured.about("election", &name);
    let info = |message: &str| -> Vec<Record> {
        records
            .iter()
            .filter(|record| record.kind == "event" && record.name == message)
            .inspect(|record| assert_eq!(record.level, tracing::Level::INFO, "{record:?}"))
            .cloned()
            .collect()
    };
    let epochs = |records: Vec<Record>| -> Vec<String> {
        records
            .iter()
            .filter_map(|record| record.field("epoch").map(str::to_owned))
            .collect()
    };
    let both = [
        first_epoch.get().to_string(),
        second_epoch.get().to_string(),
    ];
    assert_eq!(epochs(info("leadership gained")), both, "{records:#?}");
    assert_eq!(epochs(info("leadership resigned")), both, "{records:#?}");
    assert!(info("leadership lost").is_empty(), "{records:#?}");
    // Two observers: the one with vacancies saw both leaders, the plain one the second.
    let mut observed = epochs(info("observed a new leader"));
    observed.sort();
    let mut expected = vec![both[0].clone(), both[1].clone(), both[1].clone()];
    expected.sort();
    assert_eq!(observed, expected, "{records:#?}");
    // The vacancies seen: at the start (no leader before), after each resignation; the
    // plain observer saw none before the second leader (it was first read then) but the
    // one after it.
    let vacancies: Vec<Option<String>> = info("observed that nobody leads")
        .iter()
        .map(|record| record.field("after").map(str::to_owned))
        .collect();
    assert!(vacancies.contains(&Some(both[0].clone())), "{records:#?}");
    assert_eq!(
        vacancies
            .iter()
            .filter(|after| **after == Some(both[1].clone()))
            .count(),
        2,
        "both observers saw the second leader go: {records:#?}"
    );
}
