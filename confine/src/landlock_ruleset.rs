//! The command ruleset: a [`crate::landlock_plan::Plan`]'s grants turned into a Landlock
//! ruleset fd, and how much of it the kernel enforces.
//!
//! * Filesystem: every V5 right is handled, so what the plan does not grant is denied.
//! * Scoping (ABI 6+): commands cannot signal, or connect to the abstract sockets of,
//!   processes outside their domain (the executor and the broker).
//! * Network (ABI 4+): optional TCP bind/connect restriction.
//!
//! The ruleset is built once per policy, in the executor; each spawn only passes its fd to
//! `landlock_restrict_self` in the child.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use iii_shell_policy::config::NetworkAccess;
use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope, ABI,
};

use crate::landlock::kernel_abi;

/// How much of the requested ruleset the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    Fully,
    Partially,
    NotEnforced,
}

impl Enforcement {
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Fully => "fully enforced",
            Enforcement::Partially => "partially enforced",
            Enforcement::NotEnforced => "not enforced",
        }
    }
}

/// A ruleset ready to apply, and what it amounts to.
#[derive(Debug)]
pub struct CommandRuleset {
    pub fd: Option<OwnedFd>,
    pub abi: i32,
    pub enforcement: Enforcement,
    pub rules: usize,
    pub scoped: bool,
    pub network: NetworkAccess,
    /// Why it is not fully enforced, if it is not.
    pub gaps: Vec<String>,
}

/// The lowest ABI that enforces everything asked for: the V5 filesystem rights (truncate,
/// refer, ioctl on devices), V6 scoping, and V4 network rules when `network` restricts.
pub fn needed_abi(network: NetworkAccess) -> i32 {
    let mut needed = 5;
    needed = needed.max(6);
    if tcp_rules(network).is_some() {
        needed = needed.max(4);
    }
    needed
}

/// The TCP rights a ruleset takes away for `network`: none for `allow`, and none for
/// `loopback`, whose namespace is the bound (a command binds and connects inside it).
/// Under `deny` the socket-family rule (`network_block`) is the first layer and these the
/// second.
pub fn tcp_rules(network: NetworkAccess) -> Option<BitFlags<AccessNet>> {
    match network {
        NetworkAccess::Allow | NetworkAccess::Loopback => None,
        NetworkAccess::DenyBind => Some(BitFlags::from(AccessNet::BindTcp)),
        NetworkAccess::Deny => Some(AccessNet::BindTcp | AccessNet::ConnectTcp),
    }
}

/// What a kernel at `abi` enforces of a ruleset restricting `network`, and the gap to
/// report when it is not everything.
pub fn enforcement(abi: i32, network: NetworkAccess) -> (Enforcement, Option<String>) {
    let needed = needed_abi(network);
    if abi <= 0 {
        (
            Enforcement::NotEnforced,
            Some("the kernel has no Landlock (or it is disabled)".into()),
        )
    } else if abi < needed {
        (
            Enforcement::Partially,
            Some(format!("kernel Landlock ABI {abi} < {needed}: some rights (scoping, truncate, device ioctl or network) are not enforced")),
        )
    } else {
        (Enforcement::Fully, None)
    }
}

/// The ruleset of a policy with `confinement.landlock: false`: none.
pub fn disabled(network: NetworkAccess) -> CommandRuleset {
    CommandRuleset {
        fd: None,
        abi: kernel_abi(),
        enforcement: Enforcement::NotEnforced,
        rules: 0,
        scoped: false,
        network,
        gaps: vec!["confinement.landlock is false".into()],
    }
}

/// Builds the ruleset granting `grants` (a plan's), restricting `network`. `gaps` are the
/// caller's (what its plan could not cover); the kernel's come after them. Paths that do not
/// exist are skipped.
pub fn build(
    grants: &[(PathBuf, BitFlags<AccessFs>)],
    network: NetworkAccess,
    mut gaps: Vec<String>,
) -> Result<CommandRuleset, String> {
    let abi = kernel_abi();
    let (enforcement, gap) = enforcement(abi, network);
    gaps.extend(gap);
    if abi <= 0 {
        return Ok(CommandRuleset {
            fd: None,
            abi,
            enforcement,
            rules: 0,
            scoped: false,
            network,
            gaps,
        });
    }

    let err = |e: landlock::RulesetError| format!("landlock: {e}");
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(ABI::V5))
        .map_err(err)?;
    if let Some(net) = tcp_rules(network) {
        ruleset = ruleset.handle_access(net).map_err(err)?;
    }
    ruleset = ruleset.scope(Scope::from_all(ABI::V6)).map_err(err)?;
    let mut created = ruleset.create().map_err(err)?;
    let mut rules = 0;
    for (path, access) in grants {
        let Ok(fd) = PathFd::new(path) else { continue };
        created = created
            .add_rule(PathBeneath::new(fd, *access))
            .map_err(err)?;
        rules += 1;
    }
    let fd: Option<OwnedFd> = created.into();
    Ok(CommandRuleset {
        fd,
        abi,
        enforcement,
        rules,
        scoped: abi >= 6,
        network,
        gaps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_needed_abi_is_six_whatever_the_network() {
        for n in [
            NetworkAccess::Allow,
            NetworkAccess::DenyBind,
            NetworkAccess::Deny,
        ] {
            assert_eq!(needed_abi(n), 6, "{n:?}");
        }
    }

    #[test]
    fn enforcement_by_kernel_abi() {
        let none = Some("the kernel has no Landlock (or it is disabled)".to_string());
        let older = |abi: i32| {
            Some(format!("kernel Landlock ABI {abi} < 6: some rights (scoping, truncate, device ioctl or network) are not enforced"))
        };
        for (abi, want) in [
            (-1, (Enforcement::NotEnforced, none.clone())),
            (0, (Enforcement::NotEnforced, none)),
            (1, (Enforcement::Partially, older(1))),
            (4, (Enforcement::Partially, older(4))),
            (5, (Enforcement::Partially, older(5))),
            (6, (Enforcement::Fully, None)),
            (7, (Enforcement::Fully, None)),
        ] {
            assert_eq!(enforcement(abi, NetworkAccess::Deny), want, "abi {abi}");
        }
    }

    #[test]
    fn disabled_has_no_fd_no_rules_and_says_why() {
        let r = disabled(NetworkAccess::DenyBind);
        assert!(r.fd.is_none());
        assert_eq!(r.rules, 0);
        assert!(!r.scoped);
        assert_eq!(r.enforcement, Enforcement::NotEnforced);
        assert_eq!(r.network, NetworkAccess::DenyBind);
        assert_eq!(r.gaps, vec!["confinement.landlock is false".to_string()]);
    }

    #[test]
    fn build_counts_the_existing_paths_and_keeps_the_callers_gaps_first() {
        let dir = tempfile::tempdir().unwrap();
        let grants = vec![
            (dir.path().to_path_buf(), crate::landlock_plan::full()),
            (dir.path().join("missing"), crate::landlock_plan::full()),
        ];
        let r = build(&grants, NetworkAccess::Allow, vec!["caller".into()]).unwrap();
        let abi = kernel_abi();
        assert_eq!(r.abi, abi);
        let (want_enforcement, want_gap) = enforcement(abi, NetworkAccess::Allow);
        assert_eq!(r.enforcement, want_enforcement);
        let mut want_gaps = vec!["caller".to_string()];
        want_gaps.extend(want_gap);
        assert_eq!(r.gaps, want_gaps);
        if abi <= 0 {
            assert!(r.fd.is_none());
            assert_eq!(r.rules, 0);
            crate::requirement::unmet("the kernel has no Landlock");
            return;
        }
        assert!(r.fd.is_some());
        assert_eq!(r.rules, 1, "the missing path is skipped");
        assert_eq!(r.scoped, abi >= 6);
    }
}
