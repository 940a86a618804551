//! Kernel confinement, in one place for the three processes that apply it: the supervisor
//! (`iii-shell serve`), the broker and the executor.
//!
//! * [`seccomp`]: the deny filter (hand-built BPF, for its clone3 exception) and the installer.
//! * [`broker_allowlist`]: the broker's default-deny allowlist, compiled by seccompiler.
//! * [`special_bits`]: the rule refusing setuid/setgid/sticky modes, folded into a filter.
//! * [`network_block`]: the socket-family rule of `confinement.network: deny`.
//! * [`caps`]: capability sets dropped to the configured ones and verified.
//! * [`landlock`]: the kernel's Landlock ABI.
//! * [`landlock_plan`]: which path a command may reach with which rights, from the
//!   configuration, the protected entries and the device directory.
//! * [`landlock_ruleset`]: a plan turned into a ruleset fd, and what the kernel enforces of it.
//! * [`ptys`]: a private devpts instance, so commands never see the host's terminals.
//! * [`proc_stat`]: a process's resident memory and CPU time, for the worker's gauges (read,
//!   not confinement, but shared by the broker and the executor like the rest).
//! * [`requirement`]: how a test that needs root or a kernel feature skips or fails.
//! * prctl flags (no_new_privs, dumpable, child subreaper) and [`observe`], the state of
//!   this process as `doctor` reports it.
//!
//! Everything here is built and installed in the process that calls it; code that runs
//! after fork only applies what was built here (see the executor's spawn path).

mod bpf;
pub mod broker_allowlist;
pub mod caps;
pub mod landlock;
pub mod landlock_plan;
pub mod landlock_ruleset;
pub mod network_block;
pub mod proc_stat;
pub mod ptys;
pub mod requirement;
pub mod seccomp;
pub mod special_bits;

use iii_shell_policy::config::RlimitConfig;
use nix::sys::prctl;

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

/// no_new_privs is set on this process.
pub fn no_new_privs() -> bool {
    prctl::get_no_new_privs().unwrap_or(false)
}

pub fn set_no_new_privs() -> std::io::Result<()> {
    Ok(prctl::set_no_new_privs()?)
}

/// This process is a child subreaper.
pub fn subreaper() -> bool {
    prctl::get_child_subreaper().unwrap_or(false)
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
        dumpable: prctl::get_dumpable().unwrap_or(false),
        subreaper: subreaper(),
        private_ptys: ptys::is_private(),
        problems: Vec::new(),
    }
}

/// Makes this process the reaper of its orphaned descendants.
pub fn become_subreaper() -> std::io::Result<()> {
    Ok(prctl::set_child_subreaper(true)?)
}

/// Clears the dumpable flag: no process of the same user can ptrace this one or open its
/// memory and fds through /proc.
pub fn set_not_dumpable() -> std::io::Result<()> {
    Ok(prctl::set_dumpable(false)?)
}
