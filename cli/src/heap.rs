//! The allocator's share of the worker's memory: one malloc arena per process, and freed heap
//! handed back to the kernel once the process has been quiet for a while.
//!
//! glibc's malloc keeps what a program frees. Pages in the middle of the heap stay resident
//! until `malloc_trim` gives them back (its automatic trim only returns the very top, which a
//! single live allocation pins), and every thread that allocates gets an arena of its own
//! (up to eight per core), each keeping its own freed pages. After a burst of 200 concurrent
//! calls the executor held about 29 MB of heap with under 1 MB of it in use (`malloc_info`).
//!
//! So each half of the worker runs with one arena ([`one_arena`], before any thread exists)
//! and a [`trim_when_quiet`] task: every [`POLL`] it reads the process's CPU time, and once a
//! poll finds the process quiet after work worth trimming for ([`should_trim`]), it calls
//! `malloc_trim(0)` once. An idle worker wakes once per poll and trims seldom (its
//! background work adds up to [`WORTH_CPU`] in about a minute); a busy one never trims. On other C libraries both are no-ops.

use std::time::Duration;

/// How often the trim task looks at the process's CPU time.
pub const POLL: Duration = Duration::from_secs(2);
/// At most this much CPU time in one poll (1 %) reads as quiet: an idle broker still answers
/// the engine's pings and ships its gauges, a few milliseconds a second.
pub const QUIET_CPU: Duration = Duration::from_millis(20);
/// The CPU time since the last trim that makes another one worth doing: less work than this
/// leaves too little freed memory to notice. An idle broker reaches it in about a minute, and
/// a trim of a heap with nothing to give back costs microseconds.
pub const WORTH_CPU: Duration = Duration::from_millis(100);

/// Whether to trim now: the last poll was quiet, and enough work happened since the last
/// trim (or since start) to have left freed memory behind.
pub fn should_trim(cpu_this_poll: Duration, cpu_since_trim: Duration) -> bool {
    cpu_this_poll <= QUIET_CPU && cpu_since_trim >= WORTH_CPU
}

/// Allocations from this size up get a mapping of their own, returned whole when freed.
pub const MMAP_THRESHOLD: i32 = 128 * 1024;

/// One malloc arena for every thread of the process, and a fixed [`MMAP_THRESHOLD`]. Call
/// before any thread is started.
///
/// The threshold is glibc's default, but left alone glibc raises it to the size of every
/// mapped block that is freed (up to 32 MiB): after one terminal's 2 MiB ring was freed, the
/// next terminal's ring came from the heap, and stayed there once freed. Setting it turns
/// that adjustment off.
pub fn one_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Hands every free page of every arena back to the kernel.
pub fn release_free() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes the allocator's own locks; it frees nothing in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The CPU time the whole process has used.
fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// Trims the heap once after each stretch of work, when the process goes quiet (see the
/// module doc). Runs until the runtime stops.
pub async fn trim_when_quiet() {
    let mut last_poll = process_cpu();
    let mut last_trim = Duration::ZERO;
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = process_cpu();
        if should_trim(now.saturating_sub(last_poll), now.saturating_sub(last_trim)) {
            // A trim of a large heap takes a millisecond or two: off the serving thread.
            let _ = tokio::task::spawn_blocking(release_free).await;
            last_trim = process_cpu();
            tracing::debug!("heap trimmed after work");
        }
        last_poll = process_cpu();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn trims_once_quiet_after_enough_work() {
        // (CPU in the last poll, CPU since the last trim) -> trim?
        let cases = [
            (ms(0), ms(0), false),    // idle since the last trim
            (ms(0), ms(99), false),   // too little work to bother
            (ms(0), ms(100), true),   // quiet after work: trim
            (ms(20), ms(500), true),  // a little background noise still reads as quiet
            (ms(21), ms(500), false), // still working
            (ms(400), ms(400), false),
        ];
        for (poll, since, want) in cases {
            assert_eq!(should_trim(poll, since), want, "{poll:?} {since:?}");
        }
    }

    #[test]
    fn process_cpu_advances_with_work() {
        let a = process_cpu();
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < ms(30) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(process_cpu() - a >= ms(10));
    }
}
