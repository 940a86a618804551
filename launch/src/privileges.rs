//! The privilege seam: every system call that drops privileges or confines a process goes
//! through one trait, [`Privileges`], so the order of those steps can be tested without root.
//!
//! * [`Kernel`] is the real implementation: each method is the raw system call the step
//!   makes ([`sys`]), inlined into the caller. The routines that use the seam are generic
//!   over it (static dispatch), so a spawn makes exactly the system calls it made before:
//!   no allocation, no lock, no indirect call, nothing after the clone that is not
//!   async-signal-safe.
//! * A recording fake (`privileges::fake::Recorder`, built for this crate's unit tests
//!   only) records each call with its arguments and can be told to fail the call at
//!   position N with a given errno. Tests run the routines in-process on it: the one child
//!   routine ([`crate::child`]) for each kind of spawn, what a failed step reports back
//!   ([`crate::spawn`], [`crate::prestarted`]), and the command user's switch
//!   ([`crate::run_as`]).
//!
//! Two groups of steps: the child's (after the clone, in the child: raw system calls that
//! return `-errno`) and the command user's (once, in the executor, before any command:
//! these may allocate and return [`std::io::Result`]).

use std::ffi::c_void;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicU32;

/// What to exec, and what the call adds: its stdin (replacing what the setup made fd 0, -1
/// for none) and the directory to start in (-1: the executor's).
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

/// The steps that drop privileges and confine a process, each one system call (or a fixed
/// loop of them). The child's steps return `-errno` on failure (never touching `errno`);
/// those returning nothing are best effort, as the routine has always treated them.
///
/// # Safety
/// The child's steps run after a clone that shares the executor's memory: an implementation
/// used there must not allocate, lock or unwind. Only [`Kernel`] is used there.
pub trait Privileges {
    /// Every signal's disposition back to `SIG_DFL` (all but SIGKILL and SIGSTOP).
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn default_signals(&self);
    /// `PR_SET_NAME` to the NUL-terminated `name` (best effort).
    ///
    /// # Safety
    /// `name` points to a NUL-terminated string of at most 16 bytes.
    unsafe fn set_name(&self, name: *const u8);
    /// `setsid`.
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn setsid(&self) -> isize;
    /// Joins a cgroup: writes "0" to its `cgroup.procs` descriptor.
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn join_cgroup(&self, procs: RawFd) -> isize;
    /// Lets `fd` cross `execve` (clears close-on-exec).
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn keep_on_exec(&self, fd: RawFd) -> isize;
    /// `dup3(fd, onto, 0)`.
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn dup_onto(&self, fd: RawFd, onto: RawFd) -> isize;
    /// Makes fd 0 (a terminal) the controlling terminal (`TIOCSCTTY`).
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn controlling_tty(&self) -> isize;
    /// `prctl(PR_SET_NO_NEW_PRIVS, 1)`.
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn no_new_privs(&self) -> isize;
    /// `landlock_restrict_self(ruleset, 0)`.
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn landlock_restrict_self(&self, ruleset: RawFd) -> isize;
    /// `seccomp(SECCOMP_SET_MODE_FILTER, 0, prog)`.
    ///
    /// # Safety
    /// `prog` points to a valid program that outlives the call.
    unsafe fn seccomp_install(&self, prog: *const libc::sock_fprog) -> isize;
    /// Every descriptor above 2 closed but `keep`, or (`keep` = -1) marked close-on-exec.
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn close_descriptors(&self, keep: RawFd);
    /// The hand-over: `wait(arg)` blocks until the command arrives.
    ///
    /// # Safety
    /// `wait` may be called with `arg`.
    unsafe fn hand_over(&self, wait: Wait, arg: *const c_void) -> Result<Command, isize>;
    /// `fchdir(fd)`.
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn fchdir(&self, fd: RawFd) -> isize;
    /// `prlimit64(0, resource)` to `value` (soft and hard).
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn setrlimit(&self, resource: i32, value: u64) -> isize;
    /// Discards signals that reached the child before its command did.
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn drop_pending_signals(&self);
    /// The signal mask cleared (every signal was blocked since the clone).
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn clear_signal_mask(&self);
    /// `execve`; returns only on failure, with `-errno`.
    ///
    /// # Safety
    /// The command's pointers are valid C strings and NULL-terminated arrays.
    unsafe fn execve(&self, c: &Command) -> isize;
    /// Wakes one waiter on the futex word `word`.
    ///
    /// # Safety
    /// `word` is alive.
    unsafe fn wake(&self, word: *const AtomicU32);
    /// `exit_group(code)` (returns only in the fake).
    ///
    /// # Safety
    /// Child step: see the trait.
    unsafe fn exit_group(&self, code: i32);

    /// The command user's supplementary groups.
    fn setgroups(&self, groups: &[u32]) -> std::io::Result<()>;
    /// Real, effective and saved gid.
    fn setresgid(&self, gid: u32) -> std::io::Result<()>;
    /// Real, effective and saved uid.
    fn setresuid(&self, uid: u32) -> std::io::Result<()>;
    /// The capabilities left (effective or permitted), after the switch should have
    /// cleared them; empty when none.
    fn capabilities_left(&self) -> Vec<String>;
    /// Threads of this process (`/proc/self/task`), 0 when unreadable.
    fn threads(&self) -> usize;
    /// Whether `cap` is in the bounding set.
    fn in_bounding(&self, cap: caps::Capability) -> bool;
    /// Drops `cap` from the effective, then the permitted set.
    fn drop_capability(&self, cap: caps::Capability) -> std::io::Result<()>;
}

/// The real implementation: each step is its system call.
#[derive(Debug, Clone, Copy, Default)]
pub struct Kernel;

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

const DFL: KernelSigaction = KernelSigaction::of(libc::SIG_DFL);

impl Privileges for Kernel {
    #[inline(always)]
    unsafe fn default_signals(&self) {
        for sig in 1..65usize {
            if sig != libc::SIGKILL as usize && sig != libc::SIGSTOP as usize {
                // SAFETY: rt_sigaction with a disposition on this stack.
                unsafe {
                    sys(
                        libc::SYS_rt_sigaction,
                        [sig, &DFL as *const KernelSigaction as usize, 0, 8, 0, 0],
                    );
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn set_name(&self, name: *const u8) {
        // SAFETY (caller): `name` is a short NUL-terminated string.
        unsafe {
            sys(
                libc::SYS_prctl,
                [libc::PR_SET_NAME as usize, name as usize, 0, 0, 0, 0],
            );
        }
    }

    #[inline(always)]
    unsafe fn setsid(&self) -> isize {
        // SAFETY: no arguments.
        unsafe { sys(libc::SYS_setsid, [0; 6]) }
    }

    #[inline(always)]
    unsafe fn join_cgroup(&self, procs: RawFd) -> isize {
        // SAFETY: a write of one static byte.
        unsafe {
            sys(
                libc::SYS_write,
                [procs as usize, b"0".as_ptr() as usize, 1, 0, 0, 0],
            )
        }
    }

    #[inline(always)]
    unsafe fn keep_on_exec(&self, fd: RawFd) -> isize {
        // SAFETY: fcntl on a descriptor number; no memory.
        unsafe {
            sys(
                libc::SYS_fcntl,
                [fd as usize, libc::F_SETFD as usize, 0, 0, 0, 0],
            )
        }
    }

    #[inline(always)]
    unsafe fn dup_onto(&self, fd: RawFd, onto: RawFd) -> isize {
        // SAFETY: dup3 on descriptor numbers; no memory.
        unsafe { sys(libc::SYS_dup3, [fd as usize, onto as usize, 0, 0, 0, 0]) }
    }

    #[inline(always)]
    unsafe fn controlling_tty(&self) -> isize {
        // SAFETY: TIOCSCTTY takes an integer argument.
        unsafe { sys(libc::SYS_ioctl, [0, libc::TIOCSCTTY as usize, 0, 0, 0, 0]) }
    }

    #[inline(always)]
    unsafe fn no_new_privs(&self) -> isize {
        // SAFETY: prctl with integer arguments.
        unsafe {
            sys(
                libc::SYS_prctl,
                [libc::PR_SET_NO_NEW_PRIVS as usize, 1, 0, 0, 0, 0],
            )
        }
    }

    #[inline(always)]
    unsafe fn landlock_restrict_self(&self, ruleset: RawFd) -> isize {
        // SAFETY: a descriptor number and flags.
        unsafe {
            sys(
                libc::SYS_landlock_restrict_self,
                [ruleset as usize, 0, 0, 0, 0, 0],
            )
        }
    }

    #[inline(always)]
    unsafe fn seccomp_install(&self, prog: *const libc::sock_fprog) -> isize {
        // SAFETY (caller): `prog` is a valid program.
        unsafe {
            sys(
                libc::SYS_seccomp,
                [
                    libc::SECCOMP_SET_MODE_FILTER as usize,
                    0,
                    prog as usize,
                    0,
                    0,
                    0,
                ],
            )
        }
    }

    #[inline(always)]
    unsafe fn close_descriptors(&self, keep: RawFd) {
        // SAFETY: raw close_range/fcntl/close on descriptor numbers.
        unsafe { descriptors(keep) }
    }

    #[inline(always)]
    unsafe fn hand_over(&self, wait: Wait, arg: *const c_void) -> Result<Command, isize> {
        // SAFETY (caller): `wait` takes `arg`.
        unsafe { wait(arg) }
    }

    #[inline(always)]
    unsafe fn fchdir(&self, fd: RawFd) -> isize {
        // SAFETY: a descriptor number.
        unsafe { sys(libc::SYS_fchdir, [fd as usize, 0, 0, 0, 0, 0]) }
    }

    #[inline(always)]
    unsafe fn setrlimit(&self, resource: i32, value: u64) -> isize {
        let lim = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        // SAFETY: `lim` lives on this stack for the call.
        unsafe {
            sys(
                libc::SYS_prlimit64,
                [
                    0,
                    resource as usize,
                    &lim as *const libc::rlimit as usize,
                    0,
                    0,
                    0,
                ],
            )
        }
    }

    #[inline(always)]
    unsafe fn drop_pending_signals(&self) {
        // SAFETY: raw rt_sigpending/rt_sigaction on locals.
        unsafe { drop_pending_signals() }
    }

    #[inline(always)]
    unsafe fn clear_signal_mask(&self) {
        let empty: u64 = 0;
        // SAFETY: the new mask lives on this stack for the call.
        unsafe {
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
        }
    }

    #[inline(always)]
    unsafe fn execve(&self, c: &Command) -> isize {
        // SAFETY (caller): the command's pointers are valid.
        unsafe {
            sys(
                libc::SYS_execve,
                [
                    c.program as usize,
                    c.argv as usize,
                    c.envp as usize,
                    0,
                    0,
                    0,
                ],
            )
        }
    }

    #[inline(always)]
    unsafe fn wake(&self, word: *const AtomicU32) {
        // SAFETY (caller): FUTEX_WAKE on a live word.
        unsafe {
            sys(
                libc::SYS_futex,
                [
                    word as usize,
                    (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as usize,
                    1,
                    0,
                    0,
                    0,
                ],
            );
        }
    }

    #[inline(always)]
    unsafe fn exit_group(&self, code: i32) {
        // SAFETY: a plain integer.
        unsafe {
            sys(libc::SYS_exit_group, [code as usize, 0, 0, 0, 0, 0]);
        }
    }

    fn setgroups(&self, groups: &[u32]) -> std::io::Result<()> {
        // SAFETY: `groups` outlives the call. glibc applies it to every thread.
        if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn setresgid(&self, gid: u32) -> std::io::Result<()> {
        // SAFETY: plain integers; glibc applies it to every thread.
        if unsafe { libc::setresgid(gid, gid, gid) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn setresuid(&self, uid: u32) -> std::io::Result<()> {
        // SAFETY: plain integers; glibc applies it to every thread.
        if unsafe { libc::setresuid(uid, uid, uid) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn capabilities_left(&self) -> Vec<String> {
        let now = iii_shell_confine::caps::read();
        if now.effective.is_empty() && now.permitted.is_empty() {
            Vec::new()
        } else {
            now.permitted
        }
    }

    fn threads(&self) -> usize {
        std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
    }

    fn in_bounding(&self, cap: caps::Capability) -> bool {
        caps::has_cap(None, caps::CapSet::Bounding, cap).unwrap_or(false)
    }

    fn drop_capability(&self, cap: caps::Capability) -> std::io::Result<()> {
        for set in [caps::CapSet::Effective, caps::CapSet::Permitted] {
            caps::drop(None, set, cap).map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        Ok(())
    }
}

/// Nothing but stdio (and `keep`) crosses: descriptors the executor holds (the broker
/// connection, other commands' pipes) or inherited without close-on-exec.
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
unsafe fn drop_pending_signals() {
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
                    [sig, &DFL as *const KernelSigaction as usize, 0, 8, 0, 0],
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

/// The recording fake, for this crate's unit tests: the routines run in-process on it (it
/// allocates, which is fine there: nothing was cloned).
#[cfg(test)]
pub(crate) mod fake {
    use std::cell::RefCell;
    use std::ffi::{c_void, CStr};
    use std::os::fd::RawFd;
    use std::sync::atomic::AtomicU32;

    use super::{Command, Privileges, Wait};

    /// One call, with its arguments.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        DefaultSignals,
        SetName(String),
        Setsid,
        JoinCgroup(RawFd),
        KeepOnExec(RawFd),
        DupOnto(RawFd, RawFd),
        ControllingTty,
        NoNewPrivs,
        LandlockRestrictSelf(RawFd),
        /// The program's length in instructions.
        SeccompInstall(u16),
        CloseDescriptors {
            keep: RawFd,
        },
        HandOver,
        Fchdir(RawFd),
        Setrlimit(i32, u64),
        DropPendingSignals,
        ClearSignalMask,
        /// The program and argv, read back from the command's C strings.
        Execve(String, Vec<String>),
        Wake,
        ExitGroup(i32),
        Setgroups(Vec<u32>),
        Setresgid(u32),
        Setresuid(u32),
        CapabilitiesLeft,
        Threads,
        InBounding(caps::Capability),
        DropCapability(caps::Capability),
    }

    /// Records every call; the call at position `fail.0` (0-based, counting every call)
    /// fails with errno `fail.1` when it can fail.
    pub struct Recorder {
        pub calls: RefCell<Vec<Call>>,
        pub fail: Option<(usize, i32)>,
        /// What the hand-over returns.
        pub command: Command,
        /// What `threads` says.
        pub threads: usize,
        /// The bounding set.
        pub bounding: Vec<caps::Capability>,
        /// What `capabilities_left` says.
        pub left: Vec<String>,
    }

    impl Default for Recorder {
        fn default() -> Recorder {
            Recorder {
                calls: RefCell::new(Vec::new()),
                fail: None,
                command: Command::NONE,
                threads: 1,
                bounding: Vec::new(),
                left: Vec::new(),
            }
        }
    }

    impl Recorder {
        /// A recorder whose call at position `n` fails with `errno`.
        pub fn failing_at(n: usize, errno: i32) -> Recorder {
            Recorder {
                fail: Some((n, errno)),
                ..Recorder::default()
            }
        }

        /// What was called, in order.
        pub fn calls(&self) -> Vec<Call> {
            self.calls.borrow().clone()
        }

        /// Records `call`; `-errno` when it is the one told to fail, else 0.
        fn record(&self, call: Call) -> isize {
            let mut calls = self.calls.borrow_mut();
            calls.push(call);
            match self.fail {
                Some((n, errno)) if n + 1 == calls.len() => -(errno as isize),
                _ => 0,
            }
        }

        fn record_io(&self, call: Call) -> std::io::Result<()> {
            match self.record(call) {
                0 => Ok(()),
                rc => Err(std::io::Error::from_raw_os_error(-rc as i32)),
            }
        }
    }

    /// The strings of a NULL-terminated array of C strings.
    unsafe fn strings(mut p: *const *const libc::c_char) -> Vec<String> {
        let mut out = Vec::new();
        // SAFETY (caller): a NULL-terminated array of valid C strings.
        unsafe {
            while !p.is_null() && !(*p).is_null() {
                out.push(CStr::from_ptr(*p).to_string_lossy().into_owned());
                p = p.add(1);
            }
        }
        out
    }

    /// Steps whose failure the routines ignore (best effort): failing one changes nothing.
    pub fn best_effort(call: &Call) -> bool {
        matches!(
            call,
            Call::DefaultSignals
                | Call::SetName(_)
                | Call::CloseDescriptors { .. }
                | Call::DropPendingSignals
                | Call::ClearSignalMask
                | Call::Wake
                | Call::ExitGroup(_)
                | Call::CapabilitiesLeft
                | Call::Threads
                | Call::InBounding(_)
        )
    }

    /// A confinement with every layer: Landlock ruleset fd 50, a seccomp program of three
    /// instructions, open files limited to 64 and processes to 99.
    pub fn confinement() -> crate::plan::ChildConfinement {
        let nop = libc::sock_filter {
            code: 0,
            jt: 0,
            jf: 0,
            k: 0,
        };
        let mut rlimits = iii_shell_confine::Rlimits::default();
        rlimits.entries[0] = (libc::RLIMIT_NOFILE as i32, 64);
        rlimits.entries[1] = (libc::RLIMIT_NPROC as i32, 99);
        rlimits.len = 2;
        crate::plan::ChildConfinement {
            rlimits,
            no_new_privs: true,
            landlock_fd: Some(50),
            seccomp: Some(std::sync::Arc::new(iii_shell_confine::seccomp::Filter {
                program: vec![nop; 3],
                denied: Vec::new(),
            })),
        }
    }

    /// The calls of a run told to fail at `n` with `errno`, given the calls of the full run
    /// (`full`) and what the routine does after a failure (`after`): a fallible step that
    /// fails is the last step run; a best-effort one changes nothing.
    pub fn expected_on_failure(full: &[Call], n: usize, after: &[Call]) -> (Vec<Call>, bool) {
        if best_effort(&full[n]) {
            let mut all = full.to_vec();
            // A run that reached the end reports too (the fake's execve "returns").
            all.extend_from_slice(after);
            (all, false)
        } else {
            let mut upto = full[..=n].to_vec();
            upto.extend_from_slice(after);
            (upto, true)
        }
    }

    impl Privileges for Recorder {
        unsafe fn default_signals(&self) {
            self.record(Call::DefaultSignals);
        }
        unsafe fn set_name(&self, name: *const u8) {
            // SAFETY (caller): a NUL-terminated string.
            let name = unsafe { CStr::from_ptr(name.cast()) };
            self.record(Call::SetName(name.to_string_lossy().into_owned()));
        }
        unsafe fn setsid(&self) -> isize {
            self.record(Call::Setsid)
        }
        unsafe fn join_cgroup(&self, procs: RawFd) -> isize {
            self.record(Call::JoinCgroup(procs))
        }
        unsafe fn keep_on_exec(&self, fd: RawFd) -> isize {
            self.record(Call::KeepOnExec(fd))
        }
        unsafe fn dup_onto(&self, fd: RawFd, onto: RawFd) -> isize {
            self.record(Call::DupOnto(fd, onto))
        }
        unsafe fn controlling_tty(&self) -> isize {
            self.record(Call::ControllingTty)
        }
        unsafe fn no_new_privs(&self) -> isize {
            self.record(Call::NoNewPrivs)
        }
        unsafe fn landlock_restrict_self(&self, ruleset: RawFd) -> isize {
            self.record(Call::LandlockRestrictSelf(ruleset))
        }
        unsafe fn seccomp_install(&self, prog: *const libc::sock_fprog) -> isize {
            // SAFETY (caller): a valid program.
            let len = unsafe { (*prog).len };
            self.record(Call::SeccompInstall(len))
        }
        unsafe fn close_descriptors(&self, keep: RawFd) {
            self.record(Call::CloseDescriptors { keep });
        }
        unsafe fn hand_over(&self, _wait: Wait, _arg: *const c_void) -> Result<Command, isize> {
            match self.record(Call::HandOver) {
                0 => Ok(self.command),
                rc => Err(rc),
            }
        }
        unsafe fn fchdir(&self, fd: RawFd) -> isize {
            self.record(Call::Fchdir(fd))
        }
        unsafe fn setrlimit(&self, resource: i32, value: u64) -> isize {
            self.record(Call::Setrlimit(resource, value))
        }
        unsafe fn drop_pending_signals(&self) {
            self.record(Call::DropPendingSignals);
        }
        unsafe fn clear_signal_mask(&self) {
            self.record(Call::ClearSignalMask);
        }
        unsafe fn execve(&self, c: &Command) -> isize {
            // SAFETY (caller): valid C strings.
            let (program, argv) = unsafe {
                (
                    CStr::from_ptr(c.program).to_string_lossy().into_owned(),
                    strings(c.argv),
                )
            };
            self.record(Call::Execve(program, argv))
        }
        unsafe fn wake(&self, _word: *const AtomicU32) {
            self.record(Call::Wake);
        }
        unsafe fn exit_group(&self, code: i32) {
            self.record(Call::ExitGroup(code));
        }
        fn setgroups(&self, groups: &[u32]) -> std::io::Result<()> {
            self.record_io(Call::Setgroups(groups.to_vec()))
        }
        fn setresgid(&self, gid: u32) -> std::io::Result<()> {
            self.record_io(Call::Setresgid(gid))
        }
        fn setresuid(&self, uid: u32) -> std::io::Result<()> {
            self.record_io(Call::Setresuid(uid))
        }
        fn capabilities_left(&self) -> Vec<String> {
            self.record(Call::CapabilitiesLeft);
            self.left.clone()
        }
        fn threads(&self) -> usize {
            self.record(Call::Threads);
            self.threads
        }
        fn in_bounding(&self, cap: caps::Capability) -> bool {
            self.record(Call::InBounding(cap));
            self.bounding.contains(&cap)
        }
        fn drop_capability(&self, cap: caps::Capability) -> std::io::Result<()> {
            self.record_io(Call::DropCapability(cap))
        }
    }
}
