//! Kernel confinement: of the executor itself at start-up, and of every command it spawns.
//!
//! The mechanisms live in `iii_shell_confine` (shared with the supervisor and the broker)
//! and are re-exported here:
//! * [`caps`]: capability sets dropped to the configured ones and verified.
//! * [`seccomp`]: the deny filter (a hand-built BPF program).
//! * [`ptys`]: a private devpts instance, so commands never see the host's terminals.
//! * The command Landlock plan and its ruleset (`iii_shell_confine::landlock_plan`,
//!   `iii_shell_confine::landlock_ruleset`).
//!
//! Here: [`landlock_rules`], which feeds the plan from the live jail (its protected entries)
//! and builds the command ruleset, [`process_limits`], and [`harden_executor`], the
//! executor's own start-up.
//!
//! Per spawn, everything is built in the parent (once per policy) and the child only applies
//! it with raw system calls: rlimits, no_new_privs, `landlock_restrict_self`, `seccomp`.

pub mod landlock_rules;
pub use iii_shell_launch::process_limits;

pub use iii_shell_confine::{
    caps, no_new_privs, observe, ptys, seccomp, set_no_new_privs, special_bits, Rlimits, SelfReport,
};
use iii_shell_protocol::config::{ConfinementConfig, ConfinementMode};

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
        iii_shell_launch::run_as::RETAINED.into_iter().collect()
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
    if let Err(e) = iii_shell_launch::reaper::become_subreaper() {
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
        iii_shell_launch::clone3::register_seccomp_exception();
        let filter = seccomp::build(&envelope.seccomp_allow)?;
        match seccomp::install_self(&filter) {
            Ok(()) => {
                denied = filter.denied.iter().map(|s| s.to_string()).collect();
                seccomp::PROCESS.set_baseline(filter.denied.clone());
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
