//! A job's limits where their controller (`pids`, `memory`, `cpu`) is bound to a cgroup v1
//! hierarchy.
//!
//! Job cgroups live in cgroup v2 (they need `cgroup.kill`). On a hybrid or v1 host a
//! controller may be mounted as a v1 hierarchy of its own, and then v2 cannot offer it: the
//! unified hierarchy lists only what no v1 hierarchy holds. Without `pids` nothing bounds how
//! many processes a root command starts (the kernel exempts uid 0 from `RLIMIT_NPROC`), so a
//! fork bomb could use up the host's pids; without `memory` and `cpu` nothing bounds a
//! command's memory or CPU time.
//!
//! Here each job cgroup gets a twin in each such v1 hierarchy ([`Controller`]), under
//! `<executor's v1 cgroup of that controller>/iii-shell-<pid>/job-N`, with the job's limit.
//! Its `cgroup.procs` is opened when the twin is made, and the child writes "0" to it before
//! `execve`, as it does for v2 where clone3 cannot be used; every process the command
//! starts is born in it. A v1 write costs an RCU grace period (about 0.4 ms here), which the
//! pre-started processes pay before a call arrives; an ordinary spawn pays it on its path.
//!
//! Kills and "is the job empty" stay with the v2 twin: the same processes are in all.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// A controller that may have a cgroup v1 hierarchy of its own, and job twins there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    Pids,
    Memory,
    Cpu,
}

impl Controller {
    pub const ALL: [Controller; 3] = [Controller::Pids, Controller::Memory, Controller::Cpu];

    /// Its name in `/proc/self/cgroup` and in the hierarchy's mount options.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Pids => "pids",
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
        }
    }

    /// A file every cgroup of its hierarchy has (tells a usable twin).
    fn probe_file(self) -> &'static str {
        match self {
            Controller::Pids => "pids.max",
            Controller::Memory => "memory.limit_in_bytes",
            Controller::Cpu => "cpu.cfs_quota_us",
        }
    }
}

/// The directory of the executor's own cgroup in the v1 `pids` hierarchy, from the text of
/// `/proc/self/mountinfo` and `/proc/self/cgroup`.
pub fn own_dir(mountinfo: &str, proc_cgroup: &str) -> Option<PathBuf> {
    own_dir_of(Controller::Pids, mountinfo, proc_cgroup)
}

/// The directory of the executor's own cgroup in the v1 hierarchy of `controller`.
pub fn own_dir_of(controller: Controller, mountinfo: &str, proc_cgroup: &str) -> Option<PathBuf> {
    let want = controller.name();
    let (root, mount) = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split_whitespace();
        if r.next()? != "cgroup" {
            return None;
        }
        let options = r.nth(1)?;
        if !options.split(',').any(|o| o == want) {
            return None;
        }
        let mut f = left.split_whitespace();
        let root = f.nth(3)?;
        let mount = f.next()?;
        Some((root.to_string(), PathBuf::from(mount)))
    })?;
    let path = proc_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let _id = f.next()?;
        let controllers = f.next()?;
        let path = f.next()?;
        controllers
            .split(',')
            .any(|c| c == want)
            .then(|| path.to_string())
    })?;
    // The mount shows the hierarchy from `root` down; our path is relative to its top.
    let rel = if root == "/" {
        path.as_str()
    } else {
        path.strip_prefix(root.as_str())
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))?
    };
    let rel = rel.trim_start_matches('/');
    if rel.split('/').any(|c| c == "..") {
        return None;
    }
    Some(if rel.is_empty() {
        mount
    } else {
        mount.join(rel)
    })
}

/// The base of executor `pid`'s job twins under `parent` (its own v1 pids cgroup).
pub fn base_name(pid: u32) -> String {
    format!("iii-shell-{pid}")
}

/// The executor's own v1 pids cgroup, when there is one.
pub fn own() -> Option<PathBuf> {
    own_of(Controller::Pids)
}

/// The executor's own cgroup in the v1 hierarchy of `controller`, when there is one.
pub fn own_of(controller: Controller) -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    own_dir_of(controller, &mountinfo, &cgroup)
}

/// Makes a launcher's base `name` (its v2 base's name) in the v1 hierarchy of `controller`,
/// after removing the bases of executors that are gone (their processes were killed through
/// their v2 twins first).
pub fn create_base(name: &str, controller: Controller) -> Result<PathBuf, String> {
    let parent = own_of(controller)
        .ok_or_else(|| format!("no cgroup v1 {} hierarchy", controller.name()))?;
    sweep_stale(&parent);
    let dir = parent.join(name);
    // An earlier process's with our name (see `cgroups::detect_cgroup_base`): its twins'
    // processes went with its v2 base, so only empty directories are left to remove.
    if dir.is_dir() {
        remove_base(&dir);
    }
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    }
    let probe = controller.probe_file();
    if !dir.join(probe).exists() {
        let _ = std::fs::remove_dir(&dir);
        return Err(format!("{}: no {probe}", dir.display()));
    }
    Ok(dir)
}

/// Removes the bases of executor `pid` and their job twins (in every v1 hierarchy), when
/// they hold no process.
pub fn remove_base_of(pid: u32) {
    for c in Controller::ALL {
        if let Some(parent) = own_of(c) {
            remove_base(&parent.join(base_name(pid)));
        }
    }
}

/// Removes the bases of executors that no longer run.
pub fn sweep_stale(parent: &Path) {
    for base in crate::bases::stale_bases(parent) {
        remove_base(&base);
    }
}

/// Removes a base: its job twins, then itself (a cgroup with processes stays).
pub fn remove_base(base: &Path) {
    crate::bases::remove_empty_base(base);
}

/// Hands the base to the command user, so that an executor running as it can make job
/// twins. Only the directory: its limit files and `cgroup.procs` stay root's.
pub fn hand_base_to(base: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    nix::unistd::chown(
        base,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
    )
    .map_err(std::io::Error::from)
}

/// One job's twin in a cgroup v1 hierarchy.
#[derive(Debug)]
pub struct V1Twin {
    pub dir: PathBuf,
    /// `cgroup.procs`, open for writing: the child writes "0" to it.
    pub procs: OwnedFd,
}

impl V1Twin {
    /// Makes the twin `name` under `base` and opens its `cgroup.procs`.
    pub fn create(base: &Path, name: &str) -> std::io::Result<V1Twin> {
        let dir = base.join(name);
        // A twin of the same name left behind is refused (EEXIST), never reused: neither
        // opening it nor the child's write would tell whether it is empty.
        std::fs::create_dir(&dir)?;
        match std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))
        {
            Ok(f) => Ok(V1Twin {
                dir,
                procs: f.into(),
            }),
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    /// Writes `value` into the twin's limit file `file`.
    pub fn write(&self, file: &str, value: &str) -> std::io::Result<()> {
        std::fs::write(self.dir.join(file), value)
    }

    /// Reads the twin's file `file` (trimmed).
    pub fn read(&self, file: &str) -> std::io::Result<String> {
        Ok(std::fs::read_to_string(self.dir.join(file))?
            .trim()
            .to_string())
    }

    /// Removes the twin; false while processes remain in it.
    pub fn remove(&self) -> bool {
        std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 30 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
31 25 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 25 0:31 / /sys/fs/cgroup/pids rw,relatime shared:15 - cgroup cgroup rw,pids
34 25 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
";

    #[test]
    fn the_own_pids_cgroup_is_found_on_a_hybrid_host() {
        let own = "9:name=systemd:/\n8:pids:/\n4:memory:/a/b\n0::/\n";
        assert_eq!(
            own_dir(HYBRID, own),
            Some(PathBuf::from("/sys/fs/cgroup/pids"))
        );
        let nested = "8:pids:/system.slice/iii-shell.service\n0::/\n";
        assert_eq!(
            own_dir(HYBRID, nested),
            Some(PathBuf::from(
                "/sys/fs/cgroup/pids/system.slice/iii-shell.service"
            ))
        );
    }

    #[test]
    fn a_mount_of_a_subtree_is_followed_and_no_path_climbs_out() {
        let sub = "40 25 0:31 /system.slice /mnt/pids rw - cgroup cgroup rw,pids\n";
        assert_eq!(
            own_dir(sub, "3:pids:/system.slice/x.service\n"),
            Some(PathBuf::from("/mnt/pids/x.service"))
        );
        // Our cgroup is outside the mounted subtree: not reachable here.
        assert_eq!(own_dir(sub, "3:pids:/user.slice\n"), None);
        assert_eq!(own_dir(sub, "3:pids:/system.slicex/y\n"), None);
        assert_eq!(own_dir(HYBRID, "3:pids:/../etc\n"), None);
    }

    #[test]
    fn the_memory_and_cpu_hierarchies_are_found_by_their_own_lines() {
        let own = "8:pids:/\n4:memory:/a/b\n2:cpu,cpuacct:/c\n0::/\n";
        assert_eq!(
            own_dir_of(Controller::Memory, HYBRID, own),
            Some(PathBuf::from("/sys/fs/cgroup/memory/a/b"))
        );
        assert_eq!(
            own_dir_of(Controller::Cpu, HYBRID, own),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/c"))
        );
        // `cpuacct` alone is not `cpu`.
        let acct = "34 25 0:32 / /x rw - cgroup cgroup rw,cpuacct\n";
        assert_eq!(own_dir_of(Controller::Cpu, acct, "2:cpuacct:/\n"), None);
    }

    #[test]
    fn no_v1_pids_hierarchy_means_none() {
        let v2_only = "26 25 0:24 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(own_dir(v2_only, "0::/\n"), None);
        // Mounted, but this process's line does not name it.
        assert_eq!(own_dir(HYBRID, "4:memory:/\n0::/\n"), None);
        // `pids` as a part of another option is not the controller.
        let other = "33 25 0:31 / /x rw - cgroup cgroup rw,name=pidsy\n";
        assert_eq!(own_dir(other, "8:pids:/\n"), None);
    }
}
