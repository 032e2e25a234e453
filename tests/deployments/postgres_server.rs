//! The test support's PostgreSQL server checked against the real process: it starts and
//! answers as an unprivileged user, keeps its data across a restart and recovers from a
//! SIGKILL, freezes and thaws every process, and leaves nothing behind when dropped. The
//! Postgres store's tests build on it; when one of them fails, this file says whether the
//! support is to blame.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::support::postgres::PostgresServer;
use crate::support::process::{is_gone, is_stopped};
use crate::support::wait_until;

/// The user id a process runs as, from `/proc/PID/status` (`Uid: real effective ...`).
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("Uid:"))
        .unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

fn wait_gone(pids: &[u32]) {
    for &pid in pids {
        wait_until(
            "a server process to be gone",
            Duration::from_secs(10),
            || {
                if is_gone(pid) {
                    Ok(())
                } else {
                    Err(format!("process {pid} still runs"))
                }
            },
        );
    }
}

#[tokio::test]
async fn a_started_server_answers_as_an_unprivileged_user_and_leaves_nothing_when_dropped() {
    let server = PostgresServer::start();
    assert_eq!(server.psql("SELECT 1"), "1");
    let client = server.connect().await;
    let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);

    let uid = uid_of(server.pid());
    assert_ne!(uid, 0, "the postmaster runs as root");
    let data_dir = server.psql("SELECT current_setting('data_directory')");
    assert_eq!(std::fs::metadata(&data_dir).unwrap().uid(), uid);

    let processes = server.processes();
    assert!(processes.len() > 1, "no backend or helper: {processes:?}");
    drop(client);
    drop(server);
    wait_gone(&processes);
    assert!(
        !std::path::Path::new(&data_dir).exists(),
        "{data_dir} is left"
    );
}

#[test]
fn a_committed_row_survives_a_restart_on_the_same_port() {
    let mut server = PostgresServer::start();
    let (url, pid) = (server.url(), server.pid());
    server.psql("CREATE TABLE kept (id int); INSERT INTO kept VALUES (7)");

    server.restart();
    assert!(is_gone(pid));
    assert_eq!(server.url(), url);
    assert_eq!(server.psql("SELECT id FROM kept"), "7");
}

#[test]
fn a_frozen_server_thaws_and_a_killed_one_recovers_on_restart() {
    let mut server = PostgresServer::start();
    server.psql("CREATE TABLE kept (id int); INSERT INTO kept VALUES (7)");

    server.freeze();
    let processes = server.processes();
    for &pid in &processes {
        assert!(is_stopped(pid), "process {pid} of {processes:?} runs");
    }
    server.thaw();
    assert_eq!(server.psql("SELECT 1"), "1");

    let processes = server.processes();
    server.kill();
    wait_gone(&processes);
    server.restart();
    assert_eq!(server.psql("SELECT id FROM kept"), "7");
}
