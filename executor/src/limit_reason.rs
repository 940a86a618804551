//! What a command killed for reaching its memory limit is told: one line, appended to its
//! `stderr` (a foreground exec's response and a background job's record alike), naming the
//! limit and where it came from.

/// A byte count as people read it: whole MiB or GiB where it is one, else bytes.
pub fn bytes(n: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if n >= GIB && n.is_multiple_of(GIB) {
        format!("{} GiB", n / GIB)
    } else if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else {
        format!("{n} bytes")
    }
}

/// The line for a job killed at its memory limit `limit`; `from_call` when the call's own
/// `limits.memory_max_bytes` set it.
pub fn memory_killed(limit: u64, from_call: bool) -> String {
    let key = if from_call {
        "limits.memory_max_bytes of the call"
    } else {
        "confinement.job_limits.memory_max_bytes"
    };
    format!(
        "iii-shell: killed: memory limit {} reached ({key})\n",
        bytes(limit)
    )
}

/// Warns once per process for each limit in `gone` (config keys with their controller) that
/// commands run without, because the job cgroups have no controller for it (best effort).
pub fn warn_once_without(gone: &[&'static str]) {
    static WARNED: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let Ok(mut warned) = WARNED.lock() else {
        return;
    };
    for name in gone {
        if !warned.contains(name) {
            warned.push(name);
            tracing::warn!(limit = %name, "confinement.job_limits.{name} cannot be enforced: the job cgroups have no controller for it, so commands run without this limit (best effort; strict mode refuses them); delegate the controller to iii-shell's cgroup (cgroup v2) or mount its cgroup v1 hierarchy");
        }
    }
}

/// `stderr` with the line appended, on a line of its own.
pub fn append(stderr: &mut String, line: &str) {
    if !stderr.is_empty() && !stderr.ends_with('\n') {
        stderr.push('\n');
    }
    stderr.push_str(line);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(64 << 20), "64 MiB");
        assert_eq!(bytes(2 << 30), "2 GiB");
        assert_eq!(bytes(1536 << 20), "1536 MiB");
        assert_eq!(bytes(1000), "1000 bytes");
    }

    #[test]
    fn the_line_names_the_limit_and_its_key() {
        assert_eq!(
            memory_killed(64 << 20, false),
            "iii-shell: killed: memory limit 64 MiB reached (confinement.job_limits.memory_max_bytes)\n"
        );
        assert_eq!(
            memory_killed(32 << 20, true),
            "iii-shell: killed: memory limit 32 MiB reached (limits.memory_max_bytes of the call)\n"
        );
        let mut s = "partial".to_string();
        append(&mut s, "x\n");
        assert_eq!(s, "partial\nx\n");
        let mut e = String::new();
        append(&mut e, "x\n");
        assert_eq!(e, "x\n");
    }
}
