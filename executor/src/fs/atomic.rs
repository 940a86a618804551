//! Atomic file replacement: temp file in the same directory → write → fsync → rename over
//! the target → fsync the directory. A reader sees the old content or the new, never a mix,
//! and two concurrent writers leave exactly one of their payloads.
//!
//! A temp file that must wait (a staged entry of a streamed batch, see [`super::staging`])
//! is created unnamed ([`TempFile::create_unnamed`], `O_TMPFILE`): the kernel frees it when
//! its descriptor closes, so an executor that is killed leaves nothing behind. It gets a name
//! (`linkat` through `/proc/self/fd`) only at install time, just before the rename.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::ExecError;
use crate::jail::Parent;

/// An open temp file next to its target; removed on drop unless committed.
pub struct TempFile {
    dir: OwnedFd,
    name: CString,
    target: CString,
    file: Option<std::fs::File>,
    mode: u32,
    pub written: u64,
    /// Complete and fsynced.
    staged: bool,
    /// Created with `O_TMPFILE`: no name until [`TempFile::install`] links one.
    unnamed: bool,
}

/// `.<name>.iii-<random>.tmp`, within NAME_MAX (255 bytes) however long the target's name
/// is: `.` + stem + `.iii-` + 32 hex + `.tmp` leaves 213 bytes for the stem.
fn temp_name(target: &str) -> Result<CString, ExecError> {
    let mut cut = target.len().min(213);
    while !target.is_char_boundary(cut) {
        cut -= 1;
    }
    let tmp = format!(
        ".{}.iii-{}.tmp",
        &target[..cut],
        uuid::Uuid::new_v4().simple()
    );
    CString::new(tmp).map_err(|_| ExecError::Invalid("bad file name".into()))
}

impl TempFile {
    /// Creates `.<name>.iii-<random>.tmp` in the parent directory with `mode`.
    pub fn create(parent: &Parent, mode: u32) -> Result<TempFile, ExecError> {
        let dir = parent.dir.try_clone().map_err(io("dup dir"))?;
        let target = parent.c_name();
        let name = temp_name(&parent.name.to_string_lossy())?;
        // SAFETY: openat on a directory fd we own with a NUL-terminated name; O_EXCL and
        // O_NOFOLLOW guarantee a fresh regular file is created, never an existing one.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            // A directory we may not write to reads like a missing one (S211), never as an
            // I/O failure that would reveal it exists. Callers re-echo their own input path.
            if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
                return Err(ExecError::NotFound(
                    parent.path.to_string_lossy().into_owned(),
                ));
            }
            return Err(io("create temp file")(e));
        }
        // SAFETY: a new descriptor that nothing else owns.
        let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        // Apply the exact mode: the umask may have narrowed it at creation.
        // SAFETY: fchmod on a descriptor we own.
        if unsafe { libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) } != 0 {
            let e = std::io::Error::last_os_error();
            let t = TempFile {
                dir,
                name,
                target,
                file: Some(file),
                mode,
                written: 0,
                staged: false,
                unnamed: false,
            };
            drop(t);
            return Err(io("chmod temp file")(e));
        }
        Ok(TempFile {
            dir,
            name,
            target,
            file: Some(file),
            mode,
            written: 0,
            staged: false,
            unnamed: false,
        })
    }

    /// An unnamed temp file (`O_TMPFILE`) in the parent directory with `mode`, or a named one
    /// ([`TempFile::create`]) where the filesystem has no `O_TMPFILE`.
    pub fn create_unnamed(parent: &Parent, mode: u32) -> Result<TempFile, ExecError> {
        let dir = parent.dir.try_clone().map_err(io("dup dir"))?;
        // SAFETY: openat on a directory fd we own with a static NUL-terminated name; O_TMPFILE
        // creates a new inode with no directory entry.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c".".as_ptr(),
                libc::O_TMPFILE | libc::O_WRONLY | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EACCES | libc::EPERM) => Err(ExecError::NotFound(
                    parent.path.to_string_lossy().into_owned(),
                )),
                // No O_TMPFILE on this filesystem (or kernel).
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL) => {
                    TempFile::create(parent, mode)
                }
                _ => Err(io("create temp file")(e)),
            };
        }
        // SAFETY: a new descriptor that nothing else owns.
        let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        // SAFETY: fchmod on a descriptor we own (the umask may have narrowed the mode).
        if unsafe { libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) } != 0 {
            return Err(io("chmod temp file")(std::io::Error::last_os_error()));
        }
        Ok(TempFile {
            dir,
            name: CString::default(),
            target: parent.c_name(),
            file: Some(file),
            mode,
            written: 0,
            staged: false,
            unnamed: true,
        })
    }

    pub fn write(&mut self, data: &[u8]) -> Result<(), ExecError> {
        if let Some(f) = self.file.as_mut() {
            f.write_all(data).map_err(io("write"))?;
            self.written += data.len() as u64;
        }
        Ok(())
    }

    /// fsync, rename over the target, fsync the directory.
    pub fn commit(mut self) -> Result<u64, ExecError> {
        self.stage()?;
        self.install()
    }

    /// Completes the temp file: its final mode, fsynced (and closed, unless it is unnamed and
    /// lives only as long as its descriptor); the target is untouched.
    pub fn stage(&mut self) -> Result<(), ExecError> {
        if self.staged {
            return Ok(());
        }
        let Some(file) = self.file.as_ref() else {
            return Ok(());
        };
        // Without CAP_FSETID every write() clears setuid/setgid: apply the mode once more now
        // that the content is complete.
        if self.mode & 0o6000 != 0 {
            // SAFETY: fchmod on a descriptor we own.
            if unsafe { libc::fchmod(file.as_raw_fd(), self.mode as libc::mode_t) } != 0 {
                return Err(io("chmod temp file")(std::io::Error::last_os_error()));
            }
        }
        file.sync_all().map_err(io("fsync"))?;
        self.staged = true;
        if !self.unnamed {
            self.file = None;
        }
        Ok(())
    }

    /// Gives an unnamed temp file its temp name in the directory (a no-op for a named one).
    fn link(&mut self) -> Result<(), ExecError> {
        if !self.unnamed {
            return Ok(());
        }
        let Some(file) = self.file.as_ref() else {
            return Err(ExecError::Internal(
                "staged temp file lost its descriptor".into(),
            ));
        };
        let name = temp_name(&self.target.to_string_lossy())?;
        let proc = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .map_err(|_| ExecError::Internal("bad fd path".into()))?;
        // SAFETY: linkat with NUL-terminated names: the magic link of a descriptor we own
        // (followed, AT_SYMLINK_FOLLOW) to a fresh name in a directory fd we own. A linkable
        // O_TMPFILE inode (no O_EXCL) may be linked exactly like this without privilege.
        let rc = unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                proc.as_ptr(),
                self.dir.as_raw_fd(),
                name.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        };
        if rc != 0 {
            return Err(io("link temp file")(std::io::Error::last_os_error()));
        }
        self.name = name;
        self.unnamed = false;
        self.file = None;
        Ok(())
    }

    /// Renames the staged temp file over the target and fsyncs the directory.
    pub fn install(mut self) -> Result<u64, ExecError> {
        self.stage()?;
        self.link()?;
        // SAFETY: renameat within one directory fd we own, with NUL-terminated names. The
        // target is replaced atomically; a symlink at the target is replaced, not followed.
        let rc = unsafe {
            libc::renameat(
                self.dir.as_raw_fd(),
                self.name.as_ptr(),
                self.dir.as_raw_fd(),
                self.target.as_ptr(),
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EISDIR) | Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => {
                    ExecError::WrongType(format!(
                        "is a directory: {}",
                        self.target.to_string_lossy()
                    ))
                }
                _ => io("rename")(e),
            });
        }
        // The temp name is gone now; do not unlink it on drop.
        self.name = CString::default();
        // SAFETY: fsync on a directory fd we own (opened O_RDONLY by Jail::parent).
        unsafe {
            libc::fsync(self.dir.as_raw_fd());
        }
        Ok(self.written)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.name.as_bytes().is_empty() {
            // SAFETY: unlinkat of our own temp file name in a directory fd we own.
            unsafe {
                libc::unlinkat(self.dir.as_raw_fd(), self.name.as_ptr(), 0);
            }
        }
    }
}

/// Writes `data` to the parent's entry atomically with `mode`. Returns the bytes written.
pub fn write_atomic(parent: &Parent, data: &[u8], mode: u32) -> Result<u64, ExecError> {
    let mut t = TempFile::create(parent, mode)?;
    t.write(data)?;
    t.commit()
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> ExecError {
    move |e| match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
            ExecError::Internal(format!("{what}: no space left: {e}"))
        }
        _ => ExecError::Internal(format!("{what}: {e}")),
    }
}
