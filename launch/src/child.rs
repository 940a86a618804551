//! The one child routine: what a new command process does to itself between its clone and
//! `execve`, for an ordinary spawn ([`crate::spawn`]) and a pre-started process
//! ([`crate::prestarted`]) alike.
//!
//! The parent describes the setup as data ([`Setup`]: descriptors, flags, the Landlock
//! ruleset, the seccomp program, limits), built before the clone, and the child runs [`run`]
//! on it. The steps, in this order:
//!
//! 1. default dispositions for every signal (ignored ones would survive `execve`);
//! 2. a name for `ps` while it waits (pre-started only);
//! 3. `setsid` (the job is its session and process group);
//! 4. joining cgroups by writing "0" to each `cgroup.procs` in [`Setup::join`];
//! 5. stdio: each of [`Setup::stdio`] becomes 0, 1, 2; then the controlling terminal;
//! 6. `no_new_privs`, Landlock, seccomp;
//! 7. descriptors: every one above 2 is closed but [`Setup::keep_fd`] (a pre-started process,
//!    which lingers), or marked close-on-exec (an ordinary spawn, whose cwd is still to come);
//! 8. the hand-over, when [`Setup::wait`] is set: the child blocks until the call arrives
//!    with the command, its stdin and cwd ([`Command`]);
//! 9. stdin, cwd, resource limits (last: a low open-files limit must not stop a descriptor in
//!    transit), pending signals dropped (pre-started only), the signal mask cleared;
//! 10. `execve`.
//!
//! The child shares the executor's memory (`CLONE_VM`) and, for a pre-started process, runs
//! alongside it. So the routine only makes raw system calls through [`sys`], which return
//! `-errno` and never write the executor thread's `errno`; it never allocates, locks or
//! unwinds, and it writes only what the setup points it at.
//!
//! Every step is a method of [`Privileges`] ([`crate::privileges`]): [`run`] runs the
//! routine on [`Kernel`], the real system calls, statically dispatched and inlined; the unit
//! tests run [`steps`] on a recording fake, which proves the order above and what a failed
//! step leaves undone.

use std::ffi::c_void;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use iii_shell_confine::Rlimits;

pub use crate::privileges::{sys, Command, Wait};
use crate::privileges::{Kernel, Privileges};

/// A child's setup, built in the parent. `-1` (or null) leaves a step out.
#[repr(C)]
pub struct Setup {
    /// `comm` while the child waits (NUL-terminated, at most 16 bytes), or null.
    pub name: *const u8,
    /// `cgroup.procs` descriptors, open for writing: the child joins each.
    pub join: [RawFd; crate::plan::JOINS],
    /// What becomes the child's stdin, stdout and stderr.
    pub stdio: [RawFd; 3],
    /// Make fd 0 (a terminal) the controlling terminal (`TIOCSCTTY`).
    pub ctty: bool,
    pub no_new_privs: bool,
    /// A Landlock ruleset (owned by the policy, which outlives the child's use of it).
    pub landlock_fd: RawFd,
    /// The seccomp program (kept alive by the parent), or null.
    pub seccomp: *const libc::sock_fprog,
    /// Close every descriptor above 2 but this one; -1 marks them close-on-exec instead.
    pub keep_fd: RawFd,
    pub rlimits: Rlimits,
    /// Drop signals that reached the child before the command did.
    pub drop_pending: bool,
    /// The command, when it is known at the clone.
    pub command: Command,
    /// The hand-over: called with `wait_arg` after step 7, it supplies the command.
    pub wait: Option<Wait>,
    pub wait_arg: *const c_void,
    /// Set just before `execve` (tells a child that ran from one killed at birth), or null.
    pub reached_exec: *const AtomicBool,
}

impl Setup {
    /// A setup that does only the steps every child does (signals, session, mask).
    pub fn new() -> Setup {
        Setup {
            name: std::ptr::null(),
            join: [-1; crate::plan::JOINS],
            stdio: [-1; 3],
            ctty: false,
            no_new_privs: false,
            landlock_fd: -1,
            seccomp: std::ptr::null(),
            keep_fd: -1,
            rlimits: Rlimits::default(),
            drop_pending: false,
            command: Command::NONE,
            wait: None,
            wait_arg: std::ptr::null(),
            reached_exec: std::ptr::null(),
        }
    }
}

impl Default for Setup {
    fn default() -> Setup {
        Setup::new()
    }
}

/// Returns `Err(rc)` when a raw system call failed.
fn check(rc: isize) -> Result<isize, isize> {
    if rc < 0 {
        Err(rc)
    } else {
        Ok(rc)
    }
}

/// Runs the setup and execs. Returns only on failure, with `-errno`.
///
/// # Safety
/// Runs in a freshly cloned child with every signal blocked. Every pointer in `s` (and in
/// what `s.wait` returns) must stay valid until the child has exec'd or exited.
pub unsafe fn run(s: &Setup) -> isize {
    // SAFETY (caller): see above.
    unsafe { steps(&Kernel, s) }
}

/// The routine on `p`: returns what `execve` returned, or the `-errno` of the first step
/// that failed (no later step runs).
///
/// # Safety
/// As for [`run`]; `p` must be allocation-free where it runs after a clone.
pub unsafe fn steps<P: Privileges>(p: &P, s: &Setup) -> isize {
    // SAFETY (caller): pointers in `s` are valid; each step is one system call on plain data.
    match unsafe { confine(p, s).and_then(|()| command(p, s)) } {
        Ok(c) => unsafe { exec(p, s, &c) },
        Err(rc) => rc,
    }
}

/// Steps 1-7: everything before the command is known.
unsafe fn confine<P: Privileges>(p: &P, s: &Setup) -> Result<(), isize> {
    // SAFETY (caller of `steps`).
    unsafe {
        p.default_signals();
        if !s.name.is_null() {
            p.set_name(s.name);
        }
        check(p.setsid())?;
        for &procs in &s.join {
            if procs >= 0 {
                check(p.join_cgroup(procs))?;
            }
        }
        for (target, &fd) in s.stdio.iter().enumerate() {
            if fd < 0 {
                continue;
            }
            if fd as usize == target {
                // Already in place: only let it cross execve.
                check(p.keep_on_exec(fd))?;
            } else {
                check(p.dup_onto(fd, target as RawFd))?;
            }
        }
        if s.ctty {
            check(p.controlling_tty())?;
        }
        if s.no_new_privs {
            check(p.no_new_privs())?;
        }
        if s.landlock_fd >= 0 {
            check(p.landlock_restrict_self(s.landlock_fd))?;
        }
        if !s.seccomp.is_null() {
            check(p.seccomp_install(s.seccomp))?;
        }
        p.close_descriptors(s.keep_fd);
        Ok(())
    }
}

/// Steps 8-9 up to the limits: the command, and its stdin, terminal and cwd.
unsafe fn command<P: Privileges>(p: &P, s: &Setup) -> Result<Command, isize> {
    // SAFETY (caller of `steps`).
    unsafe {
        let c = match s.wait {
            Some(wait) => p.hand_over(wait, s.wait_arg)?,
            None => s.command,
        };
        if c.stdin >= 0 {
            // Received or inherited above 2 (0-2 are open), so this replaces fd 0.
            check(p.dup_onto(c.stdin, 0))?;
        }
        if c.tty >= 0 {
            // Received above 2, like a stdin. The process is a session leader without a
            // controlling terminal (setsid above), so TIOCSCTTY makes this one its own.
            for target in 0..3 {
                check(p.dup_onto(c.tty, target))?;
            }
            check(p.controlling_tty())?;
        }
        if c.cwd >= 0 {
            check(p.fchdir(c.cwd))?;
        }
        Ok(c)
    }
}

/// The rest of step 9, and step 10: limits, signals, `execve`.
unsafe fn exec<P: Privileges>(p: &P, s: &Setup, c: &Command) -> isize {
    // SAFETY (caller of `steps`).
    unsafe {
        for &(resource, value) in &s.rlimits.entries[..s.rlimits.len] {
            if let Err(rc) = check(p.setrlimit(resource, value)) {
                return rc;
            }
        }
        if s.drop_pending {
            p.drop_pending_signals();
        }
        p.clear_signal_mask();
        if !s.reached_exec.is_null() {
            (*s.reached_exec).store(true, Ordering::Release);
        }
        p.execve(c)
    }
}
