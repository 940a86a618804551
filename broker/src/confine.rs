//! The broker confines itself once its start-up is done: an unprivileged user (when started
//! as root), no capabilities, no_new_privs, Landlock with no filesystem access beyond the few
//! files name resolution reads (and never execute), and a default-deny seccomp allowlist fit
//! for a network client (`iii_shell_confine::broker_allowlist`, compiled by seccompiler).
//! Every syscall outside the list fails with EPERM.

use iii_shell_confine::{caps, landlock::kernel_abi, no_new_privs, set_no_new_privs};
use iii_shell_protocol::config::{ConfinementConfig, ConfinementMode};
use landlock::{
    Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope, ABI,
};

/// Files the broker may still read after start-up: name resolution for the engine URL.
pub const READABLE: &[&str] = &[
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/host.conf",
    "/etc/services",
];

/// Looks up the uid/gid of `user`.
pub fn lookup_user(user: &str) -> Result<(u32, u32), String> {
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Ok((u.uid.as_raw(), u.gid.as_raw())),
        Ok(None) => Err(format!(
            "user {user:?} does not exist (set confinement.broker_user)"
        )),
        Err(e) => Err(format!("cannot look up user {user:?}: {e}")),
    }
}

/// Result of the self-confinement, for logs and doctor.
#[derive(Debug, Default, Clone)]
pub struct BrokerReport {
    pub uid: u32,
    pub gid: u32,
    pub no_new_privs: bool,
    pub landlock: String,
    pub seccomp: String,
    pub caps: caps::CapState,
    pub problems: Vec<String>,
}

/// Applies everything but the uid change (done by whoever spawned us, or by
/// [`drop_user`]). Call it with as few threads as possible; seccomp is synchronised to all.
pub fn confine_self(c: &ConfinementConfig) -> Result<BrokerReport, String> {
    let strict = c.mode == ConfinementMode::Strict;
    let mut problems = Vec::new();
    // SAFETY: PR_SET_DUMPABLE 0 only changes a process flag.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    if let Err(e) = caps::drop_to(&Default::default()) {
        problems.push(format!("capabilities: {e}"));
    }
    if let Err(e) = set_no_new_privs() {
        problems.push(format!("no_new_privs: {e}"));
    }
    let landlock = if c.landlock {
        apply_landlock().unwrap_or_else(|e| {
            problems.push(format!("landlock: {e}"));
            "not enforced".into()
        })
    } else {
        problems.push("landlock disabled by configuration".into());
        "disabled".into()
    };
    let seccomp = if c.seccomp {
        match iii_shell_confine::broker_allowlist::install() {
            Ok(()) => "default-deny allowlist installed".to_string(),
            Err(e) => {
                problems.push(format!("seccomp: {e}"));
                "not installed".into()
            }
        }
    } else {
        problems.push("seccomp disabled by configuration".into());
        "disabled".into()
    };
    if strict && !problems.is_empty() {
        return Err(format!(
            "strict confinement cannot be met for the broker: {}",
            problems.join("; ")
        ));
    }
    Ok(BrokerReport {
        // SAFETY: getuid/getgid cannot fail.
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
        no_new_privs: no_new_privs(),
        landlock,
        seccomp,
        caps: caps::read(),
        problems,
    })
}

fn apply_landlock() -> Result<String, String> {
    let abi = kernel_abi();
    if abi <= 0 {
        return Err("the kernel has no Landlock".into());
    }
    let err = |e: landlock::RulesetError| e.to_string();
    let mut created = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(ABI::V5))
        .map_err(err)?
        .scope(Scope::from_all(ABI::V6))
        .map_err(err)?
        .create()
        .map_err(err)?;
    for f in READABLE {
        if let Ok(fd) = PathFd::new(f) {
            created = created
                .add_rule(PathBeneath::new(fd, AccessFs::ReadFile))
                .map_err(err)?;
        }
    }
    let status = created.restrict_self().map_err(err)?;
    Ok(format!("{:?} (ABI {abi})", status.ruleset))
}

/// Switches to `uid`/`gid` (dropping supplementary groups) and verifies it stuck.
pub fn drop_user(uid: u32, gid: u32) -> Result<(), String> {
    use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};
    setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    setresgid(Gid::from_raw(gid), Gid::from_raw(gid), Gid::from_raw(gid))
        .map_err(|e| format!("setresgid: {e}"))?;
    setresuid(Uid::from_raw(uid), Uid::from_raw(uid), Uid::from_raw(uid))
        .map_err(|e| format!("setresuid: {e}"))?;
    // SAFETY: getuid/geteuid/getgid cannot fail.
    let (r, e, g) = unsafe { (libc::getuid(), libc::geteuid(), libc::getgid()) };
    if r != uid || e != uid || g != gid || nix::unistd::setuid(Uid::from_raw(0)).is_ok() && uid != 0
    {
        return Err("privilege drop did not stick".into());
    }
    Ok(())
}
