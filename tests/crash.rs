//! A holder process killed with SIGKILL while it holds a lock (no release, no renewal, its
//! connection gone) leaves the lock free again within its lease; a reader killed among other
//! readers frees none of them.
//!
//! A custom harness (`harness = false`): the binary runs the scenarios, and re-executes itself
//! with `DISTLOCK_CRASH_HOLDER` set (to `write` or `read`, then the server's URL) to play the
//! holder process.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock::{Client, Config};
use support::RedisServer;

const HOLDER_ENV: &str = "DISTLOCK_CRASH_HOLDER";
const LEASE: Duration = Duration::from_millis(1000);

fn main() {
    if let Ok(role) = std::env::var(HOLDER_ENV) {
        hold_until_killed(&role);
        return;
    }
    let scenarios: [(&str, fn()); 3] = [
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
    ];
    for (name, scenario) in scenarios {
        print!("test {name} ... ");
        scenario();
        println!("ok");
    }
    println!(
        "\ntest result: ok. {} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n",
        scenarios.len()
    );
}

/// The holder: takes the lock `crash` (`write:URL` or `read:URL`; watchdog on), reports its
/// token, and works until killed.
fn hold_until_killed(role: &str) {
    let (mode, url) = role.split_once(':').expect("MODE:URL");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = Client::new(Config::from_url(url).expect("url")).expect("client");
        let request = match mode {
            "read" => client.read_lock("crash"),
            _ => client.write_lock("crash"),
        };
        let guard = request.lease(LEASE).acquire().await.expect("acquire");
        println!("acquired {}", guard.fencing_token().expect("fenced"));
        std::future::pending::<()>().await;
    });
}

/// Starts a holder process taking `mode` ("write" or "read") of the lock `crash`; returns it
/// once it holds, with its fencing token.
fn spawn_holder(server: &RedisServer, mode: &str) -> (Holder, u64) {
    let mut holder = Command::new(std::env::current_exe().expect("own path"))
        .env(HOLDER_ENV, format!("{mode}:{}", server.url()))
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
