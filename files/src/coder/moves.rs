//! `coder::move`.
//!
//! * Same root: one `renameat2` between the two parent fds (`RENAME_NOREPLACE` unless
//!   `overwrite`, so a destination that appears meanwhile is never replaced).
//! * Across roots (or across filesystems when unjailed): regular files only. The file is
//!   copied with its mode and owner through an atomic commit, then the source is unlinked;
//!   when the unlink fails the copy is removed again. A directory is C210.
//! * `from` and `to` naming the same file is a no-op (`moved: false`). A root cannot be
//!   moved (C210); an existing directory at `to` is C210 naming `to/<basename>`; an existing
//!   file without `overwrite` is C213.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use iii_shell_protocol::coder::*;
use iii_shell_protocol::Code;

use super::edit::commit;
use super::edit::{read_entry, EditLocks};
use super::paths::{display, CErr, Ctx};
use crate::fs::entry::{is_dir, is_file, statat};
use crate::fs::keep::Replaced;
use crate::jail::{fstat, normalize};

type Fail = (String, String, CErr);

pub fn move_files(ctx: &Ctx<'_>, req: &MoveFileInput, locks: &EditLocks) -> MoveFileOutput {
    MoveFileOutput {
        results: req
            .files
            .iter()
            .map(|f| match move_one(ctx, f, locks) {
                Ok((from, to, moved)) => MoveFileResult {
                    from,
                    to,
                    moved,
                    success: true,
                    error: None,
                },
                Err((from, to, e)) => MoveFileResult {
                    from,
                    to,
                    moved: false,
                    success: false,
                    error: Some(e.entry()),
                },
            })
            .collect(),
    }
}

fn renameat2(
    a: &OwnedFd,
    an: &CString,
    b: &OwnedFd,
    bn: &CString,
    flags: u32,
) -> std::io::Result<()> {
    // SAFETY: renameat2 between two directory fds we own, NUL-terminated names.
    let rc = unsafe {
        libc::renameat2(
            a.as_raw_fd(),
            an.as_ptr(),
            b.as_raw_fd(),
            bn.as_ptr(),
            flags,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn move_one(
    ctx: &Ctx<'_>,
    spec: &MoveFileSpec,
    locks: &EditLocks,
) -> Result<(String, String, bool), Fail> {
    let (from, to) = (spec.from.as_str(), spec.to.as_str());
    let fail = |e: CErr| (from.to_string(), to.to_string(), e);
    for p in [from, to] {
        let abs = ctx.absolute(p).map_err(fail)?;
        if ctx.is_non_accessible(&normalize(Path::new(&abs))) {
            return Err(fail(CErr::not_found(p)));
        }
    }
    let src = ctx.parent(from, false).map_err(fail)?;
    let from_c = display(&src.path);
    let sname = src.c_name();
    let st = statat(&src.dir, &sname, true).map_err(|_| fail(CErr::not_found(from)))?;
    if ctx.is_root(&src.path) {
        return Err(fail(CErr::invalid(format!(
            "refusing to move an allowed root: {from_c}"
        ))));
    }
    if ctx.policy.jail.holds_denied(&src.path) {
        return Err(fail(CErr::not_found(from)));
    }
    // An existing directory at `to` (followed through the jail) is not a target.
    if let Ok(r) = ctx.resolve(to, libc::O_PATH) {
        if let Ok(tst) = fstat(&r.fd) {
            if (tst.st_dev, tst.st_ino) == (st.st_dev, st.st_ino) {
                return Ok((from_c, display(&r.path), false));
            }
            if is_dir(&tst) {
                let base = src.name.to_string_lossy();
                return Err((
                    from_c.clone(),
                    display(&r.path),
                    CErr::invalid(format!(
                        "{to} is an existing directory; to move {from} into it pass to: {}/{base}",
                        r.path.display()
                    )),
                ));
            }
        }
    }
    let dst = ctx
        .parent(to, spec.parents)
        .map_err(|e| (from_c.clone(), to.to_string(), e))?;
    let to_c = display(&dst.path);
    let failc = |e: CErr| (from_c.clone(), to_c.clone(), e);
    if dst.path == src.path {
        return Ok((from_c.clone(), to_c.clone(), false));
    }
    if ctx.is_root(&dst.path) {
        return Err(failc(CErr::invalid(format!(
            "refusing to replace an allowed root: {to_c}"
        ))));
    }
    if is_dir(&st) && dst.path.starts_with(&src.path) {
        return Err(failc(CErr::invalid(format!(
            "cannot move the directory {from} into itself: {to} lies inside it; pick a destination outside {from_c}"
        ))));
    }
    let _guards = locks.lock_two(&src.path, &dst.path);
    let dname = dst.c_name();
    match statat(&dst.dir, &dname, true) {
        Ok(dst_st) if (dst_st.st_dev, dst_st.st_ino) == (st.st_dev, st.st_ino) => {
            return Ok((from_c.clone(), to_c.clone(), false));
        }
        Ok(dst_st) if is_dir(&dst_st) => {
            return Err(failc(CErr::invalid(format!(
                "{to} is an existing directory; pass to: {to_c}/{}",
                src.name.to_string_lossy()
            ))));
        }
        Ok(_) if !spec.overwrite => {
            return Err(failc(CErr::new(
                Code::C213,
                format!("destination exists: {to}; pass overwrite=true to replace it"),
            )));
        }
        _ => {}
    }
    let same_root = ctx.root_index(&src.path) == ctx.root_index(&dst.path);
    if same_root {
        let flags = if spec.overwrite {
            0
        } else {
            libc::RENAME_NOREPLACE
        };
        match renameat2(&src.dir, &sname, &dst.dir, &dname, flags) {
            Ok(()) => {
                // SAFETY: fsync on directory fds we own.
                unsafe {
                    libc::fsync(dst.dir.as_raw_fd());
                    libc::fsync(src.dir.as_raw_fd());
                }
                return Ok((from_c.clone(), to_c.clone(), true));
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                return Err(failc(CErr::new(
                    Code::C213,
                    format!("destination exists: {to}; pass overwrite=true to replace it"),
                )))
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EISDIR | libc::ENOTDIR | libc::ENOTEMPTY)
                ) =>
            {
                return Err(failc(CErr::invalid(format!(
                    "cannot move {from} over {to}: {e}"
                ))))
            }
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {} // another filesystem: copy
            Err(e) => return Err(failc(CErr::io(format!("move {from} to {to}: {e}")))),
        }
    }
    // Copy, then delete: regular files only.
    if is_dir(&st) {
        return Err(failc(CErr::invalid(format!(
            "{from} is a directory and {to} is in another root: cross-root moves copy files only; move its files individually"
        ))));
    }
    if !is_file(&st) {
        return Err(failc(CErr::invalid(format!(
            "{from} is not a regular file: cross-root moves copy regular files only"
        ))));
    }
    // A cross-root move writes a new file: max_write_bytes applies (CODER-10).
    let limit = ctx.max_write();
    let data = read_entry(&src, limit).map_err(failc)?.ok_or_else(|| {
        failc(CErr::too_large(format!(
            "{from} is larger than max_write_bytes ({limit}), the limit of a cross-root move (a copy): move it with shell::fs::mv"
        )))
    })?;
    // The copy keeps the source's owner, group, mode and ACL as a rename would: its bytes
    // are the owner's own, so the owner is kept wherever the executor may chown.
    let mut source = Replaced::of_entry(&src)
        .map_err(|e| failc(CErr::from_exec(e, from)))?
        .ok_or_else(|| failc(CErr::not_found(from)))?;
    source.may_write = true;
    let keep = source.keep(ctx.policy.config.fs.allow_special_bits);
    if let Some(msg) = keep.owner_refusal(&src.path, source.uid, source.gid) {
        return Err(failc(CErr::io(msg)));
    }
    commit(&dst, &data, keep.mode, Some(keep), !spec.overwrite, to).map_err(failc)?;
    // SAFETY: unlinkat on a directory fd we own with a NUL-terminated name.
    if unsafe { libc::unlinkat(src.dir.as_raw_fd(), sname.as_ptr(), 0) } != 0 {
        let e = std::io::Error::last_os_error();
        // Undo: remove the copy, so the file exists exactly once.
        // SAFETY: as above, on the destination's directory fd.
        unsafe {
            libc::unlinkat(dst.dir.as_raw_fd(), dname.as_ptr(), 0);
        }
        return Err(failc(CErr::io(format!(
            "could not remove {from} after copying it to {to} ({e}); the copy was removed again, nothing moved"
        ))));
    }
    // SAFETY: fsync on a directory fd we own.
    unsafe {
        libc::fsync(src.dir.as_raw_fd());
    }
    Ok((from_c.clone(), to_c.clone(), true))
}
