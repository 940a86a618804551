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
//!   inside a root that matches `code.non_accessible_globs` when the roots were walked (its
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
//!   Only the device directory's own filesystem is scanned: another filesystem mounted
//!   beneath it (`/dev/shm`, `/dev/mqueue`, `/dev/hugepages`) holds what processes put there,
//!   often a scratch path's files by the million, and is not walked. The scan visits at most
//!   [`MAX_DEVICE_ENTRIES`] entries; the directories it did not reach are denied whole.

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

/// The most entries the device scan visits (a host's `/dev` holds a few hundred). Past it,
/// the directories not yet scanned are denied whole (fail closed), and policy builds stay
/// fast whatever was put under the device directory.
pub const MAX_DEVICE_ENTRIES: usize = 65_536;

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

/// What the plan reads of the filesystem: the seam through which a test gives it a fake tree
/// (device nodes, symlinks) without root. [`HostTree`] is the real one.
pub trait Tree {
    /// The canonical form of `p` (symlinks resolved), or `None` when it cannot be had.
    fn canonicalize(&self, p: &Path) -> Option<PathBuf>;
    /// The entries of directory `dir`, with their types (symlinks not followed); empty when
    /// it cannot be read. A directory on another filesystem than `dir` is [`Kind::Mount`].
    fn list(&self, dir: &Path) -> Vec<(PathBuf, Kind)>;
}

/// An entry's type as the plan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    /// A directory on another filesystem than its parent (a mount point).
    Mount,
    Symlink,
    BlockDevice,
    CharDevice,
    Other,
}

/// The host's filesystem.
pub struct HostTree;

impl Tree for HostTree {
    fn canonicalize(&self, p: &Path) -> Option<PathBuf> {
        std::fs::canonicalize(p).ok()
    }

    fn list(&self, dir: &Path) -> Vec<(PathBuf, Kind)> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let Ok(rd) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let here = std::fs::symlink_metadata(dir).map(|m| m.dev()).ok();
        rd.flatten()
            .filter_map(|e| {
                let t = e.file_type().ok()?;
                let kind = if t.is_symlink() {
                    Kind::Symlink
                } else if t.is_dir() {
                    match e.metadata().map(|m| m.dev()) {
                        Ok(dev) if Some(dev) == here => Kind::Dir,
                        _ => Kind::Mount,
                    }
                } else if t.is_block_device() {
                    Kind::BlockDevice
                } else if t.is_char_device() {
                    Kind::CharDevice
                } else {
                    Kind::Other
                };
                Some((e.path(), kind))
            })
            .collect()
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
/// Only the device directory's filesystem is walked (a [`Kind::Mount`] is not descended
/// into), and at most [`MAX_DEVICE_ENTRIES`] entries: past that, every directory not yet
/// walked is denied whole.
fn device_nodes(tree: &dyn Tree, devices: &Devices, jailed: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![(devices.dir.clone(), 0usize)];
    let mut visited = 0usize;
    while let Some((dir, depth)) = stack.pop() {
        let entries = tree.list(&dir);
        visited = visited.saturating_add(entries.len());
        if visited > MAX_DEVICE_ENTRIES {
            tracing::warn!(dir = %dir.display(), "the device directory holds more than {MAX_DEVICE_ENTRIES} entries; commands are denied the directories not scanned: remove what was put under it");
            out.push(dir);
            out.extend(stack.drain(..).map(|(d, _)| d));
            break;
        }
        for (p, kind) in entries {
            if devices.allowed.iter().any(|d| p.starts_with(d)) {
                continue;
            }
            // Not followed: a symlink (`/dev/fd`, `/dev/disk/by-*/…`) is never a rule source;
            // nor is another filesystem mounted beneath (a mount point, `Kind::Mount`).
            match kind {
                Kind::Dir if depth < 8 => stack.push((p, depth + 1)),
                Kind::BlockDevice => out.push(p),
                Kind::CharDevice if jailed => out.push(p),
                _ => {}
            }
        }
    }
    out
}

/// Grants `access` on `path`, piecewise around the denied paths beneath it. A path at or
/// under a denied path gets nothing (the denylist covers everything under its entries).
fn grant(
    tree: &dyn Tree,
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
    for (child, kind) in tree.list(path) {
        // A symlink is never a rule source: its target would be granted wherever it is.
        if kind == Kind::Symlink {
            continue;
        }
        grant(tree, out, &child, access, denied, depth + 1);
    }
}

/// The plan for `config` (see the module comment), denying `protected` (and the secret
/// paths and device nodes) too. Paths that do not exist are still listed; the ruleset
/// builder skips them.
pub fn plan(config: &Config, protected: &[PathBuf], devices: &Devices) -> Plan {
    plan_in(&HostTree, config, protected, devices)
}

/// [`plan`] over `tree` instead of the host's filesystem.
pub fn plan_in(tree: &dyn Tree, config: &Config, protected: &[PathBuf], devices: &Devices) -> Plan {
    let c = &config.confinement;
    let (full, read_exec) = (full(), read_exec());
    let jailed = !config.fs.host_roots.is_empty();
    let mut denied: Vec<PathBuf> = c
        .secret_paths
        .iter()
        .map(PathBuf::from)
        .chain(protected.iter().cloned())
        .flat_map(|p| {
            let canon = tree.canonicalize(&p).filter(|c| *c != p);
            std::iter::once(p).chain(canon)
        })
        .collect();
    denied.extend(device_nodes(tree, devices, jailed));
    // Every grant path is canonical, like the denied paths it is compared with: a rule is
    // attached to the inode a path resolves to, so a symlinked grant path (`/lib` ->
    // `usr/lib`) compared lexically would grant a denied path beneath its target in full.
    let canonical = |p: &Path| tree.canonicalize(p).unwrap_or_else(|| p.to_path_buf());
    let mut grants = Vec::new();
    if !jailed {
        grant(tree, &mut grants, Path::new("/"), full, &denied, 0);
    } else {
        for r in config.fs.host_roots.iter().chain(c.scratch_paths.iter()) {
            grant(
                tree,
                &mut grants,
                &canonical(Path::new(r)),
                full,
                &denied,
                0,
            );
        }
        for s in &c.system_paths {
            grant(
                tree,
                &mut grants,
                &canonical(Path::new(s)),
                read_exec,
                &denied,
                0,
            );
        }
        for d in &devices.allowed {
            grant(
                tree,
                &mut grants,
                &canonical(d),
                device_rights(),
                &denied,
                0,
            );
        }
    }

    Plan { grants, denied }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A tree of paths and kinds, with symlinks resolved by a table: no root, no disk.
    #[derive(Default)]
    struct Fake {
        entries: BTreeMap<PathBuf, Kind>,
        links: BTreeMap<PathBuf, PathBuf>,
    }

    impl Fake {
        fn with(mut self, p: &str, k: Kind) -> Fake {
            self.entries.insert(PathBuf::from(p), k);
            self
        }
        fn link(mut self, p: &str, to: &str) -> Fake {
            self.entries.insert(PathBuf::from(p), Kind::Symlink);
            self.links.insert(PathBuf::from(p), PathBuf::from(to));
            self
        }
    }

    impl Tree for Fake {
        fn canonicalize(&self, p: &Path) -> Option<PathBuf> {
            Some(
                self.links
                    .get(p)
                    .cloned()
                    .unwrap_or_else(|| p.to_path_buf()),
            )
        }
        fn list(&self, dir: &Path) -> Vec<(PathBuf, Kind)> {
            self.entries
                .iter()
                .filter(|(p, _)| p.parent() == Some(dir))
                .map(|(p, k)| (p.clone(), *k))
                .collect()
        }
    }

    fn dev() -> Fake {
        Fake::default()
            .with("/dev", Kind::Dir)
            .with("/dev/sda", Kind::BlockDevice)
            .with("/dev/tty0", Kind::CharDevice)
            .with("/dev/null", Kind::CharDevice)
            .with("/dev/input", Kind::Dir)
            .with("/dev/input/event0", Kind::CharDevice)
            .link("/dev/disk0", "/dev/sda")
    }

    fn devices() -> Devices {
        Devices {
            dir: PathBuf::from("/dev"),
            allowed: vec![PathBuf::from("/dev/null")],
        }
    }

    fn paths(v: &[(PathBuf, BitFlags<AccessFs>)]) -> Vec<(&str, BitFlags<AccessFs>)> {
        v.iter().map(|(p, a)| (p.to_str().unwrap(), *a)).collect()
    }

    #[test]
    fn jailed_devices_through_the_seam_without_root() {
        let mut c = Config::builtin_default();
        c.fs.host_roots = vec!["/w".into()];
        c.confinement.scratch_paths = vec![];
        c.confinement.system_paths = vec!["/dev".into()];
        c.confinement.secret_paths = vec![];
        let tree = dev().with("/w", Kind::Dir);
        let p = plan_in(&tree, &c, &[], &devices());
        let mut denied: Vec<&str> = p.denied.iter().map(|d| d.to_str().unwrap()).collect();
        denied.sort_unstable();
        // Every block and (jailed) character device but the allowed one; the symlink to a
        // disk is no rule source and is not listed.
        assert_eq!(denied, ["/dev/input/event0", "/dev/sda", "/dev/tty0"]);
        assert_eq!(
            paths(&p.grants),
            [
                ("/w", full()),
                // /dev holds denied nodes: directory operations only, then each sibling.
                ("/dev", dir_ops(read_exec())),
                ("/dev/input", dir_ops(read_exec())),
                ("/dev/null", read_exec()),
                ("/dev/null", device_rights()),
            ]
        );
    }

    /// Another filesystem under the device directory (`/dev/shm`, where commands may put a
    /// million files) is not walked, and a device directory past the entry budget denies the
    /// directories it did not scan, whole.
    #[test]
    fn the_device_scan_skips_other_filesystems_and_fails_closed_past_its_budget() {
        let tree = dev()
            .with("/dev/shm", Kind::Mount)
            .with("/dev/shm/planted", Kind::BlockDevice);
        let mut denied = device_nodes(&tree, &devices(), true);
        denied.sort_unstable();
        assert_eq!(
            denied,
            [
                PathBuf::from("/dev/input/event0"),
                PathBuf::from("/dev/sda"),
                PathBuf::from("/dev/tty0")
            ]
        );
        let mut big = dev().with("/dev/big", Kind::Dir);
        for i in 0..MAX_DEVICE_ENTRIES {
            big = big.with(&format!("/dev/big/f{i}"), Kind::Other);
        }
        let mut denied = device_nodes(&big, &devices(), true);
        denied.sort_unstable();
        // /dev and /dev/input are listed (their nodes denied one by one); the walk stops at
        // the first directory that takes it past the budget and denies it (and every
        // directory still to walk) whole.
        assert_eq!(
            denied,
            [
                PathBuf::from("/dev/big"),
                PathBuf::from("/dev/input/event0"),
                PathBuf::from("/dev/sda"),
                PathBuf::from("/dev/tty0")
            ]
        );
    }

    /// The host's listing reports a directory on another filesystem as a mount point.
    #[test]
    fn the_host_listing_marks_mount_points() {
        let root = HostTree.list(Path::new("/"));
        assert!(
            root.contains(&(PathBuf::from("/proc"), Kind::Mount)),
            "{root:?}"
        );
        assert!(
            root.contains(&(PathBuf::from("/usr"), Kind::Dir))
                || root.contains(&(PathBuf::from("/usr"), Kind::Mount))
        );
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        assert_eq!(HostTree.list(d.path()), [(d.path().join("sub"), Kind::Dir)]);
    }

    #[test]
    fn unjailed_only_block_devices_are_denied_and_symlinked_grants_are_canonical() {
        let mut c = Config::builtin_default();
        c.fs.host_roots = vec![];
        c.confinement.secret_paths = vec!["/etc/shadow".into()];
        let p = plan_in(&dev(), &c, &[], &devices());
        assert_eq!(
            p.denied,
            [PathBuf::from("/etc/shadow"), PathBuf::from("/dev/sda")]
        );
        // Jailed, a root named through a symlink is granted at its target.
        let mut j = Config::builtin_default();
        j.fs.host_roots = vec!["/ws".into()];
        j.confinement.scratch_paths = vec![];
        j.confinement.system_paths = vec![];
        j.confinement.secret_paths = vec![];
        let tree = Fake::default()
            .link("/ws", "/data/ws")
            .with("/data/ws", Kind::Dir);
        let p = plan_in(
            &tree,
            &j,
            &[],
            &Devices {
                dir: "/nodev".into(),
                allowed: vec![],
            },
        );
        assert_eq!(paths(&p.grants), [("/data/ws", full())]);
    }
}
