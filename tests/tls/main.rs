//! TLS: `rediss://` end to end with the `tls` feature (`with_feature`), etcd's `https://`
//! endpoints (`etcd`) and PostgreSQL's `sslmode=verify-full` (`postgres`) with the store's
//! feature too, and what a build without it says (`without_feature`); each build runs the
//! ones that apply to it.
//!
//! Its own binary: `with_feature` points `SSL_CERT_FILE`, which is process-wide, at four
//! CAs (three Redis servers', and one for the etcd and PostgreSQL servers).

#[path = "../support/mod.rs"]
mod support;

#[cfg(all(feature = "tls", feature = "etcd"))]
mod etcd;
#[cfg(all(feature = "tls", feature = "postgres"))]
mod postgres;
#[cfg(feature = "tls")]
mod with_feature;
#[cfg(not(feature = "tls"))]
mod without_feature;
