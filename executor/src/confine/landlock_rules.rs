//! Landlock for commands, built from the live jail.
//!
//! * Jailed: read/write/execute in the roots and the scratch paths; read and execute in the
//!   system paths; read/write on a few character devices (`/dev/null`, `/dev/tty`, …).
//! * Unjailed: everything, except the denied paths.
//! * Denied, either way: `confinement.secret_paths` (by default the shadow files and their
//!   backups; the public `/etc/passwd` and `/etc/group` stay readable so `ls -l`, `id`,
//!   `getent` and git resolve users), the `fs.denylist_paths` entries that lie inside a jail
//!   root, and every entry inside a root that matches `code.non_accessible_globs` when the
//!   policy is built (see [`crate::jail::Protected`]; a file created later that matches a
//!   glob is not covered: Landlock rules are attached to inodes that exist). The rest of
//!   `fs.denylist_paths` is the fs surface's list only. Landlock cannot carve a hole in an
//!   allowed tree, so a tree that contains a denied path is granted piecewise: its
//!   directories on the way down get only directory operations (list, create, remove), and
//!   every sibling off that path gets the full grant. Limits: the denied name still shows in
//!   listings, and entries created later next to it inherit only the directory operations.
//! * Device nodes under `/dev` are treated like denied paths: block devices always (a raw
//!   disk read bypasses every rule above), and when jailed every character device except
//!   [`DEVICE_FILES`]. Grant paths are canonicalized before they are compared with the
//!   (canonical) denied paths, and nothing at or under a denied path is granted.
//! * Scoping (ABI 6+): commands cannot signal, or connect to the abstract sockets of,
//!   processes outside their domain (the executor and the broker).
//! * Network (ABI 4+): optional TCP bind/connect restriction.
//!
//! The ruleset is built once per policy, in the executor; each spawn only passes its fd to
//! `landlock_restrict_self` in the child.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use iii_shell_protocol::config::{Config, NetworkAccess};

use crate::jail::Protected;
use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope, ABI,
};

/// Character devices commands may write when jailed.
pub const DEVICE_FILES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

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

pub use iii_shell_confine::landlock::kernel_abi;

fn dir_ops(access: BitFlags<AccessFs>) -> BitFlags<AccessFs> {
    access
        & (AccessFs::ReadDir
            | AccessFs::RemoveDir
            | AccessFs::RemoveFile
            | AccessFs::MakeChar
            | AccessFs::MakeDir
            | AccessFs::MakeReg
            | AccessFs::MakeSock
            | AccessFs::MakeFifo
            | AccessFs::MakeBlock
            | AccessFs::MakeSym
            | AccessFs::Refer)
}

/// Device nodes commands must not open, for the piecewise grant: every block device (a raw
/// read of a disk bypasses every path rule and the denylist) and, when jailed, every
/// character device except [`DEVICE_FILES`] (consoles, serial lines, input devices and the
/// like would otherwise be readable through a `/dev` system path, by a uid-0 command).
/// Device nodes that appear later get no rights: their directory is granted piecewise.
fn device_nodes(jailed: bool) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let mut out = Vec::new();
    let mut stack = vec![(PathBuf::from("/dev"), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if DEVICE_FILES.iter().any(|d| p.starts_with(d)) {
                continue;
            }
            // Not followed: a symlink (`/dev/fd`, `/dev/disk/by-*/…`) is never a rule source.
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() && depth < 8 {
                stack.push((p, depth + 1));
            } else if t.is_block_device() || (jailed && t.is_char_device()) {
                out.push(p);
            }
        }
    }
    out
}

/// Grants `access` on `path`, piecewise around the denied paths beneath it. A path at or
/// under a denied path gets nothing (the denylist covers everything under its entries).
fn grant(
    out: &mut Vec<(PathBuf, BitFlags<AccessFs>)>,
    path: &Path,
    access: BitFlags<AccessFs>,
    denied: &[PathBuf],
    depth: usize,
) {
    if denied.iter().any(|d| path.starts_with(d)) || depth > 32 {
        return;
    }
    let below = denied.iter().any(|d| d.starts_with(path) && d != path);
    if !below {
        out.push((path.to_path_buf(), access));
        return;
    }
    out.push((path.to_path_buf(), dir_ops(access)));
    let Ok(rd) = std::fs::read_dir(path) else {
        return;
    };
    for e in rd.flatten() {
        let child = e.path();
        // A symlink is never a rule source: its target would be granted wherever it is.
        if e.file_type().map(|t| t.is_symlink()).unwrap_or(true) {
            continue;
        }
        grant(out, &child, access, denied, depth + 1);
    }
}

/// What a command may reach: each path and the rights granted beneath it, after the
/// piecewise carving around the denied paths (which are listed too). Pure data, built from
/// the live tree; [`build`] turns it into a ruleset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub grants: Vec<(PathBuf, BitFlags<AccessFs>)>,
    pub denied: Vec<PathBuf>,
}

/// The read-and-execute rights of a system path.
pub fn read_exec() -> BitFlags<AccessFs> {
    AccessFs::from_read(ABI::V5)
}

/// Every filesystem right (roots and scratch paths).
pub fn full() -> BitFlags<AccessFs> {
    AccessFs::from_all(ABI::V5)
}

/// The rights of a directory on the way down to a denied path: directory operations only.
pub fn directory_only() -> BitFlags<AccessFs> {
    dir_ops(full())
}

/// The rights of the [`DEVICE_FILES`] when jailed.
pub fn device_rights() -> BitFlags<AccessFs> {
    read_exec() | AccessFs::WriteFile | AccessFs::IoctlDev | AccessFs::Truncate
}

/// The plan for `config` (see the module comment). Paths that do not exist are still
/// listed; [`build`] skips them.
pub fn plan(config: &Config, protected: &Protected) -> Plan {
    let c = &config.confinement;
    let (full, read_exec) = (full(), read_exec());
    let jailed = !config.fs.host_roots.is_empty();
    let mut denied: Vec<PathBuf> = c
        .secret_paths
        .iter()
        .map(PathBuf::from)
        .chain(protected.in_roots.iter().cloned())
        .flat_map(|p| {
            let canon = std::fs::canonicalize(&p).ok();
            std::iter::once(p).chain(canon)
        })
        .collect();
    denied.extend(device_nodes(jailed));
    // Every grant path is canonical, like the denied paths it is compared with: a rule is
    // attached to the inode a path resolves to, so a symlinked grant path (`/lib` ->
    // `usr/lib`) compared lexically would grant a denied path beneath its target in full.
    let canonical = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p));
    let mut grants = Vec::new();
    if !jailed {
        grant(&mut grants, Path::new("/"), full, &denied, 0);
    } else {
        for r in config.fs.host_roots.iter().chain(c.scratch_paths.iter()) {
            grant(&mut grants, &canonical(r), full, &denied, 0);
        }
        for s in &c.system_paths {
            grant(&mut grants, &canonical(s), read_exec, &denied, 0);
        }
        for d in DEVICE_FILES {
            grant(&mut grants, &canonical(d), device_rights(), &denied, 0);
        }
    }

    Plan { grants, denied }
}

/// Builds the command ruleset for `config`. Paths that do not exist are skipped.
pub fn build(config: &Config, protected: &Protected) -> Result<CommandRuleset, String> {
    let abi = kernel_abi();
    let c = &config.confinement;
    if !c.landlock {
        return Ok(CommandRuleset {
            fd: None,
            abi,
            enforcement: Enforcement::NotEnforced,
            rules: 0,
            scoped: false,
            network: c.network,
            gaps: vec!["confinement.landlock is false".into()],
        });
    }
    let full = AccessFs::from_all(ABI::V5);
    let grants = plan(config, protected).grants;

    let mut gaps = Vec::new();
    if protected.truncated {
        gaps.push(format!(
            "the scan for protected entries in the roots stopped at {} entries: protected files past it are denied to the fs surface by name only, and not denied to commands",
            crate::jail::SCAN_LIMIT
        ));
    }
    let mut needed = 5; // the V5 filesystem rights (truncate, refer, ioctl on devices)
    let scoped = abi >= 6;
    needed = needed.max(6);
    if c.network != NetworkAccess::Allow {
        needed = needed.max(4);
    }
    let enforcement = if abi <= 0 {
        gaps.push("the kernel has no Landlock (or it is disabled)".into());
        Enforcement::NotEnforced
    } else if abi < needed {
        gaps.push(format!("kernel Landlock ABI {abi} < {needed}: some rights (scoping, truncate, device ioctl or network) are not enforced"));
        Enforcement::Partially
    } else {
        Enforcement::Fully
    };
    if abi <= 0 {
        return Ok(CommandRuleset {
            fd: None,
            abi,
            enforcement,
            rules: 0,
            scoped: false,
            network: c.network,
            gaps,
        });
    }

    let err = |e: landlock::RulesetError| format!("landlock: {e}");
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(full)
        .map_err(err)?;
    if c.network != NetworkAccess::Allow {
        let net = match c.network {
            NetworkAccess::DenyBind => BitFlags::from(AccessNet::BindTcp),
            _ => AccessNet::BindTcp | AccessNet::ConnectTcp,
        };
        ruleset = ruleset.handle_access(net).map_err(err)?;
    }
    ruleset = ruleset.scope(Scope::from_all(ABI::V6)).map_err(err)?;
    let mut created = ruleset.create().map_err(err)?;
    let mut rules = 0;
    for (path, access) in grants {
        let Ok(fd) = PathFd::new(&path) else { continue };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(err)?;
        rules += 1;
    }
    let fd: Option<OwnedFd> = created.into();
    Ok(CommandRuleset {
        fd,
        abi,
        enforcement,
        rules,
        scoped,
        network: c.network,
        gaps,
    })
}
