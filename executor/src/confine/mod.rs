//! Kernel confinement: of the executor itself at start-up, and of every command it spawns.
//!
//! * [`caps`]: capability sets dropped to the configured ones and verified.
//! * [`seccomp`]: the deny filter (a hand-built BPF program).
//! * [`landlock_rules`]: the command ruleset built from the live jail.
//! * [`ptys`]: a private devpts instance, so commands never see the host's terminals.
//!
//! Per spawn, everything is built in the parent (once per policy) and the child only applies
//! it with raw system calls: rlimits, no_new_privs, `landlock_restrict_self`, `seccomp`.

pub mod caps;
pub mod landlock_rules;
pub mod process_limits;
pub mod ptys;
pub mod seccomp;
pub mod special_bits;

use iii_shell_protocol::config::{ConfinementConfig, ConfinementMode, RlimitConfig};

/// The resource limits of a command, ready for `setrlimit` in the child.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rlimits {
    pub entries: [(i32, u64); 5],
    pub len: usize,
}

impl Rlimits {
    pub fn from_config(c: &RlimitConfig) -> Rlimits {
        let mut r = Rlimits::default();
        for (res, v) in [
            (libc::RLIMIT_NPROC as i32, c.max_processes),
            (libc::RLIMIT_AS as i32, c.address_space_bytes),
            (libc::RLIMIT_FSIZE as i32, c.file_size_bytes),
            (libc::RLIMIT_NOFILE as i32, c.open_files),
            (libc::RLIMIT_CPU as i32, c.cpu_seconds),
        ] {
            if let Some(v) = v {
                r.entries[r.len] = (res, v);
                r.len += 1;
            }
        }
        r
    }
}

/// The deny list of the filter this process installed on itself, if any. Every child
/// inherits that filter, so a command filter with the same list need not be loaded again.
pub static BASELINE: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();

/// What the executor did to itself at start-up, for `doctor` and the start-up log.
#[derive(Debug, Clone, Default)]
pub struct SelfReport {
    pub uid: u32,
    pub gid: u32,
    pub caps: caps::CapState,
    pub no_new_privs: bool,
    pub seccomp_mode: u32,
    pub seccomp_denied: Vec<String>,
    pub dumpable: bool,
    pub subreaper: bool,
    /// The executor (and so every command) has a devpts instance of its own.
    pub private_ptys: bool,
    pub problems: Vec<String>,
}

fn prctl_get(option: i32) -> i64 {
    // SAFETY: the PR_GET_* options used here take no pointer arguments.
    unsafe { libc::prctl(option, 0, 0, 0, 0) as i64 }
}

pub fn no_new_privs() -> bool {
    prctl_get(libc::PR_GET_NO_NEW_PRIVS) == 1
}

pub fn set_no_new_privs() -> std::io::Result<()> {
    // SAFETY: PR_SET_NO_NEW_PRIVS with 1 only sets a process flag.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn subreaper() -> bool {
    let mut v: libc::c_int = 0;
    // SAFETY: PR_GET_CHILD_SUBREAPER writes one int through the pointer we pass.
    unsafe {
        libc::prctl(
            libc::PR_GET_CHILD_SUBREAPER,
            &mut v as *mut libc::c_int,
            0,
            0,
            0,
        )
    };
    v != 0
}

/// Reads the state of this process (no changes).
pub fn observe() -> SelfReport {
    SelfReport {
        // SAFETY: getuid/getgid cannot fail.
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
        caps: caps::read(),
        no_new_privs: no_new_privs(),
        seccomp_mode: seccomp::current_mode().unwrap_or(0),
        seccomp_denied: Vec::new(),
        dumpable: prctl_get(libc::PR_GET_DUMPABLE) == 1,
        subreaper: subreaper(),
        private_ptys: ptys::is_private(),
        problems: Vec::new(),
    }
}

/// Hardens the executor process: not dumpable (commands cannot read its memory or open its
/// fds through /proc), a child subreaper, capabilities dropped to `envelope.capabilities`,
/// no_new_privs, and the seccomp deny filter on every thread. In strict mode any failure is
/// returned as an error; in best-effort mode it is recorded in the report.
pub fn harden_executor(envelope: &ConfinementConfig) -> Result<SelfReport, String> {
    harden_executor_retaining(envelope, false)
}

/// [`harden_executor`]; with `for_run_as`, keeps `run_as::RETAINED` in the effective and
/// permitted sets only (the uid switch, made when the first policy arrives).
pub fn harden_executor_retaining(
    envelope: &ConfinementConfig,
    for_run_as: bool,
) -> Result<SelfReport, String> {
    let retain: ::caps::CapsHashSet = if for_run_as {
        crate::run_as::RETAINED.into_iter().collect()
    } else {
        Default::default()
    };
    let strict = envelope.mode == ConfinementMode::Strict;
    let mut problems = Vec::new();
    // First, while CAP_SYS_ADMIN is still held.
    if let Err(e) = ptys::private_devpts() {
        problems.push(format!(
            "no private devpts instance ({e}): commands can open every terminal of the host under /dev/pts; run the executor as root with CAP_SYS_ADMIN"
        ));
    }
    // SAFETY: PR_SET_DUMPABLE 0 only changes a process flag.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        problems.push(format!(
            "cannot clear the dumpable flag: {}",
            std::io::Error::last_os_error()
        ));
    }
    if let Err(e) = crate::tree::become_subreaper() {
        problems.push(format!("cannot become a child subreaper: {e}"));
    }
    let keep = caps::parse(&envelope.capabilities)?;
    if let Err(e) = caps::drop_to_retaining(&keep, &retain) {
        problems.push(format!("capabilities: {e}"));
    }
    if let Err(e) = set_no_new_privs() {
        problems.push(format!("no_new_privs: {e}"));
    }
    if !no_new_privs() {
        problems.push("no_new_privs did not stick".into());
    }
    let mut denied = Vec::new();
    if envelope.seccomp {
        let filter = seccomp::build(&envelope.seccomp_allow)?;
        match seccomp::install_self(&filter) {
            Ok(()) => {
                denied = filter.denied.iter().map(|s| s.to_string()).collect();
                let _ = BASELINE.set(filter.denied.clone());
            }
            Err(e) => problems.push(format!("seccomp: {e}")),
        }
    } else {
        problems.push("seccomp is disabled by configuration".into());
    }
    if strict && !problems.is_empty() {
        return Err(format!(
            "strict confinement cannot be met: {}",
            problems.join("; ")
        ));
    }
    let mut report = observe();
    report.seccomp_denied = denied;
    report.problems = problems;
    Ok(report)
}
