//! `coder::delete-file`.
//!
//! * A missing path succeeds with `removed: false`; so does a denylisted one (it must read
//!   exactly like a missing one). A path matching `non_accessible_globs` is C211 whether or
//!   not it exists (the match is lexical, so it reveals nothing).
//! * Files, symlinks (the link itself) and empty directories ignore `recursive`; a non-empty
//!   directory needs `recursive: true` (C210 without: coder has no twin of S214).
//! * An allowed root is never deleted (C210).
//! * Recursion is iterative and fd-relative (`openat(O_NOFOLLOW | O_DIRECTORY)` from the
//!   parent's fd, never a path re-resolved), depth-bounded by [`MAX_DEPTH`]. It first checks
//!   the whole subtree and refuses (C211, nothing removed) when any entry in it is denied or
//!   non-accessible: recursion never descends through one.

use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use iii_shell_protocol::coder::*;
use iii_shell_protocol::Code;

use super::edit::{read_entry, EditLocks};
use super::list::names;
use super::paths::{display, CErr, Ctx};
use super::recorder::ChangeRecorder;
use crate::fs::entry::{is_dir, is_file, statat};
use crate::jail::normalize;

/// Deepest directory nesting a recursive delete walks (one descriptor per level).
pub const MAX_DEPTH: usize = 256;

pub fn delete_files(
    ctx: &Ctx<'_>,
    req: &DeleteFileInput,
    locks: &EditLocks,
    changes: &dyn ChangeRecorder,
) -> DeleteFileOutput {
    DeleteFileOutput {
        results: req
            .paths
            .iter()
            .map(
                |p| match delete_one(ctx, p, req.recursive, locks, changes) {
                    Ok((path, removed)) => DeleteFileResult {
                        path,
                        success: true,
                        removed,
                        error: None,
                    },
                    Err((path, e)) => DeleteFileResult {
                        path,
                        success: false,
                        removed: false,
                        error: Some(e.entry()),
                    },
                },
            )
            .collect(),
    }
}

fn delete_one(
    ctx: &Ctx<'_>,
    input: &str,
    recursive: bool,
    locks: &EditLocks,
    changes: &dyn ChangeRecorder,
) -> Result<(String, bool), (String, CErr)> {
    let fail = |e: CErr| (input.to_string(), e);
    let abs = ctx.absolute(input).map_err(fail)?;
    if ctx.is_non_accessible(&normalize(Path::new(&abs))) {
        return Err(fail(CErr::not_found(input)));
    }
    let parent = match ctx.parent(input, false) {
        Ok(p) => p,
        Err(e) if e.code == Code::C211 => return Ok((input.to_string(), false)),
        Err(e) => return Err(fail(e)),
    };
    let path = parent.path.clone();
    let canonical = display(&path);
    let failc = |e: CErr| (canonical.clone(), e);
    if ctx.is_root(&path) {
        return Err(failc(CErr::invalid(format!(
            "refusing to delete an allowed root: {canonical}; delete the entries inside it instead"
        ))));
    }
    if ctx.is_non_accessible(&path) {
        return Err(failc(CErr::not_found(input)));
    }
    let _guard = locks.lock_path(&path);
    let name = parent.c_name();
    let st = match statat(&parent.dir, &name, true) {
        Ok(st) => st,
        // Echo the input, exactly as for a denylisted path (which reads like a missing one).
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok((input.to_string(), false)),
        Err(e) => return Err(failc(CErr::io(format!("stat {input}: {e}")))),
    };
    if !is_dir(&st) {
        let old = if is_file(&st) {
            read_entry(&parent, ctx.max_read()).ok().flatten()
        } else {
            None
        };
        unlink(&parent.dir, &name, 0)
            .map_err(|e| failc(CErr::io(format!("delete {input}: {e}"))))?;
        if let Some(old) = old {
            changes.record(format!("deleted:{canonical}"), canonical.clone(), &old, &[]);
        }
        return Ok((canonical, true));
    }
    match unlink(&parent.dir, &name, libc::AT_REMOVEDIR) {
        Ok(()) => return Ok((canonical, true)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) => {}
        Err(e) => return Err(failc(CErr::io(format!("delete {input}: {e}")))),
    }
    if !recursive {
        return Err(failc(CErr::invalid(format!(
            "directory not empty: {input}; pass recursive: true to delete it with everything inside"
        ))));
    }
    if ctx.policy.jail.holds_denied(&path) {
        return Err(failc(CErr::not_found(input)));
    }
    let dir = open_child_dir(&parent.dir, &name)
        .map_err(|e| failc(CErr::io(format!("open {input}: {e}"))))?;
    // Pass 1: refuse when the subtree holds anything denied or non-accessible.
    walk(&dir, &path, &mut |full: &Path, _, _, _| {
        if ctx.policy.jail.is_denied(full) {
            Err(CErr::not_found(input))
        } else {
            Ok(())
        }
    })
    .map_err(failc)?;
    // Pass 2: remove bottom-up.
    walk(&dir, &path, &mut |_, fd: &OwnedFd, n: &CString, d: bool| {
        let flags = if d { libc::AT_REMOVEDIR } else { 0 };
        unlink(fd, n, flags).map_err(|e| CErr::io(format!("delete {input}: {e}")))
    })
    .map_err(failc)?;
    drop(dir);
    unlink(&parent.dir, &name, libc::AT_REMOVEDIR)
        .map_err(|e| failc(CErr::io(format!("delete {input}: {e}"))))?;
    Ok((canonical, true))
}

fn unlink(dir: &OwnedFd, name: &CString, flags: i32) -> std::io::Result<()> {
    // SAFETY: unlinkat on a directory fd we own with a NUL-terminated name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn open_child_dir(dir: &OwnedFd, name: &CString) -> std::io::Result<OwnedFd> {
    // SAFETY: openat on a directory fd we own; O_NOFOLLOW|O_DIRECTORY refuse a symlink or a
    // non-directory swapped in.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `visit(full path, dir fd, name, is_dir)` of [`walk`].
type Visit<'a> = dyn FnMut(&Path, &OwnedFd, &CString, bool) -> Result<(), CErr> + 'a;

struct Frame {
    fd: OwnedFd,
    path: PathBuf,
    pending: Vec<OsString>,
    /// (name in the parent frame) for the post-order visit.
    name: Option<CString>,
}

/// Post-order, iterative walk of the directory `root` (at canonical `root_path`): calls
/// `visit(full path, dir fd, name, is_dir)` for every entry after its children.
fn walk(root: &OwnedFd, root_path: &Path, visit: &mut Visit<'_>) -> Result<(), CErr> {
    let list = |fd: &OwnedFd| -> Result<Vec<OsString>, CErr> {
        Ok(names(fd)
            .map_err(|e| CErr::io(format!("list: {e}")))?
            .into_iter()
            .map(|(n, _)| n)
            .collect())
    };
    let first = root
        .try_clone()
        .map_err(|e| CErr::io(format!("dup: {e}")))?;
    let mut stack = vec![Frame {
        pending: list(&first)?,
        fd: first,
        path: root_path.to_path_buf(),
        name: None,
    }];
    loop {
        let depth = stack.len();
        let Some(top) = stack.last_mut() else { break };
        let Some(child) = top.pending.pop() else {
            let done = stack.pop().expect("non-empty stack");
            if let (Some(name), Some(parent)) = (done.name, stack.last()) {
                let full = parent
                    .path
                    .join(OsString::from(std::ffi::OsStr::from_bytes(name.as_bytes())));
                visit(&full, &parent.fd, &name, true)?;
            }
            continue;
        };
        let c = CString::new(child.as_bytes()).map_err(|_| CErr::io("bad name"))?;
        let full = top.path.join(&child);
        let st = match statat(&top.fd, &c, true) {
            Ok(st) => st,
            Err(_) => continue,
        };
        if is_dir(&st) {
            if depth >= MAX_DEPTH {
                return Err(CErr::io(format!(
                    "{} is nested deeper than {MAX_DEPTH} levels; delete its deepest folders first",
                    root_path.display()
                )));
            }
            let fd = open_child_dir(&top.fd, &c).map_err(|e| CErr::io(format!("open: {e}")))?;
            let pending = list(&fd)?;
            stack.push(Frame {
                fd,
                path: full,
                pending,
                name: Some(c),
            });
        } else {
            visit(&full, &top.fd, &c, false)?;
        }
    }
    Ok(())
}
