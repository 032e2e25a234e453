//! `rediss://` end to end against a real TLS-only `redis-server` (certificates made at test
//! time by `support::tls`), with the `tls` feature: a URL works out of the box when the
//! system trusts the server's CA, a private CA goes in through `Config::from_redis_client`,
//! and a certificate nobody vouches for is a clear error, not a panic.
//!
//! "The system trusts" is played by `SSL_CERT_FILE` (read by the root-certificate loader the
//! redis crate uses), set once before any test connects, to the CAs of three servers only:
//! one for the single-server tests, and all three as Redlock masters; and to the CA of
//! [`trusted_certificates`], which `etcd.rs` and `postgres.rs` give their servers.

use std::sync::OnceLock;
use std::time::Duration;

use crate::support::tls::{certificates, Certificates, TlsRedisServer};
use distlock::{BackendErrorKind, Client, Config, LockError};

/// The servers whose CAs this process trusts as if they were in the system's store (each
/// server has a CA of its own; the file holds the three, and [`trusted_certificates`]' CA).
fn trusted_servers() -> &'static [TlsRedisServer; 3] {
    static SERVERS: OnceLock<[TlsRedisServer; 3]> = OnceLock::new();
    SERVERS.get_or_init(|| {
        let servers = [
            TlsRedisServer::start(),
            TlsRedisServer::start(),
            TlsRedisServer::start(),
        ];
        let bundle = crate::support::scratch_dir("trusted-cas").join("trusted.pem");
        let mut pems: Vec<&str> = servers.iter().map(TlsRedisServer::ca_pem).collect();
        pems.push(&trusted_certificates().ca_pem);
        std::fs::write(&bundle, pems.join("\n")).expect("write the trusted CAs");
        // Before any TLS connection of this binary is made (every test comes through here
        // first), so no thread reads the environment while it changes.
        std::env::set_var("SSL_CERT_FILE", &bundle);
        std::env::remove_var("SSL_CERT_DIR");
        servers
    })
}

/// Server certificates (and their CA) that this process trusts as if the system did, once
/// [`trust_the_test_roots`] has run: for the etcd and PostgreSQL servers of `etcd.rs` and
/// `postgres.rs`.
pub(crate) fn trusted_certificates() -> &'static Certificates {
    static CERTIFICATES: OnceLock<Certificates> = OnceLock::new();
    CERTIFICATES.get_or_init(certificates)
}

/// Points `SSL_CERT_FILE` at the trusted CAs (once, before any TLS connection of this
/// binary): every TLS test calls it first.
pub(crate) fn trust_the_test_roots() {
    trusted_servers();
}

/// The server the single-server tests use, one of [`trusted_servers`].
fn trusted_server() -> &'static TlsRedisServer {
    &trusted_servers()[0]
}

pub(crate) fn client(config: Config) -> Client {
    Client::new(
        config
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2)),
    )
    .expect("valid config")
}

/// Takes `key` with `a`, checks that `b` is kept out while it is held, gives it back, and
/// checks that `b` gets it then.
pub(crate) async fn exclusive_over(a: &Client, b: &Client, key: &str) {
    let held = a.lock(key).acquire().await.expect("acquire over TLS");
    assert!(held.fencing_token().is_some());
    match b.lock(key).wait(Duration::ZERO).acquire().await {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("`{key}` is held, a second client should time out: {other:?}"),
    }
    held.release().await.expect("release over TLS");
    let next = b
        .lock(key)
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect("acquire after release");
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rediss_url_works_out_of_the_box_when_the_system_trusts_the_server() {
    let server = trusted_server();
    let config = Config::from_url(&server.url()).expect("a rediss:// URL is accepted");
    let shown = format!("{config:?}");
    assert!(
        shown.contains(&format!("localhost:{} (db 0, TLS)", server.port())),
        "{shown}"
    );
    exclusive_over(&client(config.clone()), &client(config), "tls:url").await;
}

/// Redlock over three `rediss://` masters, at the default node timeout (50 ms): exclusion,
/// hand-over and a fenced grant. Shown to fail (`QuorumUnavailable`, 1 of 3 answered) with
/// the trusted file holding the first server's CA only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_urls_work_for_redlock_masters() {
    let masters = trusted_servers();
    let config = Config::redlock(masters.iter().map(TlsRedisServer::url))
        .expect("rediss:// master URLs are accepted");
    exclusive_over(
        &client(config.clone()),
        &client(config.clone()),
        "tls:redlock",
    )
    .await;
    let guard = client(config)
        .lock("tls:redlock-token")
        .acquire()
        .await
        .expect("a quorum over TLS");
    assert!(guard.fencing_token().is_some());
    assert!(guard.release().await.expect("release"));
}

#[tokio::test(flavor = "current_thread")]
async fn a_rediss_url_works_from_a_current_thread_runtime_too() {
    // There the connection is made on distlock's own I/O thread.
    let server = trusted_server();
    let config = Config::from_url(&server.url()).expect("a rediss:// URL is accepted");
    exclusive_over(&client(config.clone()), &client(config), "tls:io-thread").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_is_trusted_through_from_redis_client() {
    trusted_server();
    // A server whose CA the system does not trust: only the client built with it can connect.
    let private = TlsRedisServer::start();
    let with_ca = || {
        let redis = redis::Client::build_with_tls(
            private.url(),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(private.ca_pem().as_bytes().to_vec()),
            },
        )
        .expect("a TLS client");
        Config::from_redis_client(redis).expect("a TLS client is accepted")
    };
    exclusive_over(&client(with_ca()), &client(with_ca()), "tls:private-ca").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_no_trusted_root_vouches_for_is_a_clear_tls_error() {
    trusted_server();
    let untrusted = TlsRedisServer::start();
    let client = client(Config::from_url(&untrusted.url()).expect("a rediss:// URL"));
    for _ in 0..2 {
        // Twice: the first failure must not break the client (no dead I/O runtime).
        match client
            .lock("tls:untrusted")
            .wait(Duration::ZERO)
            .acquire()
            .await
        {
            Err(LockError::Backend(err)) => {
                let message = err.to_string();
                assert_eq!(err.kind(), BackendErrorKind::Tls, "{message}");
                assert!(message.contains("certificate"), "{message}");
                assert!(message.contains("from_redis_client"), "{message}");
                assert!(!message.contains("shut down"), "{message}");
            }
            other => panic!("an untrusted certificate must fail the connect: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_goes_in_through_from_redis_client() {
    trusted_server();
    let mutual = TlsRedisServer::start_with_client_auth(true);
    let with_certificate = || {
        let redis = redis::Client::build_with_tls(
            mutual.url(),
            redis::TlsCertificates {
                client_tls: Some(redis::ClientTlsConfig {
                    client_cert: mutual.client_cert_pem().as_bytes().to_vec(),
                    client_key: mutual.client_key_pem().as_bytes().to_vec(),
                }),
                root_cert: Some(mutual.ca_pem().as_bytes().to_vec()),
            },
        )
        .expect("a TLS client with a client certificate");
        Config::from_redis_client(redis).expect("accepted")
    };
    exclusive_over(
        &client(with_certificate()),
        &client(with_certificate()),
        "tls:mutual",
    )
    .await;

    // Without a certificate the server refuses the client.
    let without = redis::Client::build_with_tls(
        mutual.url(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(mutual.ca_pem().as_bytes().to_vec()),
        },
    )
    .expect("a TLS client");
    let refused = client(Config::from_redis_client(without).unwrap())
        .lock("tls:mutual")
        .wait(Duration::ZERO)
        .acquire()
        .await;
    match refused {
        Err(LockError::Backend(err)) => assert_eq!(err.kind(), BackendErrorKind::Tls, "{err}"),
        other => panic!("a client without a certificate must be refused: {other:?}"),
    }
}
