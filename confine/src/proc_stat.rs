//! A process's resident memory and CPU time from `/proc/<pid>/stat`, for the worker's gauges.
//! Shared by the broker (its own, through a descriptor opened before Landlock) and the
//! executor (its own and the supervisor's).

use std::os::unix::fs::FileExt;

/// Resident memory and CPU time of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    pub rss_bytes: u64,
    /// User plus system time.
    pub cpu_micros: u64,
}

/// Parses the text of `/proc/<pid>/stat`: `utime` and `stime` (fields 14 and 15, in clock
/// ticks) and `rss` (field 24, in pages). The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse(text: &str, ticks_per_sec: u64, page_size: u64) -> Option<Sample> {
    let after = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_ascii_whitespace().collect();
    // `after` starts at field 3 (state).
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    let (utime, stime, rss) = (field(14)?, field(15)?, field(24)?);
    let tps = ticks_per_sec.max(1);
    Some(Sample {
        rss_bytes: rss.saturating_mul(page_size),
        cpu_micros: (utime + stime).saturating_mul(1_000_000) / tps,
    })
}

/// Clock ticks per second and the page size (from the auxiliary vector: no system call).
pub fn units() -> (u64, u64) {
    // SAFETY: sysconf only reads process constants.
    let (tps, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (
        u64::try_from(tps).unwrap_or(100).max(1),
        u64::try_from(page).unwrap_or(4096).max(1),
    )
}

/// Reads a sample through an open `/proc/<pid>/stat` (re-read from offset 0 each time).
pub fn read(file: &std::fs::File) -> Option<Sample> {
    let mut buf = [0u8; 1024];
    let n = file.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let (tps, page) = units();
    parse(text, tps, page)
}

/// Reads a sample of process `pid` (`None` for this process).
pub fn read_pid(pid: Option<u32>) -> Option<Sample> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    read(&std::fs::File::open(path).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_counted_from_the_last_parenthesis() {
        // A command name with a space and a parenthesis in it.
        let text = "4242 (iii shell) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 12345 9000000 1500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        assert_eq!(
            parse(text, 100, 4096),
            Some(Sample {
                rss_bytes: 1500 * 4096,
                cpu_micros: 3_000_000,
            })
        );
        assert_eq!(parse("garbage", 100, 4096), None);
        assert_eq!(parse("1 (x) S 1 2", 100, 4096), None);
    }

    #[test]
    fn this_process_has_memory_and_a_start() {
        let s = read_pid(None).expect("/proc/self/stat");
        assert!(s.rss_bytes > 1 << 20, "{s:?}");
    }
}
