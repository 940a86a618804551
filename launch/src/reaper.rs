//! Reaping: the executor is a child subreaper, so orphans of a job (a daemon whose parent
//! exited) are re-parented to it and reaped here instead of lingering as zombies. Job roots
//! are reaped by their own supervisors, through their pidfds ([`reap`], [`try_reap`]);
//! [`ROOTS`] names them so the orphan reaper leaves them alone.

use std::sync::Mutex;

use crate::procfs;

/// Pids of job roots, which their own supervisors reap (the orphan reaper leaves them alone).
///
/// Process-global, not a launcher's: the kernel hands a child subreaper the orphans of every
/// job this process started, whichever launcher started it, and SIGCHLD is one per process.
/// The orphan reaper must know every launcher's roots, or it would reap (and lose the exit
/// status of) a root another launcher's supervisor is waiting for.
pub static ROOTS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// What [`reap_exited_orphans`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanCheck {
    /// No exited child is left for us to reap (or we have no children).
    Clear,
    /// The first exited child is a job root, which its own supervisor reaps; any orphan
    /// queued behind it is not visible yet.
    RootPending,
}

/// Reaps exited orphans without scanning `/proc`: asks the kernel for the first exited child
/// (`waitid(P_ALL, WNOWAIT)`, which leaves it a zombie) and reaps it unless it is a job root.
///
/// This is what runs on every SIGCHLD. A command's root gets SIGCHLD as its exit signal once
/// it has exec'd (execve resets it, whatever the clone asked for), so this runs once per
/// command, and almost always finds nothing: the root was already reaped by its supervisor.
pub fn reap_exited_orphans() -> OrphanCheck {
    loop {
        // Checked and reaped under the lock, as in [`reap_orphans`].
        let Ok(roots) = ROOTS.lock() else {
            return OrphanCheck::Clear;
        };
        let mut info = zeroed_siginfo();
        // SAFETY: waitid writes into `info`, a valid zeroed siginfo_t; WNOWAIT leaves the
        // child as it is.
        let rc = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL,
            )
        };
        // SAFETY: si_pid is valid for a successful waitid (0 when nothing has exited).
        let pid = if rc == 0 { unsafe { info.si_pid() } } else { 0 };
        if pid <= 0 {
            return OrphanCheck::Clear;
        }
        if roots.contains(&pid) {
            return OrphanCheck::RootPending;
        }
        // SAFETY: waitpid on a specific pid that is our exited child; status is discarded.
        unsafe {
            libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG | libc::__WALL);
        }
        drop(roots);
    }
}

/// Reaps zombies among our children that are not job roots (orphans re-parented to us),
/// scanning `/proc`: slower than [`reap_exited_orphans`], but it sees past a root that has
/// not been reaped yet.
pub fn reap_orphans() {
    for pid in procfs::own_children() {
        if procfs::stat(pid).is_none_or(|s| s.state != b'Z') {
            continue;
        }
        // Checked and reaped under the lock: a spawn registers its root while holding it, so
        // a root that started (and exited) after this scan began is never taken for an
        // orphan. Its own supervisor must reap it, or its exit status is lost.
        let Ok(roots) = ROOTS.lock() else { return };
        if roots.contains(&pid) {
            continue;
        }
        // SAFETY: waitpid on a specific pid that is our zombie child; status is discarded.
        unsafe {
            libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG | libc::__WALL);
        }
        drop(roots);
    }
}

pub use iii_shell_confine::become_subreaper;

use crate::wait::zeroed_siginfo;
pub use crate::wait::{try_reap, try_reap_blocking, try_reap_peek, ExitStatus};

/// Reaps the child through its pidfd (blocking if it has not exited yet).
pub fn reap(child: &crate::spawn::Child) -> std::io::Result<ExitStatus> {
    try_reap_blocking(&child.pidfd)
}
