//! CPU time, shared by the benches: this process's ([`process_cpu`], every thread, to the
//! nanosecond) and a server process's as `/proc` counts it ([`ProcessCpu`], in clock ticks:
//! `postgres.rs` sums PostgreSQL's processes, `etcd.rs` its members). Included with `#[path]`
//! (see `mod.rs`, the rest of the benches' shared code).

#![allow(dead_code)] // each bench uses its own part

use std::time::Duration;

/// CPU time this process has used (user + system, every thread, ended ones included), to the
/// nanosecond: `clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`, declared here as the `libc` crate is
/// no dependency (the 64-bit Linux layout of `struct timespec`).
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
pub fn process_cpu() -> Duration {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
    }
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut time = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `time` is a `struct timespec`, writable for the whole call.
    let status = unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut time) };
    assert_eq!(status, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

/// Elsewhere the client's CPU is not measured (reads zero).
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
pub fn process_cpu() -> Duration {
    Duration::ZERO
}

/// A process's CPU time from `/proc/<pid>/stat`, in clock ticks: its own threads' (user +
/// system) and that of its children that have ended and been waited for.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessCpu {
    pub own: u64,
    pub children: u64,
}

impl ProcessCpu {
    /// `pid`'s figures, or `None` if it is gone (or `/proc` is not there).
    pub fn of(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command's closing parenthesis, from the state (field 3) on.
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<u64> = rest
            .split_whitespace()
            .skip(1)
            .map(|field| field.parse().unwrap_or(0))
            .collect();
        // utime, stime, cutime, cstime are fields 14–17.
        Some(Self {
            own: fields.get(10..12).map_or(0, |f| f.iter().sum::<u64>()),
            children: fields.get(12..14).map_or(0, |f| f.iter().sum::<u64>()),
        })
    }
}

/// Clock ticks per second, the unit of [`ProcessCpu`] (`getconf CLK_TCK`; 100 if it cannot
/// be read).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|ticks| ticks.trim().parse().ok())
        .unwrap_or(100.0)
}
