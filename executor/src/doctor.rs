//! The executor's half of `iii-shell doctor`: its own state, and what commands get.

use std::sync::Arc;

use iii_shell_protocol::config::{ConfinementMode, NetworkAccess};
use iii_shell_protocol::doctor::{CommandReport, DoctorReport, ProcessReport};
use iii_shell_protocol::messages::ExecSpec;
use tokio::sync::Notify;

use crate::confine::{self, landlock_rules::kernel_abi};
use crate::policy::Policy;

pub fn process_report(role: &str) -> ProcessReport {
    let s = confine::observe();
    ProcessReport {
        role: role.to_string(),
        pid: std::process::id(),
        uid: s.uid,
        gid: s.gid,
        cap_effective: s.caps.effective,
        cap_permitted: s.caps.permitted,
        cap_inheritable: s.caps.inheritable,
        cap_bounding: s.caps.bounding,
        cap_ambient: s.caps.ambient,
        no_new_privs: s.no_new_privs,
        seccomp_mode: s.seccomp_mode,
        seccomp: match s.seccomp_mode {
            2 => "filter installed".into(),
            1 => "strict mode".into(),
            _ => "none".into(),
        },
        landlock: "not applied to itself (fs operations are confined by the fd-relative jail; commands get their own ruleset)".into(),
        dumpable: s.dumpable,
        subreaper: s.subreaper,
        checks: if role == "executor" {
            vec![(
                "private devpts instance".into(),
                if s.private_ptys {
                    "yes: commands never see the host's terminals, and open a pty of it only through its master (TIOCGPTPEER), never by path".into()
                } else {
                    "NO: commands can open every terminal of the host under /dev/pts".into()
                },
            )]
        } else {
            Vec::new()
        },
        problems: Vec::new(),
    }
}

/// How long the report waits for the policy's walk for protected entries (its commands'
/// ruleset) before it answers without the command half.
const WALK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Builds the report; runs one real command to show what a command actually gets.
pub async fn report(policy: Option<Arc<Policy>>, envelope: Option<String>) -> DoctorReport {
    let executor = process_report("executor");
    let Some(policy) = policy else {
        return DoctorReport {
            executor,
            commands: CommandReport {
                gaps: vec!["no policy yet".into()],
                ..Default::default()
            },
            envelope,
            jobs: Default::default(),
        };
    };
    let c = &policy.config.confinement;
    // The ruleset is built off the call path once the protected entries are known; the
    // report waits for it, as a command does.
    policy.start_walk();
    let Ok(ruleset) = tokio::time::timeout(WALK_WAIT, policy.commands.landlock.wait()).await else {
        // A walk stuck on a hung mount, or a very large tree: say so rather than hang.
        return DoctorReport {
            executor,
            commands: CommandReport {
                gaps: vec![format!(
                    "the walk for protected entries is still under way after {} s (commands wait for it): run doctor again later",
                    WALK_WAIT.as_secs()
                )],
                ..Default::default()
            },
            envelope,
            jobs: Default::default(),
        };
    };
    let (ll_enforcement, ll_rules, ll_scoped, ll_gaps) = match ruleset {
        Ok(r) => (
            r.enforcement.as_str().to_string(),
            r.rules as u64,
            r.scoped,
            r.gaps.clone(),
        ),
        Err(e) => ("not enforced".to_string(), 0, false, vec![e.clone()]),
    };
    let names = [
        "max_processes",
        "address_space_bytes",
        "file_size_bytes",
        "open_files",
        "cpu_seconds",
    ];
    let rl = &policy.commands.rlimits;
    let mut rlimits = Vec::new();
    for &(res, v) in &rl.entries[..rl.len] {
        let name = [
            libc::RLIMIT_NPROC,
            libc::RLIMIT_AS,
            libc::RLIMIT_FSIZE,
            libc::RLIMIT_NOFILE,
        ]
        .iter()
        .position(|&r| r as i32 == res)
        .map_or(names[4], |i| names[i]);
        rlimits.push((name.to_string(), v));
    }
    let spec = ExecSpec {
        argv: vec!["cat".into(), "/proc/self/status".into()],
        cwd: None,
        env: Vec::new(),
        stdin: None,
        timeout_ms: 5000,
        network: None,
        limits: Default::default(),
    };
    let observed = match crate::foreground::run(policy.clone(), spec, Arc::new(Notify::new())).await
    {
        Ok(r) => r
            .stdout
            .lines()
            .filter(|l| {
                [
                    "Uid:",
                    "Gid:",
                    "Groups:",
                    "NoNewPrivs",
                    "Seccomp:",
                    "CapEff",
                    "CapPrm",
                    "CapBnd",
                    "CapAmb",
                    "CapInh",
                ]
                .iter()
                .any(|k| l.starts_with(k))
            })
            .map(|l| l.replace('\t', " "))
            .collect(),
        Err(e) => vec![format!("could not run a probe command: {}", e)],
    };
    let foreign_chmod = foreign_chmod(&policy).await;
    let launcher = &policy.launcher;
    let applied = launcher.applied_run_as();
    let cgroups = launcher.cgroups();
    let user = match &applied {
        Some(a) => format!("{}:{} groups {:?} ({})", a.uid, a.gid, a.groups, a.why),
        // SAFETY: getuid/getgid cannot fail.
        None => format!(
            "the executor's own, {}:{}",
            unsafe { libc::getuid() },
            unsafe { libc::getgid() }
        ),
    };
    let limits = confine::process_limits::LimitInputs {
        job_cgroups: cgroups.usable(),
        pids_controller: cgroups.base().is_some_and(|b| b.pids),
        pids_v1: cgroups.base().is_some_and(|b| b.pids_v1.is_some()),
        memory_controller: cgroups
            .base()
            .is_some_and(|b| b.memory_controller().is_some()),
        memory_v1: cgroups.base().is_some_and(|b| b.memory_v1.is_some()),
        cpu_controller: cgroups.base().is_some_and(|b| b.cpu_controller().is_some()),
        cpu_v1: cgroups.base().is_some_and(|b| b.cpu_v1.is_some()),
        cpu_max: c.job_limits.cpu_max_percent,
        pids_max: c.job_limits.pids_max,
        memory_max: c.job_limits.memory_max_bytes,
        max_processes: c.rlimits.max_processes,
        // SAFETY: getuid cannot fail.
        command_uid: applied
            .as_ref()
            .map_or(unsafe { libc::getuid() }, |a| a.uid),
    };
    let commands = CommandReport {
        mode: match c.mode {
            ConfinementMode::Strict => "strict".into(),
            ConfinementMode::BestEffort => "best_effort".into(),
        },
        jailed: policy.jail.is_jailed(),
        landlock_abi: kernel_abi(),
        landlock: ll_enforcement,
        landlock_rules: ll_rules,
        scoping: ll_scoped,
        network: network_line(&policy).await,
        seccomp_denied: special_bits_line(policy.commands.special_bits)
            .into_iter()
            .chain(
                policy
                    .commands
                    .seccomp
                    .iter()
                    .flat_map(|f| f.denied.iter().map(|s| s.to_string())),
            )
            .collect(),
        rlimits,
        cgroups: cgroups.usable(),
        // Read after the probe command above went through the spawn path.
        cgroup_entry: match (cgroups.usable(), launcher.clone3().available()) {
            (false, _) => "none".into(),
            (true, true) => "clone3".into(),
            (true, false) => "cgroup.procs".into(),
        },
        prestart: launcher.prestart_availability().into(),
        observed,
        user,
        foreign_chmod,
        run_as_warning: applied.and_then(|a| a.warning),
        process_limits: {
            let mut lines = confine::process_limits::report(&limits);
            lines.push(("job cgroup as the kernel has it".into(), read_back(&policy)));
            lines
        },
        processes_bounded: confine::process_limits::processes_bounded(&limits),
        home: match &policy.home.path {
            Some(h) => format!("{h} ({})", policy.home.source),
            None => policy.home.source.clone(),
        },
        cwd: match iii_shell_policy::home::default_cwd(
            policy.config.working_dir.as_deref(),
            &policy.config.fs.host_roots,
        ) {
            iii_shell_policy::home::DefaultCwd::WorkingDir(wd) => format!("{wd} (working_dir)"),
            iii_shell_policy::home::DefaultCwd::PrimaryRoot(_) => format!(
                "{} (the primary root)",
                policy
                    .jail
                    .roots()
                    .first()
                    .map_or(String::new(), |r| r.path.to_string_lossy().into_owned())
            ),
            iii_shell_policy::home::DefaultCwd::Executor => std::env::current_dir().map_or_else(
                |e| format!("the executor's own working directory ({e})"),
                |d| format!("{} (the executor's own working directory)", d.display()),
            ),
        },
        gaps: ll_gaps
            .into_iter()
            .chain(terminal_gap(&c.capabilities))
            .chain(policy.home.warning.clone())
            .chain(policy.user.reach.iter().cloned())
            .collect(),
        terminal: terminal_line(&policy),
    };
    DoctorReport {
        executor,
        commands,
        envelope,
        jobs: Default::default(),
    }
}

/// What `confinement.capabilities` opens of other sessions' terminals: the private devpts
/// instance keeps them out of reach by their mode, which these capabilities override.
pub fn terminal_gap(capabilities: &[String]) -> Option<String> {
    let reach = iii_shell_confine::ptys::reachable_by_caps(capabilities);
    (!reach.is_empty()).then(|| {
        format!(
            "confinement.capabilities grants {}: a command holding it can open the terminals of other sessions by path (/dev/pts/N), which the private devpts instance otherwise keeps out of reach; drop it unless commands need it",
            reach.join(", ")
        )
    })
}

/// What a terminal session without a program gets, and the note about it when there is one.
fn terminal_line(policy: &Policy) -> String {
    let shell = crate::pty::process::login_shell(policy);
    match &policy.user.terminal {
        Some(note) => format!("{shell}: {note}"),
        None => shell,
    }
}

/// The special-bits rule as `doctor` lists it, saying where it is loaded.
fn special_bits_line(p: crate::confine::special_bits::Placement) -> Option<String> {
    use crate::confine::special_bits::{Placement, DENIED};
    match p {
        Placement::Off => None,
        Placement::Inherited => Some(format!("{DENIED} (in the executor's own filter)")),
        Placement::PerSpawn => Some(format!("{DENIED} (loaded per spawn)")),
    }
}

/// The network mode, the mechanism enforcing it, and what a probe command
/// (`iii-shell probe network`, this binary) reports from the inside.
async fn network_line(policy: &Arc<Policy>) -> String {
    use iii_shell_policy::network::name;
    let n = &policy.commands.network;
    let mechanism = match n.runs_as {
        NetworkAccess::Allow => "nothing restricts it",
        NetworkAccess::DenyBind => "Landlock TCP bind rule",
        NetworkAccess::Loopback => "a network namespace of its own, lo up",
        NetworkAccess::Deny => "seccomp: socket/socketpair of every family but AF_UNIX fail with EACCES; Landlock TCP rules as a second layer where the kernel has them",
    };
    let mode = if n.runs_as == n.configured {
        name(n.configured).to_string()
    } else {
        format!("{} (runs as {})", name(n.configured), name(n.runs_as))
    };
    let observed = match std::env::current_exe() {
        Ok(exe) => {
            let spec = ExecSpec {
                argv: vec![
                    exe.to_string_lossy().into_owned(),
                    "probe".into(),
                    "network".into(),
                ],
                cwd: None,
                env: Vec::new(),
                stdin: None,
                timeout_ms: 5000,
                network: None,
                limits: Default::default(),
            };
            match crate::foreground::run(policy.clone(), spec, Arc::new(Notify::new())).await {
                Ok(r) if r.exit_code == Some(0) => {
                    r.stdout.lines().next().unwrap_or("").to_string()
                }
                Ok(r) => format!("not observed ({})", r.stderr.trim()),
                Err(e) => format!("not observed ({e})"),
            }
        }
        Err(e) => format!("not observed ({e})"),
    };
    format!("{mode}: {mechanism}; a command sees: {observed}")
}

/// Asks a real command to change the mode of `/` (owned by root) to the mode it already has:
/// refused (EPERM) unless the command runs as the owner (root). Nothing changes either way.
async fn foreign_chmod(policy: &Arc<Policy>) -> String {
    use std::os::unix::fs::MetadataExt;
    let mode = match std::fs::metadata("/") {
        Ok(m) => m.mode() & 0o7777,
        Err(e) => return format!("unknown (stat /: {e})"),
    };
    let spec = ExecSpec {
        argv: vec!["chmod".into(), format!("{mode:o}"), "/".into()],
        cwd: None,
        env: Vec::new(),
        stdin: None,
        timeout_ms: 5000,
        network: None,
        limits: Default::default(),
    };
    match crate::foreground::run(policy.clone(), spec, Arc::new(Notify::new())).await {
        Ok(r) if r.exit_code == Some(0) => {
            "yes: a command changed the mode of / (owned by root); set confinement.run_as to an unprivileged user".into()
        }
        Ok(r) => format!("no ({})", r.stderr.trim()),
        Err(e) => format!("unknown (could not run chmod: {e})"),
    }
}

/// The limit files of a probe job cgroup with the policy's limits written, as the kernel
/// reads them back (`pids.max=1024 memory.limit_in_bytes=... cpu.cfs_quota_us=...`): what
/// a command would run under, not what is configured.
fn read_back(policy: &Policy) -> String {
    match policy.launcher.cgroups().take_for(policy.job_limits()) {
        Some(cg) => {
            let files = cg.read_back();
            let _ = cg.recycle();
            if files.is_empty() {
                "no limit controller in the job cgroups".to_string()
            } else {
                files
                    .iter()
                    .map(|(f, v)| format!("{f}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        }
        None => "no job cgroup could be made".to_string(),
    }
}

#[cfg(test)]
mod terminal_gap_tests {
    use super::terminal_gap;

    #[test]
    fn only_capabilities_that_override_a_pty_mode_are_a_gap() {
        assert_eq!(terminal_gap(&[]), None);
        assert_eq!(terminal_gap(&["CAP_NET_BIND_SERVICE".into()]), None);
        assert_eq!(
            terminal_gap(&["net_bind_service".into(), "fowner".into(), "CAP_DAC_OVERRIDE".into()]),
            Some("confinement.capabilities grants CAP_FOWNER, CAP_DAC_OVERRIDE: a command holding it can open the terminals of other sessions by path (/dev/pts/N), which the private devpts instance otherwise keeps out of reach; drop it unless commands need it".to_string())
        );
    }
}
