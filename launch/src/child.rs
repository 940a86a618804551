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

use std::ffi::c_void;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use iii_shell_confine::Rlimits;

/// The kernel's `struct sigaction` (with `sa_restorer`, as on x86_64 and arm64).
#[repr(C)]
pub(crate) struct KernelSigaction {
    pub handler: libc::sighandler_t,
    pub flags: libc::c_ulong,
    pub restorer: usize,
    pub mask: u64,
}

impl KernelSigaction {
    /// Just a disposition (`SIG_DFL` or `SIG_IGN`): no flags, no mask.
    pub(crate) const fn of(handler: libc::sighandler_t) -> KernelSigaction {
        KernelSigaction {
            handler,
            flags: 0,
            restorer: 0,
            mask: 0,
        }
    }
}

/// What to exec, and what the call adds: its stdin (replacing what [`Setup::stdio`] made fd
/// 0, -1 for none) and the directory to start in (-1: the executor's).
#[derive(Clone, Copy)]
pub struct Command {
    pub program: *const libc::c_char,
    pub argv: *const *const libc::c_char,
    pub envp: *const *const libc::c_char,
    pub stdin: RawFd,
    pub cwd: RawFd,
    /// A terminal to make the command's stdin, stdout, stderr and controlling terminal
    /// (a pre-started process handed a terminal session's program), or -1.
    pub tty: RawFd,
}

impl Command {
    /// Nothing yet (a pre-started process learns it at the hand-over).
    pub const NONE: Command = Command {
        program: std::ptr::null(),
        argv: std::ptr::null(),
        envp: std::ptr::null(),
        stdin: -1,
        cwd: -1,
        tty: -1,
    };
}

/// Blocks until the call arrives; returns the command, or `-errno`. Runs in the child.
pub type Wait = unsafe fn(arg: *const c_void) -> Result<Command, isize>;

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
    // SAFETY (caller): see above; each step is one raw system call on plain data.
    match unsafe { steps(s) } {
        Ok(never) => match never {},
        Err(rc) => rc,
    }
}

unsafe fn steps(s: &Setup) -> Result<std::convert::Infallible, isize> {
    // SAFETY (caller of `run`): pointers in `s` are valid; the calls below are raw system
    // calls with arguments that live on this stack or in `s`.
    unsafe {
        let dfl = KernelSigaction::of(libc::SIG_DFL);
        for sig in 1..65usize {
            if sig != libc::SIGKILL as usize && sig != libc::SIGSTOP as usize {
                sys(
                    libc::SYS_rt_sigaction,
                    [sig, &dfl as *const KernelSigaction as usize, 0, 8, 0, 0],
                );
            }
        }
        if !s.name.is_null() {
            sys(
                libc::SYS_prctl,
                [libc::PR_SET_NAME as usize, s.name as usize, 0, 0, 0, 0],
            );
        }
        check(sys(libc::SYS_setsid, [0; 6]))?;
        for &procs in &s.join {
            if procs >= 0 {
                check(sys(
                    libc::SYS_write,
                    [procs as usize, b"0".as_ptr() as usize, 1, 0, 0, 0],
                ))?;
            }
        }
        for (target, &fd) in s.stdio.iter().enumerate() {
            if fd < 0 {
                continue;
            }
            if fd as usize == target {
                // Already in place: only let it cross execve.
                check(sys(
                    libc::SYS_fcntl,
                    [target, libc::F_SETFD as usize, 0, 0, 0, 0],
                ))?;
            } else {
                check(sys(libc::SYS_dup3, [fd as usize, target, 0, 0, 0, 0]))?;
            }
        }
        if s.ctty {
            check(sys(
                libc::SYS_ioctl,
                [0, libc::TIOCSCTTY as usize, 0, 0, 0, 0],
            ))?;
        }
        if s.no_new_privs {
            check(sys(
                libc::SYS_prctl,
                [libc::PR_SET_NO_NEW_PRIVS as usize, 1, 0, 0, 0, 0],
            ))?;
        }
        if s.landlock_fd >= 0 {
            check(sys(
                libc::SYS_landlock_restrict_self,
                [s.landlock_fd as usize, 0, 0, 0, 0, 0],
            ))?;
        }
        if !s.seccomp.is_null() {
            check(sys(
                libc::SYS_seccomp,
                [
                    libc::SECCOMP_SET_MODE_FILTER as usize,
                    0,
                    s.seccomp as usize,
                    0,
                    0,
                    0,
                ],
            ))?;
        }
        descriptors(s.keep_fd);
        let c = match s.wait {
            Some(wait) => wait(s.wait_arg)?,
            None => s.command,
        };
        if c.stdin >= 0 {
            // Received or inherited above 2 (0-2 are open), so this replaces fd 0.
            check(sys(libc::SYS_dup3, [c.stdin as usize, 0, 0, 0, 0, 0]))?;
        }
        if c.tty >= 0 {
            // Received above 2, like a stdin. The process is a session leader without a
            // controlling terminal (setsid above), so TIOCSCTTY makes this one its own.
            for target in 0..3usize {
                check(sys(libc::SYS_dup3, [c.tty as usize, target, 0, 0, 0, 0]))?;
            }
            check(sys(
                libc::SYS_ioctl,
                [0, libc::TIOCSCTTY as usize, 0, 0, 0, 0],
            ))?;
        }
        if c.cwd >= 0 {
            check(sys(libc::SYS_fchdir, [c.cwd as usize, 0, 0, 0, 0, 0]))?;
        }
        for &(resource, value) in &s.rlimits.entries[..s.rlimits.len] {
            let lim = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            check(sys(
                libc::SYS_prlimit64,
                [
                    0,
                    resource as usize,
                    &lim as *const libc::rlimit as usize,
                    0,
                    0,
                    0,
                ],
            ))?;
        }
        if s.drop_pending {
            drop_pending_signals(&dfl);
        }
        let empty: u64 = 0;
        sys(
            libc::SYS_rt_sigprocmask,
            [
                libc::SIG_SETMASK as usize,
                &empty as *const u64 as usize,
                0,
                8,
                0,
                0,
            ],
        );
        if !s.reached_exec.is_null() {
            (*s.reached_exec).store(true, Ordering::Release);
        }
        Err(sys(
            libc::SYS_execve,
            [
                c.program as usize,
                c.argv as usize,
                c.envp as usize,
                0,
                0,
                0,
            ],
        ))
    }
}

/// Step 7: nothing but stdio (and `keep`) crosses: descriptors the executor holds (the
/// broker connection, other commands' pipes) or inherited without close-on-exec.
unsafe fn descriptors(keep: RawFd) {
    // SAFETY (caller): raw close_range/fcntl/close on descriptor numbers; no memory.
    unsafe {
        if keep >= 0 {
            let keep = keep as usize;
            let mut ok = true;
            if keep > 3 {
                ok &= sys(libc::SYS_close_range, [3, keep - 1, 0, 0, 0, 0]) >= 0;
            }
            ok &= sys(
                libc::SYS_close_range,
                [keep + 1, u32::MAX as usize, 0, 0, 0, 0],
            ) >= 0;
            if !ok {
                // Kernels before 5.9: a bounded range one by one.
                for fd in 3..4096usize {
                    if fd != keep {
                        sys(libc::SYS_close, [fd, 0, 0, 0, 0, 0]);
                    }
                }
            }
        } else if sys(
            libc::SYS_close_range,
            [
                3,
                u32::MAX as usize,
                libc::CLOSE_RANGE_CLOEXEC as usize,
                0,
                0,
                0,
            ],
        ) < 0
        {
            // Kernels before 5.11: marked one by one, in a bounded range.
            for fd in 3..4096usize {
                sys(
                    libc::SYS_fcntl,
                    [
                        fd,
                        libc::F_SETFD as usize,
                        libc::FD_CLOEXEC as usize,
                        0,
                        0,
                        0,
                    ],
                );
            }
        }
    }
}

/// A signal sent to the child while it waited (only possible without Landlock's signal
/// scoping) was meant for no command: setting its disposition to SIG_IGN discards it.
unsafe fn drop_pending_signals(dfl: &KernelSigaction) {
    // SAFETY (caller): raw rt_sigpending/rt_sigaction on locals.
    unsafe {
        let mut pending: u64 = 0;
        sys(
            libc::SYS_rt_sigpending,
            [&mut pending as *mut u64 as usize, 8, 0, 0, 0, 0],
        );
        if pending == 0 {
            return;
        }
        let ign = KernelSigaction::of(libc::SIG_IGN);
        for sig in 1..65usize {
            if pending & (1u64 << (sig - 1)) != 0 {
                sys(
                    libc::SYS_rt_sigaction,
                    [sig, &ign as *const KernelSigaction as usize, 0, 8, 0, 0],
                );
                sys(
                    libc::SYS_rt_sigaction,
                    [sig, dfl as *const KernelSigaction as usize, 0, 8, 0, 0],
                );
            }
        }
    }
}

/// A system call that returns `-errno` instead of setting `errno`: a child shares the
/// executor's thread-local storage, so libc's wrappers would write the executor's errno.
///
/// # Safety
/// The arguments must be valid for system call `nr`.
#[cfg(target_arch = "x86_64")]
pub unsafe fn sys(nr: libc::c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY (caller): the arguments are valid for system call `nr`. The syscall instruction
    // clobbers rcx and r11 and returns in rax; memory the kernel writes is passed by pointer.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// Elsewhere through libc's `syscall`, which does write `errno`: only an ordinary spawn runs
/// there (pre-started processes need the x86_64 clone3 trampoline), and its parent thread is
/// suspended (`CLONE_VFORK`) until the child has exec'd or exited.
///
/// # Safety
/// The arguments must be valid for system call `nr`.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn sys(nr: libc::c_long, a: [usize; 6]) -> isize {
    // SAFETY (caller): as above.
    unsafe {
        let r = libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
        if r < 0 {
            -(*libc::__errno_location() as isize)
        } else {
            r as isize
        }
    }
}
