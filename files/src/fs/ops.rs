//! `ls`, `stat`, `mkdir`, `rm`, `chmod`, `mv` and inline `write`: each one resolves the
//! containing directory through the jail and then acts with `*at` system calls on the last
//! component, so nothing between the check and the act can redirect it.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use iii_shell_protocol::fs::{
    ChmodResponse, FsEntry, LsResponse, MkdirResponse, MvResponse, RmResponse, WriteFile,
    WriteFileResult, WriteResponse,
};

use std::os::unix::ffi::OsStrExt;

use super::atomic::{install_all, BatchFailure, TempFile};
use super::entry::{entry, is_dir, is_file, is_symlink, statat};
use super::keep::Replaced;
pub use super::rights::OwnerRights;
use super::walk::{walk, Node, Visitor, MAX_TREE_DEPTH};
use crate::error::ExecError;
use crate::jail::{fd_path, fstat, map_errno, open_beneath, Parent};
use crate::FsPolicy;

fn cstr(name: &std::ffi::OsStr) -> Result<CString, ExecError> {
    CString::new(name.as_encoded_bytes())
        .map_err(|_| ExecError::Invalid("path contains a NUL byte".into()))
}

pub(crate) fn display(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Refuses special mode bits unless the policy allows them (the broker checked too).
fn check_mode(policy: &FsPolicy, mode: u32) -> Result<(), ExecError> {
    if mode > 0o7777 {
        return Err(ExecError::Invalid(format!("bad octal mode {mode:o}")));
    }
    if mode & 0o7000 != 0 && !policy.config.fs.allow_special_bits {
        return Err(ExecError::Invalid(format!(
            "mode {mode:04o} carries setuid/setgid/sticky bits, which fs.allow_special_bits does not permit"
        )));
    }
    Ok(())
}

/// The metadata of the entry a symlink leads to, when it resolves inside the jail.
fn follow(policy: &FsPolicy, path: &Path) -> Option<libc::stat> {
    let r = policy.jail.resolve(&display(path)).ok()?;
    fstat(&r.fd).ok()
}

pub fn ls(policy: &FsPolicy, input: &str) -> Result<LsResponse, ExecError> {
    let dir = policy
        .jail
        .resolve_with(input, libc::O_RDONLY | libc::O_DIRECTORY)
        .map_err(|e| match e {
            ExecError::NotFound(_) => not_dir_or_missing(policy, input).unwrap_or(e),
            other => other,
        })?;
    let mut entries = Vec::new();
    let listing = std::fs::read_dir(format!("/proc/self/fd/{}", dir.fd.as_raw_fd()))
        .map_err(|e| map_errno(input, e))?;
    for item in listing.flatten() {
        let name = item.file_name();
        let full = dir.path.join(&name);
        if policy.jail.is_denied(&full) {
            continue;
        }
        let Ok(c) = cstr(&name) else { continue };
        let Ok(lst) = statat(&dir.fd, &c, true) else {
            continue;
        };
        let target = if is_symlink(&lst) {
            follow(policy, &full)
        } else {
            None
        };
        entries.push(entry(
            name.to_string_lossy().into_owned(),
            &lst,
            target.as_ref(),
        ));
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(LsResponse { entries })
}

/// S212 when `input` exists but is not a directory, so `ls` on a file says so.
fn not_dir_or_missing(policy: &FsPolicy, input: &str) -> Option<ExecError> {
    let r = policy.jail.resolve(input).ok()?;
    let st = fstat(&r.fd).ok()?;
    (!is_dir(&st)).then(|| ExecError::WrongType(format!("not a directory: {input}")))
}

pub fn stat(policy: &FsPolicy, input: &str) -> Result<FsEntry, ExecError> {
    // A trailing slash asks for a directory (following a final symlink, as POSIX does).
    if input.len() > 1 && input.ends_with('/') {
        // The kernel says ENOTDIR for `file/`, which would read as missing: resolve the path
        // without the slash and judge the type here.
        let bare = input.trim_end_matches('/');
        let bare = if bare.is_empty() { "/" } else { bare };
        let r = policy
            .jail
            .resolve(bare)
            .map_err(|e| echo_input(e, input))?;
        let st = fstat(&r.fd).map_err(|e| map_errno(input, e))?;
        if !is_dir(&st) {
            return Err(ExecError::WrongType(format!("not a directory: {input}")));
        }
    }
    match policy.jail.parent(input, false) {
        Ok(parent) => {
            let lst =
                statat(&parent.dir, &parent.c_name(), true).map_err(|e| map_errno(input, e))?;
            let target = if is_symlink(&lst) {
                follow(policy, &parent.path)
            } else {
                None
            };
            Ok(entry(
                parent.name.to_string_lossy().into_owned(),
                &lst,
                target.as_ref(),
            ))
        }
        // A root (or `/`) has no parent inside the jail: stat it directly.
        Err(ExecError::Invalid(_)) => {
            let r = policy.jail.resolve(input)?;
            let st = fstat(&r.fd).map_err(|e| map_errno(input, e))?;
            let name = r
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "/".into());
            Ok(entry(name, &st, None))
        }
        Err(e) => Err(e),
    }
}

pub fn mkdir(
    policy: &FsPolicy,
    input: &str,
    mode: u32,
    parents: bool,
) -> Result<MkdirResponse, ExecError> {
    check_mode(policy, mode)?;
    let parent = policy.jail.parent(input, parents)?;
    let name = parent.c_name();
    // SAFETY: mkdirat on a directory fd we own with a NUL-terminated name.
    let rc = unsafe { libc::mkdirat(parent.dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) };
    let path = display(&parent.path);
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EEXIST) {
            let st = statat(&parent.dir, &name, true).map_err(|e| map_errno(input, e))?;
            if parents && is_dir(&st) {
                return Ok(MkdirResponse {
                    created: false,
                    path,
                    already_existed: true,
                });
            }
            return Err(ExecError::Exists(input.to_string()));
        }
        return Err(map_errno(input, e));
    }
    // The umask may have narrowed the mode: set it exactly, on the directory we just made.
    // O_PATH needs no permission on the directory itself, so a mode without owner read
    // (0000, 0300, ...) still gets here; the directory exists now, so this is `created`.
    let fd = open_beneath(
        Some(&parent.dir),
        Path::new(&parent.name),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
    )
    .map_err(|e| map_errno(input, e))?;
    if let Err(e) = change(&fd, mode, None, None) {
        tracing::warn!(path = %path, error = %e, "mkdir: could not set the exact mode; the umask's mode stays");
    }
    Ok(MkdirResponse {
        created: true,
        path,
        already_existed: false,
    })
}

pub fn rm(policy: &FsPolicy, input: &str, recursive: bool) -> Result<RmResponse, ExecError> {
    let parent = match policy.jail.parent(input, false) {
        Ok(p) => p,
        Err(ExecError::Invalid(m))
            if policy
                .jail
                .resolve(input)
                .is_ok_and(|r| policy.jail.is_root(&r.path)) =>
        {
            let _ = m;
            return Err(ExecError::Invalid(format!(
                "refusing to remove a jail root: {input}"
            )));
        }
        Err(e) => return Err(e),
    };
    if policy.jail.is_root(&parent.path) {
        return Err(ExecError::Invalid(format!(
            "refusing to remove a jail root: {input}"
        )));
    }
    let name = parent.c_name();
    let st = statat(&parent.dir, &name, true).map_err(|e| map_errno(input, e))?;
    if is_dir(&st) {
        let dir = || {
            open_beneath(
                Some(&parent.dir),
                Path::new(&parent.name),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
            )
            .map_err(|e| map_errno(input, e))
        };
        let mut kept = false;
        if recursive {
            // Protected entries (denylisted, non-accessible) are skipped silently, as the walks
            // of grep, sed and chmod skip them: the rest of the tree goes, and the directories
            // that still hold a protected entry stay.
            // Scan first: a tree deeper than the walk's bound is refused (S218) before
            // anything is deleted.
            walk(
                dir()?,
                &parent.path,
                input,
                MAX_TREE_DEPTH,
                &mut RmScan { policy },
            )?;
            let mut delete = RmDelete {
                policy,
                input,
                kept: false,
            };
            walk(dir()?, &parent.path, input, MAX_TREE_DEPTH, &mut delete)?;
            kept = delete.kept;
        }
        if kept {
            // The directory still holds what the caller cannot see: it stays, and the answer
            // says so without naming anything in it.
            return Ok(RmResponse {
                removed: false,
                path: display(&parent.path),
                was_present: true,
            });
        }
        unlinkat(&parent.dir, &name, libc::AT_REMOVEDIR).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => {
                // Only hidden entries left (non-recursive): say no more than "not accessible".
                if only_hidden(policy, dir, &parent.path) {
                    ExecError::NotFound(input.to_string())
                } else {
                    ExecError::NotEmpty(input.to_string())
                }
            }
            _ => map_errno(input, e),
        })?;
    } else {
        unlinkat(&parent.dir, &name, 0).map_err(|e| map_errno(input, e))?;
    }
    Ok(RmResponse {
        removed: true,
        path: display(&parent.path),
        was_present: true,
    })
}

fn unlinkat(dir: &OwnedFd, name: &CStr, flags: i32) -> std::io::Result<()> {
    // SAFETY: unlinkat on a directory fd we own with a NUL-terminated name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// True when the directory still holds entries and every one of them is hidden.
fn only_hidden(
    policy: &FsPolicy,
    dir: impl Fn() -> Result<OwnedFd, ExecError>,
    dir_path: &Path,
) -> bool {
    let Ok(fd) = dir() else { return false };
    let Ok(listing) = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
        return false;
    };
    let mut any = false;
    for item in listing.flatten() {
        if !policy.jail.is_denied(&dir_path.join(item.file_name())) {
            return false;
        }
        any = true;
    }
    any
}

/// The first pass of `rm -r`: walks the tree (not entering protected entries) so that one
/// past the depth bound fails before anything is deleted.
struct RmScan<'a> {
    policy: &'a FsPolicy,
}

impl Visitor for RmScan<'_> {
    fn enter(&mut self, n: &Node<'_>) -> Result<bool, ExecError> {
        Ok(!self.policy.jail.is_denied(n.path))
    }
    fn leave(&mut self, _n: &Node<'_>) -> Result<(), ExecError> {
        Ok(())
    }
}

/// The second pass of `rm -r`: deletes children before their directory. A protected entry is skipped (not
/// entered, not deleted) and marks `kept`; a directory left non-empty by it stays.
struct RmDelete<'a> {
    policy: &'a FsPolicy,
    input: &'a str,
    /// A protected entry was skipped, so its ancestors stay.
    kept: bool,
}

impl Visitor for RmDelete<'_> {
    fn enter(&mut self, n: &Node<'_>) -> Result<bool, ExecError> {
        if self.policy.jail.is_denied(n.path) {
            self.kept = true;
            return Ok(false);
        }
        Ok(true)
    }
    fn leave(&mut self, n: &Node<'_>) -> Result<(), ExecError> {
        if self.policy.jail.is_denied(n.path) {
            self.kept = true;
            return Ok(());
        }
        let flags = if is_dir(n.st) { libc::AT_REMOVEDIR } else { 0 };
        match unlinkat(n.dir, n.name, flags) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            Err(e) => Err(match e.raw_os_error() {
                // Left holding a skipped protected entry: it stays, silently.
                Some(libc::ENOTEMPTY) | Some(libc::EEXIST) if self.kept => return Ok(()),
                Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => {
                    ExecError::NotEmpty(self.input.to_string())
                }
                _ => map_errno(self.input, e),
            }),
        }
    }
}

pub fn chmod(
    policy: &FsPolicy,
    input: &str,
    mode: u32,
    uid: Option<u32>,
    gid: Option<u32>,
    recursive: bool,
) -> Result<ChmodResponse, ExecError> {
    check_mode(policy, mode)?;
    iii_shell_policy::mode::check_owner_ids(uid, gid)?;
    let (fd, path) = match policy.jail.parent(input, false) {
        Ok(parent) => {
            let st =
                statat(&parent.dir, &parent.c_name(), true).map_err(|e| map_errno(input, e))?;
            if is_symlink(&st) {
                return Err(ExecError::WrongType(format!(
                    "is a symlink (chmod does not follow links): {input}"
                )));
            }
            let fd = open_beneath(
                Some(&parent.dir),
                Path::new(&parent.name),
                libc::O_PATH | libc::O_NOFOLLOW,
                libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
            )
            .map_err(|e| map_errno(input, e))?;
            // O_PATH|O_NOFOLLOW hands back the link itself if one was swapped in since the
            // lstat above: still refuse it.
            if fstat(&fd).is_ok_and(|st| is_symlink(&st)) {
                return Err(ExecError::WrongType(format!(
                    "is a symlink (chmod does not follow links): {input}"
                )));
            }
            (fd, parent.path)
        }
        Err(ExecError::Invalid(_)) => {
            let r = policy.jail.resolve(input)?;
            (r.fd, r.path)
        }
        Err(e) => return Err(e),
    };
    check_owner(uid, gid, &OwnerRights::current())?;
    let is_directory = fstat(&fd).is_ok_and(|st| is_dir(&st));
    if !(recursive && is_directory) {
        change(&fd, mode, uid, gid).map_err(|e| map_errno(input, e))?;
        return Ok(ChmodResponse {
            entries_changed: 1,
            path: display(&path),
            recursive,
        });
    }
    let dir = || {
        open_beneath(
            Some(&fd),
            Path::new("."),
            libc::O_RDONLY | libc::O_DIRECTORY,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
        )
        .map_err(|e| map_errno(input, e))
    };
    // A change after which the executor can still read and search a directory is applied
    // to it before its children (so a tree that was closed can be opened again); one that
    // takes that away (mode 0000, or a chown to another owner) after its children, so they
    // can still be reached when it is applied. Decided per directory (`keeps_access`).
    let rights = OwnerRights::current();
    let root_st = fstat(&fd).map_err(|e| map_errno(input, e))?;
    let pre_order = keeps_access(&root_st, mode, uid, gid, &rights);
    let mut changed = 0u64;
    let mut root_done = false;
    if pre_order && dir().is_err() {
        // A closed root can only be walked once it is open again.
        change(&fd, mode, uid, gid).map_err(|e| map_errno(input, e))?;
        changed += 1;
        root_done = true;
    }
    // Scan first, so a tree past the depth bound is refused before anything changes (what a
    // closed directory holds is only seen once the change below has opened it).
    walk(
        dir()?,
        &path,
        input,
        MAX_TREE_DEPTH,
        &mut ChmodTree::scan(policy, &rights),
    )?;
    // Walk before changing the root when the change closes it to us; the walk's own fd
    // is opened now, while the root is still open.
    let tree_fd = dir()?;
    if pre_order && !root_done {
        change(&fd, mode, uid, gid).map_err(|e| map_errno(input, e))?;
        changed += 1;
    }
    let mut tree = ChmodTree {
        policy,
        rights: &rights,
        change: Some((mode, uid, gid)),
        changed: 0,
    };
    walk(tree_fd, &path, input, MAX_TREE_DEPTH, &mut tree)?;
    changed += tree.changed;
    if !pre_order {
        change(&fd, mode, uid, gid).map_err(|e| map_errno(input, e))?;
        changed += 1;
    }
    Ok(ChmodResponse {
        entries_changed: changed,
        path: display(&path),
        recursive,
    })
}

/// Whether a chown to `uid`/`gid` can succeed, decided before anything is changed: without
/// `CAP_CHOWN` (the executor holds it only when `confinement.capabilities` names it) the
/// owner can only stay the executor's own user and the group become one of its groups.
pub fn check_owner(uid: Option<u32>, gid: Option<u32>, r: &OwnerRights) -> Result<(), ExecError> {
    if r.cap_chown {
        return Ok(());
    }
    if let Some(u) = uid.filter(|&u| u != r.euid) {
        return Err(ExecError::Invalid(format!(
            "cannot give files to uid {u}: the executor does not hold CAP_CHOWN (add it to confinement.capabilities to allow chown); nothing was changed"
        )));
    }
    if let Some(g) = gid.filter(|&g| g != r.egid && !r.groups.contains(&g)) {
        return Err(ExecError::Invalid(format!(
            "cannot give files to gid {g}: it is not one of the executor's groups and the executor does not hold CAP_CHOWN (add it to confinement.capabilities to allow chown); nothing was changed"
        )));
    }
    Ok(())
}

/// Whether the executor can still list and search a directory (`st`) once `mode`, `uid`
/// and `gid` are applied to it: by the owner bits when it will own it, else by the group
/// bits when the group is one of its own, else by the other bits.
pub fn keeps_access(
    st: &libc::stat,
    mode: u32,
    uid: Option<u32>,
    gid: Option<u32>,
    r: &OwnerRights,
) -> bool {
    let owner = uid.unwrap_or(st.st_uid);
    let group = gid.unwrap_or(st.st_gid);
    let need = if owner == r.euid {
        0o500
    } else if group == r.egid || r.groups.contains(&group) {
        0o050
    } else {
        0o005
    };
    mode & need == need
}

/// The recursive part of `chmod`: a scan (`change: None`) or the change itself. Symlinks and
/// hidden entries are skipped, never followed; hidden directories are not entered.
struct ChmodTree<'a> {
    policy: &'a FsPolicy,
    rights: &'a OwnerRights,
    change: Option<(u32, Option<u32>, Option<u32>)>,
    changed: u64,
}

impl<'a> ChmodTree<'a> {
    fn scan(policy: &'a FsPolicy, rights: &'a OwnerRights) -> ChmodTree<'a> {
        ChmodTree {
            policy,
            rights,
            change: None,
            changed: 0,
        }
    }

    fn apply(&mut self, fd: &OwnedFd) {
        if let Some((mode, uid, gid)) = self.change {
            if change(fd, mode, uid, gid).is_ok() {
                self.changed += 1;
            }
        }
    }

    /// Whether this directory is changed before its children.
    fn first(&self, st: &libc::stat) -> bool {
        self.change
            .is_some_and(|(mode, uid, gid)| keeps_access(st, mode, uid, gid, self.rights))
    }

    fn open_dir_path(n: &Node<'_>) -> Option<OwnedFd> {
        open_beneath(
            Some(n.dir),
            Path::new(std::ffi::OsStr::from_bytes(n.name.as_bytes())),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
        )
        .ok()
    }
}

impl Visitor for ChmodTree<'_> {
    /// A directory that cannot be entered is changed itself and not walked, as before; the
    /// scan cannot see into it.
    fn unreadable(&mut self, n: &Node<'_>, _e: ExecError) -> Result<(), ExecError> {
        if self.change.is_some() && !self.first(n.st) {
            if let Some(fd) = Self::open_dir_path(n) {
                self.apply(&fd);
            }
        }
        Ok(())
    }

    fn enter(&mut self, n: &Node<'_>) -> Result<bool, ExecError> {
        if self.policy.jail.is_denied(n.path) {
            return Ok(false);
        }
        if self.first(n.st) {
            if let Some(fd) = Self::open_dir_path(n) {
                self.apply(&fd);
            }
        }
        Ok(true)
    }

    fn leave(&mut self, n: &Node<'_>) -> Result<(), ExecError> {
        if self.change.is_none() || is_symlink(n.st) || self.policy.jail.is_denied(n.path) {
            return Ok(());
        }
        if let Some(own) = n.own {
            if !self.first(n.st) {
                self.apply(own);
            }
            return Ok(());
        }
        let Ok(fd) = open_beneath(
            Some(n.dir),
            Path::new(std::ffi::OsStr::from_bytes(n.name.as_bytes())),
            libc::O_PATH | libc::O_NOFOLLOW,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
        ) else {
            return Ok(());
        };
        if fstat(&fd).map_or(true, |st| is_symlink(&st)) {
            return Ok(()); // swapped for a link since the lstat
        }
        self.apply(&fd);
        Ok(())
    }
}

/// chmod/chown through an `O_PATH` fd: `/proc/self/fd/N` names the inode itself, so no
/// symlink is followed.
fn change(fd: &OwnedFd, mode: u32, uid: Option<u32>, gid: Option<u32>) -> std::io::Result<()> {
    let p = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: chmod of a NUL-terminated path naming our own open descriptor.
    if unsafe { libc::chmod(p.as_ptr(), mode as libc::mode_t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if uid.is_some() || gid.is_some() {
        let u = uid.map(|u| u as libc::uid_t).unwrap_or(libc::uid_t::MAX);
        let g = gid.map(|g| g as libc::gid_t).unwrap_or(libc::gid_t::MAX);
        // SAFETY: fchownat with AT_EMPTY_PATH acts on the descriptor itself.
        if unsafe { libc::fchownat(fd.as_raw_fd(), c"".as_ptr(), u, g, libc::AT_EMPTY_PATH) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `parent()` of a path that names a jail root fails as "does not name an entry"; say what
/// actually happened instead.
fn mv_parent(policy: &FsPolicy, input: &str) -> Result<Parent, ExecError> {
    let roots_cannot_move = || {
        ExecError::Invalid(format!(
            "{input} is a jail root, and jail roots cannot be moved or replaced; move the entries inside it instead"
        ))
    };
    match policy.jail.parent(input, false) {
        Ok(p) if policy.jail.is_root(&p.path) => Err(roots_cannot_move()),
        Ok(p) => Ok(p),
        Err(ExecError::Invalid(_))
            if policy
                .jail
                .resolve(input)
                .is_ok_and(|r| policy.jail.is_root(&r.path)) =>
        {
            Err(roots_cannot_move())
        }
        Err(e) => Err(e),
    }
}

pub fn mv(
    policy: &FsPolicy,
    src: &str,
    dst: &str,
    overwrite: bool,
) -> Result<MvResponse, ExecError> {
    let from = mv_parent(policy, src)?;
    // Moving an ancestor of a denylisted path would expose it under a new name.
    if policy.jail.holds_denied(&from.path) {
        return Err(ExecError::NotFound(src.to_string()));
    }
    let to = mv_parent(policy, dst)?;
    let (fc, tc) = (from.c_name(), to.c_name());
    statat(&from.dir, &fc, true).map_err(|e| map_errno(src, e))?;
    let existed = statat(&to.dir, &tc, true).is_ok();
    if existed && !overwrite {
        return Err(ExecError::Exists(dst.to_string()));
    }
    let flags = if overwrite { 0 } else { libc::RENAME_NOREPLACE };
    // SAFETY: renameat2 between two directory fds we own, with NUL-terminated names.
    let rc = unsafe {
        libc::renameat2(
            from.dir.as_raw_fd(),
            fc.as_ptr(),
            to.dir.as_raw_fd(),
            tc.as_ptr(),
            flags,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EEXIST) => ExecError::Exists(dst.to_string()),
            Some(libc::ENOTEMPTY) => ExecError::NotEmpty(dst.to_string()),
            Some(libc::EISDIR) | Some(libc::ENOTDIR) => {
                ExecError::WrongType(format!("cannot replace {dst}: wrong file type"))
            }
            Some(libc::EXDEV) => {
                ExecError::Internal(format!("cannot move {src} to {dst}: different filesystems"))
            }
            Some(libc::EINVAL) => {
                ExecError::Invalid(format!("cannot move {src} into itself ({dst})"))
            }
            _ => map_errno(src, e),
        });
    }
    Ok(MvResponse {
        moved: true,
        src: display(&from.path),
        dst: display(&to.path),
        overwrote: existed,
    })
}

/// Re-words a not-found error with the caller's own path, so a denied write reads exactly
/// like one to a missing path.
pub fn echo_input(e: ExecError, input: &str) -> ExecError {
    match e {
        ExecError::NotFound(_) => ExecError::NotFound(input.to_string()),
        other => other,
    }
}

/// The cap check shared by every write form.
pub fn check_write_cap(policy: &FsPolicy, len: u64, path: &str) -> Result<(), ExecError> {
    let cap = policy.config.fs.max_write_bytes;
    if cap > 0 && len > cap {
        return Err(ExecError::TooLarge(format!(
            "{path}: {len} bytes exceed fs.max_write_bytes ({cap})"
        )));
    }
    Ok(())
}

/// Resolves a write target: its parent (created when `parents`), refusing directories.
pub fn write_target(
    policy: &FsPolicy,
    path: &str,
    mode: u32,
    parents: bool,
) -> Result<Parent, ExecError> {
    check_mode(policy, mode)?;
    let parent = policy.jail.parent(path, parents)?;
    match statat(&parent.dir, &parent.c_name(), true) {
        Ok(st) if is_dir(&st) => {
            return Err(ExecError::WrongType(format!("is a directory: {path}")))
        }
        // A name over NAME_MAX would only fail at the final rename, as an I/O error.
        Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => return Err(map_errno(path, e)),
        _ => {}
    }
    Ok(parent)
}

/// Says which entry of a batch failed (a single write keeps its message as it is). A
/// not-found or escape already names the entry's own path, in the wording shared with
/// missing paths.
pub(crate) fn name_entry(e: ExecError, i: usize, n: usize, path: &str) -> ExecError {
    if n == 1 {
        return e;
    }
    let at = |m: String| format!("files[{i}] ({path}): {m}; no file was written");
    match e {
        ExecError::Invalid(m) => ExecError::Invalid(at(m)),
        ExecError::WrongType(m) => ExecError::WrongType(at(m)),
        ExecError::TooLarge(m) => ExecError::TooLarge(at(m)),
        ExecError::Internal(m) => ExecError::Internal(at(m)),
        other => other,
    }
}

/// A temp file for a write to the parent's entry with the caller's `mode`; an existing
/// regular file there is replaced keeping its owner, group and ACL ([`Replaced`]).
pub fn temp_for(parent: &Parent, mode: u32) -> Result<TempFile, ExecError> {
    let keep = Replaced::of_entry(parent)?.map(|old| old.keep_with_mode(mode));
    Ok(TempFile::create(parent, mode)?.keeping(keep))
}

/// The error of a batch whose entry `f.index` (the caller's `input`) failed while it was
/// renamed into place: named as any entry's error when every earlier entry was put back,
/// else saying which targets keep the batch's content (S216).
pub(crate) fn batch_error(f: BatchFailure, n: usize, input: &str) -> ExecError {
    let e = echo_input(f.error, input);
    if f.not_restored.is_empty() {
        return name_entry(e, f.index, n, input);
    }
    ExecError::Internal(format!(
        "files[{}] ({input}): {e}; the entries before it could not all be put back: {}",
        f.index,
        f.not_restored.join(", ")
    ))
}

/// Inline writes. A batch is all-or-nothing: every entry is validated and staged as a
/// complete, fsynced temp file beside its target before the first rename, so a failing entry
/// leaves every target as it was (the staged temp files are freed); and a rename that fails
/// part-way puts the entries before it back ([`install_all`]).
pub fn write_inline(policy: &FsPolicy, files: &[WriteFile]) -> Result<WriteResponse, ExecError> {
    let n = files.len();
    for (i, f) in files.iter().enumerate() {
        check_write_cap(policy, f.data.len() as u64, &f.path)
            .map_err(|e| name_entry(e, i, n, &f.path))?;
        check_mode(policy, f.mode).map_err(|e| name_entry(e, i, n, &f.path))?;
    }
    let mut paths = Vec::with_capacity(n);
    let mut temps = Vec::with_capacity(n);
    for (i, f) in files.iter().enumerate() {
        let stage = || {
            let parent = write_target(policy, &f.path, f.mode, f.parents)?;
            let mut t = temp_for(&parent, f.mode)?;
            t.write(&f.data)?;
            t.stage()?;
            Ok::<_, ExecError>((display(&parent.path), t))
        };
        let (path, t) = stage()
            .map_err(|e| echo_input(e, &f.path))
            .map_err(|e| name_entry(e, i, n, &f.path))?;
        paths.push(path);
        temps.push(t);
    }
    let written = match (temps.pop(), temps.is_empty()) {
        (Some(t), true) => vec![t.commit().map_err(|e| echo_input(e, &files[0].path))?],
        (last, _) => {
            temps.extend(last);
            install_all(temps).map_err(|f| {
                let input = files.get(f.index).map_or("", |x| x.path.as_str());
                batch_error(f, n, input)
            })?
        }
    };
    let mut results: Vec<WriteFileResult> = paths
        .into_iter()
        .zip(written)
        .map(|(path, bytes_written)| WriteFileResult {
            path,
            bytes_written,
        })
        .collect();
    Ok(match results.len() {
        1 => {
            let r = results.remove(0);
            WriteResponse {
                bytes_written: r.bytes_written,
                path: r.path,
                files: Vec::new(),
            }
        }
        _ => WriteResponse {
            bytes_written: results.iter().map(|r| r.bytes_written).sum(),
            path: String::new(),
            files: results,
        },
    })
}

/// Opens a file for `read`/`read-bytes`: a regular file inside the jail, under the cap.
pub fn open_for_read(
    policy: &FsPolicy,
    input: &str,
    enforce_cap: bool,
) -> Result<(std::fs::File, libc::stat, std::path::PathBuf), ExecError> {
    let r = policy
        .jail
        .resolve_with(input, libc::O_RDONLY | libc::O_NONBLOCK)?;
    let st = fstat(&r.fd).map_err(|e| map_errno(input, e))?;
    if is_dir(&st) {
        return Err(ExecError::WrongType(format!("is a directory: {input}")));
    }
    if !is_file(&st) {
        return Err(ExecError::WrongType(format!("not a regular file: {input}")));
    }
    let cap = policy.config.fs.max_read_bytes;
    if enforce_cap && cap > 0 && st.st_size as u64 > cap {
        return Err(ExecError::TooLarge(format!(
            "{input}: {} bytes exceed fs.max_read_bytes ({cap})",
            st.st_size
        )));
    }
    let path = fd_path(&r.fd).unwrap_or(r.path);
    Ok((std::fs::File::from(r.fd), st, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_changes_without_cap_chown() {
        let r = OwnerRights {
            euid: 1000,
            egid: 100,
            groups: vec![100, 27],
            cap_chown: false,
        };
        assert!(check_owner(None, None, &r).is_ok());
        assert!(check_owner(Some(1000), Some(100), &r).is_ok());
        assert!(check_owner(None, Some(27), &r).is_ok());
        for (u, g) in [(Some(0), None), (Some(1001), Some(100)), (None, Some(0))] {
            let e = check_owner(u, g, &r).unwrap_err();
            assert!(matches!(e, ExecError::Invalid(_)), "{u:?} {g:?}");
            assert!(e.to_string().contains("CAP_CHOWN"), "{e}");
        }
        let with_cap = OwnerRights {
            cap_chown: true,
            ..r
        };
        assert!(check_owner(Some(0), Some(0), &with_cap).is_ok());
    }

    #[test]
    fn access_after_a_change() {
        let r = OwnerRights {
            euid: 0,
            egid: 0,
            groups: vec![],
            cap_chown: true,
        };
        // SAFETY: all-zero is a valid stat (plain integers).
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        st.st_uid = 0;
        st.st_gid = 0;
        assert!(keeps_access(&st, 0o700, None, None, &r));
        assert!(keeps_access(&st, 0o500, None, None, &r));
        assert!(!keeps_access(&st, 0o300, None, None, &r));
        assert!(!keeps_access(&st, 0o000, None, None, &r));
        // Given away: only the group or other bits count then.
        assert!(!keeps_access(&st, 0o750, Some(4321), Some(8765), &r));
        assert!(keeps_access(&st, 0o750, Some(4321), None, &r));
        assert!(keeps_access(&st, 0o705, Some(4321), Some(8765), &r));
        st.st_uid = 4321;
        assert!(keeps_access(&st, 0o700, Some(0), None, &r));
        assert!(!keeps_access(&st, 0o700, None, Some(1), &r));
    }
}
