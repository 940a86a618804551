//! The seccomp rule that keeps commands from setting setuid or setgid bits: `chmod`,
//! `fchmod`, `fchmodat` and `fchmodat2` with `S_ISUID` or `S_ISGID` in the mode fail with
//! EPERM (unless `fs.allow_special_bits`). It holds whatever uid the command runs as.
//!
//! The block is self-contained and ends by falling through, so it is put in front of the
//! per-spawn deny filter (which starts with its own architecture check), or alone followed by
//! an ALLOW when the command inherits the executor's filter.

use super::seccomp::Filter;

const AUDIT_ARCH: u32 = if cfg!(target_arch = "x86_64") {
    0xC000_003E
} else {
    0xC000_00B7 // aarch64
};

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// Low 32 bits of argument `i` (little-endian).
const fn off_arg(i: u32) -> u32 {
    16 + 8 * i
}
const SPECIAL: u32 = libc::S_ISUID | libc::S_ISGID;

fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The system calls and the argument holding the mode.
#[allow(clippy::vec_init_then_push)] // the first push depends on the architecture
fn calls() -> Vec<(i64, u32)> {
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    v.push((libc::SYS_chmod, 1));
    v.push((libc::SYS_fchmod, 1));
    v.push((libc::SYS_fchmodat, 2));
    v.push((452, 2)); // fchmodat2 (Linux 6.6), not in every libc yet
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

/// The command filter: the block in front of `rest` (a full deny filter), or alone with an
/// ALLOW after it.
pub fn with(rest: Option<&Filter>) -> Filter {
    let mut program = block();
    let mut denied = vec!["chmod/fchmod/fchmodat/fchmodat2 setting setuid or setgid"];
    match rest {
        Some(f) => {
            program.extend_from_slice(&f.program);
            denied.extend(f.denied.iter().copied());
        }
        None => program.push(op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW)),
    }
    Filter { program, denied }
}
