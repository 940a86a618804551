//! The Landlock plan for commands: which path gets which rights, from the configuration, the
//! protected entries the jail found and the device directory. Plain data in, plain data out
//! (it reads the live tree: listings and canonical paths); [`crate::landlock_ruleset`] turns
//! it into a ruleset.
//!
//! * Jailed (`fs.host_roots` set): read/write/execute in the roots and the scratch paths;
//!   read and execute in the system paths; read/write on a few character devices
//!   ([`Devices::allowed`], on the host [`DEVICE_FILES`]).
//! * Unjailed: everything, except the denied paths.
//! * Denied, either way: `confinement.secret_paths` (by default the shadow files and their
//!   backups; the public `/etc/passwd` and `/etc/group` stay readable so `ls -l`, `id`,
//!   `getent` and git resolve users), and the protected entries the caller passes: in the
//!   executor, the `fs.denylist_paths` entries that lie inside a jail root and every entry
//!   inside a root that matches `code.non_accessible_globs` when the policy is built (its
//!   jail's `Protected::in_roots`; a file created later that matches a glob is not covered:
//!   Landlock rules are attached to inodes that exist). The rest of `fs.denylist_paths` is
//!   the fs surface's list only. Landlock cannot carve a hole in an allowed tree, so a tree
//!   that contains a denied path is granted piecewise: its directories on the way down get
//!   only directory operations (list, create, remove), and every sibling off that path gets
//!   the full grant. Limits: the denied name still shows in listings, and entries created
//!   later next to it inherit only the directory operations.
//! * Device nodes under the device directory are treated like denied paths: block devices
//!   always (a raw disk read bypasses every rule above), and when jailed every character
//!   device except the allowed ones. Grant paths are canonicalized before they are compared
//!   with the (canonical) denied paths, and nothing at or under a denied path is granted.

use std::path::{Path, PathBuf};

use iii_shell_policy::config::Config;
use landlock::{Access, AccessFs, BitFlags, ABI};

/// Character devices commands may write when jailed, on the host.
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

/// Where the device nodes are, and which of them (or which directories of them) commands
/// may use when jailed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Devices {
    /// Scanned for device nodes (8 levels at most, symlinks not followed).
    pub dir: PathBuf,
    /// Granted [`device_rights`] when jailed, and never denied.
    pub allowed: Vec<PathBuf>,
}

impl Devices {
    /// The host's: `/dev` and [`DEVICE_FILES`].
    pub fn host() -> Devices {
        Devices {
            dir: PathBuf::from("/dev"),
            allowed: DEVICE_FILES.iter().map(PathBuf::from).collect(),
        }
    }
}

/// What a command may reach: each path and the rights granted beneath it, after the
/// piecewise carving around the denied paths (which are listed too).
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

/// The directory operations within `access`: what a directory on the way down to a denied
/// path keeps.
pub fn dir_ops(access: BitFlags<AccessFs>) -> BitFlags<AccessFs> {
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

/// The rights of a directory of a root on the way down to a denied path.
pub fn directory_only() -> BitFlags<AccessFs> {
    dir_ops(full())
}

/// The rights of the allowed devices when jailed.
pub fn device_rights() -> BitFlags<AccessFs> {
    read_exec() | AccessFs::WriteFile | AccessFs::IoctlDev | AccessFs::Truncate
}

/// Device nodes commands must not open, for the piecewise grant: every block device (a raw
/// read of a disk bypasses every path rule and the denylist) and, when jailed, every
/// character device except the allowed ones (consoles, serial lines, input devices and the
/// like would otherwise be readable through a `/dev` system path, by a uid-0 command).
/// Device nodes that appear later get no rights: their directory is granted piecewise.
fn device_nodes(devices: &Devices, jailed: bool) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let mut out = Vec::new();
    let mut stack = vec![(devices.dir.clone(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if devices.allowed.iter().any(|d| p.starts_with(d)) {
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

/// The plan for `config` (see the module comment), denying `protected` (and the secret
/// paths and device nodes) too. Paths that do not exist are still listed; the ruleset
/// builder skips them.
pub fn plan(config: &Config, protected: &[PathBuf], devices: &Devices) -> Plan {
    let c = &config.confinement;
    let (full, read_exec) = (full(), read_exec());
    let jailed = !config.fs.host_roots.is_empty();
    let mut denied: Vec<PathBuf> = c
        .secret_paths
        .iter()
        .map(PathBuf::from)
        .chain(protected.iter().cloned())
        .flat_map(|p| {
            let canon = std::fs::canonicalize(&p).ok();
            std::iter::once(p).chain(canon)
        })
        .collect();
    denied.extend(device_nodes(devices, jailed));
    // Every grant path is canonical, like the denied paths it is compared with: a rule is
    // attached to the inode a path resolves to, so a symlinked grant path (`/lib` ->
    // `usr/lib`) compared lexically would grant a denied path beneath its target in full.
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mut grants = Vec::new();
    if !jailed {
        grant(&mut grants, Path::new("/"), full, &denied, 0);
    } else {
        for r in config.fs.host_roots.iter().chain(c.scratch_paths.iter()) {
            grant(&mut grants, &canonical(Path::new(r)), full, &denied, 0);
        }
        for s in &c.system_paths {
            grant(&mut grants, &canonical(Path::new(s)), read_exec, &denied, 0);
        }
        for d in &devices.allowed {
            grant(&mut grants, &canonical(d), device_rights(), &denied, 0);
        }
    }

    Plan { grants, denied }
}
