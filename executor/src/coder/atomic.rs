//! Atomic commit of one file for coder writes: a temp file next to the target, the exact
//! mode (and the previous owner when replacing), write, fsync, rename over the target, fsync
//! of the directory. A failure before the rename leaves the target byte-identical.
//!
//! Owner: a replaced file keeps its uid and gid. When the executor may not give the temp
//! file that owner (`EPERM`: no `CAP_CHOWN`, or a group it is not in), the write is refused
//! with C216 before any byte is written, rather than silently handing the file to the
//! executor's user or giving up the atomic rename.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::paths::CErr;
use crate::jail::Parent;

/// Writes `data` to the parent's entry atomically, with `mode` and (when given) `owner`.
/// With `no_replace`, the rename refuses an entry that appeared meanwhile (C213).
pub fn commit(
    parent: &Parent,
    data: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
    no_replace: bool,
) -> Result<(), CErr> {
    let full = parent.name.to_string_lossy();
    let mut cut = full.len().min(200);
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    let tmp = format!(
        ".{}.iii-coder-{}.tmp",
        &full[..cut],
        uuid::Uuid::new_v4().simple()
    );
    let name = CString::new(tmp).map_err(|_| CErr::invalid("bad file name"))?;
    let target = parent.c_name();
    let dir = parent.dir.as_raw_fd();
    // SAFETY: openat on a directory fd we own with a NUL-terminated name; O_EXCL|O_NOFOLLOW
    // create a fresh regular file, never an existing entry.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            (mode & 0o777) as libc::c_uint,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
            return Err(CErr::not_found(&parent.path.to_string_lossy()));
        }
        return Err(CErr::io(format!("create temp file: {e}")));
    }
    // SAFETY: a new descriptor that nothing else owns.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let guard = Unlink { dir, name: &name };
    // SAFETY: fchmod on a descriptor we own; applies the exact mode past the umask.
    if unsafe { libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) } != 0 {
        return Err(CErr::io(format!(
            "chmod temp file: {}",
            std::io::Error::last_os_error()
        )));
    }
    // The owner goes last: once the temp file belongs to another user, only CAP_FOWNER
    // could still change its mode.
    if let Some((uid, gid)) = owner {
        // SAFETY: fchown on a descriptor we own. The temp file holds no data yet: when the
        // owner cannot be kept the guard removes it and the target stays as it was.
        if unsafe { libc::fchown(file.as_raw_fd(), uid, gid) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) => owner_refusal(parent, uid, gid),
                _ => CErr::io(format!("chown temp file: {e}")),
            });
        }
    }
    file.write_all(data)
        .map_err(|e| CErr::io(format!("write: {e}")))?;
    if mode & 0o6000 != 0 {
        // SAFETY: as above; writes cleared setuid/setgid without CAP_FSETID.
        unsafe {
            libc::fchmod(file.as_raw_fd(), mode as libc::mode_t);
        }
    }
    file.sync_all()
        .map_err(|e| CErr::io(format!("fsync: {e}")))?;
    drop(file);
    let flags = if no_replace {
        libc::RENAME_NOREPLACE
    } else {
        0
    };
    // SAFETY: renameat2 within one directory fd we own, with NUL-terminated names; a symlink
    // at the target is replaced, not followed.
    let rc = unsafe { libc::renameat2(dir, name.as_ptr(), dir, target.as_ptr(), flags) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EEXIST) if no_replace => CErr::new(
                iii_shell_protocol::Code::C213,
                format!(
                    "already exists: {}; pass overwrite=true to replace it",
                    parent.path.display()
                ),
            ),
            Some(libc::EISDIR) | Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => {
                CErr::invalid(format!("is a directory: {}", parent.path.display()))
            }
            _ => CErr::io(format!("rename: {e}")),
        });
    }
    std::mem::forget(guard);
    // SAFETY: fsync on a directory fd we own (opened O_RDONLY by Jail::parent).
    unsafe {
        libc::fsync(dir);
    }
    Ok(())
}

/// The refusal when replacing a file would hand it to the executor's user: an edit never
/// changes who owns a file, and writing in place would give up atomicity, so nothing is done.
fn owner_refusal(parent: &Parent, uid: u32, gid: u32) -> CErr {
    // SAFETY: geteuid/getegid cannot fail.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    CErr::io(format!(
        "cannot keep the owner of {} (uid {uid}, gid {gid}): the executor runs as uid {euid} gid {egid} without CAP_CHOWN, and replacing the file would hand it to that user; nothing was written. Edit it as its owner (confinement.run_as), or keep CAP_CHOWN in confinement.capabilities",
        parent.path.display()
    ))
}

/// Removes the temp file unless the commit got as far as the rename.
struct Unlink<'a> {
    dir: i32,
    name: &'a CString,
}

impl Drop for Unlink<'_> {
    fn drop(&mut self) {
        // SAFETY: unlinkat of our own temp name in a directory fd that outlives the guard.
        unsafe {
            libc::unlinkat(self.dir, self.name.as_ptr(), 0);
        }
    }
}
