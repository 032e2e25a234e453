//! A `redis-server` that speaks only TLS, with a certificate authority made for it at test
//! time (rcgen): the CA's certificate is what a client must trust, the server's certificate
//! names `localhost` and `127.0.0.1`. Each server gets a CA of its own, so trusting one
//! server's CA does not make another's certificate valid. [`certificates`] makes such a set
//! for the etcd and PostgreSQL servers of `etcd.rs` and `postgres.rs` too.

use std::path::PathBuf;

use super::{free_port, require_redis_server, scratch_dir, server_args, RedisServer};

/// A running TLS-only server and the files a client needs to trust it.
pub struct TlsRedisServer {
    server: RedisServer,
    port: u16,
    ca_pem: String,
    ca_file: PathBuf,
    /// A client certificate and key (PEM) the CA signed, for servers that require one.
    client_cert_pem: String,
    client_key_pem: String,
}

impl TlsRedisServer {
    /// Starts a server on a free loopback port that accepts TLS only (`--port 0`) and does not
    /// ask clients for certificates.
    pub fn start() -> Self {
        Self::start_with_client_auth(false)
    }

    /// Like [`start`](Self::start); with `required`, the server accepts only clients that
    /// show a certificate its CA signed ([`client_cert_pem`](Self::client_cert_pem)).
    pub fn start_with_client_auth(required: bool) -> Self {
        require_redis_server();
        let dir = scratch_dir("tls");
        let Certificates {
            ca_pem,
            server_cert_pem: cert_pem,
            server_key_pem: key_pem,
            client_cert_pem,
            client_key_pem,
        } = certificates();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write a TLS file");
            path.to_string_lossy().into_owned()
        };
        let ca_file = write("ca.pem", &ca_pem);
        let cert_file = write("server.pem", &cert_pem);
        let key_file = write("server.key", &key_pem);
        for _ in 0..5 {
            let port = free_port();
            let tls_port = port.to_string();
            let extra = [
                "--port",
                "0",
                "--tls-port",
                &tls_port,
                "--tls-cert-file",
                &cert_file,
                "--tls-key-file",
                &key_file,
                "--tls-ca-cert-file",
                &ca_file,
                "--tls-auth-clients",
                if required { "yes" } else { "no" },
            ];
            if let Ok(server) = RedisServer::launch(port, server_args(port, &extra)) {
                return Self {
                    server,
                    port,
                    ca_pem,
                    ca_file: PathBuf::from(ca_file),
                    client_cert_pem,
                    client_key_pem,
                };
            }
        }
        panic!(
            "could not start a TLS redis-server after 5 tries; it needs a redis-server built \
             with TLS (Debian's is)"
        );
    }

    /// `rediss://localhost:PORT` (the host the certificate names).
    pub fn url(&self) -> String {
        format!("rediss://localhost:{}", self.port)
    }

    /// The port the server takes TLS connections on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The PEM of the certificate authority that signed the server's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA's PEM file.
    pub fn ca_file(&self) -> &std::path::Path {
        &self.ca_file
    }

    /// A client certificate the CA signed (PEM).
    pub fn client_cert_pem(&self) -> &str {
        &self.client_cert_pem
    }

    /// The key of [`client_cert_pem`](Self::client_cert_pem) (PEM).
    pub fn client_key_pem(&self) -> &str {
        &self.client_key_pem
    }

    /// The underlying server (to stop or signal it).
    pub fn server(&self) -> &RedisServer {
        &self.server
    }
}

/// What [`certificates`] makes, all PEM: for the TLS servers of other stores too (etcd's
/// `--cert-file`, PostgreSQL's `ssl_cert_file`).
pub struct Certificates {
    /// The CA's certificate: what a client must trust.
    pub ca_pem: String,
    /// The server's certificate, for `localhost` and `127.0.0.1`.
    pub server_cert_pem: String,
    /// The server certificate's key.
    pub server_key_pem: String,
    /// A client certificate the CA signed (common name `distlock test client`).
    pub client_cert_pem: String,
    /// The client certificate's key.
    pub client_key_pem: String,
}

impl Certificates {
    /// Writes the CA's certificate, the server's certificate and its key (mode 0600) into
    /// `dir` as `ca.pem`, `server.pem` and `server.key`, and returns their paths in that
    /// order.
    pub fn write_server_files(&self, dir: &std::path::Path) -> [PathBuf; 3] {
        use std::os::unix::fs::PermissionsExt;
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .unwrap_or_else(|err| panic!("write {}: {err}", path.display()));
            path
        };
        let ca = write("ca.pem", &self.ca_pem);
        let cert = write("server.pem", &self.server_cert_pem);
        let key = write("server.key", &self.server_key_pem);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
            .expect("make the server's key private");
        [ca, cert, key]
    }
}

/// A fresh CA, a server certificate it signed for `localhost` and `127.0.0.1`, and a client
/// certificate it signed.
pub fn certificates() -> Certificates {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "distlock test CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA certificate");

    let server_params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("server params");
    let server_key = rcgen::KeyPair::generate().expect("server key");
    let server_cert = server_params
        .signed_by(&server_key, &ca)
        .expect("server certificate");

    let mut client_params =
        rcgen::CertificateParams::new(Vec::<String>::new()).expect("client params");
    client_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "distlock test client");
    client_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = rcgen::KeyPair::generate().expect("client key");
    let client_cert = client_params
        .signed_by(&client_key, &ca)
        .expect("client certificate");

    Certificates {
        ca_pem: ca.pem(),
        server_cert_pem: server_cert.pem(),
        server_key_pem: server_key.serialize_pem(),
        client_cert_pem: client_cert.pem(),
        client_key_pem: client_key.serialize_pem(),
    }
}
