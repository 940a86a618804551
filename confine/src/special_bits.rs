//! The seccomp rule that keeps commands from setting setuid or setgid bits: `chmod`,
//! `fchmod`, `fchmodat` and `fchmodat2` with `S_ISUID` or `S_ISGID` in the mode fail with
//! EPERM (unless `fs.allow_special_bits`). It holds whatever uid the command runs as.
//!
//! The block is self-contained and ends by falling through, so it is put in front of the
//! per-spawn deny filter (which starts with its own architecture check), or alone followed by
//! an ALLOW.
//!
//! Where it sits ([`placement`]): at its first policy the executor installs it on itself
//! (every thread), when that policy wants it, so every child inherits it and none loads a
//! filter of its own for it. A seccomp filter cannot be removed, so a later policy that wants
//! it where the executor has none (`fs.allow_special_bits` true → false, or seccomp turned on)
//! gets it loaded per spawn from then on, and a policy that allows special bits once the
//! executor holds the rule is refused (the reload result and `shell::config-status` say to
//! restart the worker).

use super::bpf::{
    in_front, off_arg, op, AUDIT_ARCH, JA, JEQ_K, JSET_K, LD_W_ABS, OFF_ARCH, OFF_NR, RET_K,
};
use super::seccomp::Filter;

const SPECIAL: u32 = libc::S_ISUID | libc::S_ISGID;

/// `fchmodat2` (Linux 6.6), not in every libc yet; the same number on x86_64 and aarch64.
pub const SYS_FCHMODAT2: i64 = 452;

/// x86_64's x32 ABI shares the audit architecture; its numbers carry this bit. They are
/// listed too, so the block holds on its own (in the executor's filter with seccomp off in
/// the envelope, nothing else refuses x32).
#[cfg(target_arch = "x86_64")]
pub const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// The system calls and the argument holding the mode.
#[allow(clippy::vec_init_then_push)] // the first push depends on the architecture
pub fn calls() -> Vec<(i64, u32)> {
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    v.push((libc::SYS_chmod, 1));
    v.push((libc::SYS_fchmod, 1));
    v.push((libc::SYS_fchmodat, 2));
    v.push((SYS_FCHMODAT2, 2));
    // x32 uses the common numbers of all four, with the x32 bit.
    #[cfg(target_arch = "x86_64")]
    for i in 0..v.len() {
        let (nr, arg) = v[i];
        v.push((nr | X32_SYSCALL_BIT, arg));
    }
    v
}

/// The block: falls through (to whatever follows) unless the call sets a special bit.
pub fn block() -> Vec<libc::sock_filter> {
    let calls = calls();
    let n = calls.len();
    // Layout: [0] ld arch, [1] jeq arch else → end, [2] ld nr, [3..3+n] one jeq per call,
    // [3+n] ja end, then per call: ld arg, jset → eperm else → end; eperm; end = len.
    let mut p = vec![op(LD_W_ABS, 0, 0, OFF_ARCH)];
    let checks_at = 3 + n + 1;
    let eperm_at = checks_at + 2 * n;
    let end = eperm_at + 1;
    p.push(op(JEQ_K, 0, (end - 2) as u8, AUDIT_ARCH));
    p.push(op(LD_W_ABS, 0, 0, OFF_NR));
    for (i, (nr, _)) in calls.iter().enumerate() {
        let here = 3 + i;
        let target = checks_at + 2 * i;
        p.push(op(JEQ_K, (target - here - 1) as u8, 0, *nr as u32));
    }
    p.push(op(JA, 0, 0, (end - (3 + n) - 1) as u32));
    for (i, (_, arg)) in calls.iter().enumerate() {
        p.push(op(LD_W_ABS, 0, 0, off_arg(*arg)));
        let here = checks_at + 2 * i + 1;
        p.push(op(
            JSET_K,
            (eperm_at - here - 1) as u8,
            (end - here - 1) as u8,
            SPECIAL,
        ));
    }
    p.push(op(
        RET_K,
        0,
        0,
        libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA),
    ));
    debug_assert_eq!(p.len(), end);
    p
}

/// What `doctor` lists for the rule.
pub const DENIED: &str = "chmod/fchmod/fchmodat/fchmodat2 setting setuid or setgid";

/// The command filter: the block in front of `rest` (a full deny filter), or alone with an
/// ALLOW after it.
pub fn with(rest: Option<&Filter>) -> Filter {
    in_front(block(), DENIED, rest)
}

/// Where the rule sits for one policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Nowhere: special bits are allowed, or seccomp is off and the executor has no rule.
    Off,
    /// In the executor's own filter, which every child inherits: nothing loaded per spawn.
    Inherited,
    /// Loaded by every child (the executor's own filter lacks it).
    PerSpawn,
}

/// Whether a policy wants the rule: seccomp on and `fs.allow_special_bits` false.
pub fn wanted(allow_special_bits: bool, seccomp: bool) -> bool {
    seccomp && !allow_special_bits
}

/// The refusal of a policy that allows special bits once the executor holds the rule.
pub const NEEDS_RESTART: &str = "fs.allow_special_bits is true, but the executor's own seccomp filter already refuses setuid/setgid modes (from the policy it started with) and a filter cannot be removed; restart the worker to apply it";

/// Where the rule goes for a policy (`allow_special_bits`, `seccomp`) when the executor's own
/// filter does or does not hold it. Refused: allowing special bits under an executor that
/// holds the rule. A policy with seccomp off keeps the inherited rule (it only narrows).
pub fn placement(
    allow_special_bits: bool,
    seccomp: bool,
    in_executor: bool,
) -> Result<Placement, &'static str> {
    match (
        in_executor,
        allow_special_bits,
        wanted(allow_special_bits, seccomp),
    ) {
        (true, true, _) => Err(NEEDS_RESTART),
        (true, false, _) => Ok(Placement::Inherited),
        (false, _, true) => Ok(Placement::PerSpawn),
        (false, _, false) => Ok(Placement::Off),
    }
}

/// Whether the executor's own filter holds the rule (false before the first policy).
pub fn in_executor() -> bool {
    super::seccomp::PROCESS.special_bits.get() == Some(&true)
}

/// At the first policy: installs the rule on this process (every thread) when `wanted`;
/// later calls do nothing. Needs no_new_privs (set at start-up). When the install fails the
/// rule stays per spawn, as before.
pub fn settle(wanted: bool) {
    super::seccomp::PROCESS.special_bits.get_or_init(|| {
        if !wanted {
            return false;
        }
        match super::seccomp::install_self(&with(None)) {
            Ok(()) => {
                tracing::debug!("special-bits rule installed on the executor; children inherit it");
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot add the special-bits rule to the executor's own filter: every command loads it instead (slower spawns); check that no_new_privs is set and seccomp is available");
                false
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_exact() {
        use Placement::*;
        // (allow_special_bits, seccomp, in_executor) -> placement
        assert_eq!(placement(false, true, true), Ok(Inherited));
        assert_eq!(placement(false, false, true), Ok(Inherited));
        assert_eq!(placement(true, true, true), Err(NEEDS_RESTART));
        assert_eq!(placement(true, false, true), Err(NEEDS_RESTART));
        assert_eq!(placement(false, true, false), Ok(PerSpawn));
        assert_eq!(placement(true, true, false), Ok(Off));
        assert_eq!(placement(false, false, false), Ok(Off));
        assert_eq!(placement(true, false, false), Ok(Off));
        assert!(wanted(false, true));
        assert!(!wanted(true, true));
        assert!(!wanted(false, false));
    }

    #[test]
    fn calls_cover_the_chmod_family_and_x32() {
        let nrs: Vec<i64> = calls().iter().map(|c| c.0).collect();
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            nrs,
            vec![
                90,
                91,
                268,
                452,
                0x4000_0000 | 90,
                0x4000_0000 | 91,
                0x4000_0000 | 268,
                0x4000_0000 | 452
            ]
        );
        #[cfg(target_arch = "aarch64")]
        assert_eq!(nrs, vec![52, 53, 452]);
    }
}

#[cfg(test)]
mod kernel_tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::fs::PermissionsExt;

    /// One call of the family on `path` (or its fd) with `mode`: the raw result and errno.
    /// Only system calls: runs in a forked child.
    fn call(nr: i64, fd: i32, path: &CString, mode: u32) -> (i64, i32) {
        let base = nr & !0x4000_0000;
        // SAFETY: plain system calls on a NUL-terminated path and an open fd.
        let rc = unsafe {
            if base == libc::SYS_fchmod {
                libc::syscall(nr, fd, mode)
            } else if base == libc::SYS_fchmodat || base == SYS_FCHMODAT2 {
                libc::syscall(nr, libc::AT_FDCWD, path.as_ptr(), mode, 0)
            } else {
                libc::syscall(nr, path.as_ptr(), mode)
            }
        };
        // SAFETY: __errno_location returns this thread's errno slot.
        (rc, unsafe { *libc::__errno_location() })
    }

    /// The block alone (as the executor installs it on itself), in a real child: every call of
    /// the family, native and x32, fails with EPERM when the mode carries setuid or setgid;
    /// plain modes pass through. Fails without the rule (root may set the bits on its file),
    /// and without the x32 numbers (those calls then answer ENOSYS, or succeed).
    #[test]
    fn the_block_refuses_special_bits_on_every_call_of_the_family() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = CString::new(file.to_str().unwrap()).unwrap();
        let filter = with(None);
        let prog = filter.fprog();
        // Listed here, not taken from `calls()`, so a number missing there fails this test.
        #[cfg(target_arch = "x86_64")]
        let calls: Vec<i64> = [libc::SYS_chmod, libc::SYS_fchmod, libc::SYS_fchmodat, 452]
            .into_iter()
            .flat_map(|nr| [nr, nr | 0x4000_0000])
            .collect();
        #[cfg(target_arch = "aarch64")]
        let calls: Vec<i64> = vec![libc::SYS_fchmod, libc::SYS_fchmodat, 452];
        // SAFETY: opening a path we own.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: the child only makes system calls (no allocation, no locks) and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::syscall(
                        libc::SYS_seccomp,
                        libc::SECCOMP_SET_MODE_FILTER,
                        0,
                        &prog as *const libc::sock_fprog,
                    ) != 0
                {
                    libc::_exit(100);
                }
                for (i, nr) in calls.iter().enumerate() {
                    for mode in [0o4755, 0o2755, 0o6700, 0o104700] {
                        if call(*nr, fd, &path, mode) != (-1, libc::EPERM) {
                            libc::_exit(1 + i as i32);
                        }
                    }
                    let (rc, e) = call(*nr, fd, &path, 0o750);
                    if rc == -1 && e == libc::EPERM {
                        libc::_exit(50 + i as i32);
                    }
                }
                libc::_exit(0);
            }
        }
        assert!(pid > 0);
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        unsafe { libc::close(fd) };
        assert!(libc::WIFEXITED(status), "status {status}");
        let code = libc::WEXITSTATUS(status);
        let which = |i: i32| calls.get(i as usize).copied();
        assert_eq!(
            code,
            0,
            "{}",
            match code {
                100 => "could not install the filter".to_string(),
                1..=49 => format!("call {:?} was not refused", which(code - 1)),
                _ => format!("call {:?} refused a plain mode", which(code - 50)),
            }
        );
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode & 0o6000, 0, "mode {mode:o}");
        assert_eq!(mode, 0o750);
    }
}
