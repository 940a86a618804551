//! `clone3(CLONE_INTO_CGROUP)`: a child created directly inside its job cgroup.
//!
//! glibc does not export clone3, and a `CLONE_VM` child must start on its own stack, so the
//! call is made by a small per-architecture trampoline: the parent gets the pid back, the
//! child (which resumes at the same instruction with the new stack pointer) calls the given
//! function and exits with its result. Only x86_64 has a trampoline today; elsewhere, and on
//! kernels without clone3 or `CLONE_INTO_CGROUP` (before 5.7), [`available`] turns false and
//! the spawn path falls back to `clone` plus a write to `cgroup.procs`.

use std::ffi::c_void;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

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

static UNAVAILABLE: AtomicBool = AtomicBool::new(!cfg!(target_arch = "x86_64"));

/// Whether clone3 with `CLONE_INTO_CGROUP` is worth trying.
pub fn available() -> bool {
    !UNAVAILABLE.load(Ordering::Relaxed)
}

/// Records a failed attempt. Errors that mean "this kernel or filter has no clone3 with
/// `CLONE_INTO_CGROUP`" switch it off for the life of the process; others (a cgroup being
/// removed, a permission problem) only affect that one spawn.
pub fn note_failure(e: &std::io::Error) {
    if matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL | libc::EPERM)
    ) && !UNAVAILABLE.swap(true, Ordering::Relaxed)
    {
        tracing::info!(error = %e, "clone3(CLONE_INTO_CGROUP) unavailable: children join their job cgroup by writing cgroup.procs");
    }
}

/// Switches clone3 off for the life of the process.
pub fn disable(why: &str) {
    if !UNAVAILABLE.swap(true, Ordering::Relaxed) {
        tracing::warn!("clone3(CLONE_INTO_CGROUP) disabled: {why}; children join their job cgroup by writing cgroup.procs (slower)");
    }
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
        Err(e) => {
            note_failure(&e);
            return Ok(());
        }
    };
    // SAFETY: CLONE_PIDFD stored a fresh descriptor that only we own.
    let pidfd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) };
    match crate::spawn::try_reap_blocking(&pidfd) {
        Ok(crate::spawn::ExitStatus::Exited(0)) => Ok(()),
        Ok(other) => Err(format!(
            "a test child (pid {pid}) created in a job cgroup ended with {other:?}"
        )),
        Err(e) => Err(format!("cannot reap the test child: {e}")),
    }
}

/// Starts `f(arg)` as a child inside the cgroup `cgroup_dir`, sharing our memory, with this
/// thread suspended until the child execs or exits. No exit signal is sent when it ends; it
/// is reaped through the pidfd stored in `pidfd`.
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
    let mut args = CloneArgs {
        flags: (libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD) as u64 | CLONE_INTO_CGROUP,
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

// The x86_64 trampoline: `iii_shell_clone3(args, size, f, arg)`.
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
    "    mov r8, rdx",
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
    fn iii_shell_clone3(args: *mut CloneArgs, size: usize, f: ChildFn, arg: *mut c_void) -> isize;
    static iii_shell_clone3_ret: u8;
}

#[cfg(target_arch = "x86_64")]
unsafe fn raw(args: &mut CloneArgs, f: ChildFn, arg: *mut c_void) -> isize {
    // SAFETY: forwarded from `spawn_into`'s contract; the trampoline follows the C ABI.
    unsafe { iii_shell_clone3(args, std::mem::size_of::<CloneArgs>(), f, arg) }
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
