//! Redlock at its default settings (`Config::redlock` and nothing else: node timeout 50 ms,
//! response timeout 1 s, connect timeout 2 s, backoff 5–200 ms) against a frozen master
//! (SIGSTOP: it keeps its connections and takes requests, and answers none). The other Redlock
//! tests (`redlock.rs`, the conformance harness) set node timeouts of 150 ms to 10 s; the
//! README's "the first request waits the node timeout (50 ms); then the master is not waited
//! for" is checked here at the 50 ms a user gets, and so is "clocks kept in sync keep a fenced
//! grant at one round trip" at the least lead a client starts with (the 50 ms node timeout).

use std::time::{Duration, Instant};

use crate::support;
use crate::support::masters::start_masters;
use crate::support::monitor::{arguments, Monitor};
use crate::support::RedisServer;
use distlock::{Client, Config, LockError};

/// The default node timeout, as `Config` documents it.
const NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// Slack for a loaded 2-core machine on top of a bound.
const MARGIN: Duration = Duration::from_millis(450);

/// A Redlock client at `Config`'s defaults.
fn default_client(masters: &[RedisServer]) -> Client {
    let config = Config::redlock(masters.iter().map(RedisServer::url)).expect("valid urls");
    Client::new(config).expect("client")
}

/// Sends SIGCONT to a frozen master when dropped, so a failed assertion does not leave it
/// stopped for the rest of the test's clean-up.
struct Thaw<'a>(&'a RedisServer);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.signal("CONT");
    }
}

/// At the default node timeout, one master of three frozen costs the first request that meets
/// it at most the node timeout, and the requests after it nothing: forty acquire–release
/// cycles with the majority take far less than the 4 s that waiting 50 ms for the frozen
/// master on each request would take. Once it runs again the lock is free on a majority.
/// Seen: the first request 51 ms, the forty cycles under 40 ms. Shown to fail with
/// `ask_until_it_answers` returning at once (the master never marked slow, so every request
/// waits its node timeout for it): the cycles took 4.1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_costs_the_first_request_the_default_node_timeout_and_the_rest_nothing() {
    let masters = start_masters(3);
    let client = default_client(&masters);
    let warm = client.lock("frozen").acquire().await.expect("all up");
    assert!(warm.release().await.expect("release"));

    masters[2].signal("STOP");
    let thaw = Thaw(&masters[2]);
    let started = Instant::now();
    let first = client
        .lock("frozen")
        .acquire()
        .await
        .expect("a majority is up");
    let first_took = started.elapsed();
    assert!(
        first_took <= NODE_TIMEOUT + MARGIN,
        "the first request after the freeze took {first_took:?}: more than the node timeout \
         ({NODE_TIMEOUT:?}) and {MARGIN:?} of slack"
    );
    assert!(first.release().await.expect("release"));

    const CYCLES: u32 = 40;
    let started = Instant::now();
    for _ in 0..CYCLES {
        let guard = client
            .lock("frozen")
            .acquire()
            .await
            .expect("a majority is up");
        assert!(guard.release().await.expect("release"));
    }
    let took = started.elapsed();
    // Waiting for the frozen master would cost a node timeout per acquire and per release
    // (4 s); not waiting, round trips to the two live masters.
    let waiting = NODE_TIMEOUT * 2 * CYCLES;
    assert!(
        took < waiting / 2,
        "{CYCLES} cycles with a frozen master took {took:?}: the requests waited for it \
         (waiting {NODE_TIMEOUT:?} each would take {waiting:?})"
    );

    drop(thaw);
    let guard = client
        .lock("frozen")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("free on a majority once the master runs again");
    assert!(guard.release().await.expect("release"));
}

/// At the defaults, with one master of three frozen: a holder's short lease is renewed by the
/// majority, and a waiter's wait ends as timed out within its wait and the node timeout (the
/// try that first meets the frozen master) plus slack — not the response or connect timeouts
/// (1 s, 2 s) a request to the frozen master, or a subscription on it, takes to give up.
/// Seen: a 1 s wait took 1.001 s. Shown to fail with the bound lowered to nine tenths of the
/// wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_defaults_a_frozen_master_stretches_no_wait_and_renewals_go_on() {
    let masters = start_masters(3);
    let holder = default_client(&masters);
    let waiter = default_client(&masters);
    // The waiter's lock connections are made while every master is up.
    let warm = waiter.lock("warm").acquire().await.expect("all up");
    assert!(warm.release().await.expect("release"));
    // The shortest lease the default node timeout allows (ten node timeouts) and then some:
    // renewed every third of it, about ten times across the freeze below.
    let lease = Duration::from_millis(600);
    let held = holder
        .lock("frozen-wait")
        .lease(lease)
        .acquire()
        .await
        .expect("all up");

    masters[2].signal("STOP");
    let thaw = Thaw(&masters[2]);
    for wait in [Duration::from_secs(1), Duration::from_millis(1500)] {
        let started = Instant::now();
        let refused = waiter.lock("frozen-wait").wait(wait).acquire().await;
        let took = started.elapsed();
        assert!(
            matches!(refused, Err(LockError::Timeout { .. })),
            "{refused:?}"
        );
        assert!(
            took >= wait && took <= wait + NODE_TIMEOUT + MARGIN,
            "a {wait:?} wait with a frozen master took {took:?}"
        );
    }
    assert!(
        held.is_held(),
        "a {lease:?} lease was lost while two of three masters could renew it"
    );
    drop(thaw);
    assert!(held.release().await.expect("release"));
}

/// At the defaults (the lead a client starts with is the 50 ms node timeout, the least any
/// setting gives) and with the masters' clocks in sync, an uncontended fenced grant is one
/// request to each master, grant after grant: fifty acquire–release cycles on one key (the
/// first over no counter, the others over the one the grant before left) are, on every
/// master, exactly the acquire's script and the release's script, in turn — a proposal a
/// master refused would add a second round (or an undo) there — and nothing is logged at
/// warning level about the key. The client is fresh (the scripts loaded by another), so its
/// first grant is made with the lead it starts with. Shown to fail with the lead starting at
/// zero (a proposal at the client's clock, which the master's clock has passed when the script
/// runs): master 0's first cycle was three requests, acquire, acquire, release; and, with a
/// counter set 3 s ahead on one master, the warning check caught the client's "ahead … by more
/// than the lead it keeps" warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_defaults_an_uncontended_fenced_grant_is_one_request_to_each_master() {
    const CYCLES: usize = 50;
    const KEY: &str = "one-round";
    let captured = support::capture::install();
    let masters = start_masters(3);
    // The scripts loaded by another client: the measured client's first grant is its first
    // request (its lead as it starts), and the first grant of `KEY` finds no counter.
    let warm = default_client(&masters)
        .lock("warm")
        .acquire()
        .await
        .expect("all up");
    assert!(warm.release().await.expect("release"));
    let client = default_client(&masters);
    let monitors: Vec<Monitor> = masters.iter().map(Monitor::start).collect();
    let lock_key = format!("distlock:{{{KEY}}}");
    // Each master's requests naming the lock: the command and script (EVALSHA and its SHA).
    let requests = |monitor: &Monitor| -> Vec<String> {
        monitor
            .lines()
            .iter()
            .filter(|line| !line.contains(" lua]"))
            .map(|line| arguments(line))
            .filter(|args| args.contains(&lock_key))
            .map(|args| args[..2.min(args.len())].join(" "))
            .collect()
    };
    for cycle in 1..=CYCLES {
        let guard = client.lock(KEY).acquire().await.expect("uncontended");
        assert!(guard.fencing_token().is_some());
        assert!(guard.release().await.expect("release"));
        // The release is awaited on every master before the next cycle: what a master ran
        // for this cycle is then all in its MONITOR lines.
        let deadline = Instant::now() + Duration::from_secs(5);
        for (i, monitor) in monitors.iter().enumerate() {
            let seen = loop {
                let seen = requests(monitor);
                if seen.len() >= 2 * cycle || Instant::now() > deadline {
                    break seen;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            assert_eq!(
                seen.len(),
                2 * cycle,
                "master {i}, cycle {cycle}: {} requests for {cycle} grants and releases, not \
                 one each: {seen:?}",
                seen.len()
            );
            let (acquire, release) = (&seen[0], &seen[1]);
            assert_ne!(acquire, release, "master {i}: {seen:?}");
            assert!(
                seen.chunks(2)
                    .all(|pair| pair[0] == *acquire && pair[1] == *release),
                "master {i}, cycle {cycle}: not one acquire and one release per cycle: {seen:?}"
            );
        }
    }
    let warnings: Vec<_> = captured
        .about("key", KEY)
        .into_iter()
        .filter(|record| record.kind == "event" && record.level <= tracing::Level::WARN)
        .collect();
    assert!(warnings.is_empty(), "warnings about {KEY}: {warnings:?}");
}
