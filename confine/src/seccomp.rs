//! The seccomp deny filter, as a hand-built classic BPF program.
//!
//! Built by hand rather than with seccompiler (which compiles the broker's allowlist,
//! [`crate::broker_allowlist`]) because of the clone3 exception: the executor's own spawn
//! trampoline may call clone3 (to start children inside their job cgroup) while every other
//! clone3 answers ENOSYS, and the filter tells the two apart by the instruction pointer in
//! `seccomp_data` plus two secret argument words. seccompiler's rules match system-call
//! arguments only; they cannot look at the instruction pointer. The rest (the x32 range
//! check, EPERM per denied call, namespace-flag masks on `clone`/`unshare`) follows the same
//! hand-built layout, so the whole program, and the special-bits block stacked in front of it
//! ([`crate::special_bits`]), is one layout checked in one place. Jump offsets are checked
//! when a program is built ([`offset`]); `confine/tests/seccomp_golden.rs` runs the programs
//! in a BPF interpreter.
//!
//! Layout: check the architecture (a foreign one is killed); refuse x32; for each denied
//! system call return EPERM; refuse namespace flags on `clone`/`unshare`; allow the rest.

/// One denied system call and why it is denied (shown by `doctor`).
#[derive(Debug, Clone, Copy)]
pub struct Denied {
    pub name: &'static str,
    pub nr: i64,
    pub why: &'static str,
}

macro_rules! deny {
    ($name:ident, $why:expr) => {
        Denied {
            name: stringify!($name),
            nr: libc::$name as i64,
            why: $why,
        }
    };
}

/// The deny list. `clone` and `unshare` are handled separately (only namespace flags).
pub fn deny_list() -> Vec<Denied> {
    let mut v = vec![
        deny!(SYS_kexec_load, "replaces the running kernel"),
        deny!(SYS_kexec_file_load, "replaces the running kernel"),
        deny!(SYS_init_module, "loads kernel code"),
        deny!(SYS_finit_module, "loads kernel code"),
        deny!(SYS_delete_module, "unloads kernel code"),
        deny!(
            SYS_mount,
            "changes the filesystem namespace (can hide or replace the jail)"
        ),
        deny!(SYS_umount2, "changes the filesystem namespace"),
        deny!(SYS_pivot_root, "changes the root filesystem"),
        deny!(SYS_open_tree, "new mount API: clones mounts"),
        deny!(SYS_move_mount, "new mount API: attaches mounts"),
        deny!(SYS_fsopen, "new mount API: creates filesystems"),
        deny!(SYS_fsconfig, "new mount API: configures filesystems"),
        deny!(SYS_fsmount, "new mount API: creates mounts"),
        deny!(SYS_swapon, "host memory management"),
        deny!(SYS_swapoff, "host memory management"),
        deny!(SYS_reboot, "reboots or halts the host"),
        deny!(SYS_acct, "redirects process accounting to a file"),
        deny!(SYS_syslog, "reads or clears the kernel log"),
        deny!(SYS_bpf, "loads kernel programs; a large attack surface"),
        deny!(
            SYS_perf_event_open,
            "kernel profiling; side channels and a large attack surface"
        ),
        deny!(SYS_userfaultfd, "a common kernel exploitation primitive"),
        deny!(
            SYS_ptrace,
            "inspects and controls other processes (re-allow for debuggers)"
        ),
        deny!(SYS_process_vm_readv, "reads another process's memory"),
        deny!(SYS_process_vm_writev, "writes another process's memory"),
        deny!(
            SYS_keyctl,
            "the kernel keyring: shared secrets and a large attack surface"
        ),
        deny!(SYS_add_key, "the kernel keyring"),
        deny!(SYS_request_key, "the kernel keyring"),
        deny!(
            SYS_io_uring_setup,
            "io_uring bypasses seccomp for the operations it performs"
        ),
        deny!(
            SYS_io_uring_enter,
            "io_uring bypasses seccomp for the operations it performs"
        ),
        deny!(
            SYS_io_uring_register,
            "io_uring bypasses seccomp for the operations it performs"
        ),
        deny!(
            SYS_open_by_handle_at,
            "opens files by handle, bypassing path checks (the shocker escape)"
        ),
        deny!(
            SYS_name_to_handle_at,
            "produces handles for open_by_handle_at"
        ),
        deny!(SYS_settimeofday, "changes the host clock"),
        deny!(SYS_clock_settime, "changes the host clock"),
        deny!(SYS_adjtimex, "changes the host clock"),
        deny!(SYS_clock_adjtime, "changes the host clock"),
        deny!(SYS_setns, "enters another namespace"),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        v.push(deny!(SYS_iopl, "raw I/O port access"));
        v.push(deny!(SYS_ioperm, "raw I/O port access"));
    }
    v
}

/// Namespace flags refused on `clone` and `unshare`.
pub const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP
    | 0x80) as u64; // CLONE_NEWTIME

/// Every name `seccomp_allow` may mention.
pub fn known_names() -> Vec<&'static str> {
    let mut v: Vec<&str> = deny_list()
        .iter()
        .map(|d| d.name.trim_start_matches("SYS_"))
        .collect();
    v.extend(["clone_namespaces", "unshare", "clone3"]);
    v
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

// seccomp_data offsets.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARG0_LO: u32 = 16;
#[allow(dead_code)]
const OFF_ARG0_HI: u32 = 20;
/// `seccomp_data.instruction_pointer` (a u64 after nr and arch).
const OFF_IP_LO: u32 = 8;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

fn errno(e: i32) -> libc::sock_filter {
    stmt(RET_K, SECCOMP_RET_ERRNO | (e as u32 & 0xffff))
}

/// Shared start of every filter: a foreign architecture is killed, the syscall number is
/// loaded, and (on x86_64) the x32 range, which shares the audit arch, is refused.
fn prologue() -> Vec<libc::sock_filter> {
    let mut p = vec![
        stmt(LD_W_ABS, OFF_ARCH),
        jump(JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(RET_K, SECCOMP_RET_KILL_PROCESS),
        stmt(LD_W_ABS, OFF_NR),
    ];
    if cfg!(target_arch = "x86_64") {
        p.push(jump(JGE_K, X32_SYSCALL_BIT, 0, 1));
        p.push(errno(libc::EPERM));
    }
    p
}

/// For `nr` (clone or unshare): EPERM when arg0 carries namespace flags; otherwise `then`
/// (ALLOW, or reloading the number to go on with the next check).
fn refuse_namespace_flags(p: &mut Vec<libc::sock_filter>, nr: i64, then: libc::sock_filter) {
    let ns_low = (NAMESPACE_FLAGS & 0xffff_ffff) as u32;
    p.push(jump(JEQ_K, nr as u32, 0, 4));
    p.push(stmt(LD_W_ABS, OFF_ARG0_LO));
    p.push(jump(JSET_K, ns_low, 0, 1));
    p.push(errno(libc::EPERM));
    p.push(then);
}

/// The one clone3 the filter lets through: the executor's spawn trampoline, which starts
/// children inside their job cgroup (`CLONE_INTO_CGROUP`) without namespace flags. It is told
/// apart by two things the kernel shows the filter: the instruction pointer (the address right
/// after the trampoline's syscall instruction, fixed for the life of the executor but
/// randomized at its start) and two 64-bit secrets the trampoline passes in argument registers
/// clone3 ignores (the executor's `clone3::secret`). A command cannot read either: the executor is not
/// dumpable, commands hold no capabilities, and the filter's program is not readable without
/// CAP_SYS_ADMIN. Guessing the address alone would be feasible (a wrong guess only costs
/// ENOSYS); guessing it and 128 random bits is not. With address-space randomization off
/// (`kernel.randomize_va_space = 0`) no exception is made, and spawns use the cgroup.procs
/// write.
///
/// The executor registers its trampoline with [`except_clone3_at`] before it builds a filter;
/// without a registration no exception is made.
fn clone3_call_site() -> Option<(u64, [u64; 2])> {
    let &(site, secret) = PROCESS.clone3.get()?;
    let aslr = std::fs::read_to_string("/proc/sys/kernel/randomize_va_space")
        .map(|s| s.trim() != "0")
        .unwrap_or(false);
    aslr.then_some((site, secret))
}

/// What the seccomp filter this process holds admits and denies: the clone3 exception and
/// its secret, the deny list installed on the executor itself, and whether that filter holds
/// the special-bits rule.
///
/// This is the one process-global value of the confinement, and it cannot be owned by a
/// value: the kernel keeps one filter stack for the whole process (every thread, and every
/// child until it execs), and a filter once installed can never be removed. Two launchers in
/// one process live under the same filter, so they must agree on the secret it admits, and a
/// policy must know what that filter already denies. Each field is set once.
#[derive(Debug)]
pub struct ProcessFilter {
    /// The two values the clone3 trampoline passes (drawn once, see the launcher's `clone3`).
    secret: std::sync::OnceLock<[u64; 2]>,
    /// The registered clone3 exception: call site and secret.
    clone3: std::sync::OnceLock<(u64, [u64; 2])>,
    /// The deny list of the filter the executor installed on itself, if it did.
    baseline: std::sync::OnceLock<Vec<&'static str>>,
    /// Whether the executor's own filter holds the special-bits rule (`special_bits`); unset
    /// until its first policy.
    pub(crate) special_bits: std::sync::OnceLock<bool>,
}

/// See [`ProcessFilter`].
pub static PROCESS: ProcessFilter = ProcessFilter {
    secret: std::sync::OnceLock::new(),
    clone3: std::sync::OnceLock::new(),
    baseline: std::sync::OnceLock::new(),
    special_bits: std::sync::OnceLock::new(),
};

impl ProcessFilter {
    /// The clone3 trampoline's secret, drawn by `draw` the first time.
    pub fn clone3_secret(&self, draw: impl FnOnce() -> [u64; 2]) -> [u64; 2] {
        *self.secret.get_or_init(draw)
    }

    /// Records the deny list of the filter just installed on this process (the first wins).
    pub fn set_baseline(&self, denied: Vec<&'static str>) {
        let _ = self.baseline.set(denied);
    }

    /// The deny list of the filter this process installed on itself, if any. Every child
    /// inherits that filter, so a command filter with the same list need not be loaded again.
    pub fn baseline(&self) -> Option<&[&'static str]> {
        self.baseline.get().map(Vec::as_slice)
    }
}

/// Registers the one clone3 call site the deny filter lets through: `ip` is the address right
/// after the trampoline's syscall instruction and `secret` the two values it passes in
/// argument registers clone3 ignores. The first registration wins; it lasts for the process.
pub fn except_clone3_at(ip: u64, secret: [u64; 2]) {
    let _ = PROCESS.clone3.set((ip, secret));
}

/// clone3 answers ENOSYS unless the instruction pointer is `ip` and arguments 2 and 3 are the
/// two secrets. Expects the number in A; leaves it there for the rules that follow when the
/// call is not clone3. Each 64-bit value is compared as two 32-bit halves, the low half first
/// (`seccomp_data` is in the machine's byte order; the trampoline exists on x86_64 only).
fn refuse_clone3_except_at(
    p: &mut Vec<libc::sock_filter>,
    ip: u64,
    secret: [u64; 2],
) -> Result<(), String> {
    let checks: [(u32, u64); 3] = [
        (OFF_IP_LO, ip),
        (OFF_ARG0_LO + 16, secret[0]),
        (OFF_ARG0_LO + 24, secret[1]),
    ];
    let halves: Vec<(u32, u32)> = checks
        .iter()
        .flat_map(|&(off, v)| [(off, v as u32), (off + 4, (v >> 32) as u32)])
        .collect();
    // Layout: JEQ clone3; then per half LD + JEQ (a mismatch jumps to the final ENOSYS);
    // RET ALLOW; RET ENOSYS.
    let block = halves.len() * 2 + 2;
    p.push(jump(JEQ_K, libc::SYS_clone3 as u32, 0, offset(block)?));
    for (n, &(off, value)) in halves.iter().enumerate() {
        // Instructions between this JEQ and the ENOSYS at the end of the block.
        let to_enosys = (halves.len() - n - 1) * 2 + 1;
        p.push(stmt(LD_W_ABS, off));
        p.push(jump(JEQ_K, value, 0, offset(to_enosys)?));
    }
    p.push(stmt(RET_K, SECCOMP_RET_ALLOW));
    p.push(errno(libc::ENOSYS));
    Ok(())
}

/// A conditional jump's offset, checked: classic BPF has 8 bits for it, and a program whose
/// offset does not fit is refused when it is built instead of jumping somewhere else.
pub fn offset(n: usize) -> Result<u8, String> {
    u8::try_from(n)
        .map_err(|_| format!("seccomp program: a jump of {n} instructions does not fit in 8 bits"))
}

/// A compiled filter.
#[derive(Debug, Clone)]
pub struct Filter {
    pub program: Vec<libc::sock_filter>,
    /// The names actually denied (after `seccomp_allow`).
    pub denied: Vec<&'static str>,
}

impl PartialEq for Filter {
    fn eq(&self, other: &Self) -> bool {
        self.denied == other.denied
    }
}

/// Builds the filter, minus the re-allowed names (`ptrace`, `unshare`, `clone_namespaces`,
/// `clone3`, …), with the clone3 exception registered by [`except_clone3_at`] (if any and
/// address-space randomization is on). Unknown names are an error.
pub fn build(allow: &[String]) -> Result<Filter, String> {
    build_with(allow, clone3_call_site())
}

/// [`build`] with the clone3 exception given: `Some((ip, secret))` lets clone3 through at
/// that instruction pointer with those two secrets, `None` answers every clone3 ENOSYS.
pub fn build_with(
    allow: &[String],
    clone3_site: Option<(u64, [u64; 2])>,
) -> Result<Filter, String> {
    let known = known_names();
    for a in allow {
        if !known.contains(&a.as_str()) {
            return Err(format!(
                "confinement.seccomp_allow: unknown system call {a:?} (known: {})",
                known.join(", ")
            ));
        }
    }
    let allowed = |n: &str| allow.iter().any(|a| a == n);
    let denied: Vec<Denied> = deny_list()
        .into_iter()
        .filter(|d| !allowed(d.name.trim_start_matches("SYS_")))
        .collect();
    let mut p = prologue();
    for d in &denied {
        p.push(jump(JEQ_K, d.nr as u32, 0, 1));
        p.push(errno(libc::EPERM));
    }
    if !allowed("clone3") {
        // clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc use clone.
        match clone3_site {
            Some((ip, secret)) => refuse_clone3_except_at(&mut p, ip, secret)?,
            None => {
                p.push(jump(JEQ_K, libc::SYS_clone3 as u32, 0, 1));
                p.push(errno(libc::ENOSYS));
            }
        }
    }
    if !allowed("clone_namespaces") {
        refuse_namespace_flags(&mut p, libc::SYS_clone, stmt(LD_W_ABS, OFF_NR));
    }
    if !allowed("unshare") {
        refuse_namespace_flags(&mut p, libc::SYS_unshare, stmt(LD_W_ABS, OFF_NR));
    }
    p.push(stmt(RET_K, SECCOMP_RET_ALLOW));
    let mut names: Vec<&'static str> = denied.iter().map(|d| d.name).collect();
    if !allowed("clone3") {
        names.push(if clone3_site.is_some() {
            "SYS_clone3 (ENOSYS, except at the executor's own spawn call site)"
        } else {
            "SYS_clone3 (ENOSYS)"
        });
    }
    if !allowed("clone_namespaces") {
        names.push("SYS_clone with namespace flags");
    }
    if !allowed("unshare") {
        names.push("SYS_unshare with namespace flags");
    }
    if p.len() > u16::MAX as usize {
        return Err(format!(
            "seccomp program of {} instructions is too long",
            p.len()
        ));
    }
    Ok(Filter {
        program: p,
        denied: names,
    })
}

impl Filter {
    /// The `sock_fprog` to hand to `seccomp(2)`; valid while `self` lives.
    pub fn fprog(&self) -> libc::sock_fprog {
        libc::sock_fprog {
            len: self.program.len() as u16,
            filter: self.program.as_ptr() as *mut libc::sock_filter,
        }
    }
}

/// Installs `filter` on the calling thread's process (all threads, TSYNC). Requires
/// no_new_privs (set it first).
pub fn install_self(filter: &Filter) -> std::io::Result<()> {
    let prog = filter.fprog();
    // SAFETY: `prog` points into `filter.program`, which outlives the call; the kernel copies
    // the program.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The `Seccomp:` mode of this process (0 none, 1 strict, 2 filter), from /proc.
pub fn current_mode() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .and_then(|v| v.trim().parse().ok())
}
