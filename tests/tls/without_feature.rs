//! TLS in a build without distlock's `tls` feature: a `rediss://` URL is refused when the
//! config is made, naming the feature; and a TLS `redis::Client` handed over through
//! `Config::from_redis_client` by an application whose redis crate has TLS but no rustls crypto
//! provider (rustls then panics while connecting) gives a clear error naming the feature, on
//! every try, instead of "the client's I/O runtime has shut down"; `https://` etcd endpoints
//! and PostgreSQL's `sslmode=verify-full` name the feature too. Built only without the
//! feature (`cargo test --test tls`); with it, `with_feature.rs` runs instead.

use std::time::Duration;

use crate::support::tls::TlsRedisServer;
use distlock::{BackendErrorKind, Client, Config, LockError};

#[test]
fn a_rediss_url_is_a_config_error_that_names_the_feature() {
    for url in [
        "rediss://localhost:6380",
        "rediss://:SECRET@localhost:6380/0",
    ] {
        let err = Config::from_url(url).expect_err("TLS without the feature");
        let message = err.to_string();
        assert!(matches!(err, LockError::Config(_)), "{err:?}");
        assert!(message.contains(r#"features = ["tls"]"#), "{message}");
        assert!(!message.contains("SECRET"), "{message}");
    }
    let err = Config::redlock(["redis://a:1", "rediss://b:2", "redis://c:3"]).unwrap_err();
    assert!(
        err.to_string().contains("Redlock master URL uses TLS"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_without_a_crypto_provider_is_a_clear_error_not_a_dead_runtime() {
    let server = TlsRedisServer::start();
    let redis = redis::Client::open(server.url()).expect("a TLS redis::Client");
    // This test binary's redis crate has TLS through a dev-dependency (rslock), with no
    // crypto provider: exactly an application that enabled the redis crate's TLS by hand.
    assert!(
        redis.get_connection_info().addr().is_supported(),
        "the redis crate of this test build should have TLS (via rslock's tokio-comp)"
    );
    let client = Client::new(
        Config::from_redis_client(redis)
            .expect("the application owns TLS here")
            .connect_timeout(Duration::from_secs(2)),
    )
    .expect("client");
    for _ in 0..3 {
        match client
            .lock("no-provider")
            .wait(Duration::ZERO)
            .acquire()
            .await
        {
            Err(LockError::Backend(err)) => {
                let message = err.to_string();
                assert_eq!(err.kind(), BackendErrorKind::Tls, "{message}");
                assert!(message.contains("crypto provider"), "{message}");
                assert!(message.contains(r#"features = ["tls"]"#), "{message}");
                assert!(!message.contains("shut down"), "{message}");
            }
            other => panic!("expected a TLS setup error, got {other:?}"),
        }
    }
    // The client's I/O runtime still serves: a current-thread caller, whose connects run on
    // distlock's I/O thread, gets the same clear error (and the thread survives the panic).
    let from_io_thread = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                match client
                    .lock("no-provider")
                    .wait(Duration::ZERO)
                    .acquire()
                    .await
                {
                    Err(LockError::Backend(err)) => err.kind(),
                    other => panic!("expected a TLS setup error, got {other:?}"),
                }
            })
    })
    .join()
    .expect("the caller thread");
    assert_eq!(from_io_thread, BackendErrorKind::Tls);
}

#[cfg(feature = "etcd")]
#[test]
fn an_https_etcd_endpoint_is_a_config_error_that_names_the_feature() {
    let err = Config::etcd(["https://etcd-1.internal:2379"]).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    assert!(
        message.contains("https://etcd-1.internal:2379"),
        "{message}"
    );
    assert!(message.contains(r#"features = ["tls"]"#), "{message}");
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_tls_is_a_config_error_that_names_the_feature() {
    for url in [
        "postgres://app:SECRET@db.internal/app?sslmode=verify-full",
        "postgres://app:SECRET@db.internal/app?sslmode=require",
    ] {
        let err = Config::postgres(url).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, LockError::Config(_)), "{err:?}");
        assert!(message.contains(r#"features = ["tls"]"#), "{message}");
        assert!(!message.contains("SECRET"), "{message}");
    }
    // Certificates given through the config ask for TLS too.
    let config = Config::postgres("postgres://app@db.internal/app")
        .unwrap()
        .postgres_ca_pem("-----BEGIN CERTIFICATE-----");
    let err = Client::new(config).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains(r#"features = ["tls"]"#), "{err}");
}
