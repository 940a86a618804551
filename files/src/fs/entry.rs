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
/// None when the link is broken or leads outside the jail). `is_symlink` describes the path
/// itself; everything else (`is_dir`, `size`, `mode`, `mtime`) describes one inode
/// consistently: the target when the link resolves inside the jail, else the link itself.
pub fn entry(name: String, lst: &libc::stat, target: Option<&libc::stat>) -> FsEntry {
    let shown = if is_symlink(lst) {
        target.unwrap_or(lst)
    } else {
        lst
    };
    FsEntry {
        name,
        is_dir: is_dir(shown),
        is_symlink: is_symlink(lst),
        mode: mode_string(shown.st_mode),
        size: shown.st_size as u64,
        mtime: shown.st_mtime,
    }
}
