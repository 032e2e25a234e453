//! PostgreSQL over TLS, with the `tls` and `postgres` features, against real servers with
//! `ssl = on` (`PostgresServer::start_tls`, certificates made at test time): the pool's
//! connections and the one that `LISTEN`s all speak TLS under `sslmode=verify-full`; a
//! private CA and a client certificate go in through `Config::postgres_ca_pem` and
//! `Config::postgres_client_cert`; an untrusted certificate, a server without TLS and a
//! `hostssl`-only server reached in plaintext are clear errors, never a plaintext
//! connection; the `sslmode`s distlock cannot honour are refused.

use std::sync::OnceLock;
use std::time::Duration;

use crate::support::postgres::{shared_postgres, PostgresServer, TlsAccess};
use crate::support::tls::{certificates, Certificates};
use crate::support::wait_until;
use crate::with_feature::{client, exclusive_over, trust_the_test_roots, trusted_certificates};
use distlock::{BackendErrorKind, Client, Config, LockError};

/// A server that takes clients over TLS alone (`hostssl`), its certificate chaining to a CA
/// the system trusts (`SSL_CERT_FILE`).
fn tls_only_server() -> &'static PostgresServer {
    static SERVER: OnceLock<PostgresServer> = OnceLock::new();
    trust_the_test_roots();
    SERVER.get_or_init(|| PostgresServer::start_tls(trusted_certificates(), TlsAccess::TlsOnly))
}

/// A server with a CA of its own (nobody trusts it unless told), that takes only clients
/// with a certificate that CA signed, and those certificates.
fn client_certificate_server() -> &'static (PostgresServer, Certificates) {
    static SERVER: OnceLock<(PostgresServer, Certificates)> = OnceLock::new();
    trust_the_test_roots();
    SERVER.get_or_init(|| {
        let certificates = certificates();
        let server = PostgresServer::start_tls(&certificates, TlsAccess::ClientCertificate);
        (server, certificates)
    })
}

/// `postgres://postgres@localhost:PORT/postgres` with `query` (the host the certificates
/// name).
fn url(server: &PostgresServer, query: &str) -> String {
    format!(
        "postgres://postgres@localhost:{}/postgres{query}",
        server.port()
    )
}

/// The error a lock request through `config` ends with (it must not be granted).
async fn refusal(config: Config, key: &str) -> distlock::BackendError {
    match client(config)
        .lock(key)
        .wait(Duration::ZERO)
        .acquire()
        .await
    {
        Err(LockError::Backend(err)) => err,
        other => panic!("`{key}` must not be granted here: {other:?}"),
    }
}

/// Shown to fail (no `LISTEN` session appeared: the listener's plaintext connection was
/// refused by `hostssl`, and the waiter was woken by the backoff alone) with the listener
/// connecting through `NoTls`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_takes_the_pool_and_the_listener_over_tls() {
    let server = tls_only_server();
    let config = Config::postgres(&url(server, "?sslmode=verify-full"))
        .expect("sslmode=verify-full is accepted");
    let shown = format!("{config:?}");
    assert!(shown.contains("TLS"), "{shown}");
    let (a, b) = (client(config.clone()), client(config));
    exclusive_over(&a, &b, "tls:postgres").await;

    // A waiter listens for the release; its listener's session, like every other of
    // distlock's, comes over TLS (a plaintext one is refused by `hostssl`, so it would not be
    // there at all).
    let held = a
        .lock("tls:postgres-wake")
        .acquire()
        .await
        .expect("acquire");
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            b.lock("tls:postgres-wake")
                .wait(Duration::from_secs(30))
                .acquire()
                .await
        })
    };
    let sessions = || {
        server.psql(
            "SELECT count(*) FILTER (WHERE a.query LIKE 'LISTEN%'), \
                    count(*) FILTER (WHERE NOT s.ssl) \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()",
        )
    };
    tokio::task::spawn_blocking(move || {
        wait_until("a LISTEN session", Duration::from_secs(10), || {
            let now = sessions();
            match now.split_once('|') {
                Some((listeners, plain)) if listeners != "0" => {
                    assert_eq!(plain, "0", "a session without TLS: {now}");
                    Ok(())
                }
                _ => Err(format!(
                    "no LISTEN session yet (listening|plaintext): {now}"
                )),
            }
        })
    })
    .await
    .expect("the sessions were read");
    held.release().await.expect("release");
    let next = waiter
        .await
        .expect("the waiter")
        .expect("granted after the release");
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_and_a_client_certificate_go_in_through_the_config() {
    let (server, certificates) = client_certificate_server();
    // No sslmode: the certificates ask for TLS.
    let config = || {
        Config::postgres(&url(server, ""))
            .expect("a URL")
            .postgres_ca_pem(certificates.ca_pem.as_str())
            .postgres_client_cert(
                certificates.client_cert_pem.as_str(),
                certificates.client_key_pem.as_str(),
            )
    };
    exclusive_over(&client(config()), &client(config()), "tls:postgres-mutual").await;

    // Without the client certificate, the server says what it misses.
    let err = refusal(
        Config::postgres(&url(server, "?sslmode=verify-full"))
            .unwrap()
            .postgres_ca_pem(certificates.ca_pem.as_str()),
        "tls:postgres-no-client-cert",
    )
    .await;
    let message = err.to_string();
    assert!(message.contains("certificate"), "{message}");
    assert!(
        message.contains("Config::postgres_client_cert"),
        "{message}"
    );
}

/// Shown to fail (the connect error a `Connection`, its advice "check that PostgreSQL is
/// running") with the handshake's failure left unclassified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_no_trusted_root_vouches_for_is_a_clear_tls_error() {
    // That server's CA is its own: neither the system's roots nor this config trust it.
    let (server, _) = client_certificate_server();
    let config = Config::postgres(&url(server, "?sslmode=verify-full")).unwrap();
    let err = refusal(config, "tls:postgres-untrusted").await;
    let message = err.to_string();
    assert_eq!(err.kind(), BackendErrorKind::Tls, "{message}");
    assert!(message.contains("certificate"), "{message}");
    assert!(message.contains("Config::postgres_ca_pem"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_is_a_clear_tls_error() {
    // The certificate chains to a trusted root but names `localhost` and `127.0.0.1` only;
    // libpq's `hostaddr` reaches the server while the name checked is `host`'s.
    let server = tls_only_server();
    let config = Config::postgres(&format!(
        "host=db.example hostaddr=127.0.0.1 port={} user=postgres dbname=postgres \
         sslmode=verify-full",
        server.port()
    ))
    .unwrap();
    let err = refusal(config, "tls:postgres-other-host").await;
    let message = err.to_string();
    assert_eq!(err.kind(), BackendErrorKind::Tls, "{message}");
    assert!(
        message.contains("not valid for name \"db.example\""),
        "{message}"
    );
}

/// Shown to fail (granted, over plaintext) with the store's connections left at
/// tokio-postgres' `prefer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tls_is_an_error_never_a_plaintext_connection() {
    trust_the_test_roots();
    let plain = shared_postgres();
    let err = refusal(
        Config::postgres(&format!(
            "postgres://postgres@localhost:{}/postgres?sslmode=verify-full",
            plain.port()
        ))
        .unwrap(),
        "tls:postgres-no-tls",
    )
    .await;
    let message = err.to_string();
    assert_eq!(err.kind(), BackendErrorKind::Tls, "{message}");
    assert!(message.contains("does not support TLS"), "{message}");
}

/// Shown to fail (the advice "check the user and password in the URL") before the store read
/// the server's "no encryption".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostssl_only_server_refuses_plaintext_with_what_to_do() {
    let server = tls_only_server();
    for query in ["", "?sslmode=disable"] {
        let err = refusal(
            Config::postgres(&url(server, query)).unwrap(),
            "tls:postgres-plain",
        )
        .await;
        let message = err.to_string();
        assert!(message.contains("no encryption"), "{message}");
        assert!(message.contains("hostssl"), "{message}");
        assert!(message.contains("sslmode=verify-full"), "{message}");
    }
}

#[test]
fn the_sslmodes_distlock_cannot_honour_are_refused_with_what_to_say() {
    let base = "postgres://app@db.internal:5432/app";
    for (query, says) in [
        ("?sslmode=prefer", "falls back to plaintext"),
        ("?sslmode=allow", "falls back to plaintext"),
        ("?sslmode=verify-ca", "host name"),
        (
            "?sslmode=verify-full&sslrootcert=/etc/ca.pem",
            "Config::postgres_ca_pem",
        ),
        (
            "?sslcert=/a.crt&sslkey=/a.key",
            "Config::postgres_client_cert",
        ),
    ] {
        let err = Config::postgres(&format!("{base}{query}"))
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(err, LockError::Config(_)), "{query}: {err:?}");
        assert!(err.to_string().contains(says), "{query}: {err}");
    }
    // The key=value form reads the same.
    let err = Config::postgres("host=db.internal user=app sslmode=prefer")
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("falls back to plaintext"), "{err}");
    for taken in [
        "?sslmode=verify-full",
        "?sslmode=require",
        "?sslmode=disable",
        "",
    ] {
        let _ = Config::postgres(&format!("{base}{taken}")).expect(taken);
    }
    let _ = Config::postgres("host=db.internal user=app sslmode=verify-full").expect("key=value");
    // Certificates with `sslmode=disable` contradict each other; bad PEM is no certificate.
    let certificates = trusted_certificates();
    for (config, says) in [
        (
            Config::postgres(&format!("{base}?sslmode=disable"))
                .unwrap()
                .postgres_ca_pem(certificates.ca_pem.as_str()),
            "with `sslmode=disable`",
        ),
        (
            Config::postgres(base)
                .unwrap()
                .postgres_ca_pem("not a certificate"),
            "holds no PEM certificate",
        ),
    ] {
        let err = Client::new(config).map(|_| ()).unwrap_err();
        assert!(matches!(err, LockError::Config(_)), "{err:?}");
        assert!(err.to_string().contains(says), "{err}");
    }
}
