//! The broker's default-deny seccomp allowlist, compiled by seccompiler.
//!
//! The broker is a tokio network client: [`syscalls`] are the calls it needs, and every other
//! system call fails with EPERM. The verdicts, for every thread of the broker:
//!
//! * a foreign architecture is killed (seccompiler's architecture check);
//! * a listed call is allowed; `clone` only when its flags (the low 32 bits of argument 0)
//!   carry none of [`NAMESPACE_FLAGS`];
//! * `clone3` answers ENOSYS (it passes its flags in memory a filter cannot read; glibc then
//!   falls back to `clone`, whose flags the filter checks);
//! * everything else, x32 numbers included (they match no listed number), answers EPERM.
//!
//! A seccompiler filter has one action for a match and one for a miss, so the ENOSYS of
//! `clone3` is a second, tiny program ([`filters`] returns both, in installation order). The
//! kernel runs every installed program and keeps the most restrictive verdict (ERRNO over
//! ALLOW), so the pair answers as one program would: the allowlist lets `clone3` through and
//! the clone3 program refuses it. The clone3 program is installed first, so a failure of the
//! second install leaves no call allowed that the pair refuses. Unlike the executor's deny
//! filter ([`crate::seccomp`]), the broker needs no instruction-pointer check, which is what
//! seccompiler cannot express.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

pub use crate::seccomp::NAMESPACE_FLAGS;
use crate::seccomp::{install_self, Filter};

macro_rules! sys {
    ($($name:ident),* $(,)?) => {
        [$((stringify!($name), libc::$name as i64)),*]
    };
}

/// The system calls a tokio network client needs, by name (`SYS_…`) and number.
pub fn syscalls() -> Vec<(&'static str, i64)> {
    let mut v = sys![
        SYS_read,
        SYS_write,
        SYS_readv,
        SYS_writev,
        SYS_pread64,
        SYS_close,
        SYS_fstat,
        SYS_newfstatat,
        SYS_statx,
        SYS_lseek,
        SYS_openat,
        SYS_mmap,
        SYS_mprotect,
        SYS_munmap,
        SYS_madvise,
        SYS_mremap,
        SYS_brk,
        SYS_rt_sigaction,
        SYS_rt_sigprocmask,
        SYS_rt_sigreturn,
        SYS_sigaltstack,
        SYS_ioctl,
        SYS_fcntl,
        SYS_dup,
        SYS_dup3,
        SYS_socket,
        SYS_socketpair,
        SYS_connect,
        SYS_bind,
        SYS_getsockopt,
        SYS_setsockopt,
        SYS_getsockname,
        SYS_getpeername,
        SYS_sendto,
        SYS_recvfrom,
        SYS_sendmsg,
        SYS_recvmsg,
        SYS_sendmmsg,
        SYS_recvmmsg,
        SYS_shutdown,
        SYS_ppoll,
        SYS_epoll_create1,
        SYS_epoll_ctl,
        SYS_epoll_pwait,
        SYS_epoll_pwait2,
        SYS_eventfd2,
        SYS_pipe2,
        SYS_futex,
        SYS_sched_yield,
        SYS_sched_getaffinity,
        SYS_nanosleep,
        SYS_clock_nanosleep,
        SYS_clock_gettime,
        SYS_clock_getres,
        SYS_gettimeofday,
        SYS_getpid,
        SYS_gettid,
        SYS_getppid,
        SYS_getuid,
        SYS_geteuid,
        SYS_getgid,
        SYS_getegid,
        SYS_exit,
        SYS_exit_group,
        SYS_set_robust_list,
        SYS_rseq,
        SYS_clone,
        SYS_prctl,
        SYS_getrandom,
        SYS_uname,
        SYS_restart_syscall,
        SYS_prlimit64,
        SYS_sysinfo,
        SYS_membarrier,
        SYS_tgkill,
        SYS_getcwd,
        SYS_readlinkat,
        SYS_faccessat,
        SYS_faccessat2,
        SYS_timerfd_create,
        SYS_timerfd_settime,
    ]
    .to_vec();
    #[cfg(target_arch = "x86_64")]
    v.extend(sys![
        SYS_poll,
        SYS_epoll_wait,
        SYS_epoll_create,
        SYS_pipe,
        SYS_dup2,
        SYS_stat,
        SYS_lstat,
        SYS_open,
        SYS_access,
        SYS_readlink,
        SYS_arch_prctl,
        SYS_getdents64,
    ]);
    v
}

fn arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())
}

fn compile(filter: SeccompFilter, denied: &'static str) -> Result<Filter, String> {
    let program: BpfProgram = filter.try_into().map_err(|e| format!("{e}"))?;
    Ok(Filter {
        program: program
            .into_iter()
            .map(|i| libc::sock_filter {
                code: i.code,
                jt: i.jt,
                jf: i.jf,
                k: i.k,
            })
            .collect(),
        denied: vec![denied],
    })
}

/// The programs that allow exactly `allowed` (plus `clone` without namespace flags; `clone3`
/// answers ENOSYS), in the order they are installed: the clone3 program, then the allowlist.
pub fn filters(allowed: &[i64]) -> Result<Vec<Filter>, String> {
    let e = |e: seccompiler::BackendError| e.to_string();
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    )
    .map_err(e)?;
    let no_namespaces = SeccompRule::new(vec![SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(NAMESPACE_FLAGS),
        0,
    )
    .map_err(e)?])
    .map_err(e)?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        allowed.iter().map(|&nr| (nr, Vec::new())).collect();
    rules.insert(libc::SYS_clone, vec![no_namespaces]);
    // Refused by the clone3 program; allowed here so that a verdict never depends on which
    // of two ERRNO values the kernel keeps.
    rules.insert(libc::SYS_clone3, Vec::new());
    let allowlist = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch()?,
    )
    .map_err(e)?;
    Ok(vec![
        compile(clone3, "SYS_clone3 (ENOSYS)")?,
        compile(allowlist, "everything not on the broker allowlist")?,
    ])
}

/// Installs the broker's allowlist ([`syscalls`]) on every thread of this process. Requires
/// no_new_privs (set it first).
pub fn install() -> Result<(), String> {
    let allowed: Vec<i64> = syscalls().iter().map(|&(_, nr)| nr).collect();
    for f in filters(&allowed)? {
        install_self(&f).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The broker's allowed set, exactly: a call added or lost here is a change of the
    /// broker's confinement and must be made on purpose.
    #[test]
    fn the_broker_allows_exactly_these_calls() {
        let names: Vec<&str> = syscalls().iter().map(|&(n, _)| n).collect();
        let mut want = vec![
            "SYS_read",
            "SYS_write",
            "SYS_readv",
            "SYS_writev",
            "SYS_pread64",
            "SYS_close",
            "SYS_fstat",
            "SYS_newfstatat",
            "SYS_statx",
            "SYS_lseek",
            "SYS_openat",
            "SYS_mmap",
            "SYS_mprotect",
            "SYS_munmap",
            "SYS_madvise",
            "SYS_mremap",
            "SYS_brk",
            "SYS_rt_sigaction",
            "SYS_rt_sigprocmask",
            "SYS_rt_sigreturn",
            "SYS_sigaltstack",
            "SYS_ioctl",
            "SYS_fcntl",
            "SYS_dup",
            "SYS_dup3",
            "SYS_socket",
            "SYS_socketpair",
            "SYS_connect",
            "SYS_bind",
            "SYS_getsockopt",
            "SYS_setsockopt",
            "SYS_getsockname",
            "SYS_getpeername",
            "SYS_sendto",
            "SYS_recvfrom",
            "SYS_sendmsg",
            "SYS_recvmsg",
            "SYS_sendmmsg",
            "SYS_recvmmsg",
            "SYS_shutdown",
            "SYS_ppoll",
            "SYS_epoll_create1",
            "SYS_epoll_ctl",
            "SYS_epoll_pwait",
            "SYS_epoll_pwait2",
            "SYS_eventfd2",
            "SYS_pipe2",
            "SYS_futex",
            "SYS_sched_yield",
            "SYS_sched_getaffinity",
            "SYS_nanosleep",
            "SYS_clock_nanosleep",
            "SYS_clock_gettime",
            "SYS_clock_getres",
            "SYS_gettimeofday",
            "SYS_getpid",
            "SYS_gettid",
            "SYS_getppid",
            "SYS_getuid",
            "SYS_geteuid",
            "SYS_getgid",
            "SYS_getegid",
            "SYS_exit",
            "SYS_exit_group",
            "SYS_set_robust_list",
            "SYS_rseq",
            "SYS_clone",
            "SYS_prctl",
            "SYS_getrandom",
            "SYS_uname",
            "SYS_restart_syscall",
            "SYS_prlimit64",
            "SYS_sysinfo",
            "SYS_membarrier",
            "SYS_tgkill",
            "SYS_getcwd",
            "SYS_readlinkat",
            "SYS_faccessat",
            "SYS_faccessat2",
            "SYS_timerfd_create",
            "SYS_timerfd_settime",
        ];
        if cfg!(target_arch = "x86_64") {
            want.extend([
                "SYS_poll",
                "SYS_epoll_wait",
                "SYS_epoll_create",
                "SYS_pipe",
                "SYS_dup2",
                "SYS_stat",
                "SYS_lstat",
                "SYS_open",
                "SYS_access",
                "SYS_readlink",
                "SYS_arch_prctl",
                "SYS_getdents64",
            ]);
        }
        assert_eq!(names, want);
    }

    #[test]
    fn the_programs_come_in_installation_order() {
        let f = filters(&[libc::SYS_read]).unwrap();
        let denied: Vec<&str> = f.iter().flat_map(|f| f.denied.iter().copied()).collect();
        assert_eq!(
            denied,
            [
                "SYS_clone3 (ENOSYS)",
                "everything not on the broker allowlist"
            ]
        );
    }
}
