//! What services lock for (issue 27), on the in-process store and on a Redis server: a busy
//! lock that is no error (`LockRequest::try_acquire`: `Ok(None)`), an annotated fn that is
//! skipped while its lock is held elsewhere (`on_busy = "skip"`: `Ok(())` or `Ok(None)`, the
//! body not run; with a `wait`, skipped only after waiting), and `distlock::fencing_token()`
//! inside an annotated fn, with the errors that say why there is none elsewhere.

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

#[tokio::test]
async fn in_process_busy_is_no_error_and_a_busy_job_is_skipped() {
    busy_is_no_error_and_a_busy_job_is_skipped(Client::in_memory()).await;
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
