//! The classic-BPF vocabulary the self-contained seccomp blocks share
//! ([`crate::special_bits`], [`crate::network_block`]): opcodes, `seccomp_data` offsets, the
//! audit architecture, and how a block is put in front of a command's other filter.

use super::seccomp::Filter;

pub(crate) const AUDIT_ARCH: u32 = if cfg!(target_arch = "x86_64") {
    0xC000_003E
} else {
    0xC000_00B7 // aarch64
};

/// x86_64's x32 ABI shares the audit architecture; its system call numbers carry this bit.
pub(crate) const X32_BIT: u32 = 0x4000_0000;

pub(crate) const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
pub(crate) const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
pub(crate) const JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
pub(crate) const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
pub(crate) const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
pub(crate) const OFF_NR: u32 = 0;
pub(crate) const OFF_ARCH: u32 = 4;

/// Low 32 bits of argument `i` (little-endian).
pub(crate) const fn off_arg(i: u32) -> u32 {
    16 + 8 * i
}

pub(crate) fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// A command's filter: `block` (which falls through for every call it does not refuse) in
/// front of `rest`, its other filter, or alone with an ALLOW after it; `denied` is what the
/// block refuses, listed first.
pub(crate) fn in_front(
    mut program: Vec<libc::sock_filter>,
    denied: &'static str,
    rest: Option<&Filter>,
) -> Filter {
    let mut names = vec![denied];
    match rest {
        Some(f) => {
            program.extend_from_slice(&f.program);
            names.extend(f.denied.iter().copied());
        }
        None => program.push(op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW)),
    }
    Filter {
        program,
        denied: names,
    }
}
