//! `FsEntry` from stat data, and fd-relative stat helpers.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd};

use iii_shell_protocol::fs::{mode_string, FsEntry};

/// `fstatat(dir, name, flags)`.
pub fn statat(dir: &OwnedFd, name: &CStr, nofollow: bool) -> std::io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    let flags = if nofollow {
        libc::AT_SYMLINK_NOFOLLOW
    } else {
        0
    };
    // SAFETY: fstatat fills `st` on success; we only read it when it returned 0.
    let rc = unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), flags) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstatat returned 0, so the struct is initialised.
    Ok(unsafe { st.assume_init() })
}

pub fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

pub fn is_symlink(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

pub fn is_file(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// An entry from the path's own stat (`lst`) and, for a symlink, its target's stat (`target`,
/// None when the link is broken or leads outside the jail).
pub fn entry(name: String, lst: &libc::stat, target: Option<&libc::stat>) -> FsEntry {
    let followed = if is_symlink(lst) { target } else { Some(lst) };
    FsEntry {
        name,
        is_dir: followed.is_some_and(is_dir),
        is_symlink: is_symlink(lst),
        mode: mode_string(lst.st_mode),
        size: followed
            .map(|s| s.st_size as u64)
            .unwrap_or(lst.st_size as u64),
        mtime: lst.st_mtime,
    }
}
