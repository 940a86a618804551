//! The job-cgroup bases of executors (`iii-shell-<pid>` beside the executor's own cgroup, in
//! cgroup v2 and in a cgroup v1 `pids` hierarchy alike): where they are, which belong to
//! executors that are gone, and how what is left in one is killed and removed. The supervisor
//! uses these on a dead executor's base; a launcher sweeps them before it makes its own.

use std::path::{Path, PathBuf};

/// This process's own cgroup v2 directory, where executors create their bases.
pub fn own_cgroup_dir() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .trim_start_matches('/');
    Some(mount.join(rel))
}

/// The job-cgroup base of the executor `pid`, when that executor was started in our own
/// cgroup (as `serve` starts it) and made one.
pub fn base_of(pid: u32) -> Option<PathBuf> {
    let base = own_cgroup_dir()?.join(format!("iii-shell-{pid}"));
    base.is_dir().then_some(base)
}

/// Kills every process in a job-cgroup base and all its job cgroups (`cgroup.kill` on the
/// base reaches the whole subtree, setsid daemons included), waits up to 5 s for them to be
/// gone and removes the cgroups. Used on the base of an executor that died: what it started
/// must not outlive it. True when the base is gone.
pub fn kill_base(base: &Path) -> bool {
    let _ = std::fs::write(base.join("cgroup.kill"), "1");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let populated = std::fs::read_to_string(base.join("cgroup.events"))
            .map(|t| !t.lines().any(|l| l.trim() == "populated 0"))
            .unwrap_or(false);
        if !populated || std::time::Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    remove_empty_base(base);
    !base.exists()
}

/// The pid of the process that made a base called `iii-shell-<rest>`: `<pid>` (an
/// executor's base) or `<pid>-<name>` (another launcher of that process, a test's).
fn owner_pid(rest: &str) -> Option<u32> {
    rest.split_once('-')
        .map_or(rest, |(pid, _)| pid)
        .parse()
        .ok()
}

/// The bases under `parent` (`iii-shell-<pid>`, `iii-shell-<pid>-<name>`) of processes that
/// no longer run: neither this process nor a live one.
pub fn stale_bases(parent: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("iii-shell-"))
                .and_then(owner_pid)
                .is_some_and(|pid| {
                    pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
                })
        })
        .map(|e| e.path())
        .collect()
}

/// Kills what is left in the job-cgroup bases of executors that no longer exist, and removes
/// them. An executor runs without capabilities once hardened, so when the cgroup parent is
/// only writable with CAP_DAC_OVERRIDE it cannot remove its own base on exit; the next
/// executor, which sweeps before it drops its capabilities, does. A dead executor's commands
/// (an executor killed with SIGKILL leaves them running) are killed first: nothing it
/// started outlives it, even when no supervisor did it already.
pub fn sweep_stale_bases(parent: &Path) {
    for base in stale_bases(parent) {
        if base.join("cgroup.kill").exists() {
            kill_base(&base);
        } else {
            remove_empty_base(&base);
        }
    }
}

/// Removes a base whose cgroups hold no process: its job cgroups, then itself (one that
/// still holds processes stays).
pub fn remove_empty_base(base: &Path) {
    if let Ok(jobs) = std::fs::read_dir(base) {
        for j in jobs.flatten() {
            if j.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir(j.path());
            }
        }
    }
    let _ = std::fs::remove_dir(base);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_removes_bases_of_dead_executors_only() {
        let dir = tempfile::tempdir().unwrap();
        // A pid that cannot exist (above pid_max) and one that always does (init).
        let dead = dir.path().join("iii-shell-4294967294");
        let live = dir.path().join("iii-shell-1");
        let other = dir.path().join("not-ours-4294967294");
        // Another launcher's base, of a process that is gone and of this one.
        let dead_named = dir.path().join("iii-shell-4294967294-b");
        let own_named = dir
            .path()
            .join(format!("iii-shell-{}-b", std::process::id()));
        std::fs::create_dir_all(&dead_named).unwrap();
        std::fs::create_dir_all(&own_named).unwrap();
        std::fs::create_dir_all(dead.join("job-1")).unwrap();
        std::fs::create_dir_all(&live).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        sweep_stale_bases(dir.path());
        assert!(!dead.exists(), "a dead executor's base is swept");
        assert!(live.exists(), "a live executor's base is kept");
        assert!(!dead_named.exists(), "a dead process's named base is swept");
        assert!(own_named.exists(), "this process's named base is kept");
        assert!(
            other.exists(),
            "directories that are not ours are left alone"
        );
    }
}
