//! `clone3(CLONE_INTO_CGROUP)`: a child created directly inside its job cgroup.
//!
//! glibc does not export clone3, and a `CLONE_VM` child must start on its own stack, so the
//! call is made by a small per-architecture trampoline: the parent gets the pid back, the
//! child (which resumes at the same instruction with the new stack pointer) calls the given
//! function and exits with its result. Only x86_64 has a trampoline today; elsewhere, and on
//! kernels without clone3 or `CLONE_INTO_CGROUP` (before 5.7), [`Clone3::available`] turns false and
//! the spawn path falls back to `clone` plus a write to `cgroup.procs`.

use std::ffi::c_void;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The child's entry point: receives the spawn context, never returns in practice.
pub type ChildFn = extern "C" fn(*mut c_void) -> libc::c_int;

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` up to `cgroup` (CLONE_ARGS_SIZE_VER2, 88 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Consecutive failures of other kinds after which clone3 is switched off too.
const MAX_FAILURES: u32 = 3;

/// Whether clone3 with `CLONE_INTO_CGROUP` is worth trying, for one launcher: off where there
/// is no trampoline, and switched off for good by the failures [`Clone3::note_failure`] counts.
#[derive(Debug)]
pub struct Clone3 {
    unavailable: AtomicBool,
    failures: AtomicU32,
}

impl Default for Clone3 {
    fn default() -> Self {
        Clone3 {
            unavailable: AtomicBool::new(!cfg!(target_arch = "x86_64")),
            failures: AtomicU32::new(0),
        }
    }
}

impl Clone3 {
    /// Whether clone3 with `CLONE_INTO_CGROUP` is worth trying.
    pub fn available(&self) -> bool {
        !self.unavailable.load(Ordering::Relaxed)
    }

    /// Records a failed attempt. Errors that mean "this kernel or filter has no clone3 with
    /// `CLONE_INTO_CGROUP`" switch it off for the life of the launcher at once; others (a
    /// cgroup being removed, a permission problem) after [`MAX_FAILURES`] in a row, so spawns
    /// do not keep paying for a clone3 that fails before their fallback.
    pub fn note_failure(&self, e: &std::io::Error) {
        let fatal = matches!(
            e.raw_os_error(),
            Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL | libc::EPERM)
        );
        if fatal || self.failures.fetch_add(1, Ordering::Relaxed) + 1 >= MAX_FAILURES {
            self.disable(&e.to_string());
        }
    }

    /// Records a successful attempt.
    pub fn note_success(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    /// Switches clone3 off for the life of the launcher.
    pub fn disable(&self, why: &str) {
        if !self.unavailable.swap(true, Ordering::Relaxed) {
            tracing::warn!("clone3(CLONE_INTO_CGROUP) disabled: {why}; children join their job cgroup by writing cgroup.procs (slower)");
        }
    }
}

/// The two 64-bit values the trampoline passes in clone3's unused argument registers (rdx and
/// r10), drawn from the kernel's random pool once per process. The seccomp filter admits
/// clone3 only with these values *and* from the trampoline's address, so a command that
/// guessed the (randomized) address still has 128 bits to guess; it cannot read them (the
/// executor is not dumpable, commands hold no capabilities, and a filter's program is not
/// readable without CAP_SYS_ADMIN). Kept with what the process's filter holds
/// (`iii_shell_confine::seccomp::PROCESS`): the filter is the process's, not a launcher's.
pub fn secret() -> [u64; 2] {
    iii_shell_confine::seccomp::PROCESS.clone3_secret(|| {
        // No kernel randomness (pre-3.17 kernels, no /dev/urandom): the address check still
        // holds.
        [getrandom::u64().unwrap_or(0), getrandom::u64().unwrap_or(0)]
    })
}

/// Starts a child inside `cgroup_dir` that exits at once with status 0, and checks that it
/// did. Err says what went wrong.
pub fn self_test(cgroup_dir: RawFd) -> Result<(), String> {
    extern "C" fn exit_zero(_: *mut c_void) -> libc::c_int {
        // SAFETY: _exit is async-signal-safe and touches no shared memory.
        unsafe { libc::_exit(0) }
    }
    let mut stack = vec![0u8; 16 * 1024];
    let size = (stack.len() - 64) & !15;
    let base = stack.as_mut_ptr();
    let top = (base as usize + size) & !15;
    let mut pidfd: libc::c_int = -1;
    // SAFETY: the child only calls _exit, on `stack`, which outlives the call (CLONE_VFORK
    // suspends us until the child has exited).
    let pid = unsafe {
        spawn_into(
            cgroup_dir,
            exit_zero,
            std::ptr::null_mut(),
            base,
            top - base as usize,
            &mut pidfd,
        )
    };
    drop(stack);
    let pid = match pid {
        Ok(p) => p,
        // Any failure here means spawns would fail the same way before their fallback.
        Err(e) => return Err(format!("clone3 into a fresh job cgroup failed: {e}")),
    };
    // SAFETY: CLONE_PIDFD stored a fresh descriptor that only we own.
    let pidfd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) };
    match crate::wait::try_reap_blocking(&pidfd) {
        Ok(crate::wait::ExitStatus::Exited(0)) => Ok(()),
        Ok(other) => Err(format!(
            "a test child (pid {pid}) created in a job cgroup ended with {other:?}"
        )),
        Err(e) => Err(format!("cannot reap the test child: {e}")),
    }
}

/// Starts `f(arg)` as a child inside the cgroup `cgroup_dir`, sharing our memory, with this
/// thread suspended until the child execs or exits. It is cloned without an exit signal (a
/// child that fails before `execve` raises none; `execve` resets it to SIGCHLD) and is reaped
/// through the pidfd stored in `pidfd`.
///
/// # Safety
/// The same contract as `clone(CLONE_VM | CLONE_VFORK)`: `f` must only make async-signal-safe
/// system calls, `arg` and everything it points to must stay valid until the child has exec'd
/// or exited, and `stack..stack + stack_size` must be memory nothing else uses meanwhile, with
/// `stack + stack_size` 16-byte aligned.
pub unsafe fn spawn_into(
    cgroup_dir: RawFd,
    f: ChildFn,
    arg: *mut c_void,
    stack: *mut u8,
    stack_size: usize,
    pidfd: &mut libc::c_int,
) -> std::io::Result<i32> {
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        clone_into(
            cgroup_dir,
            f,
            arg,
            stack,
            stack_size,
            pidfd,
            libc::CLONE_VFORK,
        )
    }
}

/// [`spawn_into`] without `CLONE_VFORK`: the call returns at once and the child runs alongside
/// this thread, in the same memory (a pre-started command, see `prestarted`).
///
/// # Safety
/// As for [`spawn_into`], and more: `arg`, everything it points to and the stack must stay
/// valid until the child has exec'd or exited, which this call does not wait for; the child
/// must not touch memory this process uses (no allocation, no locks, no `errno`: only raw
/// system calls on data reserved for it).
pub unsafe fn start_into(
    cgroup_dir: RawFd,
    f: ChildFn,
    arg: *mut c_void,
    stack: *mut u8,
    stack_size: usize,
    pidfd: &mut libc::c_int,
) -> std::io::Result<i32> {
    // SAFETY: forwarded from the caller's contract.
    unsafe { clone_into(cgroup_dir, f, arg, stack, stack_size, pidfd, 0) }
}

unsafe fn clone_into(
    cgroup_dir: RawFd,
    f: ChildFn,
    arg: *mut c_void,
    stack: *mut u8,
    stack_size: usize,
    pidfd: &mut libc::c_int,
    vfork: libc::c_int,
) -> std::io::Result<i32> {
    let mut args = CloneArgs {
        flags: (libc::CLONE_VM | vfork | libc::CLONE_PIDFD) as u64 | CLONE_INTO_CGROUP,
        pidfd: pidfd as *mut libc::c_int as u64,
        stack: stack as u64,
        stack_size: stack_size as u64,
        cgroup: cgroup_dir as u64,
        ..CloneArgs::default()
    };
    // SAFETY: forwarded from the caller's contract; `args` lives across the call.
    let rc = unsafe { raw(&mut args, f, arg) };
    if rc < 0 {
        return Err(std::io::Error::from_raw_os_error(-rc as i32));
    }
    Ok(rc as i32)
}

// The x86_64 trampoline: `iii_shell_clone3(args, size, f, arg, s0, s1)`. clone3 reads only
// its first two arguments; s0 and s1 go in the third and fourth argument registers (rdx,
// r10), where the seccomp filter checks them (see `secret`).
//
// The syscall instruction clobbers only rax (the result), rcx and r11. The child resumes after
// it with rax = 0 and every other register as the parent had it, but with rsp at the top of
// its own stack (16-byte aligned, so `call` leaves the callee with the alignment the ABI
// expects). It calls f(arg) from r8/r9 and exits with f's result; it never returns. The label
// right after the syscall is exported so the seccomp filter can tell this call site (the
// instruction pointer the kernel reports) from every other clone3.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.iii_shell_clone3,\"ax\",@progbits",
    ".globl iii_shell_clone3",
    ".hidden iii_shell_clone3",
    ".type iii_shell_clone3,@function",
    "iii_shell_clone3:",
    "    mov rax, rdx",
    "    mov rdx, r8",
    "    mov r10, r9",
    "    mov r8, rax",
    "    mov r9, rcx",
    "    mov eax, {clone3}",
    "    syscall",
    ".globl iii_shell_clone3_ret",
    ".hidden iii_shell_clone3_ret",
    "iii_shell_clone3_ret:",
    "    test rax, rax",
    "    jnz .Liii_shell_clone3_parent",
    "    xor ebp, ebp",
    "    mov rdi, r9",
    "    call r8",
    "    mov edi, eax",
    "    mov eax, {exit}",
    "    syscall",
    "    ud2",
    ".Liii_shell_clone3_parent:",
    "    ret",
    ".size iii_shell_clone3, .-iii_shell_clone3",
    ".popsection",
    clone3 = const libc::SYS_clone3,
    exit = const libc::SYS_exit,
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    fn iii_shell_clone3(
        args: *mut CloneArgs,
        size: usize,
        f: ChildFn,
        arg: *mut c_void,
        s0: u64,
        s1: u64,
    ) -> isize;
    static iii_shell_clone3_ret: u8;
}

#[cfg(target_arch = "x86_64")]
unsafe fn raw(args: &mut CloneArgs, f: ChildFn, arg: *mut c_void) -> isize {
    // SAFETY: forwarded from the callers' contract; the trampoline follows the C ABI.
    let [s0, s1] = secret();
    unsafe { iii_shell_clone3(args, std::mem::size_of::<CloneArgs>(), f, arg, s0, s1) }
}

/// Tells the seccomp deny filter about this trampoline, so a filter built afterwards lets
/// its clone3 through (`iii_shell_confine::seccomp::except_clone3_at`). Idempotent; called
/// before every filter is built.
pub fn register_seccomp_exception() {
    if let Some(site) = call_site() {
        iii_shell_confine::seccomp::except_clone3_at(site, secret());
    }
}

/// The instruction pointer the kernel reports (to seccomp) for the trampoline's clone3: the
/// address right after its syscall instruction. None where there is no trampoline.
pub fn call_site() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: only the address of the label is taken; it is never read.
        Some(std::ptr::addr_of!(iii_shell_clone3_ret) as u64)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn raw(_args: &mut CloneArgs, _f: ChildFn, _arg: *mut c_void) -> isize {
    -(libc::ENOSYS as isize)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    extern "C" fn exit_zero(_: *mut c_void) -> libc::c_int {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(0) }
    }

    /// clone3 through the trampoline with the given secrets, without a cgroup: 0 when a child
    /// was created (and reaped), otherwise the errno.
    fn try_trampoline(stack: &mut [u8], secret: [u64; 2]) -> i32 {
        let size = (stack.len() - 64) & !15;
        let mut args = CloneArgs {
            flags: (libc::CLONE_VM | libc::CLONE_VFORK) as u64,
            stack: stack.as_mut_ptr() as u64,
            stack_size: size as u64,
            ..CloneArgs::default()
        };
        // SAFETY: the child only calls _exit on `stack`, which outlives the call.
        let rc = unsafe {
            iii_shell_clone3(
                &mut args,
                std::mem::size_of::<CloneArgs>(),
                exit_zero,
                std::ptr::null_mut(),
                secret[0],
                secret[1],
            )
        };
        if rc < 0 {
            return -rc as i32;
        }
        let mut info: libc::siginfo_t = unsafe_zeroed();
        // SAFETY: waits for the child just created, writing into `info`.
        unsafe {
            libc::waitid(
                libc::P_PID,
                rc as u32,
                &mut info,
                libc::WEXITED | libc::__WALL,
            )
        };
        0
    }

    fn unsafe_zeroed() -> libc::siginfo_t {
        // SAFETY: all-zero is a valid siginfo_t.
        unsafe { std::mem::zeroed() }
    }

    /// Under the executor's filter, clone3 works only from the trampoline and only with this
    /// process's secrets; libc's own clone3 and a trampoline call with other values get ENOSYS.
    #[test]
    fn the_filter_admits_only_the_trampoline_with_its_secrets() {
        let aslr = std::fs::read_to_string("/proc/sys/kernel/randomize_va_space")
            .is_ok_and(|s| s.trim() != "0");
        if !aslr {
            iii_shell_confine::requirement::unmet(
                "address-space randomization is off, so no exception is made",
            );
            return;
        }
        register_seccomp_exception();
        let filter = iii_shell_confine::seccomp::build(&[]).expect("filter");
        let prog = filter.fprog();
        let good = secret();
        let bad = [good[0] ^ 1, good[1]];
        let mut stack = vec![0u8; 16 * 1024];
        // Everything the child needs is ready; it only makes system calls and exits.
        // SAFETY: fork in a test; the child calls only async-signal-safe functions.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: prctl/seccomp/syscall/_exit are async-signal-safe system calls.
            unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0u32,
                    &prog,
                ) != 0
                {
                    libc::_exit(10);
                }
                let libc_clone3 = libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize);
                if libc_clone3 != -1 || *libc::__errno_location() != libc::ENOSYS {
                    libc::_exit(11);
                }
                if try_trampoline(&mut stack, bad) != libc::ENOSYS {
                    libc::_exit(12);
                }
                if try_trampoline(&mut stack, good) != 0 {
                    libc::_exit(13);
                }
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waits for our forked child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "exit code {} (10 filter, 11 libc clone3 not refused, 12 wrong secret admitted, 13 trampoline refused)",
            libc::WEXITSTATUS(status)
        );
    }
}
