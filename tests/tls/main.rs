//! TLS: `rediss://` end to end with the `tls` feature (`with_feature`), and what a build
//! without it says (`without_feature`); each build runs the one that applies to it.
//!
//! Its own binary: `with_feature` points `SSL_CERT_FILE`, which is process-wide, at three
//! servers' CAs.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "tls")]
mod with_feature;
#[cfg(not(feature = "tls"))]
mod without_feature;
