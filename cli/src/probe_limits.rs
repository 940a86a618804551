//! `iii-shell probe limits | alloc MIB | burn MS`, run as a command: what limits bind this
//! process as the kernel has them (its own cgroups, from `/proc/self/cgroup`), and two
//! bounded loads that meet them (memory touched, CPU burned).

use iii_shell_launch::pids_v1::{own_dir_of, Controller};

/// The limit files of each controller, as (file, v1?).
const FILES: [(Controller, &[&str], &[&str]); 3] = [
    (Controller::Pids, &["pids.max"], &["pids.max"]),
    (
        Controller::Memory,
        &["memory.max", "memory.swap.max"],
        &["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"],
    ),
    (
        Controller::Cpu,
        &["cpu.max"],
        &["cpu.cfs_quota_us", "cpu.cfs_period_us"],
    ),
];

/// This process's own cgroup v2 directory.
fn own_v2(mountinfo: &str, cgroup: &str) -> Option<std::path::PathBuf> {
    let mount = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(std::path::PathBuf::from))?
    })?;
    let rel = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(rel.trim_start_matches('/')))
}

fn read(dir: &std::path::Path, file: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(file))
        .ok()
        .map(|s| s.trim().to_string())
}

/// One line per controller: `NAME FILE=VALUE... (cgroup v1|v2 DIR)`, or `NAME none`.
pub fn limits() -> i32 {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let v2 = own_v2(&mountinfo, &cgroup);
    for (c, v2_files, v1_files) in FILES {
        let found = own_dir_of(c, &mountinfo, &cgroup)
            .map(|d| (d, v1_files, "v1"))
            .filter(|(d, f, _)| read(d, f[0]).is_some())
            .or_else(|| {
                v2.clone()
                    .map(|d| (d, v2_files, "v2"))
                    .filter(|(d, f, _)| read(d, f[0]).is_some())
            });
        match found {
            Some((dir, files, v)) => {
                let values: Vec<String> = files
                    .iter()
                    .filter_map(|f| read(&dir, f).map(|x| format!("{f}={x}")))
                    .collect();
                println!(
                    "{} {} (cgroup {v} {})",
                    c.name(),
                    values.join(" "),
                    dir.display()
                );
            }
            None => println!("{} none", c.name()),
        }
    }
    0
}

/// Touches `mib` MiB, one MiB at a time, printing how far it got every 16 MiB.
pub fn alloc(mib: usize) -> i32 {
    let mut held: Vec<Vec<u8>> = Vec::new();
    for i in 1..=mib {
        held.push(vec![0xa5; 1 << 20]);
        if i % 16 == 0 {
            println!("allocated {i} MiB");
        }
    }
    println!("allocated {} MiB in all", held.len());
    0
}

/// CPU time this process has used, in ms.
fn cpu_ms() -> u64 {
    // SAFETY: getrusage fills the struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

/// Spins for `ms` of wall time; prints the CPU time it got, and its cpu cgroup's throttling
/// counters (`cpu.stat`) where it can read them.
pub fn burn(ms: u64) -> i32 {
    let start = std::time::Instant::now();
    let mut x: u64 = 0;
    while start.elapsed() < std::time::Duration::from_millis(ms) {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let stat = own_dir_of(Controller::Cpu, &mountinfo, &cgroup)
        .or_else(|| own_v2(&mountinfo, &cgroup))
        .and_then(|d| read(&d, "cpu.stat"))
        .unwrap_or_default();
    let throttled = stat
        .lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .unwrap_or("unknown");
    println!(
        "cpu_ms={} wall_ms={} nr_throttled={throttled}",
        cpu_ms(),
        start.elapsed().as_millis()
    );
    0
}
