//! Golden tests of the seccomp programs: a small classic-BPF interpreter runs the deny filter
//! and the broker's allowlist (two stacked programs, combined as the kernel does) on chosen
//! `seccomp_data` and the verdicts are compared with exact values. (The same programs are
//! installed for real by the escape suite and `broker_allowlist.rs`.)

#![cfg(target_arch = "x86_64")]

use iii_shell_confine::broker_allowlist;
use iii_shell_confine::seccomp::{build, build_with, deny_list, Filter};

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const AUDIT_ARCH_I386: u32 = 0x4000_0003;
const X32: i64 = 0x4000_0000;

const KILL_PROCESS: u32 = 0x8000_0000;
const ALLOW: u32 = 0x7fff_0000;
fn errno(e: i32) -> u32 {
    0x0005_0000 | e as u32
}

/// What the kernel hands the filter.
#[derive(Clone, Copy)]
struct Data {
    nr: i64,
    arch: u32,
    ip: u64,
    args: [u64; 6],
}

impl Data {
    fn call(nr: i64) -> Data {
        Data {
            nr,
            arch: AUDIT_ARCH_X86_64,
            ip: 0x7f00_0000_1000,
            args: [0; 6],
        }
    }
    fn arg(mut self, i: usize, v: u64) -> Data {
        self.args[i] = v;
        self
    }
    fn at(mut self, ip: u64) -> Data {
        self.ip = ip;
        self
    }
    /// The 32-bit word at byte offset `off` of `struct seccomp_data` (little-endian).
    fn word(&self, off: u32) -> u32 {
        let mut bytes = Vec::with_capacity(64);
        bytes.extend_from_slice(&(self.nr as i32).to_le_bytes());
        bytes.extend_from_slice(&self.arch.to_le_bytes());
        bytes.extend_from_slice(&self.ip.to_le_bytes());
        for a in self.args {
            bytes.extend_from_slice(&a.to_le_bytes());
        }
        let o = off as usize;
        assert!(
            o.is_multiple_of(4) && o + 4 <= bytes.len(),
            "load outside seccomp_data: {off}"
        );
        u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap())
    }
}

/// Runs a classic BPF program the way the kernel's seccomp does (the instructions these
/// programs use; anything else fails the test). Every jump must stay inside the program and
/// every path must end in a RET.
fn run(f: &Filter, d: Data) -> u32 {
    let p = &f.program;
    assert!(
        !p.is_empty() && p.len() <= 4096,
        "program length {}",
        p.len()
    );
    let (mut pc, mut a) = (0usize, 0u32);
    for _ in 0..p.len() {
        let i = p
            .get(pc)
            .unwrap_or_else(|| panic!("fell off the program at {pc}"));
        let code = i.code as u32;
        let class = code & 0x07;
        match class {
            libc::BPF_LD => {
                assert_eq!(
                    code,
                    libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
                    "load {code:#x}"
                );
                a = d.word(i.k);
                pc += 1;
            }
            libc::BPF_ALU => {
                assert_eq!(
                    code,
                    libc::BPF_ALU | libc::BPF_AND | libc::BPF_K,
                    "alu {code:#x}"
                );
                a &= i.k;
                pc += 1;
            }
            libc::BPF_JMP => {
                let op = code & 0xf0;
                if op == libc::BPF_JA {
                    pc += 1 + i.k as usize;
                } else {
                    assert_eq!(code & 0x08, libc::BPF_K, "jump on X {code:#x}");
                    let taken = match op {
                        libc::BPF_JEQ => a == i.k,
                        libc::BPF_JGT => a > i.k,
                        libc::BPF_JGE => a >= i.k,
                        libc::BPF_JSET => a & i.k != 0,
                        _ => panic!("jump op {op:#x}"),
                    };
                    pc += 1 + if taken { i.jt } else { i.jf } as usize;
                }
                assert!(
                    pc < p.len(),
                    "a jump leaves the program ({pc} of {})",
                    p.len()
                );
            }
            libc::BPF_RET => {
                assert_eq!(code, libc::BPF_RET | libc::BPF_K, "ret {code:#x}");
                return i.k;
            }
            _ => panic!("instruction class {class:#x} at {pc}"),
        }
    }
    panic!("no RET reached: a loop or a path without an end");
}

/// The verdict of programs stacked in `installed` order, as seccomp(2) combines them: every
/// program runs, the most recently installed first, and the first-seen verdict of the most
/// restrictive action wins (actions compared as signed values, KILL_PROCESS lowest).
fn run_stack(installed: &[Filter], d: Data) -> u32 {
    let action = |r: u32| (r & 0xffff_0000) as i32;
    let mut verdict = ALLOW;
    for f in installed.iter().rev() {
        let r = run(f, d);
        if action(r) < action(verdict) {
            verdict = r;
        }
    }
    verdict
}

/// The broker's programs for a test list.
fn broker(allowed: &[i64]) -> Vec<Filter> {
    broker_allowlist::filters(allowed).unwrap()
}

const EPERM: i32 = libc::EPERM;
const ENOSYS: i32 = libc::ENOSYS;

#[test]
fn the_deny_filter_refuses_every_denied_call_and_allows_the_rest() {
    let f = build_with(&[], None).unwrap();
    let denied = deny_list();
    assert!(denied.len() > 30, "{}", denied.len());
    for d in &denied {
        assert_eq!(run(&f, Data::call(d.nr)), errno(EPERM), "{}", d.name);
    }
    for nr in [
        libc::SYS_read,
        libc::SYS_write,
        libc::SYS_openat,
        libc::SYS_execve,
        libc::SYS_wait4,
        libc::SYS_chmod,
    ] {
        assert_eq!(run(&f, Data::call(nr)), ALLOW, "{nr}");
    }
}

#[test]
fn x32_numbers_and_foreign_architectures() {
    let f = build_with(&[], None).unwrap();
    for nr in [libc::SYS_read, libc::SYS_write, libc::SYS_execve, 0] {
        assert_eq!(run(&f, Data::call(nr | X32)), errno(EPERM), "x32 {nr}");
    }
    let mut i386 = Data::call(libc::SYS_read);
    i386.arch = AUDIT_ARCH_I386;
    assert_eq!(run(&f, i386), KILL_PROCESS);
    let b = broker(&[libc::SYS_read]);
    assert_eq!(
        run_stack(&b, Data::call(libc::SYS_read | X32)),
        errno(EPERM)
    );
    assert_eq!(
        run_stack(&b, Data::call(libc::SYS_clone3 | X32)),
        errno(EPERM)
    );
    assert_eq!(run_stack(&b, i386), KILL_PROCESS);
}

#[test]
fn clone_and_unshare_are_refused_only_with_namespace_flags() {
    let f = build_with(&[], None).unwrap();
    let thread = (libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD) as u64;
    assert_eq!(run(&f, Data::call(libc::SYS_clone).arg(0, thread)), ALLOW);
    assert_eq!(
        run(&f, Data::call(libc::SYS_clone).arg(0, libc::SIGCHLD as u64)),
        ALLOW
    );
    assert_eq!(
        run(
            &f,
            Data::call(libc::SYS_unshare).arg(0, libc::CLONE_FILES as u64)
        ),
        ALLOW
    );
    for flag in [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWCGROUP,
        0x80, // CLONE_NEWTIME
    ] {
        let v = flag as u64 | libc::SIGCHLD as u64;
        assert_eq!(
            run(&f, Data::call(libc::SYS_clone).arg(0, v)),
            errno(EPERM),
            "clone {flag:#x}"
        );
        assert_eq!(
            run(&f, Data::call(libc::SYS_unshare).arg(0, v)),
            errno(EPERM),
            "unshare {flag:#x}"
        );
    }
    // Re-allowed by name.
    let open = build_with(&["clone_namespaces".into(), "unshare".into()], None).unwrap();
    let v = libc::CLONE_NEWUSER as u64;
    assert_eq!(run(&open, Data::call(libc::SYS_clone).arg(0, v)), ALLOW);
    assert_eq!(run(&open, Data::call(libc::SYS_unshare).arg(0, v)), ALLOW);
}

#[test]
fn clone3_answers_enosys_except_at_the_trampoline_with_both_secrets() {
    let none = build_with(&[], None).unwrap();
    assert_eq!(run(&none, Data::call(libc::SYS_clone3)), errno(ENOSYS));

    let ip = 0x5555_1234_5678u64;
    let secret = [0x0123_4567_89ab_cdefu64, 0xfedc_ba98_7654_3210u64];
    let f = build_with(&[], Some((ip, secret))).unwrap();
    let ok = Data::call(libc::SYS_clone3)
        .at(ip)
        .arg(2, secret[0])
        .arg(3, secret[1]);
    assert_eq!(run(&f, ok), ALLOW);
    // Every half of every value matters.
    let wrong = [
        ok.at(ip + 1),
        ok.at(ip ^ (1 << 40)),
        ok.arg(2, secret[0] ^ 1),
        ok.arg(2, secret[0] ^ (1 << 63)),
        ok.arg(3, secret[1] ^ 1),
        ok.arg(3, secret[1] ^ (1 << 33)),
        Data::call(libc::SYS_clone3).at(ip),
    ];
    for (i, d) in wrong.iter().enumerate() {
        assert_eq!(run(&f, *d), errno(ENOSYS), "case {i}");
    }
    // The exception does not disturb the rest of the filter.
    assert_eq!(run(&f, Data::call(libc::SYS_read)), ALLOW);
    assert_eq!(run(&f, Data::call(libc::SYS_ptrace)), errno(EPERM));
    assert_eq!(
        run(
            &f,
            Data::call(libc::SYS_clone).arg(0, libc::CLONE_NEWNET as u64)
        ),
        errno(EPERM)
    );
    // `seccomp_allow: [clone3]` lets every clone3 through.
    let open = build_with(&["clone3".into()], Some((ip, secret))).unwrap();
    assert_eq!(run(&open, Data::call(libc::SYS_clone3)), ALLOW);
}

#[test]
fn seccomp_allow_re_allows_exactly_the_named_calls() {
    let f = build_with(&["ptrace".into(), "bpf".into()], None).unwrap();
    assert_eq!(run(&f, Data::call(libc::SYS_ptrace)), ALLOW);
    assert_eq!(run(&f, Data::call(libc::SYS_bpf)), ALLOW);
    assert_eq!(
        run(&f, Data::call(libc::SYS_process_vm_readv)),
        errno(EPERM)
    );
    assert!(!f.denied.contains(&"SYS_ptrace"));
    assert!(f.denied.contains(&"SYS_process_vm_readv"));
    let e = build(&["nosuchcall".into()]).unwrap_err();
    assert!(
        e.starts_with("confinement.seccomp_allow: unknown system call \"nosuchcall\""),
        "{e}"
    );
}

#[test]
fn the_broker_allowlist_allows_only_its_list() {
    let f = broker(&[libc::SYS_read, libc::SYS_write, libc::SYS_clone]);
    assert_eq!(run_stack(&f, Data::call(libc::SYS_read)), ALLOW);
    assert_eq!(run_stack(&f, Data::call(libc::SYS_write)), ALLOW);
    for nr in [
        libc::SYS_openat,
        libc::SYS_execve,
        libc::SYS_ptrace,
        libc::SYS_socket,
    ] {
        assert_eq!(run_stack(&f, Data::call(nr)), errno(EPERM), "{nr}");
    }
    assert_eq!(run_stack(&f, Data::call(libc::SYS_clone3)), errno(ENOSYS));
    assert_eq!(
        run_stack(&f, Data::call(libc::SYS_clone).arg(0, libc::SIGCHLD as u64)),
        ALLOW
    );
    assert_eq!(
        run_stack(
            &f,
            Data::call(libc::SYS_clone).arg(0, libc::CLONE_NEWUSER as u64)
        ),
        errno(EPERM)
    );
}

/// The real list: every listed call is allowed (clone without namespace flags), each of them
/// under its x32 number is EPERM, clone3 is ENOSYS, clone with any namespace flag and calls
/// off the list are EPERM.
#[test]
fn the_broker_allowlist_verdicts_for_its_own_list() {
    let list = broker_allowlist::syscalls();
    let numbers: Vec<i64> = list.iter().map(|&(_, nr)| nr).collect();
    let f = broker(&numbers);
    let thread = (libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD
        | libc::CLONE_SYSVSEM
        | libc::CLONE_SETTLS
        | libc::CLONE_PARENT_SETTID
        | libc::CLONE_CHILD_CLEARTID) as u64;
    for &(name, nr) in &list {
        let d = Data::call(nr).arg(0, thread);
        assert_eq!(run_stack(&f, d), ALLOW, "{name}");
        assert_eq!(
            run_stack(&f, Data::call(nr | X32)),
            errno(EPERM),
            "x32 {name}"
        );
    }
    assert_eq!(run_stack(&f, Data::call(libc::SYS_clone3)), errno(ENOSYS));
    for flag in [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWCGROUP,
        0x80, // CLONE_NEWTIME
    ] {
        let d = Data::call(libc::SYS_clone).arg(0, flag as u64 | thread);
        assert_eq!(run_stack(&f, d), errno(EPERM), "clone {flag:#x}");
    }
    for nr in [
        libc::SYS_execve,
        libc::SYS_execveat,
        libc::SYS_ptrace,
        libc::SYS_unshare,
        libc::SYS_mkdirat,
        libc::SYS_unlinkat,
        libc::SYS_kill,
        libc::SYS_fork,
        libc::SYS_vfork,
        libc::SYS_setuid,
        libc::SYS_mount,
        libc::SYS_io_uring_setup,
    ] {
        assert_eq!(run_stack(&f, Data::call(nr)), errno(EPERM), "{nr}");
    }
    // Both programs kill a foreign architecture.
    let mut i386 = Data::call(libc::SYS_read);
    i386.arch = AUDIT_ARCH_I386;
    for p in &f {
        assert_eq!(run(p, i386), KILL_PROCESS);
    }
}

#[test]
fn jump_offsets_are_checked() {
    use iii_shell_confine::seccomp::offset;
    assert_eq!(offset(0), Ok(0));
    assert_eq!(offset(255), Ok(255));
    assert_eq!(
        offset(256),
        Err("seccomp program: a jump of 256 instructions does not fit in 8 bits".to_string())
    );
}

#[test]
fn the_special_bits_block_refuses_setuid_and_setgid_modes_only() {
    use iii_shell_confine::special_bits::with;
    let deny = build_with(&[], None).unwrap();
    // Alone (the command inherits the executor's filter, which refuses x32) or in front of a
    // full deny filter.
    for (f, x32) in [(with(None), ALLOW), (with(Some(&deny)), errno(EPERM))] {
        for (nr, arg) in [
            (libc::SYS_chmod, 1),
            (libc::SYS_fchmod, 1),
            (libc::SYS_fchmodat, 2),
            (452, 2),
        ] {
            for (mode, want) in [
                (0o755u64, ALLOW),
                (0o1777, ALLOW),
                (0o4755, errno(EPERM)),
                (0o2755, errno(EPERM)),
                (0o6755, errno(EPERM)),
            ] {
                assert_eq!(
                    run(&f, Data::call(nr).arg(arg, mode)),
                    want,
                    "{nr} {mode:o}"
                );
            }
        }
        assert_eq!(run(&f, Data::call(libc::SYS_read)), ALLOW);
        assert_eq!(run(&f, Data::call(libc::SYS_read | X32)), x32);
    }
}

#[test]
fn the_network_block_refuses_every_socket_family_but_unix() {
    use iii_shell_confine::network_block::with;
    let deny = build_with(&[], None).unwrap();
    for f in [with(None), with(Some(&deny))] {
        for nr in [
            libc::SYS_socket,
            libc::SYS_socketpair,
            libc::SYS_socket | X32,
            libc::SYS_socketpair | X32,
        ] {
            for (family, want) in [
                (libc::AF_UNIX, ALLOW),
                (libc::AF_INET, errno(libc::EACCES)),
                (libc::AF_INET6, errno(libc::EACCES)),
                (libc::AF_PACKET, errno(libc::EACCES)),
                (libc::AF_NETLINK, errno(libc::EACCES)),
                (libc::AF_VSOCK, errno(libc::EACCES)),
            ] {
                let want = if nr & X32 != 0 && want == ALLOW && f.denied.len() > 1 {
                    errno(EPERM) // the deny filter behind it refuses x32
                } else {
                    want
                };
                assert_eq!(
                    run(&f, Data::call(nr).arg(0, family as u64)),
                    want,
                    "{nr} family {family}"
                );
            }
            // The family is an int: high bits do not turn AF_INET into AF_UNIX.
            assert_eq!(
                run(
                    &f,
                    Data::call(nr).arg(0, (1u64 << 32) | libc::AF_INET as u64)
                ),
                errno(libc::EACCES)
            );
        }
        assert_eq!(
            run(&f, Data::call(libc::SYS_connect).arg(0, 3)),
            ALLOW,
            "connect on an inherited socket is left to Landlock"
        );
        let mut i386 = Data::call(102); // socketcall on i386
        i386.arch = AUDIT_ARCH_I386;
        assert_eq!(run(&f, i386), KILL_PROCESS);
    }
}
