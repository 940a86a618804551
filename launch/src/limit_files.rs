//! What a job's limits ([`crate::cgroups::JobLimits`]) are written as: the files and their
//! exact values, in the order they are written, for a cgroup v2 job cgroup and for the twins
//! in cgroup v1 hierarchies ([`crate::pids_v1`]). Pure: the caller writes them.
//!
//! - memory: v2 `memory.max` and `memory.swap.max` (0 while a limit is set, so that the limit
//!   is not escaped by swapping); v1 `memory.limit_in_bytes` and, where swap accounting is on,
//!   `memory.memsw.limit_in_bytes` (memory + swap, set to the same value). The kernel refuses
//!   a `memsw` limit below `limit_in_bytes`, so `memsw` is lifted first.
//! - CPU: a share of one CPU in percent, as a quota per period of [`CPU_PERIOD_US`]: v2
//!   `cpu.max` ("quota period"), v1 `cpu.cfs_period_us` and `cpu.cfs_quota_us` (-1 for none).
//! - processes: `pids.max` on both.

/// The CFS period every job's CPU quota is a share of: 100 ms, the kernel's default.
pub const CPU_PERIOD_US: u64 = 100_000;

/// The CPU quota per [`CPU_PERIOD_US`] for `percent` of one CPU (250 is two and a half CPUs).
pub fn cpu_quota_us(percent: u32) -> u64 {
    u64::from(percent) * CPU_PERIOD_US / 100
}

/// A limit file's value in cgroup v2: the number, or "max" for none.
pub fn v2_value(limit: Option<u64>) -> String {
    limit.map_or_else(|| "max".to_string(), |n| n.to_string())
}

/// A limit file's value in cgroup v1: the number, or "-1" for none.
pub fn v1_value(limit: Option<u64>) -> String {
    limit.map_or_else(|| "-1".to_string(), |n| n.to_string())
}

/// v2: `memory.max`, then `memory.swap.max` (written only where the file exists).
pub fn v2_memory(limit: Option<u64>) -> Vec<(&'static str, String)> {
    vec![
        ("memory.max", v2_value(limit)),
        (
            "memory.swap.max",
            if limit.is_some() { "0" } else { "max" }.to_string(),
        ),
    ]
}

/// v2: `cpu.max` as "quota period".
pub fn v2_cpu(percent: Option<u32>) -> Vec<(&'static str, String)> {
    let quota = percent.map(cpu_quota_us);
    vec![("cpu.max", format!("{} {CPU_PERIOD_US}", v2_value(quota)))]
}

/// v1 memory twin: `memsw` lifted, the limit, then `memsw` to the same value (the `memsw`
/// files are skipped where swap accounting is off).
pub fn v1_memory(limit: Option<u64>) -> Vec<(&'static str, String)> {
    let v = v1_value(limit);
    vec![
        ("memory.memsw.limit_in_bytes", "-1".to_string()),
        ("memory.limit_in_bytes", v.clone()),
        ("memory.memsw.limit_in_bytes", v),
    ]
}

/// v1 cpu twin: the period, then the quota.
pub fn v1_cpu(percent: Option<u32>) -> Vec<(&'static str, String)> {
    vec![
        ("cpu.cfs_period_us", CPU_PERIOD_US.to_string()),
        ("cpu.cfs_quota_us", v1_value(percent.map(cpu_quota_us))),
    ]
}

/// `pids.max`, v1 and v2 alike.
pub fn pids(limit: Option<u64>) -> Vec<(&'static str, String)> {
    vec![("pids.max", v2_value(limit))]
}

/// Whether a missing file may be skipped: swap files exist only with swap accounting.
pub fn optional(file: &str) -> bool {
    file == "memory.swap.max" || file.starts_with("memory.memsw.")
}

/// How many times a job's memory cgroup has had the OOM killer kill in it, from its
/// `memory.events` (v2) or `memory.oom_control` (v1): the `oom_kill N` line of either.
pub fn oom_kills(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: Vec<(&'static str, String)>) -> Vec<(&'static str, &'static str)> {
        // Only the test's expected literals are compared: turn the values into them.
        v.into_iter().map(|(f, s)| (f, &*String::leak(s))).collect()
    }

    #[test]
    fn cgroup_v2_memory_and_swap() {
        assert_eq!(
            pairs(v2_memory(Some(64 << 20))),
            vec![("memory.max", "67108864"), ("memory.swap.max", "0")]
        );
        assert_eq!(
            pairs(v2_memory(None)),
            vec![("memory.max", "max"), ("memory.swap.max", "max")]
        );
    }

    #[test]
    fn cgroup_v2_cpu_max_is_quota_and_period() {
        assert_eq!(pairs(v2_cpu(Some(20))), vec![("cpu.max", "20000 100000")]);
        assert_eq!(pairs(v2_cpu(Some(250))), vec![("cpu.max", "250000 100000")]);
        assert_eq!(pairs(v2_cpu(Some(1))), vec![("cpu.max", "1000 100000")]);
        assert_eq!(pairs(v2_cpu(None)), vec![("cpu.max", "max 100000")]);
    }

    #[test]
    fn cgroup_v1_memory_lifts_memsw_first() {
        assert_eq!(
            pairs(v1_memory(Some(64 << 20))),
            vec![
                ("memory.memsw.limit_in_bytes", "-1"),
                ("memory.limit_in_bytes", "67108864"),
                ("memory.memsw.limit_in_bytes", "67108864"),
            ]
        );
        assert_eq!(
            pairs(v1_memory(None)),
            vec![
                ("memory.memsw.limit_in_bytes", "-1"),
                ("memory.limit_in_bytes", "-1"),
                ("memory.memsw.limit_in_bytes", "-1"),
            ]
        );
    }

    #[test]
    fn cgroup_v1_cpu_quota() {
        assert_eq!(
            pairs(v1_cpu(Some(20))),
            vec![
                ("cpu.cfs_period_us", "100000"),
                ("cpu.cfs_quota_us", "20000")
            ]
        );
        assert_eq!(
            pairs(v1_cpu(None)),
            vec![("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "-1")]
        );
    }

    #[test]
    fn pids_max_and_optional_files() {
        assert_eq!(pairs(pids(Some(64))), vec![("pids.max", "64")]);
        assert_eq!(pairs(pids(None)), vec![("pids.max", "max")]);
        assert!(optional("memory.swap.max"));
        assert!(optional("memory.memsw.limit_in_bytes"));
        assert!(!optional("memory.max"));
        assert!(!optional("cpu.max"));
    }

    #[test]
    fn oom_kill_counts() {
        assert_eq!(
            oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"),
            3
        );
        assert_eq!(
            oom_kills("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n"),
            1
        );
        assert_eq!(oom_kills("oom_kill_disable 0\n"), 0);
    }
}
