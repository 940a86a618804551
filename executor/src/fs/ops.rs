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

use super::atomic::write_atomic;
use super::entry::{entry, is_dir, is_file, is_symlink, statat};
use crate::error::ExecError;
use crate::jail::{fd_path, fstat, map_errno, open_beneath, Parent};
use crate::policy::Policy;

fn cstr(name: &std::ffi::OsStr) -> Result<CString, ExecError> {
    CString::new(name.as_encoded_bytes())
        .map_err(|_| ExecError::Invalid("path contains a NUL byte".into()))
}

fn display(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Refuses special mode bits unless the policy allows them (the broker checked too).
fn check_mode(policy: &Policy, mode: u32) -> Result<(), ExecError> {
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
fn follow(policy: &Policy, path: &Path) -> Option<libc::stat> {
    let r = policy.jail.resolve(&display(path)).ok()?;
    fstat(&r.fd).ok()
}

pub fn ls(policy: &Policy, input: &str) -> Result<LsResponse, ExecError> {
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
fn not_dir_or_missing(policy: &Policy, input: &str) -> Option<ExecError> {
    let r = policy.jail.resolve(input).ok()?;
    let st = fstat(&r.fd).ok()?;
    (!is_dir(&st)).then(|| ExecError::WrongType(format!("not a directory: {input}")))
}

pub fn stat(policy: &Policy, input: &str) -> Result<FsEntry, ExecError> {
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
    policy: &Policy,
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
    let fd = open_beneath(
        Some(&parent.dir),
        Path::new(&parent.name),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
    )
    .map_err(|e| map_errno(input, e))?;
    // SAFETY: fchmod on a descriptor we own.
    unsafe {
        libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t);
    }
    Ok(MkdirResponse {
        created: true,
        path,
        already_existed: false,
    })
}

pub fn rm(policy: &Policy, input: &str, recursive: bool) -> Result<RmResponse, ExecError> {
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
        if recursive {
            let dir = open_beneath(
                Some(&parent.dir),
                Path::new(&parent.name),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
            )
            .map_err(|e| map_errno(input, e))?;
            empty_dir(policy, &dir, &parent.path, input)?;
        }
        unlinkat(&parent.dir, &name, libc::AT_REMOVEDIR).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => ExecError::NotEmpty(input.to_string()),
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

/// Removes everything inside `dir` (never following symlinks), skipping denied entries.
fn empty_dir(
    policy: &Policy,
    dir: &OwnedFd,
    dir_path: &Path,
    input: &str,
) -> Result<(), ExecError> {
    let listing = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .map_err(|e| map_errno(input, e))?;
    for item in listing.flatten() {
        let name = item.file_name();
        let full = dir_path.join(&name);
        if policy.jail.is_denied(&full) {
            continue;
        }
        let c = cstr(&name)?;
        let Ok(st) = statat(dir, &c, true) else {
            continue;
        };
        if is_dir(&st) {
            let sub = open_beneath(
                Some(dir),
                Path::new(&name),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
            )
            .map_err(|e| map_errno(input, e))?;
            empty_dir(policy, &sub, &full, input)?;
            unlinkat(dir, &c, libc::AT_REMOVEDIR).map_err(|e| match e.raw_os_error() {
                Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => {
                    ExecError::NotEmpty(input.to_string())
                }
                _ => map_errno(input, e),
            })?;
        } else {
            unlinkat(dir, &c, 0).map_err(|e| map_errno(input, e))?;
        }
    }
    Ok(())
}

pub fn chmod(
    policy: &Policy,
    input: &str,
    mode: u32,
    uid: Option<u32>,
    gid: Option<u32>,
    recursive: bool,
) -> Result<ChmodResponse, ExecError> {
    check_mode(policy, mode)?;
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
    let mut changed = 0u64;
    change(&fd, mode, uid, gid).map_err(|e| map_errno(input, e))?;
    changed += 1;
    if recursive && fstat(&fd).is_ok_and(|st| is_dir(&st)) {
        let dir = open_beneath(
            Some(&fd),
            Path::new("."),
            libc::O_RDONLY | libc::O_DIRECTORY,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
        )
        .map_err(|e| map_errno(input, e))?;
        changed += chmod_tree(policy, &dir, &path, mode, uid, gid);
    }
    Ok(ChmodResponse {
        entries_changed: changed,
        path: display(&path),
        recursive,
    })
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

/// Applies the change to everything under `dir`; symlinks are skipped, never followed.
fn chmod_tree(
    policy: &Policy,
    dir: &OwnedFd,
    dir_path: &Path,
    mode: u32,
    uid: Option<u32>,
    gid: Option<u32>,
) -> u64 {
    let mut n = 0;
    let Ok(listing) = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
        return 0;
    };
    for item in listing.flatten() {
        let name = item.file_name();
        let full = dir_path.join(&name);
        if policy.jail.is_denied(&full) {
            continue;
        }
        let Ok(c) = cstr(&name) else { continue };
        let Ok(st) = statat(dir, &c, true) else {
            continue;
        };
        if is_symlink(&st) {
            continue;
        }
        let flags = if is_dir(&st) {
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW
        } else {
            libc::O_PATH | libc::O_NOFOLLOW
        };
        let Ok(fd) = open_beneath(
            Some(dir),
            Path::new(&name),
            flags,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
        ) else {
            continue;
        };
        if fstat(&fd).map_or(true, |st| is_symlink(&st)) {
            continue; // swapped for a link since the lstat above
        }
        if change(&fd, mode, uid, gid).is_ok() {
            n += 1;
        }
        if is_dir(&st) {
            n += chmod_tree(policy, &fd, &full, mode, uid, gid);
        }
    }
    n
}

pub fn mv(policy: &Policy, src: &str, dst: &str, overwrite: bool) -> Result<MvResponse, ExecError> {
    let from = policy.jail.parent(src, false)?;
    if policy.jail.is_root(&from.path) {
        return Err(ExecError::Invalid(format!(
            "refusing to move a jail root: {src}"
        )));
    }
    // Moving an ancestor of a denylisted path would expose it under a new name.
    if policy.jail.holds_denied(&from.path) {
        return Err(ExecError::NotFound(src.to_string()));
    }
    let to = policy.jail.parent(dst, false)?;
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
pub fn check_write_cap(policy: &Policy, len: u64, path: &str) -> Result<(), ExecError> {
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
    policy: &Policy,
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

pub fn write_inline(policy: &Policy, files: &[WriteFile]) -> Result<WriteResponse, ExecError> {
    for f in files {
        check_write_cap(policy, f.data.len() as u64, &f.path)?;
        check_mode(policy, f.mode)?;
    }
    let mut results = Vec::with_capacity(files.len());
    for f in files {
        let parent = write_target(policy, &f.path, f.mode, f.parents)?;
        let n = write_atomic(&parent, &f.data, f.mode).map_err(|e| echo_input(e, &f.path))?;
        results.push(WriteFileResult {
            path: display(&parent.path),
            bytes_written: n,
        });
    }
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
    policy: &Policy,
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
