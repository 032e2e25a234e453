//! CPU time of the benchmark process, shared by the benches (`locks.rs`, `client_costs.rs`).

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
