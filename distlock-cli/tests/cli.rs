//! The `distlock` binary end to end: the built executable run against real `redis-server` and
//! `postgres` processes (started by the workspace's shared test support), with locks held by the library
//! in this test process, as an operator would meet them.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use distlock::{Client, Config, FencingToken, LockError};
use serde_json::Value;
use support::etcd::EtcdServer;
use support::masters::start_masters;
use support::postgres::PostgresServer;
use support::RedisServer;

/// Runs `distlock` with `args`, the environment cleared of distlock's variables (and `env`
/// added).
fn distlock(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distlock"));
    for var in [
        "REDIS_URL",
        "DISTLOCK_CLUSTER_URLS",
        "DISTLOCK_SENTINEL_URLS",
        "DISTLOCK_SENTINEL_MASTER",
        "DISTLOCK_REDLOCK_URLS",
        "DISTLOCK_POSTGRES_URL",
    ] {
        command.env_remove(var);
    }
    command.args(args).envs(env.iter().copied());
    command.output().expect("the distlock binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The exit code, with both streams shown when it is not `expected`.
fn assert_exit(output: &Output, expected: i32) {
    assert_eq!(
        output.status.code(),
        Some(expected),
        "stdout:\n{}\nstderr:\n{}",
        stdout(output),
        stderr(output)
    );
}

fn json(output: &Output) -> Value {
    serde_json::from_str(stdout(output).trim()).unwrap_or_else(|err| {
        panic!("not JSON ({err}):\n{}", stdout(output));
    })
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("a Linux host name")
        .trim()
        .to_owned()
}

fn client(url: &str, app: &str) -> Client {
    Client::new(Config::from_url(url).unwrap().app_name(app)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_writer_with_its_app_host_and_pid() {
    let server = RedisServer::start();
    let url = server.url();
    let shop = client(&url, "shop");
    let guard = shop.lock("order:1").acquire().await.unwrap();

    let text = distlock(&["--url", &url, "status", "order:1"], &[]);
    assert_exit(&text, 0);
    let shown = stdout(&text);
    assert!(shown.contains("order:1: locked (write)"), "{shown}");
    assert!(shown.contains("app=shop"), "{shown}");
    assert!(
        shown.contains(&format!("pid={}", std::process::id())),
        "{shown}"
    );
    assert!(shown.contains(&format!("host={}", host_name())), "{shown}");

    let parsed = json(&distlock(
        &["--url", &url, "--json", "status", "order:1"],
        &[],
    ));
    assert_eq!(parsed["key"], "order:1");
    assert_eq!(parsed["locked"], true);
    assert_eq!(parsed["mode"], "write");
    let holder = &parsed["holders"][0];
    assert_eq!(holder["app"], "shop");
    assert_eq!(holder["pid"], std::process::id());
    assert_eq!(holder["host"], host_name().as_str());
    assert!(holder["since_ms"].as_u64().is_some(), "{parsed}");
    assert!(holder["remaining_ms"].as_u64().unwrap() > 0, "{parsed}");
    assert!(
        parsed["token_ceiling"].as_u64().unwrap() >= guard.fencing_token().unwrap().get(),
        "{parsed}"
    );

    // The environment, as the library reads it, names the store when no option does.
    let from_env = distlock(&["status", "order:1"], &[("REDIS_URL", &url)]);
    assert_exit(&from_env, 0);
    assert!(stdout(&from_env).contains("app=shop"));

    guard.release().await.unwrap();
    let free = distlock(&["--url", &url, "status", "order:1"], &[]);
    assert_exit(&free, 1);
    assert!(
        stdout(&free).contains("order:1: not locked"),
        "{}",
        stdout(&free)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_every_reader() {
    let server = RedisServer::start();
    let url = server.url();
    let (one, two) = (client(&url, "reader-one"), client(&url, "reader-two"));
    let _r1 = one.read_lock("catalog").acquire().await.unwrap();
    let _r2 = two.read_lock("catalog").acquire().await.unwrap();
    let parsed = json(&distlock(
        &["--url", &url, "--json", "status", "catalog"],
        &[],
    ));
    assert_eq!(parsed["mode"], "read");
    let mut apps: Vec<&str> = parsed["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["app"].as_str().unwrap())
        .collect();
    apps.sort_unstable();
    assert_eq!(apps, ["reader-one", "reader-two"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_the_held_locks_matching_a_pattern() {
    let server = RedisServer::start();
    let url = server.url();
    let app = client(&url, "shop");
    let _a = app.lock("order:1").acquire().await.unwrap();
    let _b = app.lock("order:2").acquire().await.unwrap();
    let _c = app.read_lock("user:7").acquire().await.unwrap();
    let other = Client::new(Config::from_url(&url).unwrap().key_prefix("other:")).unwrap();
    let _d = other.lock("order:3").acquire().await.unwrap();

    let listed = distlock(&["--url", &url, "list", "order:*"], &[]);
    assert_exit(&listed, 0);
    assert_eq!(stdout(&listed), "order:1\norder:2\n");

    let all = json(&distlock(&["--url", &url, "--json", "list"], &[]));
    assert_eq!(all["pattern"], "*");
    assert_eq!(
        all["locks"],
        serde_json::json!(["order:1", "order:2", "user:7"])
    );
    let prefixed = distlock(&["--url", &url, "--prefix", "other:", "list"], &[]);
    assert_eq!(stdout(&prefixed), "order:3\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_refuses_without_force_and_with_it_evicts_the_holder() {
    let server = RedisServer::start();
    let url = server.url();
    let hung = client(&url, "hung-job");
    let lease = Duration::from_millis(900);
    let guard = hung.lock("report").lease(lease).acquire().await.unwrap();

    let refused = distlock(&["--url", &url, "unlock", "report"], &[]);
    assert_exit(&refused, 2);
    let said = stderr(&refused);
    assert!(
        said.contains("--force") && said.contains("evict 1 holder"),
        "{said}"
    );
    assert!(said.contains("app=hung-job"), "{said}");
    assert!(hung.is_locked("report").await.unwrap(), "nothing was done");

    let forced = distlock(
        &["--url", &url, "--json", "unlock", "report", "--force"],
        &[],
    );
    assert_exit(&forced, 0);
    let parsed = json(&forced);
    assert_eq!(parsed["evicted"][0]["app"], "hung-job");
    let token = parsed["token"].as_u64().unwrap();
    let evicted: FencingToken = guard.fencing_token().unwrap();
    assert!(token > evicted.get(), "{token} {evicted}");
    assert!(!hung.is_locked("report").await.unwrap());
    // The evicted holder's guard reports the lease lost at its next renewal.
    tokio::time::timeout(lease * 3, guard.lost())
        .await
        .expect("the evicted holder learns it lost the lock");

    // A free lock: nothing to evict, exit 1.
    let again = distlock(&["--url", &url, "unlock", "report", "--force"], &[]);
    assert_exit(&again, 1);
    assert!(
        stdout(&again).contains("was not locked"),
        "{}",
        stdout(&again)
    );
    // And it does not claim holders below a token were evicted (issue 25).
    assert!(!stdout(&again).contains("token"), "{}", stdout(&again));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_refreshes_count_times_at_the_interval() {
    let server = RedisServer::start();
    let url = server.url();
    let app = client(&url, "watched");
    let _guard = app.lock("queue").acquire().await.unwrap();
    let started = Instant::now();
    let watched = distlock(
        &[
            "--url",
            &url,
            "--json",
            "watch",
            "queue",
            "--interval",
            "150ms",
            "--count",
            "3",
        ],
        &[],
    );
    assert_exit(&watched, 0);
    assert!(started.elapsed() >= Duration::from_millis(300));
    let lines: Vec<Value> = stdout(&watched)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON document per line"))
        .collect();
    assert_eq!(lines.len(), 3, "{}", stdout(&watched));
    for line in &lines {
        assert_eq!(line["holders"][0]["app"], "watched");
    }
    let text = distlock(&["--url", &url, "watch", "queue", "--count", "1"], &[]);
    assert_exit(&text, 0);
    assert!(stdout(&text).contains("app=watched"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_on_redlock() {
    let masters = start_masters(3);
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let joined = urls.join(",");
    let app = Client::new(Config::redlock(&urls).unwrap().app_name("quorum-app")).unwrap();
    let guard = app.lock("ledger:9").acquire().await.unwrap();

    let parsed = json(&distlock(
        &["--redlock", &joined, "--json", "status", "ledger:9"],
        &[],
    ));
    assert_eq!(parsed["holders"][0]["app"], "quorum-app");
    let listed = distlock(&["--redlock", &joined, "list", "ledger:*"], &[]);
    assert_eq!(stdout(&listed), "ledger:9\n");
    let from_env = distlock(&["list"], &[("DISTLOCK_REDLOCK_URLS", &joined)]);
    assert_eq!(stdout(&from_env), "ledger:9\n");
    let forced = json(&distlock(
        &[
            "--redlock",
            &joined,
            "--json",
            "unlock",
            "ledger:9",
            "--force",
        ],
        &[],
    ));
    assert!(forced["token"].as_u64().unwrap() > guard.fencing_token().unwrap().get());
    let next = app.lock("ledger:9").acquire().await.unwrap();
    assert!(next.fencing_token().unwrap().get() > forced["token"].as_u64().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_on_postgres() {
    let server = PostgresServer::start();
    let url = server.url();
    let app = Client::new(Config::postgres(&url).unwrap().app_name("pg-app")).unwrap();
    let guard = app.lock("ledger:9").acquire().await.unwrap();

    let parsed = json(&distlock(
        &["--postgres", &url, "--json", "status", "ledger:9"],
        &[],
    ));
    assert_eq!(parsed["holders"][0]["app"], "pg-app");
    let listed = distlock(&["--postgres", &url, "list", "ledger:*"], &[]);
    assert_eq!(stdout(&listed), "ledger:9\n");
    let from_env = distlock(&["list"], &[("DISTLOCK_POSTGRES_URL", &url)]);
    assert_eq!(stdout(&from_env), "ledger:9\n");
    let watched = distlock(
        &[
            "--postgres",
            &url,
            "watch",
            "ledger:9",
            "--count",
            "2",
            "--interval",
            "10ms",
        ],
        &[],
    );
    assert_exit(&watched, 0);
    assert!(stdout(&watched).contains("pg-app"), "{}", stdout(&watched));
    let forced = json(&distlock(
        &[
            "--postgres",
            &url,
            "--json",
            "unlock",
            "ledger:9",
            "--force",
        ],
        &[],
    ));
    assert!(forced["token"].as_u64().unwrap() > guard.fencing_token().unwrap().get());
    let next = app.lock("ledger:9").acquire().await.unwrap();
    assert!(next.fencing_token().unwrap().get() > forced["token"].as_u64().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_on_etcd() {
    let server = EtcdServer::start();
    let endpoint = server.endpoint();
    let app = Client::new(Config::etcd([&endpoint]).unwrap().app_name("etcd-app")).unwrap();
    let guard = app.lock("ledger:9").acquire().await.unwrap();

    let parsed = json(&distlock(
        &["--etcd", &endpoint, "--json", "status", "ledger:9"],
        &[],
    ));
    assert_eq!(parsed["holders"][0]["app"], "etcd-app");
    let listed = distlock(&["--etcd", &endpoint, "list", "ledger:*"], &[]);
    assert_eq!(stdout(&listed), "ledger:9\n");
    let from_env = distlock(&["list"], &[("DISTLOCK_ETCD_ENDPOINTS", &endpoint)]);
    assert_eq!(stdout(&from_env), "ledger:9\n");
    let forced = json(&distlock(
        &[
            "--etcd", &endpoint, "--json", "unlock", "ledger:9", "--force",
        ],
        &[],
    ));
    assert!(forced["token"].as_u64().unwrap() > guard.fencing_token().unwrap().get());
    let next = app.lock("ledger:9").acquire().await.unwrap();
    assert!(next.fencing_token().unwrap().get() > forced["token"].as_u64().unwrap());
}

/// `distlock schema` prints SQL that, run by a migration tool, makes a schema a client that
/// creates nothing (`postgres_create_schema(false)`) works with; before it, that client says
/// what to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_prints_the_sql_a_client_that_creates_nothing_needs() {
    let server = PostgresServer::start();
    let config = Config::postgres(&server.url())
        .unwrap()
        .postgres_schema("locks_app")
        .postgres_create_schema(false);
    let before = Client::new(config.clone())
        .unwrap()
        .lock("k")
        .acquire()
        .await;
    let err = before.expect_err("no schema yet");
    assert!(
        matches!(&err, LockError::Config(why) if why.contains("distlock schema")),
        "{err:?}"
    );
    let printed = distlock(&["schema", "--postgres-schema", "locks_app"], &[]);
    assert_exit(&printed, 0);
    let sql = stdout(&printed);
    assert!(
        sql.contains("CREATE TABLE IF NOT EXISTS locks_app.locks"),
        "{sql}"
    );
    server.psql(&sql);
    let guard = Client::new(config)
        .unwrap()
        .lock("k")
        .acquire()
        .await
        .unwrap();
    assert!(guard.fencing_token().is_some());
    let bad = distlock(&["schema", "--postgres-schema", "Bad-Name"], &[]);
    assert_exit(&bad, 2);
}

#[test]
fn usage_and_configuration_errors_exit_2_with_a_message() {
    let both = distlock(
        &[
            "--url",
            "redis://127.0.0.1:1",
            "--redlock",
            "redis://a,redis://b,redis://c",
            "list",
        ],
        &[],
    );
    assert_exit(&both, 2);
    assert!(
        stderr(&both).contains("cannot be used with"),
        "{}",
        stderr(&both)
    );
    let bad_url = distlock(&["--url", "http://nope", "status", "k"], &[]);
    assert_exit(&bad_url, 2);
    assert!(
        stderr(&bad_url).starts_with("distlock: "),
        "{}",
        stderr(&bad_url)
    );
    let no_master = distlock(&["--sentinel", "redis://127.0.0.1:1", "status", "k"], &[]);
    assert_exit(&no_master, 2);
    // Neither an option nor a variable names a store: no guess at a local server.
    let nowhere = distlock(&["status", "k"], &[]);
    assert_exit(&nowhere, 2);
    for named in ["REDIS_URL", "DISTLOCK_REDLOCK_URLS", "--url"] {
        assert!(stderr(&nowhere).contains(named), "{}", stderr(&nowhere));
    }
}

#[test]
fn an_unreachable_store_exits_3() {
    let port = support::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let down = distlock(&["--url", &url, "status", "k"], &[]);
    assert_exit(&down, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_the_fair_waiters_queued() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = client(&url, "shop");
    let guard = holder.lock("invoice:9").acquire().await.unwrap();
    let waiter = client(&url, "billing");
    let waiting = tokio::spawn(async move {
        waiter
            .lock("invoice:9")
            .fair()
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    let started = Instant::now();
    while holder.inspect("invoice:9").await.unwrap().queued < 1 {
        assert!(started.elapsed() < Duration::from_secs(10), "never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let text = distlock(&["--url", &url, "status", "invoice:9"], &[]);
    assert_exit(&text, 0);
    assert!(
        stdout(&text).contains("fair waiters queued: 1"),
        "{}",
        stdout(&text)
    );
    let parsed = json(&distlock(
        &["--url", &url, "--json", "status", "invoice:9"],
        &[],
    ));
    assert_eq!(parsed["queued"], 1, "{parsed}");
    guard.release().await.unwrap();
    let granted = waiting.await.unwrap().expect("the fair waiter is granted");
    granted.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_an_elections_leader_epoch_and_value() {
    let server = RedisServer::start();
    let url = server.url();
    let scheduler = client(&url, "scheduler");
    let leadership = scheduler
        .election("cron")
        .value("127.0.0.1:8081")
        .campaign()
        .await
        .unwrap();
    let epoch = leadership.epoch().get();

    let text = distlock(&["--url", &url, "status", "cron"], &[]);
    assert_exit(&text, 0);
    let shown = stdout(&text);
    assert!(shown.contains("cron: locked (write)"), "{shown}");
    assert!(shown.contains("app=scheduler"), "{shown}");
    assert!(
        shown.contains(&format!(
            "election leader: epoch {epoch}, value \"127.0.0.1:8081\""
        )),
        "{shown}"
    );
    let parsed = json(&distlock(&["--url", &url, "--json", "status", "cron"], &[]));
    assert_eq!(parsed["leader"]["epoch"], epoch, "{parsed}");
    assert_eq!(parsed["leader"]["value"], "127.0.0.1:8081", "{parsed}");

    // A plain lock has no leader.
    let guard = scheduler.lock("order:1").acquire().await.unwrap();
    let parsed = json(&distlock(
        &["--url", &url, "--json", "status", "order:1"],
        &[],
    ));
    assert!(parsed["leader"].is_null(), "{parsed}");
    guard.release().await.unwrap();
    leadership.resign().await.unwrap();
}

/// `distlock watch … | head -1`: the reader goes away after one line, and the tool ends
/// quietly — exit 0, nothing on stderr (no "failed printing to stdout: Broken pipe" panic),
/// long before its count of refreshes.
#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let server = RedisServer::start();
    let url = server.url();
    let mut child = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(["--url", &url, "watch", "pipe:k", "--interval", "10ms"])
        .args(["--count", "100000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the distlock binary runs");
    let mut reader = BufReader::new(child.stdout.take().expect("piped"));
    let mut first = String::new();
    reader.read_line(&mut first).expect("a first line");
    assert!(first.contains("pipe:k: not locked"), "{first}");
    drop(reader); // as `head -1` does

    let (ended, end) = std::sync::mpsc::channel();
    std::thread::spawn(move || ended.send(child.wait_with_output()));
    // 100000 refreshes at 10 ms would take over 16 minutes; a quiet end takes one refresh.
    let output = end
        .recv_timeout(Duration::from_secs(60))
        .expect("the tool ends once its reader is gone")
        .expect("wait");
    assert_exit(&output, 0);
    assert_eq!(stderr(&output), "", "nothing said on stderr");

    // A command that prints once keeps its exit code when nobody reads: `status` of a free
    // lock still exits 1, of a held one 0, and `list` 0.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let shop = client(&url, "shop");
    let guard = runtime
        .block_on(shop.lock("pipe:held").acquire())
        .expect("free");
    for (args, code) in [
        (vec!["status", "pipe:free"], 1),
        (vec!["status", "pipe:held"], 0),
        (vec!["--json", "status", "pipe:held"], 0),
        (vec!["list"], 0),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_distlock"))
            .args(["--url", &url])
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the distlock binary runs");
        // The reader goes before the tool has connected, let alone printed.
        drop(child.stdout.take());
        let output = child.wait_with_output().expect("wait");
        assert_exit(&output, code);
        assert_eq!(stderr(&output), "", "{args:?}: nothing said on stderr");
    }
    runtime.block_on(guard.release()).expect("release");
}

/// The fenced-write connection to the data's Redis, as an application holds one.
async fn data_connection(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The command `unlock --force` printed, run with the data's URL in place of `DATA_URL`.
fn run_next(next: &str, data_url: &str, json: bool) -> Output {
    let mut args: Vec<&str> = next
        .split_whitespace()
        .map(|word| if word == "DATA_URL" { data_url } else { word })
        .collect();
    assert_eq!(args.remove(0), "distlock", "{next}");
    if json {
        args.insert(0, "--json");
    }
    distlock(&args, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_unlock_force_the_printed_fence_raise_refuses_the_evicted_holders_write() {
    use distlock::fenced::{self, FencedWrite};

    let (locks, data) = (RedisServer::start(), RedisServer::start());
    let (url, data_url) = (locks.url(), data.url());
    let hung = client(&url, "hung-job");
    let guard = hung.lock("order:7").acquire().await.unwrap();
    let evicted = guard.fencing_token().unwrap();
    let mut conn = data_connection(&data).await;
    let written = fenced::set(&mut conn, "order:7", "paid", evicted).await;
    assert_eq!(written.unwrap(), FencedWrite::Applied(()));

    let forced = json(&distlock(
        &["--url", &url, "--json", "unlock", "order:7", "--force"],
        &[],
    ));
    let token = forced["token"].as_u64().unwrap();
    let next = forced["next"].as_str().expect("the command to run next");
    assert_eq!(
        next,
        format!("distlock fence raise order:7 {token} --data-url DATA_URL")
    );
    // Nothing has written a newer token yet: the evicted holder's late write still passes.
    let late = fenced::set(&mut conn, "order:7", "late", evicted).await;
    assert!(late.unwrap().is_applied(), "not fenced before the raise");

    let raised = run_next(next, &data_url, true);
    assert_exit(&raised, 0);
    let raised = json(&raised);
    assert_eq!(raised["raised"], true, "{raised}");
    assert_eq!(raised["previous"], evicted.get(), "{raised}");
    assert_eq!(raised["fence"], token, "{raised}");
    assert_eq!(raised["fence_key"], "{order:7}:fence", "{raised}");

    let refused = fenced::set(&mut conn, "order:7", "later", evicted).await;
    assert_eq!(
        refused.unwrap(),
        FencedWrite::Stale {
            highest: FencingToken::from_raw(token)
        },
        "the evicted holder's write is refused once the fence is raised"
    );
    // The next holder's token is above the raised fence: its writes pass.
    let next_holder = hung.lock("order:7").acquire().await.unwrap();
    let next_token = next_holder.fencing_token().unwrap();
    let written = fenced::set(&mut conn, "order:7", "shipped", next_token).await;
    assert!(written.unwrap().is_applied());

    // The text form prints the same command; raising again with an older token changes
    // nothing and says so.
    let text = distlock(&["--url", &url, "unlock", "order:7", "--force"], &[]);
    assert_exit(&text, 0);
    assert!(
        stdout(&text).contains("next: raise the fence")
            && stdout(&text).contains("distlock fence raise order:7 "),
        "{}",
        stdout(&text)
    );
    let again = distlock(
        &[
            "fence",
            "raise",
            "order:7",
            &token.to_string(),
            "--data-url",
            &data_url,
        ],
        &[],
    );
    assert_exit(&again, 0);
    assert!(
        stdout(&again).contains(&format!("already at {next_token}")),
        "{}",
        stdout(&again)
    );
    // Pasted without filling in DATA_URL: a usage error, nothing done.
    assert_exit(&run_next(next, "DATA_URL", false), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_raise_leaves_a_key_that_holds_no_fence_and_exits_3() {
    let data = RedisServer::start();
    let mut conn = data_connection(&data).await;
    let () = redis::cmd("HSET")
        .arg("{profile}:fence")
        .arg("name")
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let refused = distlock(
        &["fence", "raise", "profile", "42", "--data-url", &data.url()],
        &[],
    );
    assert_exit(&refused, 3);
    assert!(
        stderr(&refused).contains("{profile}:fence") && stderr(&refused).contains("hash"),
        "{}",
        stderr(&refused)
    );
    let kind: String = redis::cmd("TYPE")
        .arg("{profile}:fence")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "hash", "left untouched");
}
