//! Reaping: the executor is a child subreaper, so orphans of a job (a daemon whose parent
//! exited) are re-parented to it and reaped here instead of lingering as zombies. Job roots
//! are reaped by their own supervisors, through their pidfds ([`reap`], [`try_reap`]);
//! [`ROOTS`] names them so the orphan reaper leaves them alone.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

use crate::procfs;

/// Pids of job roots, which their own supervisors reap (the orphan reaper leaves them alone).
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

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Exited(i32),
    Signaled(i32),
}

impl ExitStatus {
    pub fn code(self) -> Option<i32> {
        match self {
            ExitStatus::Exited(c) => Some(c),
            ExitStatus::Signaled(_) => None,
        }
    }
}

/// Reaps the child through its pidfd (blocking if it has not exited yet).
pub fn reap(child: &crate::spawn::Child) -> std::io::Result<ExitStatus> {
    try_reap_blocking(&child.pidfd)
}

/// Reaps a child through its pidfd, blocking until it has exited.
pub fn try_reap_blocking(pidfd: &OwnedFd) -> std::io::Result<ExitStatus> {
    reap_flags(pidfd, 0).map(|s| s.unwrap_or(ExitStatus::Signaled(0)))
}

/// True when the child has exited (it is left a zombie: nothing is reaped).
pub fn try_reap_peek(pidfd: &OwnedFd) -> std::io::Result<bool> {
    reap_flags(pidfd, libc::WNOHANG | libc::WNOWAIT).map(|s| s.is_some())
}

/// Reaps the child if it has exited; `None` if it is still running.
pub fn try_reap(pidfd: &OwnedFd) -> std::io::Result<Option<ExitStatus>> {
    reap_flags(pidfd, libc::WNOHANG)
}

/// `waitid(P_PIDFD)` by hand rather than through nix: nix turns the exit of a child killed by
/// a real-time signal (SIGRTMIN and above, which a command may well be) into an EINVAL error,
/// after the kernel has already reaped it, so its status would be lost.
fn reap_flags(pidfd: &OwnedFd, extra: i32) -> std::io::Result<Option<ExitStatus>> {
    loop {
        let mut info: libc::siginfo_t = zeroed_siginfo();
        // SAFETY: waitid writes into `info`, which is a valid, zeroed siginfo_t.
        let rc = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                pidfd.as_raw_fd() as libc::id_t,
                &mut info,
                // __WALL: a root that never reached execve has no exit signal (a "clone child").
                libc::WEXITED | libc::__WALL | extra,
            )
        };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        // SAFETY: waitid succeeded; si_pid/si_status/si_code are valid for SIGCHLD infos.
        let (pid, status, code) = unsafe { (info.si_pid(), info.si_status(), info.si_code) };
        if pid == 0 {
            return Ok(None);
        }
        return Ok(Some(if code == libc::CLD_EXITED {
            ExitStatus::Exited(status)
        } else {
            ExitStatus::Signaled(status)
        }));
    }
}

pub(crate) fn zeroed_siginfo() -> libc::siginfo_t {
    // SAFETY: siginfo_t is a plain C struct for which all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}
