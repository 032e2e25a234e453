//! distlock's metrics, exported for Prometheus: installs the `metrics-exporter-prometheus`
//! recorder, has eight tasks contend for a few locks (some wait, some time out, the watchdog
//! renews the long holds), and prints the text Prometheus would scrape — or, with
//! `-- --serve 127.0.0.1:9184`, serves it at `/metrics` until Ctrl-C.
//!
//! ```sh
//! cargo run --example prometheus --features metrics
//! cargo run --example prometheus --features metrics -- --serve 127.0.0.1:9184
//! ```
//!
//! Uses `REDIS_URL` (or redis://127.0.0.1:6379), and the in-process backend if nothing answers.

use std::time::Duration;

use distlock::{Client, Config, LockError};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Before the first client: the client describes its metrics (units, help) to the recorder.
    let metrics = PrometheusBuilder::new().install_recorder()?;
    let client = client().await?;

    let mut tasks = Vec::new();
    for worker in 0..8u64 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..10u64 {
                let key = format!("report:{}", (worker + round) % 3);
                match client
                    .lock(&key)
                    .lease(Duration::from_millis(300))
                    .wait(Duration::from_millis(150))
                    .acquire()
                    .await
                {
                    Ok(guard) => {
                        // Some holds outlive a third of the lease: the watchdog renews them.
                        tokio::time::sleep(Duration::from_millis(20 + 30 * (round % 5))).await;
                        guard.release().await?;
                    }
                    Err(LockError::Timeout { .. }) => {}
                    Err(err) => return Err(err),
                }
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }

    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--serve") {
        Some(at) => {
            let addr = args.get(at + 1).map_or("127.0.0.1:9184", String::as_str);
            serve(addr, metrics).await?;
        }
        None => print!("{}", metrics.render()),
    }
    Ok(())
}

/// A client on `REDIS_URL`, or the in-process backend when no Redis answers.
async fn client() -> Result<Client, Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| distlock::DEFAULT_REDIS_URL.into());
    let redis = redis::Client::open(url.as_str())?;
    let reachable = tokio::time::timeout(
        Duration::from_secs(2),
        redis.get_multiplexed_async_connection(),
    )
    .await;
    Ok(if matches!(reachable, Ok(Ok(_))) {
        Client::new(Config::from_url(&url)?)?
    } else {
        eprintln!("no Redis answered at {url}; using the in-process backend");
        Client::new(Config::in_memory())?
    })
}

/// Answers every HTTP request with the current metrics (enough for a Prometheus scrape).
async fn serve(addr: &str, metrics: PrometheusHandle) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    eprintln!("serving http://{addr}/metrics (Ctrl-C to stop)");
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (mut stream, _) = accepted?;
                let body = metrics.render();
                tokio::spawn(async move {
                    let mut request = [0u8; 1024];
                    let _ = stream.read(&mut request).await;
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                });
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
