//! A holder process killed with SIGKILL while it holds a lock (no release, no renewal, its
//! connection gone) leaves the lock free again within its lease; a reader killed among other
//! readers frees none of them; two holders of a semaphore's five permits killed give their
//! permits back within their lease, and never more than five are held (on a single server,
//! Redlock over three masters, and a Redis Cluster); twenty fair waiters, each a process, three
//! of them SIGKILLed while queued: the rest are granted in the order they came, and each dead
//! waiter holds the queue up for at most two heartbeats (on a single server, Sentinel, Redlock
//! and a Redis Cluster; the in-process store's twin of this is in `tests/conformance/fair.rs`).
//! Run-once jobs (issue 27): eight processes run the same every-200-ms job with
//! `on_busy = "skip"` and `hold_at_least = "300ms"` for 20 s while processes are SIGKILLed and
//! restarted: never two runs at once, no two starts closer than the window, and no gap longer
//! than the lease and one period without a run. Leader elections (issue 27): six campaigner
//! processes on one election for 30 s while the leader is SIGKILLed or SIGSTOPped past its
//! term and others are SIGKILLed and restarted, each leader writing to a fenced list with its
//! epoch — on a single node, on Redlock with a master killed, and on a Cluster whose primary
//! is killed and replaced by its replica: epochs strictly increase, one leader's writes per
//! epoch are accepted, a new leader comes within a term of the leader's death, and every
//! campaigner observes every leader of its lifetime in order.
//!
//! A custom harness (`harness = false`): the binary runs the scenarios, and re-executes itself
//! with `DISTLOCK_CRASH_HOLDER` set (to `write`, `read`, `semaphore`, `fair`, `job` or `leader`, then the
//! server's URL, or `redlock|URL,URL,…` / `cluster|URL,URL,…` / `sentinel|MASTER|URL,URL,…`)
//! to play the holder (or fair waiter) process.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock::{Client, Config, LockError};
use support::cluster::RedisCluster;
use support::masters::start_masters;
use support::RedisServer;

const HOLDER_ENV: &str = "DISTLOCK_CRASH_HOLDER";
const LEASE: Duration = Duration::from_millis(1000);

fn main() {
    if let Ok(role) = std::env::var(HOLDER_ENV) {
        hold_until_killed(&role);
        return;
    }
    let scenarios: [(&str, fn()); 9] = [
        (
            "a_crashed_holder_frees_the_lock_within_its_lease",
            a_crashed_holder_frees_the_lock_within_its_lease,
        ),
        (
            "a_crashed_reader_frees_no_other_reader",
            a_crashed_reader_frees_no_other_reader,
        ),
        (
            "a_writer_gets_in_at_the_latest_a_crashed_readers_lease_later",
            a_writer_gets_in_at_the_latest_a_crashed_readers_lease_later,
        ),
        (
            "two_crashed_permit_holders_give_their_permits_back_within_their_lease",
            two_crashed_permit_holders_give_their_permits_back_within_their_lease,
        ),
        (
            "twenty_fair_waiters_keep_their_order_while_three_are_killed",
            twenty_fair_waiters_keep_their_order_while_three_are_killed,
        ),
        (
            "eight_job_processes_run_the_job_once_per_window_while_killed",
            eight_job_processes_run_the_job_once_per_window_while_killed,
        ),
        (
            "six_campaigners_on_a_single_node",
            six_campaigners_on_a_single_node,
        ),
        (
            "six_campaigners_on_redlock_with_a_master_killed",
            six_campaigners_on_redlock_with_a_master_killed,
        ),
        (
            "six_campaigners_on_a_cluster_failing_over",
            six_campaigners_on_a_cluster_failing_over,
        ),
    ];
    // `cargo test --test crash -- NAME` runs the scenarios whose name contains NAME (the
    // options libtest would take are ignored).
    let filter = std::env::args().skip(1).find(|arg| !arg.starts_with('-'));
    // The scenarios run side by side: each starts its own servers and holder processes, and
    // spends most of its time waiting for leases to run out.
    let scenarios: Vec<_> = scenarios
        .into_iter()
        .filter(|(name, _)| {
            filter
                .as_ref()
                .is_none_or(|filter| name.contains(filter.as_str()))
        })
        .collect();
    let total = scenarios.len();
    let running: Vec<_> = scenarios
        .into_iter()
        .map(|(name, scenario)| (name, std::thread::spawn(scenario)))
        .collect();
    let mut failed = 0;
    for (name, scenario) in running {
        match scenario.join() {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out\n",
        total - failed
    );
    if failed > 0 {
        std::process::exit(101);
    }
}

/// The holder: takes the lock `crash` (`write:URL` or `read:URL`; watchdog on), reports its
/// token, and works until killed.
fn hold_until_killed(role: &str) {
    let (mode, url) = role.split_once(':').expect("MODE:URL");
    if mode == "fair" {
        wait_fairly(url);
        return;
    }
    if mode == "job" {
        run_the_job_until_killed(url);
        return;
    }
    if mode == "leader" {
        campaign_until_killed(url);
        return;
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = Client::new(store_config(url)).expect("client");
        let request = match mode {
            "read" => client.read_lock("crash"),
            "semaphore" => client.semaphore("crash", PERMITS),
            _ => client.write_lock("crash"),
        };
        let guard = request.lease(LEASE).acquire().await.expect("acquire");
        println!("acquired {}", guard.fencing_token().expect("fenced"));
        std::future::pending::<()>().await;
    });
}

/// A store as the holder process is told of it: a server's URL, or `redlock|URLs` or
/// `cluster|URLs` (comma-separated).
fn store_config(store: &str) -> Config {
    match store.split_once('|') {
        // Killed masters refuse at once; a live one may be slow on this loaded machine, and a
        // semaphore's release needs every master to answer within the timeout.
        Some(("redlock", urls)) => Config::redlock(urls.split(','))
            .expect("urls")
            .node_timeout(Duration::from_secs(1)),
        Some(("cluster", urls)) => Config::cluster(urls.split(',')).expect("urls"),
        Some(("sentinel", rest)) => {
            let (master, urls) = rest.split_once('|').expect("sentinel|MASTER|URLs");
            Config::sentinel(urls.split(','), master).expect("urls")
        }
        _ => Config::from_url(store).expect("url"),
    }
}

/// Starts a holder process taking `mode` ("write" or "read") of the lock `crash`; returns it
/// once it holds, with its fencing token.
fn spawn_holder(server: &RedisServer, mode: &str) -> (Holder, u64) {
    spawn_holder_on(&server.url(), mode)
}

/// [`spawn_holder`] on a store given as [`store_config`] reads it.
fn spawn_holder_on(store: &str, mode: &str) -> (Holder, u64) {
    let mut holder = Command::new(std::env::current_exe().expect("own path"))
        .env(HOLDER_ENV, format!("{mode}:{store}"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder process");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the holder's report");
    let token: u64 = line
        .trim()
        .strip_prefix("acquired ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("holder said {line:?}"));
    (Holder(holder), token)
}

/// A holder process; killed (SIGKILL) and reaped when dropped, also when a failed assertion
/// unwinds.
struct Holder(Child);

impl Holder {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.kill();
    }
}

fn a_crashed_holder_frees_the_lock_within_its_lease() {
    let server = RedisServer::start();
    let (mut holder, held_token) = spawn_holder(&server, "write");

    // Let the holder's watchdog renew at least once, so the lock is not simply expiring.
    std::thread::sleep(LEASE);
    let killed_at = Instant::now();
    holder.kill();

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
        let guard = client
            .lock("crash")
            .wait(LEASE * 5)
            .acquire()
            .await
            .expect("the lock is free again after the holder died");
        let freed_after = killed_at.elapsed();
        assert!(
            freed_after <= LEASE + Duration::from_millis(400),
            "freed {freed_after:?} after the kill; lease {LEASE:?}"
        );
        assert!(guard.fencing_token().expect("fenced").get() > held_token);
        assert!(guard.release().await.expect("release"));
    });
}

/// Three readers: one in a process that is SIGKILLed, two in this one. The two keep the lock
/// past the killed reader's lease, and a waiting writer gets in right after they release.
fn a_crashed_reader_frees_no_other_reader() {
    let server = RedisServer::start();
    let (mut reader, _) = spawn_holder(&server, "read");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let config = Config::from_url(&server.url()).expect("url");
        let (a, b) = (
            Client::new(config.clone()).expect("client"),
            Client::new(config.clone()).expect("client"),
        );
        let first = a
            .read_lock("crash")
            .lease(LEASE)
            .acquire()
            .await
            .expect("read");
        let second = b
            .read_lock("crash")
            .lease(LEASE)
            .acquire()
            .await
            .expect("read");
        // Let every reader's watchdog renew at least once.
        tokio::time::sleep(LEASE).await;
        reader.kill();
        let killed_at = Instant::now();
        let writers = Client::new(config).expect("client");
        // Past the killed reader's lease the other two still hold, renewed.
        while killed_at.elapsed() < LEASE * 2 {
            let writer = writers
                .write_lock("crash")
                .wait(Duration::ZERO)
                .acquire()
                .await;
            assert!(
                matches!(writer, Err(distlock::LockError::Timeout { .. })),
                "a writer got in {:?} after a reader was killed, while two held: {writer:?}",
                killed_at.elapsed()
            );
            assert!(first.is_held() && second.is_held());
            tokio::time::sleep(LEASE / 4).await;
        }
        let waiting = tokio::spawn(async move {
            let guard = writers
                .write_lock("crash")
                .wait(LEASE * 5)
                .acquire()
                .await
                .expect("the writer gets in");
            (Instant::now(), guard)
        });
        // The writer's first try has found the readers (its mark keeps new readers out).
        let started = Instant::now();
        while a
            .read_lock("crash")
            .wait(Duration::ZERO)
            .acquire()
            .await
            .is_ok()
        {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the writer never tried"
            );
            tokio::task::yield_now().await;
        }
        assert!(first.release().await.expect("release"));
        assert!(second.release().await.expect("release"));
        let released_at = Instant::now();
        let (got_at, guard) = waiting.await.expect("writer task");
        let after = got_at - released_at;
        assert!(
            after <= Duration::from_millis(500),
            "the writer got in {after:?} after the last reader released"
        );
        assert!(guard.release().await.expect("release"));
    });
}

/// A reader SIGKILLed while the other readers release at once: a writer gets in once the
/// killed reader's lease runs out, not later.
fn a_writer_gets_in_at_the_latest_a_crashed_readers_lease_later() {
    let server = RedisServer::start();
    let (mut reader, _) = spawn_holder(&server, "read");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
        let other = client
            .read_lock("crash")
            .lease(LEASE)
            .acquire()
            .await
            .expect("read");
        tokio::time::sleep(LEASE).await;
        reader.kill();
        let killed_at = Instant::now();
        assert!(other.release().await.expect("release"));
        let guard = client
            .write_lock("crash")
            .wait(LEASE * 5)
            .acquire()
            .await
            .expect("the writer gets in once the killed reader's lease ran out");
        let after = killed_at.elapsed();
        assert!(
            after <= LEASE + Duration::from_millis(400),
            "the writer got in {after:?} after the kill; lease {LEASE:?}"
        );
        assert!(guard.release().await.expect("release"));
    });
}

/// The semaphore's permits in [`two_crashed_permit_holders_give_their_permits_back_within_their_lease`].
const PERMITS: u32 = 5;

/// A semaphore of five permits: two holder processes and three holders here take them all;
/// the two processes are SIGKILLed, and two waiters here get their permits once the killed
/// holders' leases run out (within a lease and a margin of the kill), while a sixth holder
/// never gets in and the store never shows more than five. On a single server, Redlock over
/// three masters, and a Redis Cluster. Shown to fail (six and more in) with the count check
/// taken out of `semaphore/acquire.lua`, and (the permits never come back) without the purge
/// before counting.
fn two_crashed_permit_holders_give_their_permits_back_within_their_lease() {
    let server = RedisServer::start();
    crashed_permit_holders_on(&server.url());
    drop(server);
    let masters = start_masters(3);
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    crashed_permit_holders_on(&format!("redlock|{}", urls.join(",")));
    drop(masters);
    let cluster = RedisCluster::start();
    crashed_permit_holders_on(&format!("cluster|{}", cluster.urls().join(",")));
}

fn crashed_permit_holders_on(store: &str) {
    let mut crashing = [
        spawn_holder_on(store, "semaphore").0,
        spawn_holder_on(store, "semaphore").0,
    ];
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let config =
            store_config(store).backoff(Duration::from_millis(5), Duration::from_millis(50));
        let clients: Vec<Client> = (0..3)
            .map(|_| Client::new(config.clone()).expect("client"))
            .collect();
        let mut held = Vec::new();
        for client in &clients {
            let permit = client
                .semaphore("crash", PERMITS)
                .lease(LEASE)
                .wait(LEASE)
                .acquire()
                .await
                .unwrap_or_else(|err| panic!("{store}: a permit beside two holders: {err}"));
            held.push(permit);
        }
        let observer = Client::new(config.clone()).expect("client");
        let full = |what: &'static str| {
            let observer = observer.clone();
            async move {
                let sixth = observer
                    .semaphore("crash", PERMITS)
                    .wait(Duration::ZERO)
                    .acquire()
                    .await;
                assert!(
                    matches!(sixth, Err(LockError::Timeout { .. })),
                    "{store}: {what}: a sixth holder got in: {sixth:?}"
                );
            }
        };
        full("all five taken").await;
        // Let every holder's watchdog renew at least once, so the permits are not simply
        // expiring.
        tokio::time::sleep(LEASE).await;
        full("all five renewed").await;
        for holder in &mut crashing {
            holder.kill();
        }
        let killed_at = Instant::now();
        let waiters: Vec<_> = (0..2)
            .map(|i| {
                let client = clients[i].clone();
                tokio::spawn(async move {
                    let permit = client
                        .semaphore("crash", PERMITS)
                        .lease(LEASE)
                        .wait(LEASE * 5)
                        .acquire()
                        .await;
                    (permit, killed_at.elapsed())
                })
            })
            .collect();
        // Until both are in, never more than five holders.
        while waiters.iter().any(|waiter| !waiter.is_finished()) {
            let state = observer.inspect("crash").await.expect("inspect");
            assert!(
                state.holders.len() <= PERMITS as usize,
                "{store}: {} holders: {state:?}",
                state.holders.len()
            );
            assert!(
                killed_at.elapsed() < LEASE * 6,
                "{store}: the waiters are still waiting"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        for waiter in waiters {
            let (permit, after) = waiter.await.expect("waiter task");
            let permit = permit.unwrap_or_else(|err| {
                panic!("{store}: a killed holder's permit did not come back: {err}")
            });
            assert!(
                after <= LEASE + Duration::from_millis(500),
                "{store}: a permit came back {after:?} after the kill; lease {LEASE:?}"
            );
            held.push(permit);
        }
        full("five held again").await;
        let state = observer.inspect("crash").await.expect("inspect");
        assert_eq!(state.holders.len(), PERMITS as usize, "{store}: {state:?}");
        for permit in held {
            assert!(
                permit.release().await.expect("release"),
                "{store}: was ours"
            );
        }
        assert!(!observer.is_locked("crash").await.expect("is_locked"));
    });
}

/// The fair waiters' heartbeat in [`twenty_fair_waiters_keep_their_order_while_three_are_killed`].
const FAIR_HEARTBEAT: Duration = Duration::from_millis(500);
/// A fair waiter process: queues for the lock `fair` on `store`, says `granted` and its
/// fencing token when it gets it, holds it until the harness says `release` on its standard
/// input (the harness first kills the waiter behind it, if that one is to die queued), releases
/// it and says `released`.
fn wait_fairly(store: &str) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client =
            Client::new(store_config(store).fair_heartbeat(FAIR_HEARTBEAT)).expect("client");
        let guard = client
            .lock("fair")
            .fair()
            .wait(Duration::from_secs(60))
            .acquire()
            .await
            .expect("granted within the wait");
        println!("granted {}", guard.fencing_token().expect("fenced"));
        let told = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map(|_| line)
        })
        .await
        .expect("read stdin");
        assert_eq!(told.expect("stdin").trim(), "release", "the harness's word");
        assert!(guard.release().await.expect("release"), "was ours");
        println!("released");
    });
}

/// Twenty fair waiters, each a process of its own, queue one after the other behind a
/// holder; three of them (the 4th, 10th and 16th) are SIGKILLed while queued, just before the
/// holder releases. The other seventeen are granted in the order they came, one at a time, and
/// a dead waiter holds the queue up for at most two heartbeats (plus a margin for this
/// machine) — never a fixed multi-minute timeout. On a single server, Sentinel, Redlock over
/// three masters and a Redis Cluster. Shown to fail (the queue stalled until the waiters'
/// wait ran out) with the deadline purge taken out of `fair/acquire.lua`.
fn twenty_fair_waiters_keep_their_order_while_three_are_killed() {
    let server = RedisServer::start();
    fair_waiters_killed_on(&server.url());
    drop(server);
    let sentinel = support::sentinel::SentinelSetup::start("crashfair");
    fair_waiters_killed_on(&format!(
        "sentinel|{}|{}",
        sentinel.master_name(),
        sentinel.sentinel_urls().join(",")
    ));
    drop(sentinel);
    let masters = start_masters(3);
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    fair_waiters_killed_on(&format!("redlock|{}", urls.join(",")));
    drop(masters);
    let cluster = RedisCluster::start();
    fair_waiters_killed_on(&format!("cluster|{}", cluster.urls().join(",")));
}

fn fair_waiters_killed_on(store: &str) {
    const WAITERS: usize = 20;
    const KILLED: [usize; 3] = [3, 9, 15];
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let observer = Client::new(store_config(store)).expect("client");
    let holder = runtime
        .block_on(observer.lock("fair").lease(LEASE).acquire())
        .unwrap_or_else(|err| panic!("{store}: the lock is free: {err}"));
    let (events, said) = std::sync::mpsc::channel::<(usize, String, Instant)>();
    let mut waiters = Vec::new();
    // Each waiter's standard input: `release` tells it to let go.
    let mut releases = Vec::new();
    for i in 0..WAITERS {
        let mut child = Command::new(std::env::current_exe().expect("own path"))
            .env(HOLDER_ENV, format!("fair:{store}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a waiter process");
        let stdout = child.stdout.take().expect("stdout");
        releases.push(child.stdin.take().expect("stdin"));
        let events = events.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = events.send((i, line, Instant::now()));
            }
        });
        waiters.push(Holder(child));
        // Queued before the next one starts.
        let started = Instant::now();
        while runtime
            .block_on(observer.inspect("fair"))
            .expect("inspect")
            .queued
            < i as u64 + 1
        {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{store}: waiter {i} never queued"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // Each dead waiter is killed just before the queue reaches it (the first just before the
    // release, each other when the waiter before it is granted), so each holds it up anew.
    waiters[KILLED[0]].kill();
    let released_at = Instant::now();
    assert!(runtime.block_on(holder.release()).expect("release"));
    // Each granted waiter: who, when granted (as its line reached this process), when it
    // released, and its fencing token, which says the order of the grants whatever the order
    // the lines of different processes were read in.
    let mut order: Vec<(usize, Instant, Option<Instant>, u64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while order.iter().filter(|(_, _, r, _)| r.is_some()).count() < WAITERS - KILLED.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let (i, line, at) = said
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("{store}: the queue stalled; granted so far: {order:?}"));
        match line.split_once(' ') {
            Some(("granted", token)) => {
                let token = token.parse().expect("a token");
                order.push((i, at, None, token));
                // Killed before the grant is let go, whatever the time this process took to
                // hear of it: the next in line is still queued.
                if KILLED.contains(&(i + 1)) {
                    waiters[i + 1].kill();
                }
                writeln!(releases[i], "release")
                    .unwrap_or_else(|err| panic!("{store}: tell waiter {i} to release: {err}"));
            }
            None if line == "released" => {
                let granted = order.iter_mut().find(|(w, ..)| *w == i);
                granted.expect("released after granted").2 = Some(at);
            }
            _ => panic!("{store}: waiter {i} said {line:?}"),
        }
    }
    order.sort_by_key(|&(.., token)| token);
    let expected: Vec<usize> = (0..WAITERS).filter(|i| !KILLED.contains(i)).collect();
    let granted: Vec<usize> = order.iter().map(|&(i, ..)| i).collect();
    assert_eq!(granted, expected, "{store}: grant order");
    // One at a time, and how long each waited once the one before it had released.
    let mut free_since = released_at;
    let mut previous = None;
    let mut stalls = Vec::new();
    for &(i, granted_at, released, _) in &order {
        // Dead waiters between the previous granted waiter and this one.
        let dead_ahead = KILLED
            .iter()
            .filter(|&&k| k < i && previous.is_none_or(|p| k > p))
            .count() as u32;
        previous = Some(i);
        // (Lines of two processes may be read in either order: a wait too short to measure
        // counts as none.)
        let stall = granted_at.saturating_duration_since(free_since);
        let allowed = FAIR_HEARTBEAT * 2 * dead_ahead + Duration::from_millis(700);
        assert!(
            stall <= allowed,
            "{store}: waiter {i} was granted {stall:?} after the lock was free, with \
             {dead_ahead} dead waiters just ahead of it (heartbeat {FAIR_HEARTBEAT:?})"
        );
        stalls.push(format!("{}:{}ms", i, stall.as_millis()));
        free_since = released.expect("released");
    }
    // The figures RELIABILITY.md quotes: each waiter's wait once the lock was free.
    eprintln!(
        "  {}: granted in order, waits once free (waiter:ms): {}",
        store.split('|').next().unwrap_or(store),
        stalls.join(" ")
    );
    let state = runtime.block_on(observer.inspect("fair")).expect("inspect");
    assert!(
        !state.is_locked() && state.queued == 0,
        "{store}: after the last waiter: {state:?}"
    );
}

// ---- run-once jobs (issue 27) -------------------------------------------------------------

/// The job's period in every process, its `hold_at_least` and its lease.
const JOB_PERIOD: Duration = Duration::from_millis(200);
const JOB_WINDOW: Duration = Duration::from_millis(300);
const JOB_LEASE: Duration = Duration::from_millis(1000);
/// What a start may come before the window's end by: the window runs from the request's send,
/// but a start is read on entering the body, a round trip and a wake-up later — on this loaded
/// 2-core machine more than 10 ms at times. Without `hold_at_least` a run may start as soon
/// as the one before has ended its 100 ms body: shown to fail so (starts 207 ms apart).
const JOB_CLOCK_SLACK: Duration = Duration::from_millis(60);

/// A job process: the same job every 200 ms, each run recorded in the list `runs` on the
/// server (`S:<pid>:<n>:<µs>` on entering, `E:<pid>:<n>:<µs>` on leaving).
struct Job {
    locks: Client,
    recorder: redis::aio::MultiplexedConnection,
    runs: std::sync::atomic::AtomicU64,
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Job {
    #[distlock::distributed_lock(
        key = "every-200ms",
        client = self.locks,
        on_busy = "skip",
        hold_at_least = "300ms",
        lease = "1s"
    )]
    async fn tick(&self) -> Result<(), LockError> {
        let started = now_micros();
        let n = self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let pid = std::process::id();
        let mut recorder = self.recorder.clone();
        let _: () = redis::cmd("RPUSH")
            .arg("runs")
            .arg(format!("S:{pid}:{n}:{started}"))
            .query_async(&mut recorder)
            .await
            .expect("record the start");
        // Long enough that many kills land inside a run (its lock then lapses with its lease).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _: () = redis::cmd("RPUSH")
            .arg("runs")
            .arg(format!("E:{pid}:{n}:{}", now_micros()))
            .query_async(&mut recorder)
            .await
            .expect("record the end");
        Ok(())
    }
}

fn run_the_job_until_killed(url: &str) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let job = Job {
            locks: Client::new(Config::from_url(url).expect("url")).expect("client"),
            recorder: redis::Client::open(url)
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("connect"),
            runs: std::sync::atomic::AtomicU64::new(0),
        };
        println!("acquired 1");
        loop {
            job.tick().await.expect("a skipped or finished run");
            tokio::time::sleep(JOB_PERIOD).await;
        }
    });
}

/// One run as recorded: its process, start and (unless the process was killed in it) end.
struct Run {
    pid: u64,
    start: u64,
    end: Option<u64>,
}

fn eight_job_processes_run_the_job_once_per_window_while_killed() {
    let server = RedisServer::start();
    let store = server.url();
    let mut workers: Vec<Holder> = (0..8).map(|_| spawn_holder_on(&store, "job").0).collect();
    let started = Instant::now();
    let mut kills = 0;
    while started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(1300));
        let victim = fastrand::usize(..workers.len());
        workers[victim].kill();
        kills += 1;
        workers[victim] = spawn_holder_on(&store, "job").0;
    }
    drop(workers);
    let records: Vec<String> = redis::cmd("LRANGE")
        .arg("runs")
        .arg(0)
        .arg(-1)
        .query(&mut server.connection())
        .expect("LRANGE runs");
    let mut runs: Vec<Run> = Vec::new();
    let mut open: std::collections::HashMap<(u64, u64), usize> = Default::default();
    for record in &records {
        let fields: Vec<&str> = record.split(':').collect();
        let [what, pid, n, at] = fields[..] else {
            panic!("record {record:?}");
        };
        let (pid, n, at): (u64, u64, u64) = (
            pid.parse().expect("pid"),
            n.parse().expect("n"),
            at.parse().expect("µs"),
        );
        match what {
            "S" => {
                open.insert((pid, n), runs.len());
                runs.push(Run {
                    pid,
                    start: at,
                    end: None,
                });
            }
            _ => {
                let at_run = open.remove(&(pid, n)).expect("an end after its start");
                runs[at_run].end = Some(at);
            }
        }
    }
    runs.sort_by_key(|run| run.start);
    let micros = |d: Duration| d.as_micros() as u64;
    assert!(
        runs.len() >= 20,
        "{} runs in 20 s with {kills} kills: the job must keep running",
        runs.len()
    );
    let killed_in_a_run = runs.iter().filter(|run| run.end.is_none()).count();
    for pair in runs.windows(2) {
        let (first, next) = (&pair[0], &pair[1]);
        if let Some(end) = first.end {
            assert!(
                next.start >= end,
                "two runs at once: {} started at {} before {}'s run ended at {end}",
                next.pid,
                next.start,
                first.pid
            );
        }
        let apart = next.start - first.start;
        assert!(
            apart + micros(JOB_CLOCK_SLACK) >= micros(JOB_WINDOW),
            "starts {apart} µs apart, within the {JOB_WINDOW:?} window"
        );
        assert!(
            apart <= micros(JOB_LEASE + JOB_PERIOD + Duration::from_millis(300)),
            "{apart} µs without a run: more than the lease and a period"
        );
    }
    println!(
        "jobs: {} runs, {kills} processes killed, {killed_in_a_run} of them inside a run",
        runs.len()
    );
}

// ---- leader elections (issue 27) ----------------------------------------------------------

/// The election's name, its term's lease and the campaigners' longest backoff step.
const ELECTION: &str = "chaos";
const TERM: Duration = Duration::from_millis(1000);
const CAMPAIGN_BACKOFF: Duration = Duration::from_millis(100);
/// How long the elections run on each deployment, and how often the harness strikes.
const ELECTION_RUN: Duration = Duration::from_secs(30);
const STRIKE_EVERY: Duration = Duration::from_millis(2500);
/// What a takeover may take beyond a term and a backoff step on this loaded 2-core machine
/// (18 campaigners and three deployments' servers share it).
const TAKEOVER_SLACK: Duration = Duration::from_millis(1000);
/// Where campaigners find the recorder: a server of its own, outside the deployment under
/// test, holding the event log (`events`) and the fenced resource (`accepted`).
const RECORDER_ENV: &str = "DISTLOCK_CRASH_RECORDER";

async fn record(recorder: &mut redis::aio::MultiplexedConnection, event: String) {
    let _: Result<(), _> = redis::cmd("RPUSH")
        .arg("events")
        .arg(event)
        .query_async(recorder)
        .await;
}

/// A campaigner process: observes the election (logging each leader it sees, `O:pid:epoch`),
/// and campaigns; while it leads it appends `pid:epoch` to the fenced list `accepted` every
/// 50 ms through the fenced-write helper with its epoch, and once more when it learns the
/// leadership is lost (logging `L` when it starts to lead, `W`/`R` for each write accepted or
/// refused as stale, `X` when the leadership is lost), and campaigns again once it is lost.
fn campaign_until_killed(store: &str) {
    let recorder_url = std::env::var(RECORDER_ENV).expect("the recorder's URL");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let pid = std::process::id();
        let config = store_config(store)
            .backoff(Duration::from_millis(1), CAMPAIGN_BACKOFF)
            .app_name("campaigner");
        let client = Client::new(config).expect("client");
        let election = client.election(ELECTION).lease(TERM).value(pid.to_string());
        let mut recorder = redis::Client::open(recorder_url)
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the recorder");
        record(&mut recorder, format!("B:{pid}:0:{}", now_micros())).await;
        let mut changes = election.observe();
        let mut observed = recorder.clone();
        tokio::spawn(async move {
            while let Some(leader) = changes.next().await {
                let event = format!("O:{pid}:{}:{}", leader.epoch(), now_micros());
                record(&mut observed, event).await;
            }
        });
        println!("acquired 1");
        loop {
            let leadership = match election.campaign().await {
                Ok(leadership) => leadership,
                Err(err) => {
                    eprintln!("campaign: {err}");
                    tokio::time::sleep(CAMPAIGN_BACKOFF).await;
                    continue;
                }
            };
            let epoch = leadership.epoch();
            record(&mut recorder, format!("L:{pid}:{epoch}:{}", now_micros())).await;
            loop {
                // A loss ends the loop after one more write: the write a leader had on its way
                // when it was paused past its term reaches the resource late, as a real one's
                // may. The fence must refuse it. (Which a frozen leader sees first on waking,
                // its timer or its loss, is a race between threads: the write cannot wait on it.)
                let lost = tokio::select! {
                    biased;
                    () = tokio::time::sleep(Duration::from_millis(50)) => false,
                    () = leadership.lost() => true,
                };
                let write = distlock::fenced::pipe("accepted", epoch)
                    .cmd(
                        redis::cmd("RPUSH")
                            .arg("accepted")
                            .arg(format!("{pid}:{epoch}")),
                    )
                    .query_async::<(u64,)>(&mut recorder)
                    .await;
                let what = match write {
                    Ok(outcome) if outcome.is_applied() => Some("W"),
                    Ok(_) => Some("R"),
                    Err(_) => None,
                };
                if let Some(what) = what {
                    record(
                        &mut recorder,
                        format!("{what}:{pid}:{epoch}:{}", now_micros()),
                    )
                    .await;
                }
                if lost {
                    break;
                }
            }
            record(&mut recorder, format!("X:{pid}:{epoch}:{}", now_micros())).await;
        }
    });
}

/// Starts a campaigner process on `store`; returns it once it runs, with its pid.
fn spawn_campaigner(store: &str, recorder: &str) -> (Holder, u32) {
    let mut process = Command::new(std::env::current_exe().expect("own path"))
        .env(HOLDER_ENV, format!("leader:{store}"))
        .env(RECORDER_ENV, recorder)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn a campaigner");
    let mut line = String::new();
    BufReader::new(process.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the campaigner's report");
    assert_eq!(line.trim(), "acquired 1", "the campaigner said {line:?}");
    let pid = process.id();
    (Holder(process), pid)
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// One logged event: what, the process, the epoch and when (µs on the shared clock).
struct Event {
    what: String,
    pid: u32,
    epoch: u64,
    at: u64,
}

fn events(recorder: &RedisServer, list: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(list)
        .arg(0)
        .arg(-1)
        .query(&mut recorder.connection())
        .unwrap_or_else(|err| panic!("LRANGE {list}: {err}"))
}

fn parse_events(recorder: &RedisServer) -> Vec<Event> {
    events(recorder, "events")
        .iter()
        .map(|event| {
            let fields: Vec<&str> = event.split(':').collect();
            let [what, pid, epoch, at] = fields[..] else {
                panic!("event {event:?}");
            };
            Event {
                what: what.to_owned(),
                pid: pid.parse().expect("pid"),
                epoch: epoch.parse().expect("epoch"),
                at: at.parse().expect("µs"),
            }
        })
        .collect()
}

/// What the harness did to a process and when (µs): the leader killed or frozen for longer
/// than its term (until `resumed`), or another campaigner killed.
struct Strike {
    pid: u32,
    at: u64,
    leader: bool,
    resumed: Option<u64>,
}

/// Six campaigners on `store` for [`ELECTION_RUN`] while the harness, every
/// [`STRIKE_EVERY`], SIGKILLs the leader, SIGSTOPs it past its term (then SIGCONTs it), or
/// SIGKILLs another campaigner, restarting the killed; `fault` runs once, a third of the way
/// in, and returns when the deployment is whole again. Then: epochs strictly increase from
/// leader to leader; the fenced list holds one process's writes per epoch, in epoch order (a
/// frozen leader's late writes are refused); a new leader comes within a term, a backoff step
/// and some slack of the leader's death or freezing (except around `fault`); and every
/// campaigner observed every leader of its lifetime, in order.
fn campaigners_elect_one_leader_at_a_time(
    deployment: &str,
    store: &str,
    fault: impl FnOnce() + Send,
) {
    let recorder = RedisServer::start();
    let recorder_url = recorder.url();
    let mut campaigners: Vec<(Holder, u32)> = (0..6)
        .map(|_| spawn_campaigner(store, &recorder_url))
        .collect();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let harness = Client::new(store_config(store)).expect("client");
    let election = harness.election(ELECTION);
    let started = Instant::now();
    let mut strikes: Vec<Strike> = Vec::new();
    let mut fault = Some(fault);
    let mut fault_window = (0, 0);
    let mut round = 0;
    while started.elapsed() < ELECTION_RUN {
        std::thread::sleep(STRIKE_EVERY);
        round += 1;
        if round == 4 {
            let from = now_micros();
            (fault.take().expect("once"))();
            // The campaigners' connections may take a few retries to find the new layout.
            fault_window = (from, now_micros() + 3_000_000);
            continue;
        }
        // The leader, once it has logged that it leads (so that freezing it cannot hold back
        // its own log line past its successor's).
        let leader = runtime.block_on(election.leader()).ok().flatten();
        let leader = leader.and_then(|leader| {
            let pid = leader.holder().pid?;
            let logged = format!("L:{pid}:{}:", leader.epoch());
            events(&recorder, "events")
                .iter()
                .any(|event| event.starts_with(&logged))
                .then_some(pid)
        });
        let at = campaigners.iter().position(|&(_, pid)| Some(pid) == leader);
        match (round % 3, at) {
            (0, Some(at)) => {
                // Frozen past its term, then resumed: it must find itself deposed.
                let pid = campaigners[at].1;
                let from = now_micros();
                signal(pid, "STOP");
                std::thread::sleep(TERM * 2);
                signal(pid, "CONT");
                strikes.push(Strike {
                    pid,
                    at: from,
                    leader: true,
                    resumed: Some(now_micros()),
                });
            }
            (1, Some(at)) => {
                let pid = campaigners[at].1;
                let at_us = now_micros();
                campaigners[at].0.kill();
                strikes.push(Strike {
                    pid,
                    at: at_us,
                    leader: true,
                    resumed: None,
                });
                campaigners[at] = spawn_campaigner(store, &recorder_url);
            }
            _ => {
                let others: Vec<usize> = (0..campaigners.len())
                    .filter(|&i| Some(campaigners[i].1) != leader)
                    .collect();
                let victim = others[fastrand::usize(..others.len())];
                let pid = campaigners[victim].1;
                let at_us = now_micros();
                campaigners[victim].0.kill();
                strikes.push(Strike {
                    pid,
                    at: at_us,
                    leader: false,
                    resumed: None,
                });
                campaigners[victim] = spawn_campaigner(store, &recorder_url);
            }
        }
    }
    // The last strike's successor comes within the bound checked below.
    std::thread::sleep(TERM + CAMPAIGN_BACKOFF + TAKEOVER_SLACK);
    let ended = now_micros();
    drop(campaigners);
    drop(runtime);

    let events = parse_events(&recorder);
    let leads: Vec<&Event> = events.iter().filter(|e| e.what == "L").collect();
    assert!(
        leads.len() >= 5,
        "{deployment}: {} leaders in {ELECTION_RUN:?}: the harness deposes one every few seconds",
        leads.len()
    );
    for pair in leads.windows(2) {
        assert!(
            pair[0].epoch < pair[1].epoch,
            "{deployment}: epoch {} (pid {}) led after epoch {} (pid {})",
            pair[1].epoch,
            pair[1].pid,
            pair[0].epoch,
            pair[0].pid
        );
    }
    // The fenced resource: its writes in the order they were accepted.
    let accepted: Vec<(u32, u64)> = crate::events(&recorder, "accepted")
        .iter()
        .map(|write| {
            let (pid, epoch) = write.split_once(':').expect("pid:epoch");
            (pid.parse().expect("pid"), epoch.parse().expect("epoch"))
        })
        .collect();
    assert!(!accepted.is_empty(), "{deployment}: no leader wrote");
    for pair in accepted.windows(2) {
        let ((pid_a, epoch_a), (pid_b, epoch_b)) = (pair[0], pair[1]);
        assert!(
            epoch_a < epoch_b || (epoch_a == epoch_b && pid_a == pid_b),
            "{deployment}: {pid_b} wrote with epoch {epoch_b} after {pid_a} with epoch {epoch_a}"
        );
    }
    for &(pid, epoch) in &accepted {
        assert!(
            leads.iter().any(|l| l.pid == pid && l.epoch == epoch),
            "{deployment}: {pid} wrote with epoch {epoch}, which it never led with"
        );
    }
    let refused = events.iter().filter(|e| e.what == "R").count();
    let frozen = strikes.iter().filter(|s| s.resumed.is_some()).count();
    assert!(
        frozen == 0 || refused > 0,
        "{deployment}: {frozen} leaders were frozen past their term and woke, and none wrote \
         late: the fence was not put to the test"
    );
    // Takeovers: after the leader died or froze, the next leader within a term, a backoff
    // step and the slack.
    let bound = (TERM + CAMPAIGN_BACKOFF + TAKEOVER_SLACK).as_micros() as u64;
    let (fault_from, fault_to) = fault_window;
    let mut takeovers = Vec::new();
    for strike in strikes.iter().filter(|s| s.leader) {
        if strike.at + bound >= fault_from && strike.at <= fault_to {
            continue;
        }
        let next = leads
            .iter()
            .find(|l| l.at > strike.at && l.pid != strike.pid)
            .unwrap_or_else(|| panic!("{deployment}: no leader after {} was struck", strike.pid));
        let took = next.at - strike.at;
        assert!(
            took <= bound,
            "{deployment}: {} µs from the leader's death to the next leader (bound {bound} µs)",
            took
        );
        takeovers.push(took);
    }
    assert!(!takeovers.is_empty(), "{deployment}: no leader was struck");
    // Observers: each campaigner saw, in order, every leader that led for a while within its
    // lifetime (from a second after it started, as its subscription may still be coming up,
    // to when it was killed), except while it was frozen.
    let leaders_at: Vec<(u64, u64)> = leads.iter().map(|l| (l.epoch, l.at)).collect();
    for start in events.iter().filter(|e| e.what == "B") {
        let pid = start.pid;
        let end = strikes
            .iter()
            .find(|s| s.pid == pid && s.resumed.is_none())
            .map_or(ended, |s| s.at);
        let frozen: Vec<(u64, u64)> = strikes
            .iter()
            .filter(|s| s.pid == pid)
            .filter_map(|s| Some((s.at, s.resumed? + 1_000_000)))
            .collect();
        let seen: Vec<u64> = events
            .iter()
            .filter(|e| e.what == "O" && e.pid == pid)
            .map(|e| e.epoch)
            .collect();
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "{deployment}: {pid} observed {seen:?}, not in epoch order"
        );
        for (i, &(epoch, at)) in leaders_at.iter().enumerate() {
            // A leader that led for at least a second, well inside the observer's life.
            let until = leaders_at.get(i + 1).map_or(ended, |&(_, next)| next);
            let steady = at > start.at + 1_000_000 && until < end && until - at >= 1_000_000;
            let thawed = frozen.iter().all(|&(from, to)| until < from || at > to);
            let in_fault = at <= fault_to && until >= fault_from;
            if steady && thawed && !in_fault {
                assert!(
                    seen.contains(&epoch),
                    "{deployment}: {pid} never observed epoch {epoch}, which led from {at} to \
                     {until} µs within its life; it saw {seen:?}"
                );
            }
        }
    }
    takeovers.sort_unstable();
    println!(
        "elections on {deployment}: {} leaders, {} fenced writes accepted, {refused} refused as \
         stale, {} strikes; takeover after the leader's death or freeze: median {} ms, max {} ms",
        leads.len(),
        accepted.len(),
        strikes.len(),
        takeovers[takeovers.len() / 2] / 1000,
        takeovers[takeovers.len() - 1] / 1000
    );
}

fn six_campaigners_on_a_single_node() {
    let server = RedisServer::start();
    // The fault: a restart of nothing; a single node's own outage is `redis_faults`' to test.
    campaigners_elect_one_leader_at_a_time("a single node", &server.url(), || {});
}

fn six_campaigners_on_redlock_with_a_master_killed() {
    let mut masters = start_masters(3);
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let store = format!("redlock|{}", urls.join(","));
    let first = &mut masters[0];
    campaigners_elect_one_leader_at_a_time("Redlock", &store, move || first.stop());
}

fn six_campaigners_on_a_cluster_failing_over() {
    let mut cluster = RedisCluster::start();
    let store = format!("cluster|{}", cluster.urls().join(","));
    let key = format!("{}{{{ELECTION}}}", distlock::DEFAULT_KEY_PREFIX);
    let cluster_ref = &mut cluster;
    campaigners_elect_one_leader_at_a_time("a Cluster", &store, move || {
        let primary = cluster_ref.primary_for_key(&key);
        cluster_ref.kill(primary);
        cluster_ref.wait_until_replica_promoted(primary);
    });
}
