//! A process's resident memory (`/proc/<pid>/statm`) and CPU time (`/proc/<pid>/stat`), for
//! the worker's gauges. Shared by the broker (its own, through descriptors opened before
//! Landlock) and the executor (its own and the supervisor's). Both files are world-readable
//! and need no ptrace access.

use std::os::unix::fs::FileExt;

/// Resident memory and CPU time of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    pub rss_bytes: u64,
    /// The file-backed part of `rss_bytes` (the binary, libc: pages processes share).
    pub file_bytes: u64,
    /// User plus system time.
    pub cpu_micros: u64,
}

/// CPU time from the text of `/proc/<pid>/stat`: `utime` and `stime` (fields 14 and 15, in
/// clock ticks). The command name (field 2) may hold spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn parse_stat(text: &str, ticks_per_sec: u64) -> Option<u64> {
    let after = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_ascii_whitespace().collect();
    // `after` starts at field 3 (state).
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    let (utime, stime) = (field(14)?, field(15)?);
    Some((utime + stime).saturating_mul(1_000_000) / ticks_per_sec.max(1))
}

/// Resident and file-backed resident bytes from the text of `/proc/<pid>/statm` (its second
/// and third fields, in pages).
pub fn parse_statm(text: &str, page_size: u64) -> Option<(u64, u64)> {
    let mut f = text.split_ascii_whitespace().skip(1);
    let resident: u64 = f.next()?.parse().ok()?;
    let shared: u64 = f.next()?.parse().ok()?;
    Some((
        resident.saturating_mul(page_size),
        shared.min(resident).saturating_mul(page_size),
    ))
}

/// The memory of processes that share one binary: each one's own (anonymous) pages, and the
/// file-backed pages once, as much as the process holding the most of them (the others
/// hold mostly the same pages of the same files).
pub fn combined_rss(samples: &[Sample]) -> u64 {
    let own: u64 = samples
        .iter()
        .map(|s| s.rss_bytes.saturating_sub(s.file_bytes))
        .sum();
    own + samples.iter().map(|s| s.file_bytes).max().unwrap_or(0)
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

fn text_of(file: &std::fs::File, buf: &mut [u8]) -> Option<usize> {
    file.read_at(buf, 0).ok()
}

/// Open `/proc/<pid>/stat` and `/proc/<pid>/statm`, re-read from offset 0 at each sample.
#[derive(Debug)]
pub struct Files {
    stat: std::fs::File,
    statm: std::fs::File,
}

impl Files {
    /// `None` for this process.
    pub fn open(pid: Option<u32>) -> Option<Files> {
        let dir = match pid {
            Some(p) => format!("/proc/{p}"),
            None => "/proc/self".to_string(),
        };
        Some(Files {
            stat: std::fs::File::open(format!("{dir}/stat")).ok()?,
            statm: std::fs::File::open(format!("{dir}/statm")).ok()?,
        })
    }

    pub fn read(&self) -> Option<Sample> {
        let (tps, page) = units();
        let mut buf = [0u8; 1024];
        let n = text_of(&self.stat, &mut buf)?;
        let cpu_micros = parse_stat(std::str::from_utf8(&buf[..n]).ok()?, tps)?;
        let n = text_of(&self.statm, &mut buf)?;
        let (rss_bytes, file_bytes) = parse_statm(std::str::from_utf8(&buf[..n]).ok()?, page)?;
        Some(Sample {
            rss_bytes,
            file_bytes,
            cpu_micros,
        })
    }
}

/// Reads a sample of process `pid` (`None` for this process).
pub fn read_pid(pid: Option<u32>) -> Option<Sample> {
    Files::open(pid)?.read()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_counted_from_the_last_parenthesis() {
        // A command name with a space and a parenthesis in it.
        let text = "4242 (iii shell) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 12345 9000000 1500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        assert_eq!(parse_stat(text, 100), Some(3_000_000));
        assert_eq!(parse_stat("garbage", 100), None);
        assert_eq!(parse_stat("1 (x) S 1 2", 100), None);
    }

    #[test]
    fn statm_gives_resident_and_file_backed_pages() {
        assert_eq!(
            parse_statm("5000 1500 1200 300 0 400 0\n", 4096),
            Some((1500 * 4096, 1200 * 4096))
        );
        assert_eq!(parse_statm("5000", 4096), None);
    }

    #[test]
    fn shared_file_pages_count_once() {
        let s = |rss, file| Sample {
            rss_bytes: rss,
            file_bytes: file,
            cpu_micros: 0,
        };
        // Own pages 2 + 3 + 1, file-backed pages at most 8: 14.
        assert_eq!(combined_rss(&[s(10, 8), s(10, 7), s(7, 6)]), 14);
        assert_eq!(combined_rss(&[]), 0);
    }

    #[test]
    fn this_process_has_memory_and_cpu() {
        let s = read_pid(None).expect("/proc/self");
        assert!(
            s.rss_bytes > 1 << 20 && s.file_bytes > 0 && s.file_bytes < s.rss_bytes,
            "{s:?}"
        );
    }
}
