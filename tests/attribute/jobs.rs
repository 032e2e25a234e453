//! What services lock for (issue 27), on the in-process store and on a Redis server: a busy
//! lock that is no error (`LockRequest::try_acquire`: `Ok(None)`), an annotated fn that is
//! skipped while its lock is held elsewhere (`on_busy = "skip"`: `Ok(())` or `Ok(None)`, the
//! body not run; with a `wait`, skipped only after waiting), and `distlock::fencing_token()`
//! inside an annotated fn, with the errors that say why there is none elsewhere; and
//! `hold_at_least`: a job that ends early keeps its lock to the end of the window (the release
//! shortens the lease instead of deleting), so it is not run again within it; and
//! `LockRequest::run`, the attribute's behaviour as a method.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::RedisServer;
use distlock::{distributed_lock, Client, Config, LockError};

struct Job {
    locks: Client,
    runs: AtomicUsize,
}

impl Job {
    fn on(locks: Client) -> Self {
        Self {
            locks,
            runs: AtomicUsize::new(0),
        }
    }

    #[distributed_lock(key = "job:{name}", client = self.locks, on_busy = "skip")]
    async fn run(&self, name: &str) -> Result<(), LockError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    #[distributed_lock(key = "job:{name}", client = self.locks, on_busy = "skip")]
    async fn report(&self, name: &str) -> Result<Option<u64>, LockError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(Some(distlock::fencing_token()?.get()))
    }

    #[distributed_lock(key = "job:{name}", client = self.locks, on_busy = "skip", wait = "300ms")]
    async fn patient(&self, name: &str) -> Result<(), LockError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    #[distributed_lock(key = "job:{name}", client = self.locks, on_busy = "skip", hold_at_least = "400ms")]
    async fn at_most_every_400ms(&self, name: &str) -> Result<(), LockError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    #[distributed_lock(key = "job:{name}", client = self.locks, fencing = false)]
    async fn unfenced(&self, name: &str) -> Result<(), LockError> {
        match distlock::fencing_token() {
            Err(LockError::NoFencingToken(why)) if why.contains("without a fencing token") => {
                Ok(())
            }
            other => panic!("expected no token for a lock taken without one: {other:?}"),
        }
    }
}

async fn busy_is_no_error_and_a_busy_job_is_skipped(locks: Client) {
    // try_acquire: granted, then busy (`None`, no error), then granted again.
    let first = locks
        .lock("job:nightly")
        .try_acquire()
        .await
        .expect("no failure")
        .expect("free");
    assert!(locks
        .lock("job:nightly")
        .try_acquire()
        .await
        .expect("busy is no error")
        .is_none());

    // The annotated fns: skipped while the lock is held, the body not run.
    let job = Job::on(locks.clone());
    job.run("nightly").await.expect("skipped is Ok(())");
    assert_eq!(job.report("nightly").await.expect("skipped"), None);
    assert_eq!(job.runs.load(Ordering::SeqCst), 0, "no body ran while busy");

    // With a wait, a skip comes only after waiting that long.
    let started = Instant::now();
    job.patient("nightly")
        .await
        .expect("skipped after the wait");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "skipped after {:?}, before its wait",
        started.elapsed()
    );
    assert_eq!(job.runs.load(Ordering::SeqCst), 0);

    assert!(first.release().await.expect("release"));
    job.run("nightly").await.expect("ran");
    let token = job
        .report("nightly")
        .await
        .expect("ran")
        .expect("not skipped");
    assert!(token > 0, "the grant's fencing token");
    assert_eq!(job.runs.load(Ordering::SeqCst), 2, "both ran once free");
    let again = locks
        .lock("job:nightly")
        .try_acquire()
        .await
        .expect("no failure");
    assert!(
        again.is_some(),
        "every skipped or finished call gave the lock back"
    );
    job.unfenced("other").await.expect("checked inside");
}

/// Polls `name` with `try_acquire` until it is free; how long after `since` that was.
async fn free_after(locks: &Client, name: &str, since: Instant) -> Duration {
    loop {
        if let Some(guard) = locks.lock(name).try_acquire().await.expect("no failure") {
            let after = since.elapsed();
            assert!(guard.release().await.expect("release"));
            return after;
        }
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "{name} never came free"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn an_early_release_keeps_the_lock_for_hold_at_least(locks: Client) {
    let window = Duration::from_millis(400);
    // Taken and given back at once: kept to the end of the window, then free.
    let sent = Instant::now();
    let guard = locks
        .lock("job:min-hold")
        .hold_at_least(window)
        .try_acquire()
        .await
        .expect("no failure")
        .expect("free");
    assert!(guard.release().await.expect("release"), "it was ours");
    assert!(
        locks
            .lock("job:min-hold")
            .try_acquire()
            .await
            .expect("no failure")
            .is_none(),
        "kept after an early release"
    );
    let free = free_after(&locks, "job:min-hold", sent).await;
    assert!(
        free >= window - Duration::from_millis(20) && free < window + Duration::from_secs(2),
        "free {free:?} after the request, the window is {window:?}"
    );

    // The attribute: a job that ends at once runs once per window.
    let job = Job::on(locks.clone());
    let started = Instant::now();
    job.at_most_every_400ms("min-hold-job").await.expect("ran");
    job.at_most_every_400ms("min-hold-job")
        .await
        .expect("skipped");
    assert_eq!(
        job.runs.load(Ordering::SeqCst),
        1,
        "skipped within the window"
    );
    let free = free_after(&locks, "job:min-hold-job", started).await;
    assert!(
        free >= window - Duration::from_millis(20),
        "free after {free:?}"
    );

    // A window longer than max_hold, or on a lock that cannot be kept, is refused.
    let too_long = locks
        .lock("job:bad")
        .max_hold(Duration::from_secs(60))
        .hold_at_least(Duration::from_secs(61))
        .try_acquire()
        .await;
    assert!(
        matches!(&too_long, Err(LockError::Config(why)) if why.contains("longer than `max_hold`")),
        "{too_long:?}"
    );
    let read = locks
        .read_lock("job:bad")
        .hold_at_least(window)
        .try_acquire()
        .await;
    assert!(
        matches!(&read, Err(LockError::Config(why)) if why.contains("hold_at_least")),
        "{read:?}"
    );
}

#[tokio::test]
async fn in_process_busy_is_no_error_and_a_busy_job_is_skipped() {
    busy_is_no_error_and_a_busy_job_is_skipped(Client::in_memory()).await;
}

#[tokio::test]
async fn in_process_an_early_release_keeps_the_lock_for_hold_at_least() {
    an_early_release_keeps_the_lock_for_hold_at_least(Client::in_memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_an_early_release_keeps_the_lock_for_hold_at_least() {
    let server = RedisServer::start();
    let locks = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
    an_early_release_keeps_the_lock_for_hold_at_least(locks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_busy_is_no_error_and_a_busy_job_is_skipped() {
    let server = RedisServer::start();
    let locks = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
    busy_is_no_error_and_a_busy_job_is_skipped(locks).await;
}

#[tokio::test]
async fn outside_an_annotated_fn_there_is_no_fencing_token_and_the_error_says_why() {
    match distlock::fencing_token() {
        Err(LockError::NoFencingToken(why)) => {
            assert!(why.contains("#[distributed_lock]"), "{why}")
        }
        other => panic!("{other:?}"),
    }
}

/// `LockRequest::run`: the attribute's behaviour as a method — the body runs under the lock
/// (its token at hand), its output comes back and the lock is given back; a body whose lease
/// runs out is cancelled at its next await with `LeaseLost`; a busy lock is the request's error.
async fn run_is_the_attribute_as_a_method(locks: Client) {
    let out = locks
        .lock("run:report")
        .run(async {
            let token = distlock::fencing_token().expect("a token inside run");
            assert_eq!(distlock::current().expect("held").key(), "run:report");
            token.get()
        })
        .await
        .expect("ran");
    assert!(out > 0);
    assert!(
        locks
            .lock("run:report")
            .try_acquire()
            .await
            .expect("no failure")
            .is_some(),
        "given back after the body"
    );

    let started = Instant::now();
    let lost = locks
        .lock("run:hard-limit")
        .lease(Duration::from_millis(150))
        .watchdog(false)
        .run(async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            "finished"
        })
        .await;
    assert!(matches!(lost, Err(LockError::LeaseLost { .. })), "{lost:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "cancelled at the loss, not after the body's 30 s"
    );

    let _held = locks.lock("run:busy").acquire().await.expect("free");
    let busy = locks
        .lock("run:busy")
        .wait(Duration::ZERO)
        .run(async { unreachable!("the body of a lock never taken") })
        .await;
    assert!(matches!(busy, Err(LockError::Timeout { .. })), "{busy:?}");
}

#[tokio::test]
async fn in_process_run_is_the_attribute_as_a_method() {
    run_is_the_attribute_as_a_method(Client::in_memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_run_is_the_attribute_as_a_method() {
    let server = RedisServer::start();
    let locks = Client::new(Config::from_url(&server.url()).expect("url")).expect("client");
    run_is_the_attribute_as_a_method(locks).await;
}
