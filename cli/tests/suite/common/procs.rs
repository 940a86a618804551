//! Processes as `/proc` shows them: command lines, states, children, unique markers for test
//! commands, and the executor's job cgroups.

use std::path::{Path, PathBuf};

/// The command line of `pid`, NULs as spaces.
pub fn cmdline(pid: i32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        String::from_utf8_lossy(&raw)
            .replace('\0', " ")
            .trim_end()
            .to_string(),
    )
}

/// `(state, ppid)` of `pid`.
fn stat(pid: i32) -> Option<(char, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = s.rsplit_once(')')?;
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((state, ppid))
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// True while `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    matches!(stat(pid), Some((s, _)) if s != 'Z' && s != 'X')
}

/// Children of `parent`, each with its state letter from `/proc/<pid>/stat` (zombies too).
pub fn child_states(parent: u32) -> Vec<(i32, char)> {
    all_pids()
        .into_iter()
        .filter_map(|p| match stat(p) {
            Some((state, ppid)) if i64::from(ppid) == i64::from(parent) => Some((p, state)),
            _ => None,
        })
        .collect()
}

/// Live (non-zombie) children of `parent`.
pub fn children_of(parent: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|p| matches!(stat(*p), Some((s, pp)) if pp == parent && s != 'Z' && s != 'X'))
        .collect()
}

/// Zombie children of `parent`.
pub fn zombies_of(parent: u32) -> Vec<i32> {
    child_states(parent)
        .into_iter()
        .filter(|&(_, state)| state == 'Z')
        .map(|(pid, _)| pid)
        .collect()
}

/// Every live process below `root`.
pub fn descendants(root: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for c in children_of(p) {
            if !out.contains(&c) {
                out.push(c);
                todo.push(c);
            }
        }
    }
    out
}

/// Live (non-zombie) processes whose command line contains `needle`.
pub fn procs_with(needle: &str) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|p| alive(*p) && cmdline(*p).is_some_and(|c| c.contains(needle)))
        .collect()
}

/// `<seconds>.<unique digits>`: a `sleep` argument that is unique to this test run.
pub fn unique_sleep_arg(seconds: u32) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(1);
    format!(
        "{seconds}.{:07}{:03}1",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed) % 1000
    )
}

/// A unique token for marking test processes (`sleep <marker>` sleeps for a day).
pub fn marker() -> String {
    unique_sleep_arg(86_400)
}

/// The job-cgroup base (`iii-shell-<pid>`) of the executor `pid`, when it has one.
pub fn job_cgroup_base_of(pid: u32) -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })?;
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let here = mount.join(rel.trim_start_matches('/'));
    // An executor that became the command user moved itself into `<base>/executor`.
    let name = format!("iii-shell-{pid}");
    let base = if here.ends_with(Path::new(&name).join("executor")) {
        here.parent()?.to_path_buf()
    } else {
        here.join(name)
    };
    base.is_dir().then_some(base)
}

/// Whether the executor `pid` runs its commands in job cgroups.
pub fn job_cgroups_enabled(pid: u32) -> bool {
    job_cgroup_base_of(pid).is_some()
}

/// Pids of `executor`'s children that are still the executor's image (not exec'd yet) and
/// sleeping: its pre-started processes, waiting for a command. Compared by image, not name: a
/// child cloned from a runtime worker thread carries that thread's name.
pub fn waiting_of(executor: u32) -> std::collections::BTreeSet<i32> {
    let Ok(exe) = std::fs::read_link(format!("/proc/{executor}/exe")) else {
        return Default::default();
    };
    child_states(executor)
        .into_iter()
        .filter(|&(pid, state)| {
            state == 'S' && std::fs::read_link(format!("/proc/{pid}/exe")).ok() == Some(exe.clone())
        })
        .map(|(pid, _)| pid)
        .collect()
}
