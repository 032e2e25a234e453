//! Where a bench and its servers run (issue 10): unless `BENCH_PIN=0` (or the machine has a
//! single CPU), the servers on CPU 0 and the bench on CPU 1, so that client and servers never
//! take turns on one core. [`pin`] sets `DISTLOCK_SERVER_CPUS` (unless it is set already),
//! which the tests' support reads to start each server under `taskset -c`, and pins this
//! process with `taskset -p -c` to `BENCH_CLIENT_CPUS` (default `1`) before any thread starts:
//! its threads inherit that. Neighbours: `header.rs` reports the placement; the servers are
//! `tests/support/`'s.

use std::process::Command;

/// Puts the servers on CPU 0 (`DISTLOCK_SERVER_CPUS`, unless set) and this process on
/// `BENCH_CLIENT_CPUS` (default 1), unless `BENCH_PIN=0` or the machine has one CPU. Must run
/// before any thread starts. Returns what was done, for the header; `servers` names the
/// servers there (`servers`, `server`).
pub fn pin(servers: &str) -> String {
    if std::env::var("BENCH_PIN").as_deref() == Ok("0") {
        return format!("not pinned (BENCH_PIN=0): {}", placement(servers));
    }
    if online_cpus() < 2 {
        return format!("not pinned (a single CPU): {}", placement(servers));
    }
    if std::env::var_os("DISTLOCK_SERVER_CPUS").is_none() {
        std::env::set_var("DISTLOCK_SERVER_CPUS", "0");
    }
    pin_process(&std::env::var("BENCH_CLIENT_CPUS").unwrap_or_else(|_| "1".to_owned()));
    placement(servers)
}

/// Where the servers and this process run.
fn placement(servers: &str) -> String {
    let cpus = std::env::var("DISTLOCK_SERVER_CPUS").unwrap_or_else(|_| "any".to_owned());
    format!(
        "{servers} on CPUs {cpus}, client on CPUs {}",
        allowed_cpus()
    )
}

/// Pins this process to `cpus` with `taskset`. Done while it has a single thread: the threads
/// created later inherit its CPUs.
fn pin_process(cpus: &str) {
    let pid = std::process::id().to_string();
    let output = Command::new("taskset")
        .args(["-p", "-c", cpus, &pid])
        .output()
        .unwrap_or_else(|err| {
            fail(&format!(
                "cannot run taskset to pin the client ({err}); install util-linux or set BENCH_PIN=0"
            ))
        });
    if !output.status.success() {
        fail(&format!(
            "`taskset -p -c {cpus} {pid}` failed: {}; set BENCH_CLIENT_CPUS, or BENCH_PIN=0",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
}

/// Stops the bench with `message`, naming the bench (`benches/locks.rs: …`).
pub fn fail(message: &str) -> ! {
    eprintln!("benches/{}.rs: {message}", env!("CARGO_CRATE_NAME"));
    std::process::exit(2)
}

/// How many CPUs a list like `0-3,6` (the kernel's notation) names.
fn cpu_count(list: &str) -> usize {
    list.trim()
        .split(',')
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once('-') {
            Some((first, last)) => {
                let number = |n: &str| n.parse::<usize>().unwrap_or(0);
                (number(last) + 1).saturating_sub(number(first))
            }
            None => 1,
        })
        .sum()
}

/// The CPUs online, as `nproc --all` counts them.
pub fn online_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .map(|list| cpu_count(&list))
        .unwrap_or_else(|_| std::thread::available_parallelism().map_or(1, usize::from))
}

/// The CPUs this process may run on (`Cpus_allowed_list` of `/proc/self/status`).
fn allowed_cpus() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .map_or("?".to_owned(), |list| list.trim().to_owned())
}
