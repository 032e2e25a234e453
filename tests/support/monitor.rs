//! A MONITOR connection to a test server that records every command the server executes, so
//! a test can check what went over the wire and in which order.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::RedisServer;

/// Records every command the server executes, from a MONITOR connection.
pub struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl Monitor {
    pub fn start(server: &RedisServer) -> Self {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
        stream.write_all(b"MONITOR\r\n").expect("send MONITOR");
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).expect("MONITOR reply");
        assert_eq!(ok.trim(), "+OK");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, stopped) = (lines.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut line = String::new();
            while !stopped.load(Ordering::Relaxed) {
                line.clear();
                if reader.read_line(&mut line).is_ok() && !line.is_empty() {
                    sink.lock().unwrap().push(line.trim().to_owned());
                }
            }
        });
        Self { lines, stop }
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits (bounded) until a line containing `needle` has been seen; returns its index.
    pub async fn wait_for(&self, needle: &str) -> usize {
        let started = Instant::now();
        loop {
            if let Some(at) = self.lines().iter().position(|l| l.contains(needle)) {
                return at;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "never saw {needle}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The arguments of a MONITOR line, unquoted: `… "EVALSHA" "sha" "2" "k" …` gives
/// `["EVALSHA", "sha", "2", "k", …]`.
pub fn arguments(line: &str) -> Vec<String> {
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}
