//! The default retry schedule (`Config::retry`, 3 from 200 ms), timed: a request whose every
//! connection is cut tries again after 200 ms, 400 ms and 800 ms, each pause drawn between half
//! and all of its step, and never tries past its wait (README, "Failures within `wait`"). The
//! tries are timed where they arrive: a listener on 127.0.0.1 that records when it accepts a
//! connection and closes it at once (as the proxy's `Mode::Drop` does, or a crashed
//! middlebox). `retries.rs` checks the number of tries at another setting.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::{BackendErrorKind, Client, Config, LockError};

/// The default retry steps, as the README gives them.
const STEPS: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
];

/// A try's connects (the connection layer may connect again once within a try) come within
/// this much of each other; the pauses between tries are 100 ms at least.
const SAME_TRY: Duration = Duration::from_millis(50);

/// Slack for a loaded 2-core machine above a pause's longest draw.
const MARGIN: Duration = Duration::from_millis(150);

/// Accepts connections on a free loopback port, notes when, and closes each at once.
struct CuttingListener {
    port: u16,
    accepted: Arc<Mutex<Vec<Instant>>>,
    stop: Arc<AtomicBool>,
}

impl CuttingListener {
    fn start() -> Self {
        // A port no server of this process had: the client takes the listener for a server.
        let (listener, port) = loop {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
            let port = listener.local_addr().expect("address").port();
            if crate::support::claim_port(port) {
                break (listener, port);
            }
        };
        listener.set_nonblocking(true).expect("non-blocking");
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (times, stopped) = (accepted.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((connection, _)) => {
                        times.lock().unwrap().push(Instant::now());
                        drop(connection);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        Self {
            port,
            accepted,
            stop,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The tries since `since`: each the first and last connect of a burst, bursts apart by
    /// more than [`SAME_TRY`].
    fn tries_since(&self, since: Instant) -> Vec<(Duration, Duration)> {
        let mut tries: Vec<(Duration, Duration)> = Vec::new();
        for at in self
            .accepted
            .lock()
            .unwrap()
            .iter()
            .filter(|at| **at >= since)
        {
            let at = *at - since;
            match tries.last_mut() {
                Some((_, last)) if at - *last <= SAME_TRY => *last = at,
                _ => tries.push((at, at)),
            }
        }
        tries
    }
}

impl Drop for CuttingListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn is_connection_failure(result: &Result<distlock::LockGuard, LockError>) -> bool {
    matches!(result, Err(LockError::Backend(e)) if e.kind() == BackendErrorKind::Connection)
}

/// At the default `retry` and wait (10 s), a request whose connections are all cut tries four
/// times: the pause after the n-th failure lies between half and all of 200 ms · 2ⁿ⁻¹, and the
/// request then ends with the failure, not a timeout. Three requests, for nine pauses. Seen:
/// pauses of 162–200, 225–391 and 513–611 ms, one connect per try. Shown to fail with
/// `retry_after` (acquire/mod.rs) drawing the pause between none and all of the step (a pause
/// under 50 ms: three bursts of connects instead of four), and with it not doubling the step
/// (the second pause 136 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_retries_pause_200_400_and_800_ms_each_drawn_from_half_to_all_of_it() {
    let listener = CuttingListener::start();
    let config = Config::from_url(&listener.url()).expect("valid url");
    let client = Client::new(config).expect("client");
    for round in 0..3 {
        let since = Instant::now();
        let result = client.lock("schedule").acquire().await;
        let took = since.elapsed();
        assert!(is_connection_failure(&result), "{result:?}");
        // Let a connect of the last try that is still under way land.
        tokio::time::sleep(SAME_TRY * 2).await;
        let tries = listener.tries_since(since);
        assert_eq!(
            tries.len(),
            STEPS.len() + 1,
            "round {round}: the first try and {} retries, each a burst of connects: {tries:?}",
            STEPS.len()
        );
        for (n, (step, pair)) in STEPS.iter().zip(tries.windows(2)).enumerate() {
            let pause = pair[1].0 - pair[0].1;
            assert!(
                pause >= *step / 2 && pause <= *step + MARGIN,
                "round {round}: the pause before retry {} was {pause:?}, not between {:?} and \
                 {step:?} (tries at {tries:?})",
                n + 1,
                *step / 2
            );
        }
        // Ended with the last try's failure, far inside its 10 s wait.
        let last = tries.last().expect("tries").1;
        assert!(
            took <= last + MARGIN,
            "round {round}: the request ended {took:?} in, its last try at {last:?}"
        );
    }
}

/// The same cut connections and default `retry`, but a wait shorter than the schedule: no try
/// starts past the wait, and the request ends with the failure within it (a retry that would
/// resume past the wait is not made). Waits of 300 ms, 700 ms and 1.2 s cut the schedule after
/// its first, second or third pause at the latest. Shown to fail with `retry_after` sleeping
/// its pause whatever the deadline (tries 0.50 s and 1.27 s into a 300 ms wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_retries_never_try_past_the_wait() {
    let listener = CuttingListener::start();
    let config = Config::from_url(&listener.url()).expect("valid url");
    let client = Client::new(config).expect("client");
    for wait in [
        Duration::from_millis(300),
        Duration::from_millis(700),
        Duration::from_millis(1200),
    ] {
        let since = Instant::now();
        let result = client.lock("within").wait(wait).acquire().await;
        let took = since.elapsed();
        assert!(is_connection_failure(&result), "{wait:?}: {result:?}");
        tokio::time::sleep(SAME_TRY * 2).await;
        let tries = listener.tries_since(since);
        assert!(!tries.is_empty(), "{wait:?}: no try reached the listener");
        let late: Vec<_> = tries.iter().filter(|(first, _)| *first > wait).collect();
        assert!(
            late.is_empty(),
            "a {wait:?} wait made tries past it: {late:?} (all: {tries:?})"
        );
        assert!(
            took <= wait + MARGIN,
            "a {wait:?} wait ended after {took:?} (tries at {tries:?})"
        );
    }
}
