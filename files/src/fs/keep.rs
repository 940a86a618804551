//! What a rewritten file keeps of the file it replaces: its owner, group, mode and POSIX ACL
//! (`system.posix_acl_access`), as editors keep them. Every write that replaces an existing
//! file through a temp file and a rename takes it from here ([`Replaced`], read from the old
//! file; [`Keep`], applied to the new one by [`super::atomic::TempFile`]: the ACL and mode
//! when it is staged, the owner just before its rename): `shell::fs::write`, `sed`, the
//! staged batches, `coder::update-file`, an overwriting `coder::create-file`, a cross-root
//! `coder::move` and a turn's revert.
//!
//! Which owner and mode are kept is the policy's pure decision
//! ([`iii_shell_policy::mode::kept_owner`], [`iii_shell_policy::mode::kept_mode`]); this module
//! only reads the old file and applies the answer. Nothing here follows a symlink: the old
//! file is read through an `O_NOFOLLOW` descriptor, and the new one is changed through its
//! own descriptor.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use iii_shell_policy::mode::{kept_mode, kept_owner, KeptOwner};

use super::entry::is_file;
use super::rights::OwnerRights;
use crate::error::ExecError;
use crate::jail::{open_beneath, Parent};

/// The POSIX access ACL's extended attribute.
const ACL_ACCESS: &std::ffi::CStr = c"system.posix_acl_access";
/// The largest ACL read back (ext4 keeps one in a block; 64 KiB is past every filesystem's).
const ACL_MAX: usize = 64 << 10;

/// The file a write replaces, as it was when read.
#[derive(Debug, Clone)]
pub struct Replaced {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    /// Its `system.posix_acl_access` bytes, when it has an extended ACL.
    pub acl: Option<Vec<u8>>,
    /// Whether the executor may write it in place (the kernel's `W_OK` answer).
    pub may_write: bool,
}

/// What a new file gets so that it keeps what [`Replaced`] had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keep {
    /// The owner to give it (`None`: the executor's own).
    pub uid: Option<u32>,
    /// The group to give it (`None`: the one it was created with).
    pub gid: Option<u32>,
    /// Its exact mode, applied after the ACL.
    pub mode: u32,
    pub acl: Option<Vec<u8>>,
}

impl Replaced {
    /// The regular file open at `fd` (an `O_PATH` descriptor will do).
    pub fn of_fd(fd: BorrowedFd<'_>, path: &Path) -> Result<Replaced, ExecError> {
        let st = fstat_of(fd).map_err(|e| internal(path, "stat", e))?;
        let proc = proc_path(fd)?;
        Ok(Replaced {
            uid: st.st_uid,
            gid: st.st_gid,
            mode: st.st_mode,
            acl: read_acl(&proc).map_err(|e| internal(path, "read the ACL of", e))?,
            may_write: may_write(&proc),
        })
    }

    /// The entry `parent` names, when it is a regular file; `None` when it is missing, a
    /// symlink (replaced, never followed) or anything else.
    pub fn of_entry(parent: &Parent) -> Result<Option<Replaced>, ExecError> {
        let fd = match open_beneath(
            Some(&parent.dir),
            Path::new(&parent.name),
            libc::O_PATH | libc::O_NOFOLLOW,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
        ) {
            Ok(fd) => fd,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ELOOP)) => {
                return Ok(None)
            }
            Err(e) => return Err(internal(&parent.path, "open", e)),
        };
        let st = fstat_of(fd_ref(&fd)).map_err(|e| internal(&parent.path, "stat", e))?;
        if !is_file(&st) {
            return Ok(None);
        }
        Replaced::of_fd(fd_ref(&fd), &parent.path).map(Some)
    }

    fn owner(&self, rights: &OwnerRights) -> KeptOwner {
        kept_owner(self.uid, self.gid, &rights.writer(), self.may_write)
    }

    /// A rewrite that keeps the old mode (an edit, sed, a revert, a move): setuid/setgid/
    /// sticky only as `allow_special_bits` and the kept owner allow.
    pub fn keep(&self, allow_special_bits: bool) -> Keep {
        let owner = self.owner(&OwnerRights::current());
        Keep {
            uid: owner.uid,
            gid: owner.gid,
            mode: kept_mode(self.mode, allow_special_bits, owner),
            acl: self.acl.clone(),
        }
    }

    /// A write whose caller gave the mode (`shell::fs::write`, `coder::create-file`): that
    /// mode (already checked against the policy), the kept owner and the ACL, whose owner,
    /// group-class and other entries then follow the mode as a chmod makes them.
    pub fn keep_with_mode(&self, mode: u32) -> Keep {
        let owner = self.owner(&OwnerRights::current());
        Keep {
            uid: owner.uid,
            gid: owner.gid,
            mode,
            acl: self.acl.clone(),
        }
    }
}

impl Keep {
    /// The refusal of a `coder::*` rewrite of `path` (owned by `uid`:`gid`) whose new file
    /// would not keep that owner: an edit never hands another user's file to the executor's
    /// user, and writing in place would give up atomicity, so nothing is done
    /// ([`iii_shell_policy::mode::edit_changes_owner`]).
    pub fn owner_refusal(&self, path: &Path, uid: u32, gid: u32) -> Option<String> {
        if !iii_shell_policy::mode::edit_changes_owner(uid, self.uid) {
            return None;
        }
        // SAFETY: geteuid/getegid cannot fail.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Some(format!(
            "cannot keep the owner of {} (uid {uid}, gid {gid}): the executor runs as uid {euid} gid {egid} without CAP_CHOWN (or may not write the file), and replacing the file would hand it to that user; nothing was written. Edit it as its owner (confinement.run_as), or keep CAP_CHOWN in confinement.capabilities",
            path.display()
        ))
    }

    /// Gives the complete new file `fd` its ACL and mode. An ACL that cannot be set fails the
    /// write (without it the group class would get the mask's bits).
    pub fn apply_access(&self, fd: BorrowedFd<'_>, path: &Path) -> Result<(), ExecError> {
        let raw = fd.as_raw_fd();
        if let Some(acl) = &self.acl {
            // SAFETY: fsetxattr on a descriptor we own, a NUL-terminated name and a buffer of
            // `acl.len()` bytes.
            let rc = unsafe {
                libc::fsetxattr(raw, ACL_ACCESS.as_ptr(), acl.as_ptr().cast(), acl.len(), 0)
            };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                return Err(ExecError::Internal(format!(
                    "cannot keep the ACL of {}: {e}; nothing was written",
                    path.display()
                )));
            }
        }
        chmod(fd, self.mode).map_err(|e| internal(path, "chmod the new file for", e))
    }

    /// Gives the new file its owner and group, last (once it belongs to someone else, only
    /// its owner may still set the ACL and mode, or link it: `fs.protected_hardlinks`), and
    /// the mode again where the chown cleared a set-id bit. An owner that cannot be given is
    /// left as the executor's (the policy decided what it may try; a refusal it did not
    /// foresee keeps what the kernel allows). Returns whether anything changed.
    pub fn apply_owner(&self, fd: BorrowedFd<'_>, path: &Path) -> Result<bool, ExecError> {
        let st = fstat_of(fd).map_err(|e| internal(path, "stat the new file for", e))?;
        let uid = self.uid.filter(|&u| u != st.st_uid);
        let gid = self.gid.filter(|&g| g != st.st_gid);
        if uid.is_none() && gid.is_none() {
            return Ok(false);
        }
        if chown(fd, uid, gid).is_err() && uid.is_some() && gid.is_some() {
            // Keep the group at least.
            let _ = chown(fd, None, gid);
        }
        let st = fstat_of(fd).map_err(|e| internal(path, "stat the new file for", e))?;
        let mut want = self.mode;
        if self.uid.is_some_and(|u| u != st.st_uid) {
            want &= !0o4000;
        }
        if self.gid.is_some_and(|g| g != st.st_gid) {
            want &= !0o2000;
        }
        if st.st_mode & 0o7777 != want && chmod(fd, want).is_err() {
            // Only a set-id bit the chown cleared can differ here, and only CAP_FOWNER may
            // set it on a file that now belongs to someone else.
            tracing::warn!(
                path = %path.display(),
                "kept the owner of {} but not its setuid/setgid bits (mode {:04o}, wanted {want:04o}): a file given back to its owner can get them again only with CAP_FOWNER; add CAP_FOWNER to confinement.capabilities, or have the owner set them",
                path.display(),
                st.st_mode & 0o7777
            );
        }
        Ok(true)
    }
}

fn fd_ref(fd: &OwnedFd) -> BorrowedFd<'_> {
    use std::os::fd::AsFd;
    fd.as_fd()
}

fn internal(path: &Path, what: &str, e: std::io::Error) -> ExecError {
    ExecError::Internal(format!("{what} {}: {e}", path.display()))
}

/// `/proc/self/fd/N`: the inode itself, for the calls that take no descriptor of any kind.
fn proc_path(fd: BorrowedFd<'_>) -> Result<CString, ExecError> {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|_| ExecError::Internal("bad fd path".into()))
}

pub(super) fn fstat_of(fd: BorrowedFd<'_>) -> std::io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat fills the buffer on success; we only read it when it returned 0.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstat returned 0, so the struct is initialised.
    Ok(unsafe { st.assume_init() })
}

fn chmod(fd: BorrowedFd<'_>, mode: u32) -> std::io::Result<()> {
    // SAFETY: fchmod on a descriptor the caller owns.
    if unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn chown(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> std::io::Result<()> {
    let u = uid.unwrap_or(libc::uid_t::MAX);
    let g = gid.unwrap_or(libc::gid_t::MAX);
    // SAFETY: fchown on a descriptor the caller owns; -1 leaves an id unchanged.
    if unsafe { libc::fchown(fd.as_raw_fd(), u, g) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The access ACL of the inode `proc` names, `None` when it has none (or the filesystem
/// keeps none).
fn read_acl(proc: &CString) -> std::io::Result<Option<Vec<u8>>> {
    for _ in 0..4 {
        // SAFETY: getxattr with NUL-terminated strings and no buffer asks for the size.
        let n =
            unsafe { libc::getxattr(proc.as_ptr(), ACL_ACCESS.as_ptr(), std::ptr::null_mut(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENODATA | libc::EOPNOTSUPP) => Ok(None),
                _ => Err(e),
            };
        }
        let len = usize::try_from(n).unwrap_or(usize::MAX);
        if len > ACL_MAX {
            return Err(std::io::Error::other(format!(
                "an ACL of {len} bytes (more than {ACL_MAX})"
            )));
        }
        let mut buf = vec![0u8; len];
        // SAFETY: as above, with a buffer of `buf.len()` bytes.
        let n = unsafe {
            libc::getxattr(
                proc.as_ptr(),
                ACL_ACCESS.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n >= 0 {
            buf.truncate(usize::try_from(n).unwrap_or(0));
            return Ok(Some(buf));
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) => continue, // it grew meanwhile
            Some(libc::ENODATA | libc::EOPNOTSUPP) => return Ok(None),
            _ => return Err(e),
        }
    }
    Err(std::io::Error::other(
        "the ACL kept changing while it was read",
    ))
}

/// Whether the executor may write the inode `proc` names, by the kernel's own rules (mode
/// bits, ACL, capabilities; effective ids).
fn may_write(proc: &CString) -> bool {
    // SAFETY: faccessat with a NUL-terminated path; it only answers.
    unsafe { libc::faccessat(libc::AT_FDCWD, proc.as_ptr(), libc::W_OK, libc::AT_EACCESS) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Only a regular file is "replaced" with what it keeps; a symlink at the target is
    /// replaced as a name (never followed), and a missing target keeps nothing.
    #[test]
    fn what_an_entry_keeps() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let jail = crate::jail::Jail::new(&[root.to_string_lossy().into()], &[], &[]).unwrap();
        std::fs::write(root.join("f"), "x").unwrap();
        std::fs::set_permissions(root.join("f"), std::fs::Permissions::from_mode(0o4640)).unwrap();
        std::os::unix::fs::symlink("f", root.join("link")).unwrap();
        let of = |p: &str| Replaced::of_entry(&jail.parent(p, false).unwrap()).unwrap();
        assert!(of("missing").is_none());
        assert!(of("link").is_none());
        let f = of("f").unwrap();
        assert_eq!((f.mode & 0o7777, f.acl.as_deref()), (0o4640, None));
        // SAFETY: geteuid/getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        assert_eq!((f.uid, f.gid), (uid, gid));
        // The executor's own file: owner and group kept; setuid only when allowed.
        let k = f.keep(false);
        assert_eq!((k.uid, k.gid, k.mode), (Some(uid), Some(gid), 0o640));
        assert_eq!(f.keep(true).mode, 0o4640);
        assert_eq!(f.keep_with_mode(0o600).mode, 0o600);
    }
}
