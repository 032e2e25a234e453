//! A fault-injecting TCP proxy for tests (placeholder; see tests/stalled_connection.rs).
