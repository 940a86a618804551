//! The seccomp block of `confinement.network: deny`: `socket` and `socketpair` of any family
//! but `AF_UNIX` fail with EACCES, so a command opens no IP (TCP, UDP), packet, raw or
//! netlink socket; Unix sockets keep working (under Landlock's scoping).
//!
//! EACCES, not EAFNOSUPPORT: it is the errno Landlock's TCP rules give too (the second layer,
//! where the kernel has them), and programs report it as "Permission denied", which says what
//! happened; EAFNOSUPPORT would read as a missing kernel feature. Either way `socket()` fails at
//! once, so a client fails without waiting on a timeout.
//!
//! The block is self-contained (its own architecture check) and falls through when the call
//! is anything else, so it is put in front of a command's other filter (or alone, followed
//! by an ALLOW). A system call of a foreign architecture (the i386 entry point on x86_64,
//! where `socketcall` would go around the check) kills the process, as the deny filter does.
//! It is built once per policy in the parent; the child only loads it.

use super::bpf::{
    in_front, off_arg, op, AUDIT_ARCH, JA, JEQ_K, LD_W_ABS, OFF_ARCH, OFF_NR, RET_K, X32_BIT,
};
use super::seccomp::Filter;

/// The errno of a refused socket.
pub const ERRNO: i32 = libc::EACCES;

/// What `doctor` lists for the block.
pub const DENIED: &str = "socket/socketpair of any family but AF_UNIX (EACCES)";

/// The system calls that take a family in argument 0 (x32 numbers too on x86_64).
#[allow(clippy::vec_init_then_push)]
pub fn calls() -> Vec<u32> {
    let mut v = vec![libc::SYS_socket as u32, libc::SYS_socketpair as u32];
    #[cfg(target_arch = "x86_64")]
    {
        v.push(libc::SYS_socket as u32 | X32_BIT);
        v.push(libc::SYS_socketpair as u32 | X32_BIT);
    }
    v
}

/// The block: falls through unless the call opens a socket of a family other than AF_UNIX.
pub fn block() -> Vec<libc::sock_filter> {
    let calls = calls();
    let n = calls.len();
    // Layout: [0] ld arch, [1] jeq arch else → kill, [2] kill, [3] ld nr,
    // [4..4+n] jeq call → check, [4+n] ja end, [check] ld arg0, jeq AF_UNIX → end else → errno,
    // [errno], end = len.
    let check_at = 4 + n + 1;
    let errno_at = check_at + 2;
    let end = errno_at + 1;
    let mut p = vec![
        op(LD_W_ABS, 0, 0, OFF_ARCH),
        op(JEQ_K, 1, 0, AUDIT_ARCH),
        op(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        op(LD_W_ABS, 0, 0, OFF_NR),
    ];
    for (i, nr) in calls.iter().enumerate() {
        let here = 4 + i;
        p.push(op(JEQ_K, (check_at - here - 1) as u8, 0, *nr));
    }
    p.push(op(JA, 0, 0, (end - (4 + n) - 1) as u32));
    p.push(op(LD_W_ABS, 0, 0, off_arg(0)));
    p.push(op(
        JEQ_K,
        (end - (check_at + 1) - 1) as u8,
        0,
        libc::AF_UNIX as u32,
    ));
    p.push(op(
        RET_K,
        0,
        0,
        libc::SECCOMP_RET_ERRNO | (ERRNO as u32 & libc::SECCOMP_RET_DATA),
    ));
    debug_assert_eq!(p.len(), end);
    p
}

/// The filter of a command under `deny`: the block in front of `rest` (its other filter), or
/// alone with an ALLOW after it.
pub fn with(rest: Option<&Filter>) -> Filter {
    in_front(block(), DENIED, rest)
}
