//! The etcd store's faults and pitfalls against real etcd members (issue 39, item 6, and the
//! etcd pitfalls of `../shared/research-stores.md`, Part 3): a 3-member cluster's leader
//! SIGKILLed under contention for one fenced lock (clients of every member, or of the
//! followers alone), its quorum lost and regained, the member listed first SIGKILLed or
//! SIGSTOPped; a holder that stops renewing, or that is cut off from etcd, loses the lock
//! when etcd expires its lease and knows it first; the lease as etcd grants it
//! (whole seconds, raised to the server's minimum); a release after the lease ran out that
//! leaves the next holder alone; a least-privilege user, wrong credentials, and a grant's key
//! or lease removed behind its holder's back. What the store does is seen from outside: the
//! etcd keys of a lock's directory (`<prefix>{key}/s`, `<prefix>{key}/h/<side>/<owner>`) and their
//! leases, read with a raw `etcd-client` of the test's own. Tests that kill, freeze or turn
//! auth on start their own members ([`EtcdCluster`], [`EtcdServer`]); the others share the
//! binary's ([`shared_etcd`]), each under a key prefix of its own. Neighbours: `etcd_server.rs`
//! checks the test support's members themselves; the conformance suite (`tests/conformance`,
//! `etcd_store`) runs every kind's rules on etcd.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock::{BackendErrorKind, Client, Config, LockError, LockGuard};
use etcd_client::{Client as RawClient, GetOptions};
use tokio::sync::watch;
use tokio::time::{sleep, timeout, Instant};

use crate::support::etcd::{shared_etcd, EtcdCluster, EtcdServer, LEADER_TIMEOUT};
use crate::support::proxy::{Mode, Proxy};

/// The store's default key prefix, which the tests on members of their own keep.
const PREFIX: &str = "distlock:";

/// How long a raw request of the test's own may take on a loaded machine.
const ANSWER: Duration = Duration::from_secs(10);

/// What a request may overrun its wait by on a loaded 2-core machine (its last try is cut off
/// at the wait, the clean-up after it is not waited for).
const WAIT_MARGIN: Duration = Duration::from_millis(1500);

/// etcd's minimum lease at its default election timeout (1 s): 1.5 of it, in whole seconds.
const MIN_TTL: Duration = Duration::from_secs(2);

/// etcd's expiry scan runs every 500 ms; with a loaded machine's delays, a lease is revoked
/// within this of its end.
const EXPIRY_SLACK: Duration = Duration::from_millis(1500);

/// A follower of `cluster` (its index), and every member's endpoint with that follower's
/// first: the member a client uses until it fails.
async fn a_follower_first(cluster: &EtcdCluster) -> (usize, Vec<String>) {
    let first = (cluster.leader().await + 1) % 3;
    let mut endpoints = vec![cluster.member(first).endpoint()];
    endpoints.extend(
        (0..3)
            .filter(|&index| index != first)
            .map(|index| cluster.member(index).endpoint()),
    );
    (first, endpoints)
}

/// A client config for `endpoints`, with the default response and connect timeouts (1 s, 2 s)
/// spelled out: the fault tests' margins are counted from them.
fn config<S: AsRef<str>>(endpoints: impl IntoIterator<Item = S>) -> Config {
    Config::etcd(endpoints)
        .expect("etcd endpoints")
        .response_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(2))
}

fn client(config: Config) -> Client {
    Client::new(config).expect("a valid config")
}

/// A client of the shared member whose locks live under `prefix` (one per test).
fn shared_client(prefix: &str) -> Client {
    client(config([shared_etcd().endpoint()]).key_prefix(prefix))
}

/// The etcd key prefix of lock `key`'s directory under `prefix`.
fn directory(prefix: &str, key: &str) -> String {
    format!("{prefix}{{{key}}}/")
}

/// One grant's etcd key, as etcd has it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GrantKey {
    owner: String,
    /// The value the store wrote: `"<slot> <ttl secs>"`.
    value: String,
    /// `w`, `r` or `p`: the side of the lock the grant holds.
    side: String,
    create_revision: i64,
    mod_revision: i64,
    lease: i64,
}

/// The grants' keys (`…/h/<side>/<owner>`) of lock `key` under `prefix`, read through `raw`.
async fn grant_keys(raw: &mut RawClient, prefix: &str, key: &str) -> Vec<GrantKey> {
    let holders = format!("{}h/", directory(prefix, key));
    let reply = timeout(
        ANSWER,
        raw.get(holders.as_str(), Some(GetOptions::new().with_prefix())),
    )
    .await
    .unwrap_or_else(|_| panic!("no answer to a read of {holders} in {ANSWER:?}"))
    .unwrap_or_else(|err| panic!("read {holders}: {err}"));
    reply
        .kvs()
        .iter()
        .map(|kv| GrantKey {
            // `<side>/<owner>`: the owner alone.
            owner: String::from_utf8_lossy(&kv.key()[holders.len()..])
                .split_once('/')
                .map_or_else(String::new, |(_, owner)| owner.to_owned()),
            side: String::from_utf8_lossy(&kv.key()[holders.len()..])
                .split_once('/')
                .map_or_else(String::new, |(side, _)| side.to_owned()),
            value: String::from_utf8_lossy(kv.value()).into_owned(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            lease: kv.lease(),
        })
        .collect()
}

/// The one grant's key of lock `key`; panics if there is not exactly one.
async fn only_grant_key(raw: &mut RawClient, prefix: &str, key: &str) -> GrantKey {
    match grant_keys(raw, prefix, key).await.as_slice() {
        [grant] => grant.clone(),
        other => panic!("lock {key}: not one grant's key in etcd: {other:?}"),
    }
}

/// A key's value and mod revision, if etcd has it.
async fn raw_get(raw: &mut RawClient, key: &str) -> Option<(String, i64)> {
    let reply = timeout(ANSWER, raw.get(key, None))
        .await
        .unwrap_or_else(|_| panic!("no answer to a read of {key} in {ANSWER:?}"))
        .unwrap_or_else(|err| panic!("read {key}: {err}"));
    reply.kvs().first().map(|kv| {
        (
            String::from_utf8_lossy(kv.value()).into_owned(),
            kv.mod_revision(),
        )
    })
}

/// Puts `key` = `value` through `raw` (root's, where auth is on).
async fn raw_put(raw: &mut RawClient, key: &str, value: &str) {
    timeout(ANSWER, raw.put(key, value, None))
        .await
        .unwrap_or_else(|_| panic!("no answer to a put of {key} in {ANSWER:?}"))
        .unwrap_or_else(|err| panic!("put {key}: {err}"));
}

/// The fencing token of `guard`, as a number.
fn token(guard: &LockGuard) -> u64 {
    guard.fencing_token().expect("a fenced grant").get()
}

/// Whether `err` is what a request that etcd could not answer linearizably ends with: a store
/// error of kind `Unavailable` (no leader) or `Timeout` (no answer), or the request's own
/// timeout.
fn unavailable(err: &LockError) -> bool {
    match err {
        // With etcd's advice, never Redis' (a try cut off by its wait once said "Redis did not
        // answer in time").
        LockError::Backend(err) if err.to_string().contains("Redis") => false,
        LockError::Backend(err) => matches!(
            err.kind(),
            BackendErrorKind::Unavailable | BackendErrorKind::Timeout
        ),
        LockError::Timeout { .. } => true,
        _ => false,
    }
}

// --- A leader SIGKILLed under contention --------------------------------------------------

/// A resource the holders of one lock write to with their fencing tokens, which notes what
/// must never happen: two holders inside at once, a write whose token is not above the last.
#[derive(Default)]
struct Fenced {
    inside: AtomicU32,
    /// The token of the last accepted write.
    last: Mutex<u64>,
    /// Writes accepted so far.
    writes: watch::Sender<u64>,
    /// What went wrong: overlaps, stale tokens, requests past their wait.
    faults: Mutex<Vec<String>>,
    /// Failed requests and releases (expected while there is no leader), for the log.
    errors: Mutex<Vec<String>>,
}

impl Fenced {
    fn fault(&self, what: String) {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what);
    }

    fn error(&self, what: String) {
        self.errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what);
    }

    /// The work under the lock: in, a write with `token`, out.
    async fn write(&self, token: u64) {
        let before = self.inside.fetch_add(1, Ordering::SeqCst);
        if before != 0 {
            self.fault(format!(
                "token {token} entered with {before} other holder(s) inside"
            ));
        }
        {
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            if token <= *last {
                self.fault(format!("token {token} wrote after token {}", *last));
            }
            *last = token.max(*last);
        }
        // The work itself: a holder stays inside a moment, so that an overlap would show.
        sleep(Duration::from_millis(3)).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
        self.writes.send_modify(|writes| *writes += 1);
    }

    /// Waits until `count` writes were accepted, for at most `within`.
    async fn wait_for_writes(&self, count: u64, within: Duration, what: &str) {
        let mut writes = self.writes.subscribe();
        let reached = timeout(within, writes.wait_for(|writes| *writes >= count)).await;
        assert!(
            reached.is_ok(),
            "{what}: {} writes after {within:?}, not {count}; faults so far: {:?}; {}",
            *self.writes.borrow(),
            self.faults.lock().unwrap_or_else(PoisonError::into_inner),
            self.errors_seen()
        );
    }

    /// How many requests and releases failed, and the first few failures (shortened).
    fn errors_seen(&self) -> String {
        let errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        let first: Vec<String> = errors
            .iter()
            .take(3)
            .map(|error| error.chars().take(300).collect())
            .collect();
        format!("{} errors, the first: {first:?}", errors.len())
    }
}

/// One contender: takes `key` through `client` again and again until `stop`, writes to
/// `fenced` while it holds it, and gives it back.
async fn contend(client: Client, key: &'static str, fenced: Arc<Fenced>, stop: Arc<AtomicBool>) {
    let wait = Duration::from_secs(5);
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        let acquired = client
            .lock(key)
            .lease(Duration::from_secs(3))
            .wait(wait)
            .acquire()
            .await;
        let took = sent.elapsed();
        if took > wait + WAIT_MARGIN {
            fenced.fault(format!("a request with a wait of {wait:?} took {took:?}"));
        }
        match acquired {
            Ok(guard) => {
                fenced.write(token(&guard)).await;
                if let Err(err) = guard.release().await {
                    fenced.error(format!("release: {err}"));
                }
            }
            Err(err) => {
                fenced.error(format!("acquire after {took:?}: {err}"));
                // Not a wait for anything: a failing request is not sent again at once.
                sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Pitfall 7's second half and issue 39's "show it": four contenders on two clients of every
/// member take one lock with a fenced resource behind it while the leader is SIGKILLed. No
/// two holders are ever inside, every write's token is above the one before, no request
/// overruns its wait, grants go on once a new leader is elected, the killed member restarted
/// rejoins (it serves what was written while it was down) and grants go on with it back;
/// nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_go_on_across_a_killed_leader_with_one_holder_inside_and_tokens_rising() {
    kill_the_leader_under_contention("etcdf:leader-killed", Endpoints::Every).await;
}

/// The same with clients of the two followers alone, so that no request is sent to the
/// killed member: what the leader's death costs by itself — the election — with the fenced
/// resource's checks (no two holders inside, tokens rising), apart from a client's moving
/// off a dead endpoint (which the test above and the member-loss test take in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_go_on_through_the_followers_across_a_killed_leader_with_tokens_rising() {
    kill_the_leader_under_contention("etcdf:leader-killed-followers", Endpoints::Followers).await;
}

/// Which members the contenders' clients are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoints {
    Every,
    /// Every member but the leader, which the test kills.
    Followers,
}

/// The scenario of the two tests above, on `key`.
async fn kill_the_leader_under_contention(key: &'static str, endpoints: Endpoints) {
    let mut cluster = EtcdCluster::start();
    let old = cluster.leader().await;
    let given: Vec<String> = (0..3)
        .filter(|&index| endpoints == Endpoints::Every || index != old)
        .map(|index| cluster.member(index).endpoint())
        .collect();
    let fenced = Arc::new(Fenced::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clients = [client(config(&given)), client(config(&given))];
    let contenders: Vec<_> = clients
        .iter()
        .flat_map(|client| [client.clone(), client.clone()])
        .map(|client| tokio::spawn(contend(client, key, fenced.clone(), stop.clone())))
        .collect();

    fenced
        .wait_for_writes(10, Duration::from_secs(10), "before the kill")
        .await;
    cluster.kill(old);
    let killed = Instant::now();
    let new = cluster.wait_for_leader(LEADER_TIMEOUT, Some(old)).await;
    let elected = *fenced.writes.borrow();
    eprintln!(
        "member {new} leads {:?} after member {old} was killed, {elected} writes so far",
        killed.elapsed()
    );
    fenced
        .wait_for_writes(
            elected + 10,
            Duration::from_secs(10),
            "after the new leader's election",
        )
        .await;

    cluster.restart(old);
    cluster.wait_for_leader(LEADER_TIMEOUT, None).await;
    // The restarted member has what was written while it was down: its own (serializable)
    // view reaches the revision the leader had once it was back.
    let mut leader = cluster.member(new).client().await;
    let mut rejoined = cluster.member(old).client().await;
    let written = timeout(ANSWER, leader.get(key, None))
        .await
        .expect("the leader answers")
        .expect("a read on the leader")
        .header()
        .expect("a header")
        .revision();
    let mut caught_up = false;
    for _ in 0..100 {
        let local = timeout(
            ANSWER,
            rejoined.get(key, Some(GetOptions::new().with_serializable())),
        )
        .await
        .expect("the rejoined member answers")
        .expect("a serializable read on the rejoined member")
        .header()
        .expect("a header")
        .revision();
        if local >= written {
            caught_up = true;
            break;
        }
        sleep(Duration::from_millis(50)).await;
    }
    assert!(
        caught_up,
        "the restarted member never caught up with revision {written}"
    );
    let back = *fenced.writes.borrow();
    fenced
        .wait_for_writes(
            back + 5,
            Duration::from_secs(10),
            "after the member rejoined",
        )
        .await;

    stop.store(true, Ordering::SeqCst);
    for contender in contenders {
        timeout(Duration::from_secs(15), contender)
            .await
            .expect("a contender ends within its wait")
            .expect("a contender's task");
    }
    eprintln!(
        "{} writes; {}",
        *fenced.writes.borrow(),
        fenced.errors_seen()
    );
    let faults = fenced
        .faults
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert!(faults.is_empty(), "faults: {faults:?}");
    // A release that failed while there was no leader leaves its key until its lease (3 s)
    // runs out on the server; none is left after that.
    let mut raw = cluster.member(new).client().await;
    let deadline = Instant::now() + Duration::from_secs(3) + EXPIRY_SLACK + WAIT_MARGIN;
    loop {
        let left = grant_keys(&mut raw, PREFIX, key).await;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "grants left held by nobody: {left:?}"
        );
        sleep(Duration::from_millis(100)).await;
    }
}

// --- Quorum lost and regained -------------------------------------------------------------

/// Issue 39, item 3: with two of three members frozen (the leader among them), a request with
/// a wait of 2 s ends within about its wait with an error, and a try within about the
/// response timeout; neither grants anything. Once the members are thawed and a leader is
/// elected, a request is granted with a token above every earlier one. The errors are of the
/// kinds `docs/etcd.md` names for a lost quorum — `Unavailable` (no leader) or `Timeout` (no
/// answer) — or the request's own timeout (checked last, after the rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_lost_ends_requests_within_their_wait_with_an_error_and_grants_nothing() {
    quorum_lost_and_regained(Duration::from_secs(1)).await;
}

/// [`quorum_lost_ends_requests_within_their_wait_with_an_error_and_grants_nothing`] at a
/// response timeout far past every wait and lease ([`LARGEST_RESPONSE_TIMEOUT`]: `Config`
/// sets no bound): a request still ends within its wait (a try that does not wait is bounded
/// by the response timeout, so it is not sent here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_lost_ends_requests_within_their_wait_at_the_largest_response_timeout() {
    quorum_lost_and_regained(LARGEST_RESPONSE_TIMEOUT).await;
}

/// A response timeout far past every wait and lease of these tests: the largest setting a
/// test can tell from an unbounded one (`Config` accepts any).
const LARGEST_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3600);

async fn quorum_lost_and_regained(response_timeout: Duration) {
    let cluster = EtcdCluster::start();
    let store = client(config(cluster.endpoints()).response_timeout(response_timeout));
    let key = "etcdf:quorum";
    let before = store.lock(key).acquire().await.expect("acquire");
    let earlier = token(&before);
    assert!(before.release().await.expect("release"));

    let leader = cluster.leader().await;
    let frozen = [leader, (leader + 1) % 3];
    let survivor = (leader + 2) % 3;
    for member in frozen {
        cluster.freeze(member);
    }

    let mut other_kinds = Vec::new();
    let wait = Duration::from_secs(2);
    for round in 0..2 {
        let sent = Instant::now();
        let outcome = store.lock(key).wait(wait).acquire().await;
        let took = sent.elapsed();
        eprintln!("request {round} without a quorum: {took:?}, {outcome:?}");
        match outcome {
            Err(err) if unavailable(&err) => {}
            Err(err) => other_kinds.push(format!("request {round}: {err:?}")),
            Ok(guard) => panic!("request {round} without a quorum was granted: {guard:?}"),
        }
        assert!(
            took <= wait + WAIT_MARGIN,
            "request {round} without a quorum took {took:?}, its wait is {wait:?}"
        );
    }
    if response_timeout < LARGEST_RESPONSE_TIMEOUT {
        let sent = Instant::now();
        let tried = store.lock(key).try_acquire().await;
        let took = sent.elapsed();
        eprintln!("a try without a quorum: {took:?}, {tried:?}");
        match tried {
            Err(err) if unavailable(&err) => {}
            Err(err) => other_kinds.push(format!("the try: {err:?}")),
            // A try cut off unanswered reads as "held": nothing granted either way.
            Ok(None) => {}
            Ok(Some(guard)) => panic!("a try without a quorum was granted: {guard:?}"),
        }
        assert!(
            took <= response_timeout + WAIT_MARGIN,
            "a try without a quorum took {took:?}, its response timeout is {response_timeout:?}"
        );
    }

    for member in frozen {
        cluster.thaw(member);
    }
    cluster.wait_for_leader(LEADER_TIMEOUT, None).await;
    let mut raw = cluster.member(survivor).client().await;
    let left = grant_keys(&mut raw, PREFIX, key).await;
    assert!(
        left.is_empty(),
        "a request without a quorum left a grant: {left:?}"
    );
    let after = store
        .lock(key)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire once a majority is back");
    assert!(
        token(&after) > earlier,
        "token {} after the quorum came back, {earlier} before",
        token(&after)
    );
    assert_eq!(
        only_grant_key(&mut raw, PREFIX, key).await.create_revision,
        i64::try_from(token(&after)).expect("a revision"),
        "the token is not the grant's key's create revision"
    );
    assert!(after.release().await.expect("release"));
    assert!(
        other_kinds.is_empty(),
        "without a quorum, not an Unavailable or Timeout error: {other_kinds:?}"
    );
}

// --- A member SIGKILLed -------------------------------------------------------------------

/// Issue 39, item 3 ("the client moves to another endpoint when one dies"): the member listed
/// first in the endpoints (a follower: no election here) is SIGKILLed. A grant held across it
/// keeps being renewed through the others for more than its lease; a client that was using
/// every member, and one made after the kill with the dead member still listed first, are
/// each granted and give back again and again (a key per round, so that one failure does not
/// hold the next round up), every request within its wait and without an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_listed_first_leaves_requests_to_the_others_within_their_wait() {
    let mut cluster = EtcdCluster::start();
    let (first, endpoints) = a_follower_first(&cluster).await;
    let before = client(config(&endpoints));
    let lease = Duration::from_secs(3);
    let held = before
        .lock("etcdf:member-held")
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");
    // Every member has served this client before the kill.
    for round in 0..6 {
        let guard = before
            .lock("etcdf:member")
            .acquire()
            .await
            .unwrap_or_else(|err| panic!("acquire {round} before the kill: {err}"));
        assert!(guard.release().await.expect("release"));
    }

    cluster.kill(first);
    let killed = Instant::now();
    let after = client(config(&endpoints));
    let wait = Duration::from_secs(3);
    let mut failures = Vec::new();
    let mut cycles = 0;
    for (who, store) in [("old", &before), ("new", &after)] {
        for round in 0..8 {
            cycles += 1;
            let key = format!("etcdf:member-{who}-{round}");
            let sent = Instant::now();
            let acquired = store.lock(key.as_str()).wait(wait).acquire().await;
            let took = sent.elapsed();
            if took > wait {
                failures.push(format!(
                    "{who} client: acquire {round} took {took:?}, its wait is {wait:?}"
                ));
            }
            match acquired {
                Ok(guard) => match guard.release().await {
                    Ok(true) => {}
                    other => failures.push(format!("{who} client: release {round}: {other:?}")),
                },
                Err(err) => failures.push(format!(
                    "{who} client: acquire {round} after {took:?}: {err}"
                )),
            }
        }
    }
    // More than a lease after the kill, the grant is still held: renewed through the others.
    let lost = timeout(
        (lease + Duration::from_secs(1)).saturating_sub(killed.elapsed()),
        held.lost(),
    )
    .await;
    assert!(
        lost.is_err(),
        "the grant held across the kill was lost {:?} after it",
        killed.elapsed()
    );
    assert!(held.is_held());
    match held.release().await {
        Ok(true) => {}
        other => failures.push(format!("the release of the grant held across: {other:?}")),
    }
    let shown: Vec<String> = failures
        .iter()
        .take(3)
        .map(|failure| failure.chars().take(400).collect())
        .collect();
    assert!(
        failures.is_empty(),
        "with member {first} (listed first) killed, {} failures in {cycles} acquire-release \
         cycles and a release; the first: {shown:#?}",
        failures.len()
    );
}

/// A member frozen (SIGSTOP) keeps its connections open and answers nothing, which no
/// connection error reveals: the member listed first (a follower: no election) is frozen
/// while a client uses it. A grant held across the freeze keeps being renewed through the
/// others for more than its lease, and six acquire-release cycles on that client are each
/// granted within their wait: the first request without an answer moves the client on.
/// Shown to fail (every request timed out against the frozen member, the grant lost) while
/// only a failed or broken connection moved the client on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_member_listed_first_leaves_requests_to_the_others_within_their_wait() {
    let cluster = EtcdCluster::start();
    let (first, endpoints) = a_follower_first(&cluster).await;
    let store = client(config(&endpoints));
    let lease = Duration::from_secs(3);
    let held = store
        .lock("etcdf:frozen-held")
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");

    cluster.freeze(first);
    let frozen = Instant::now();
    let wait = Duration::from_secs(3);
    let mut failures = Vec::new();
    for round in 0..6 {
        let key = format!("etcdf:frozen-{round}");
        let sent = Instant::now();
        let acquired = store.lock(key.as_str()).wait(wait).acquire().await;
        let took = sent.elapsed();
        if took > wait + WAIT_MARGIN {
            failures.push(format!(
                "acquire {round} took {took:?}, its wait is {wait:?}"
            ));
        }
        match acquired {
            Ok(guard) => match guard.release().await {
                Ok(true) => {}
                other => failures.push(format!("release {round}: {other:?}")),
            },
            Err(err) => failures.push(format!("acquire {round} after {took:?}: {err}")),
        }
    }
    // More than a lease after the freeze, the grant is still held: renewed through the others.
    let lost = timeout(
        (lease + Duration::from_secs(1)).saturating_sub(frozen.elapsed()),
        held.lost(),
    )
    .await;
    let renewed = lost.is_err() && held.is_held();
    let lasted = frozen.elapsed();
    cluster.thaw(first);
    assert!(
        renewed,
        "the grant held across the freeze was lost {lasted:?} after it"
    );
    match held.release().await {
        Ok(true) => {}
        other => failures.push(format!("the release of the grant held across: {other:?}")),
    }
    let shown: Vec<String> = failures
        .iter()
        .take(3)
        .map(|failure| failure.chars().take(400).collect())
        .collect();
    assert!(
        failures.is_empty(),
        "with member {first} (listed first) frozen, {} failures in six acquire-release cycles \
         and a release; the first: {shown:#?}",
        failures.len()
    );
}

// --- A holder that stops renewing ---------------------------------------------------------

/// Pitfall 1 (a holder that keeps believing after its lease is gone): a holder that stops
/// renewing (watchdog off, lease 1 s — etcd's 2 s) and never gives the lock back (its guard
/// forgotten: no release is ever sent) is told its grant is lost by its own deadline, 1 s
/// after its request, before etcd frees the lock. A waiter of another client is granted only
/// once etcd has expired the lease — at least etcd's 2 s after the grant, at most 2 s plus
/// the expiry scan and a margin — with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_stops_renewing_loses_the_lock_when_etcd_expires_its_lease() {
    let prefix = "etcdf-stops:";
    let (old, new) = (shared_client(prefix), shared_client(prefix));
    let key = "etcdf:stops-renewing";
    let lease = Duration::from_secs(1);
    let sent = Instant::now();
    let holder = old
        .lock(key)
        .lease(lease)
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    let old_token = token(&holder);
    let waiting = tokio::spawn({
        let request = new.lock(key).wait(Duration::from_secs(8));
        async move {
            let guard = request.acquire().await;
            (guard, Instant::now())
        }
    });

    timeout(lease + WAIT_MARGIN, holder.lost())
        .await
        .expect("the holder is told its grant is lost at its deadline");
    let lost_at = Instant::now();
    assert!(!holder.is_held());
    // A frozen holder: it never releases.
    std::mem::forget(holder);

    let (granted, granted_at) = waiting.await.expect("the waiter's task");
    let granted = granted.expect("the waiter is granted once etcd expires the lease");
    let after = granted_at - sent;
    eprintln!(
        "lost {:?} after the request, taken over {after:?} after it",
        lost_at - sent
    );
    assert!(
        lost_at < granted_at,
        "the holder learnt of its loss only after the takeover"
    );
    assert!(
        after >= MIN_TTL,
        "taken over {after:?} after the request: before etcd's minimum lease ({MIN_TTL:?})"
    );
    assert!(
        after <= MIN_TTL + EXPIRY_SLACK + WAIT_MARGIN,
        "taken over {after:?} after the request: etcd's lease is {MIN_TTL:?}"
    );
    assert!(
        token(&granted) > old_token,
        "token {} after {old_token}",
        token(&granted)
    );
    assert!(granted.release().await.expect("release"));
}

/// Pitfalls 1 and 6 (a keep-alive stream that stalls silently): a holder whose connection to
/// etcd goes silent (a proxy that forwards nothing and closes nothing) with its watchdog on
/// (lease 1 s, etcd's 2 s) is told its grant is lost at its deadline — before etcd frees the
/// lock to a waiter of another client, which gets a higher token. Once the link is back, the
/// old holder's release says the lock was no longer its own, and the new holder keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_from_etcd_is_told_before_etcd_frees_its_lock() {
    holder_cut_off(Duration::from_secs(1)).await;
}

/// [`a_holder_cut_off_from_etcd_is_told_before_etcd_frees_its_lock`] with the holder at a
/// response timeout far past its lease ([`LARGEST_RESPONSE_TIMEOUT`]): its renewals' deadline,
/// not their response timeout, tells it of the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_at_the_largest_response_timeout_is_told_before_etcd_frees_its_lock() {
    holder_cut_off(LARGEST_RESPONSE_TIMEOUT).await;
}

async fn holder_cut_off(response_timeout: Duration) {
    let server = EtcdServer::start();
    let proxy = Proxy::start(server.port());
    let cut_off = client(
        config([format!("http://127.0.0.1:{}", proxy.port())]).response_timeout(response_timeout),
    );
    let other = client(config([server.endpoint()]));
    let key = "etcdf:cut-off";
    let lease = Duration::from_secs(1);
    let holder = cut_off
        .lock(key)
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");
    let old_token = token(&holder);
    // Renewals went through: it holds past its lease first.
    let lost = timeout(lease + lease / 2, holder.lost()).await;
    assert!(lost.is_err(), "the holder lost its grant with the link up");

    proxy.set_mode(Mode::Stall);
    let stalled = Instant::now();
    let waiting = tokio::spawn({
        let request = other.lock(key).wait(Duration::from_secs(8));
        async move {
            let guard = request.acquire().await;
            (guard, Instant::now())
        }
    });
    timeout(lease + WAIT_MARGIN, holder.lost())
        .await
        .expect("the holder is told its grant is lost at its deadline");
    let lost_at = Instant::now();
    assert!(!holder.is_held());
    let (granted, granted_at) = waiting.await.expect("the waiter's task");
    let granted = granted.expect("the waiter is granted once etcd expires the lease");
    eprintln!(
        "lost {:?} after the stall, taken over {:?} after it",
        lost_at - stalled,
        granted_at - stalled
    );
    assert!(
        lost_at < granted_at,
        "the holder learnt of its loss only after the takeover"
    );
    assert!(
        granted_at - stalled <= MIN_TTL + EXPIRY_SLACK + WAIT_MARGIN,
        "taken over {:?} after the stall: etcd's lease is {MIN_TTL:?}",
        granted_at - stalled
    );
    assert!(token(&granted) > old_token);

    proxy.set_mode(Mode::Pass);
    let released = holder.release().await;
    assert!(
        matches!(released, Ok(false) | Err(LockError::LeaseLost { .. })),
        "the cut-off holder's release: {released:?}"
    );
    assert!(granted.is_held());
    let mut raw = server.client().await;
    let kept = only_grant_key(&mut raw, PREFIX, key).await;
    assert_eq!(
        kept.create_revision,
        i64::try_from(token(&granted)).expect("a revision")
    );
    assert!(granted.release().await.expect("release"));
}

// --- Lease granularity --------------------------------------------------------------------

/// Pitfall 7: etcd leases are whole seconds, raised to the server's minimum (2 s at the
/// default election timeout). A grant's lease is rounded up to the next second and then taken
/// as etcd grants it: 300 ms, 1 s and 1.5 s live on leases etcd reports as 2 s, 2.5 s on one
/// of 3 s, and the grant's key (`…/h/w/<owner>`) says so (its value: the TTL), as `docs/etcd.md` states. The holder's
/// own view is the lease it asked for: a 300 ms grant without renewals is lost to its holder
/// within about 300 ms, while etcd still has its key.
#[tokio::test]
async fn a_lease_is_rounded_up_to_whole_seconds_and_etcds_minimum() {
    let prefix = "etcdf-granularity:";
    let store = shared_client(prefix);
    let mut raw = shared_etcd().client().await;
    for (asked, granted_secs) in [
        (Duration::from_millis(300), 2),
        (Duration::from_secs(1), 2),
        (Duration::from_millis(1500), 2),
        (Duration::from_millis(2500), 3),
    ] {
        let key = format!("etcdf:lease-{}ms", asked.as_millis());
        let guard = store
            .lock(key.as_str())
            .lease(asked)
            .acquire()
            .await
            .expect("acquire");
        let grant = only_grant_key(&mut raw, prefix, &key).await;
        assert_eq!(
            grant.value,
            format!("{granted_secs}"),
            "the grant's key of a {asked:?} lease"
        );
        let lease = timeout(ANSWER, raw.lease_time_to_live(grant.lease, None))
            .await
            .expect("an answer")
            .expect("the grant's lease");
        assert_eq!(
            lease.granted_ttl(),
            granted_secs,
            "the etcd lease of a {asked:?} grant"
        );
        assert!(lease.ttl() > 0 && lease.ttl() <= granted_secs);
        assert!(guard.release().await.expect("release"));
    }

    let key = "etcdf:lease-local";
    let asked = Duration::from_millis(300);
    let sent = Instant::now();
    let guard = store
        .lock(key)
        .lease(asked)
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    timeout(asked + Duration::from_millis(700), guard.lost())
        .await
        .expect("the holder's own deadline is the lease it asked for");
    let lost_after = sent.elapsed();
    let grant = only_grant_key(&mut raw, prefix, key).await;
    let left = timeout(ANSWER, raw.lease_time_to_live(grant.lease, None))
        .await
        .expect("an answer")
        .expect("the grant's lease")
        .ttl();
    assert!(
        left > 0,
        "etcd's lease had run out {lost_after:?} after the request"
    );
    let released = guard.release().await;
    eprintln!("the release of a grant lost to its holder but still in etcd: {released:?}");
}

// --- Blind unlock -------------------------------------------------------------------------

/// Pitfall 9 (etcd's own `Unlock` deletes whatever key it is given): A's lease runs out
/// (no renewals), B is granted, and A's release then says the lock was no longer A's — and
/// leaves B's grant alone: B's key is still in etcd with B's token as its create revision, B
/// holds, and a third client finds the lock held until B gives it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_lease_ran_out_leaves_the_next_holder_alone() {
    let prefix = "etcdf-blind:";
    let (a, b, c) = (
        shared_client(prefix),
        shared_client(prefix),
        shared_client(prefix),
    );
    let mut raw = shared_etcd().client().await;
    let key = "etcdf:blind-unlock";
    let old = a
        .lock(key)
        .lease(Duration::from_secs(1))
        .watchdog(false)
        .acquire()
        .await
        .expect("A's acquire");
    let old_key = only_grant_key(&mut raw, prefix, key).await;
    timeout(Duration::from_secs(3), old.lost())
        .await
        .expect("A's lease runs out");
    let new = b
        .lock(key)
        .wait(Duration::from_secs(6))
        .acquire()
        .await
        .expect("B's acquire after A's lease ran out");
    let new_key = only_grant_key(&mut raw, prefix, key).await;
    assert_ne!(new_key.owner, old_key.owner);

    let released = old.release().await;
    assert!(
        matches!(released, Ok(false) | Err(LockError::LeaseLost { .. })),
        "A's release after its lease ran out: {released:?}"
    );
    assert_eq!(
        grant_keys(&mut raw, prefix, key).await,
        std::slice::from_ref(&new_key),
        "A's release touched B's grant"
    );
    assert_eq!(
        new_key.create_revision,
        i64::try_from(token(&new)).expect("a revision")
    );
    assert!(new.is_held());
    let third = c.lock(key).try_acquire().await.expect("C's try");
    assert!(third.is_none(), "C was granted the lock B holds");
    assert!(new.release().await.expect("B's release"));
    assert!(grant_keys(&mut raw, prefix, key).await.is_empty());
}

/// The transactions of an uncontended cycle, counted by a member of the test's own (its gRPC
/// counters): a free key's write lock (one key or several) is taken without a read — one
/// transaction that creates the grant if the key is free, else brings the key back as the
/// read (`FirstTry::Blind`, `store/etcd/transaction.rs`) — and given back in one per key
/// (`store/etcd/give_back.rs`); a read lock is read first (it shares the key) and given back
/// in one; a fair lock (its queue is bookkeeping) reads first both ways. A try on a held key
/// costs one transaction. Each release frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_write_lock_is_one_transaction_each_way() {
    let member = EtcdServer::start();
    let (client, other) = (
        client(config([member.endpoint()])),
        client(config([member.endpoint()])),
    );
    // What: (transactions to acquire, to release; a multi-key grant's keys are given back one
    // by one, at once).
    for (what, expected) in [
        ("write", (1, 1)),
        ("multi", (1, 2)),
        ("read", (2, 1)),
        ("fair", (2, 2)),
    ] {
        let key = format!("cycle-{what}");
        let second = format!("cycle-{what}-2");
        let before = member.grpc_calls("Txn").await;
        let guard = match what {
            "write" => client.lock(&key).acquire().await,
            "multi" => {
                client
                    .lock_all([key.as_str(), second.as_str()])
                    .acquire()
                    .await
            }
            "read" => client.read_lock(&key).acquire().await,
            _ => client.lock(&key).fair().acquire().await,
        }
        .unwrap_or_else(|err| panic!("{what}: {err}"));
        let taken = member.grpc_calls("Txn").await - before;
        if what == "write" {
            let before = member.grpc_calls("Txn").await;
            let refused = other
                .lock(&key)
                .try_acquire()
                .await
                .expect("the other's try");
            assert!(refused.is_none(), "the other was granted a held lock");
            let tried = member.grpc_calls("Txn").await - before;
            assert_eq!(
                tried, 1,
                "a try on a held key sent {tried} transactions, not 1"
            );
        }
        let before = member.grpc_calls("Txn").await;
        assert!(
            guard.release().await.expect("release"),
            "{what}: the release found the grant gone"
        );
        let given = member.grpc_calls("Txn").await - before;
        assert_eq!(
            (taken, given),
            expected,
            "{what}: (transactions to acquire, to release)"
        );
        for key in [&key, &second] {
            let state = client.inspect(key).await.expect("inspect");
            assert!(
                !state.is_locked(),
                "{what}: {key} held after the release: {state:?}"
            );
        }
    }
}

// --- Least privilege ----------------------------------------------------------------------

/// Issue 39, item 4: with auth on, the store runs as a user whose role has read and write on
/// the key prefix alone. Every kind works (exclusive, read, semaphore, fair, `lock_all`), and
/// a waiter is woken by the watch (its backoff step is 5 s, it is granted within 1 s of the
/// release). Keys outside the prefix that root wrote are untouched. A key root put inside a
/// lock's directory that is not the store's makes a request on that lock fail at once with an
/// error that says so, and the key is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_privileged_user_runs_every_kind_and_leaves_other_keys_alone() {
    let server = EtcdServer::start();
    let (user, password) = server.enable_auth(PREFIX).await;
    let mut root = server.client().await;
    let outside = ["other:{etcdf:x}/s", "distlock", "distlock;{etcdf:x}/s"];
    for key in outside {
        raw_put(&mut root, key, "root's").await;
    }
    let mut untouched = Vec::new();
    for key in outside {
        untouched.push(raw_get(&mut root, key).await);
    }
    let limited = || client(config([server.endpoint()]).etcd_user(&user, &password));
    let store = limited();

    let write = store.lock("etcdf:lp").acquire().await.expect("exclusive");
    assert!(write.release().await.expect("release"));
    let readers = [
        store.read_lock("etcdf:lp").acquire().await.expect("read"),
        store.read_lock("etcdf:lp").acquire().await.expect("read"),
    ];
    let writer = store.lock("etcdf:lp").try_acquire().await.expect("try");
    assert!(writer.is_none(), "a writer got in beside two readers");
    for reader in readers {
        assert!(reader.release().await.expect("release"));
    }
    let permits = [
        store
            .semaphore("etcdf:lp-sem", 2)
            .acquire()
            .await
            .expect("a permit"),
        store
            .semaphore("etcdf:lp-sem", 2)
            .acquire()
            .await
            .expect("a permit"),
    ];
    let third = store
        .semaphore("etcdf:lp-sem", 2)
        .try_acquire()
        .await
        .expect("try");
    assert!(third.is_none(), "a third permit of two");
    for permit in permits {
        assert!(permit.release().await.expect("release"));
    }
    let fair = store
        .lock("etcdf:lp-fair")
        .fair()
        .acquire()
        .await
        .expect("fair");
    assert!(fair.release().await.expect("release"));
    let all = store
        .lock_all(["etcdf:lp-a", "etcdf:lp-b"])
        .acquire()
        .await
        .expect("lock_all");
    assert!(all.release().await.expect("release"));

    // A wake-up through the watch, which the limited user's role must allow too.
    let waiter = client(
        config([server.endpoint()])
            .etcd_user(&user, &password)
            .backoff(Duration::from_secs(5), Duration::from_secs(5)),
    );
    let key = "etcdf:lp-wake";
    let held = store.lock(key).acquire().await.expect("acquire");
    let waiting = tokio::spawn({
        let request = waiter.lock(key).wait(Duration::from_secs(10));
        async move {
            let guard = request.acquire().await;
            (guard, Instant::now())
        }
    });
    // Its first try was refused: its writer-waiting mark is in the bookkeeping.
    let state = format!("{}s", directory(PREFIX, key));
    let deadline = Instant::now() + ANSWER;
    loop {
        match raw_get(&mut root, &state).await {
            Some((json, _)) if json.contains("\"ww\"") => break,
            other => assert!(
                Instant::now() < deadline,
                "the waiter never tried: {other:?}"
            ),
        }
        sleep(Duration::from_millis(10)).await;
    }
    // From the mark's write to the waiter's pause: its reply's way back, nothing to watch.
    sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    assert!(held.release().await.expect("release"));
    let (woken, granted_at) = waiting.await.expect("the waiter's task");
    let woken = woken.expect("the waiter's acquire");
    assert!(
        granted_at - released < Duration::from_secs(1),
        "the waiter took {:?} after the release: not woken by the watch",
        granted_at - released
    );
    assert!(woken.release().await.expect("release"));

    for (key, before) in outside.iter().zip(&untouched) {
        assert_eq!(
            &raw_get(&mut root, key).await,
            before,
            "{key} outside the prefix was touched"
        );
    }

    // Keys inside a lock's directory that the store did not write.
    for (lock, foreign) in [
        ("etcdf:foreign-state", "s"),
        ("etcdf:foreign-grant", "h/someone"),
        ("etcdf:foreign-other", "notes"),
    ] {
        let foreign = format!("{}{foreign}", directory(PREFIX, lock));
        raw_put(&mut root, &foreign, "hello").await;
        let before = raw_get(&mut root, &foreign).await;
        let sent = Instant::now();
        let outcome = store
            .lock(lock)
            .wait(Duration::from_secs(5))
            .acquire()
            .await;
        let took = sent.elapsed();
        match &outcome {
            Err(LockError::Backend(err)) => {
                let message = err.to_string();
                assert!(
                    message.contains("not a distlock lock") && message.contains("untouched"),
                    "{foreign}: the error does not say what is wrong: {message}"
                );
            }
            other => panic!("{foreign}: expected a store error, got {other:?}"),
        }
        assert!(
            took < Duration::from_secs(2),
            "{foreign}: the request failed only after {took:?}: not at once"
        );
        assert_eq!(
            raw_get(&mut root, &foreign).await,
            before,
            "{foreign} was touched"
        );
        let directory = directory(PREFIX, lock);
        let keys = timeout(
            ANSWER,
            root.get(directory.as_str(), Some(GetOptions::new().with_prefix())),
        )
        .await
        .expect("an answer")
        .expect("read the directory");
        assert_eq!(
            keys.kvs().len(),
            1,
            "{directory}: the store wrote beside a key it did not write"
        );
    }
}

/// Wrong credentials: the first request fails at once with a store error of kind
/// `Authentication`, not a timeout after its wait; the right ones work on the same member.
#[tokio::test]
async fn wrong_credentials_fail_the_first_request_at_once_as_an_authentication_error() {
    let server = EtcdServer::start();
    let (user, password) = server.enable_auth(PREFIX).await;
    let wrong = client(config([server.endpoint()]).etcd_user(&user, "wrong"));
    let wait = Duration::from_secs(5);
    let sent = Instant::now();
    let outcome = wrong.lock("etcdf:creds").wait(wait).acquire().await;
    let took = sent.elapsed();
    match &outcome {
        Err(LockError::Backend(err)) => assert_eq!(
            err.kind(),
            BackendErrorKind::Authentication,
            "wrong credentials: {err}"
        ),
        other => panic!("wrong credentials: expected a store error, got {other:?}"),
    }
    assert!(
        took < Duration::from_secs(2),
        "wrong credentials failed only after {took:?} (the wait is {wait:?})"
    );
    let right = client(config([server.endpoint()]).etcd_user(&user, &password));
    let guard = right.lock("etcdf:creds").acquire().await.expect("acquire");
    assert!(guard.release().await.expect("release"));
}

// --- A grant removed behind its holder's back ---------------------------------------------

/// The lease of the grants removed behind their holders' backs: renewed every 2 s, so that a
/// loss told at the next renewal (within 2 s) and one told only at the local deadline (6 s
/// after the last renewal) are seconds apart.
const BEHIND_LEASE: Duration = Duration::from_secs(6);

/// How soon after its grant was removed a holder must be told: a renewal interval (a third of
/// [`BEHIND_LEASE`]) and a margin.
const TOLD_WITHIN: Duration = Duration::from_millis(3500);

/// A holder of lock `key` under `prefix` (lease [`BEHIND_LEASE`]), a client to take over,
/// and the grant's key as etcd has it.
async fn held_behind_its_back(prefix: &str, key: &str) -> (LockGuard, Client, GrantKey) {
    let holder = shared_client(prefix).lock(key).lease(BEHIND_LEASE);
    let guard = holder.acquire().await.expect("acquire");
    let mut raw = shared_etcd().client().await;
    let grant = only_grant_key(&mut raw, prefix, key).await;
    (guard, shared_client(prefix), grant)
}

/// Waits until etcd has had a keep-alive of `lease` (its remaining TTL, which only falls
/// between keep-alives, rises), for at most a renewal interval and a margin.
async fn renewed_on_etcd(raw: &mut RawClient, lease: i64) {
    let within = BEHIND_LEASE / 3 + WAIT_MARGIN;
    let deadline = Instant::now() + within;
    let mut lowest = i64::MAX;
    loop {
        let ttl = timeout(ANSWER, raw.lease_time_to_live(lease, None))
            .await
            .expect("an answer")
            .expect("the grant's lease")
            .ttl();
        if ttl > lowest {
            return;
        }
        lowest = lowest.min(ttl);
        assert!(
            Instant::now() < deadline,
            "lease {lease} not renewed within {within:?} (TTL {ttl} s)"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts that `guard` is told of its loss within [`TOLD_WITHIN`] of `removed`, that `other`
/// is granted the lock with a higher token, and that the old holder's release says the grant
/// was no longer its own.
async fn told_at_the_next_renewal(guard: LockGuard, other: &Client, key: &str, removed: Instant) {
    let lost = timeout(TOLD_WITHIN, guard.lost()).await;
    assert!(
        lost.is_ok(),
        "the holder still believes it holds {TOLD_WITHIN:?} after its grant was removed (it \
         renews every {:?})",
        BEHIND_LEASE / 3
    );
    eprintln!("told of the loss {:?} after the removal", removed.elapsed());
    assert!(!guard.is_held());
    let next = other
        .lock(key)
        .try_acquire()
        .await
        .expect("try")
        .expect("the lock is free");
    assert!(token(&next) > token(&guard));
    assert!(next.release().await.expect("release"));
    let released = guard.release().await;
    assert!(
        matches!(released, Ok(false) | Err(LockError::LeaseLost { .. })),
        "the removed grant's release: {released:?}"
    );
}

/// An operator (root) revokes a holder's etcd lease, which deletes its key, after the
/// watchdog has renewed it once: the next keep-alive on the grant's stream is answered with a
/// TTL of 0, and the holder is told its grant is lost.
#[tokio::test]
async fn a_holder_whose_lease_is_revoked_after_a_renewal_is_told_at_its_next_renewal() {
    let (prefix, key) = ("etcdf-revoked:", "etcdf:revoked");
    let (guard, other, grant) = held_behind_its_back(prefix, key).await;
    let mut raw = shared_etcd().client().await;
    renewed_on_etcd(&mut raw, grant.lease).await;
    timeout(ANSWER, raw.lease_revoke(grant.lease))
        .await
        .expect("an answer")
        .expect("revoke the grant's lease");
    let revoked = Instant::now();
    assert!(grant_keys(&mut raw, prefix, key).await.is_empty());
    told_at_the_next_renewal(guard, &other, key, revoked).await;
}

/// An operator (root) revokes a holder's etcd lease at once, before the watchdog's first
/// renewal: that renewal (which opens the grant's keep-alive stream) finds the lease gone,
/// and the holder is told then — not only at its local deadline, a whole lease later.
#[tokio::test]
async fn a_holder_whose_lease_is_revoked_before_its_first_renewal_is_told_at_that_renewal() {
    let (prefix, key) = ("etcdf-revoked-early:", "etcdf:revoked-early");
    let (guard, other, grant) = held_behind_its_back(prefix, key).await;
    let mut raw = shared_etcd().client().await;
    timeout(ANSWER, raw.lease_revoke(grant.lease))
        .await
        .expect("an answer")
        .expect("revoke the grant's lease");
    let revoked = Instant::now();
    assert!(grant_keys(&mut raw, prefix, key).await.is_empty());
    told_at_the_next_renewal(guard, &other, key, revoked).await;
}

/// An operator (root) deletes a holder's grant key (`…/h/<side>/<owner>`) and leaves its lease: the
/// lock is free for anyone from then on (every request reads the directory), so the holder's
/// next renewal must report the grant lost, as on Redis (a deleted key) and PostgreSQL (a
/// deleted row).
#[tokio::test]
async fn a_holder_whose_key_is_deleted_behind_its_back_is_told_at_its_next_renewal() {
    let (prefix, key) = ("etcdf-deleted:", "etcdf:deleted");
    let (guard, other, grant) = held_behind_its_back(prefix, key).await;
    let mut raw = shared_etcd().client().await;
    renewed_on_etcd(&mut raw, grant.lease).await;
    let grant_key = format!("{}h/{}/{}", directory(prefix, key), grant.side, grant.owner);
    let deleted = timeout(ANSWER, raw.delete(grant_key.as_str(), None))
        .await
        .expect("an answer")
        .expect("delete the grant's key");
    assert_eq!(deleted.deleted(), 1, "{grant_key} was not there");
    let removed = Instant::now();
    told_at_the_next_renewal(guard, &other, key, removed).await;
}
