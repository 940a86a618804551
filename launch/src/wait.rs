//! Waiting for a child through its pidfd: how it ended ([`ExitStatus`]), blocking or not.
//! The lowest layer of the launcher, used by the spawn path (a child that failed before
//! `execve`, clone3's self-test) and by the supervisors above it.

use std::os::fd::{AsRawFd, OwnedFd};

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
