//! Owning and killing a job's whole process tree.
//!
//! Each command starts in a new session (so its process group and session id equal its pid)
//! and, where a writable cgroup v2 hierarchy exists, in a cgroup of its own, joined before
//! `execve`. Killing a job then means `cgroup.kill` (which also catches processes that called
//! `setsid` to escape the session), plus SIGKILL to the session, the process group and every
//! descendant still linked by parentage. The executor is a child subreaper, so orphans of a
//! job are re-parented to it and reaped by [`crate::reaper`] instead of lingering as zombies.
//! The job cgroups themselves are [`crate::cgroups`].

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use crate::cgroups::JobCgroup;
use crate::procfs;

/// The tree of one job: its root pid (= session and process group id) and its cgroup.
#[derive(Debug)]
pub struct JobTree {
    pub root: i32,
    /// The job's cgroup until it is released (empty, and handed back for reuse). After that
    /// a kill must not touch it: another job may be running there.
    pub cgroup: Mutex<Option<JobCgroup>>,
    /// Set once the root has been reaped: its pid may then be reused by an unrelated process,
    /// so it is no longer signalled by number.
    pub reaped: std::sync::atomic::AtomicBool,
}

impl JobTree {
    pub fn new(root: i32, cgroup: Option<JobCgroup>) -> JobTree {
        JobTree {
            root,
            cgroup: Mutex::new(cgroup),
            reaped: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// SIGKILLs everything that belongs to the job. Idempotent.
    pub fn kill(&self) {
        if let Some(cg) = self.cgroup.lock().ok().as_deref().and_then(Option::as_ref) {
            cg.kill();
        }
        // Repeat a few times: a process may fork between the scan and the signal.
        for _ in 0..3 {
            let table = procfs::all();
            let mut victims: Vec<i32> = table
                .iter()
                .filter(|p| p.sid == self.root || p.pgid == self.root)
                .map(|p| p.pid)
                .collect();
            let reaped = self.reaped.load(Ordering::SeqCst);
            if !reaped {
                victims.extend(procfs::descendants(self.root, &table));
            }
            victims.retain(|&p| {
                p > 1 && p != std::process::id() as i32 && !(reaped && p == self.root)
            });
            victims.sort_unstable();
            victims.dedup();
            let alive: Vec<i32> = victims
                .into_iter()
                .filter(|&p| procfs::stat(p).is_some_and(|s| s.state != b'Z'))
                .collect();
            if alive.is_empty() {
                break;
            }
            for p in alive {
                // SAFETY: kill(2) with a positive pid and SIGKILL has no memory effects.
                unsafe {
                    libc::kill(p, libc::SIGKILL);
                }
            }
        }
    }

    /// Kills what is left of the job once its root has exited (a daemon that closed its
    /// output, a child still holding a pipe). With a job cgroup this costs one read of
    /// `cgroup.events` when nothing is left; without one only the session and the process
    /// group are searched, and only when `scan_without_cgroup` says so (it walks `/proc`).
    /// Returns true when something was killed.
    pub fn kill_leftovers(&self, scan_without_cgroup: bool) -> bool {
        let populated = match self.cgroup.lock().ok().as_deref() {
            Some(Some(cg)) => !cg.is_empty(),
            Some(None) | None => {
                if !scan_without_cgroup {
                    return false;
                }
                procfs::all()
                    .iter()
                    .any(|p| (p.sid == self.root || p.pgid == self.root) && p.state != b'Z')
            }
        };
        if populated {
            self.kill();
        }
        populated
    }

    /// The job's memory limit, when the kernel's OOM killer killed one of its processes for
    /// reaching it (read from the job's memory cgroup; call before [`JobTree::release`]).
    pub fn memory_limit_hit(&self) -> Option<u64> {
        let slot = self.cgroup.lock().ok()?;
        let cg = slot.as_ref()?;
        let limit = cg.limits()?.memory_max?;
        cg.oom_killed().then_some(limit)
    }

    /// Hands the cgroup back once it is empty; call after the root has been reaped. True
    /// when nothing of the job is left to release.
    pub fn release(&self) -> bool {
        let Ok(mut slot) = self.cgroup.lock() else {
            return true;
        };
        match slot.take() {
            None => true,
            Some(cg) => match cg.recycle() {
                Ok(()) => true,
                Err(cg) => {
                    *slot = Some(cg);
                    false
                }
            },
        }
    }
}
