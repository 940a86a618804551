//! `.gitignore`, `.ignore` and `.git/info/exclude` files, read the one safe way: a command
//! controls them, so they are opened only when they are regular files (an `O_PATH |
//! O_NOFOLLOW` handle is checked with `fstat` first and only that same inode is then opened
//! for reading: a FIFO, a device or a symlink swapped in at any moment is never opened), and
//! only up to [`MAX_IGNORE_FILE_BYTES`]. A file past that, or not a regular file, is skipped
//! with one WARN naming it, and whoever asked goes on without it.
//!
//! `coder::search` (`respect_gitignore`) and the change feed's filter read them here; the
//! `ignore` crate never opens one itself.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::jail::{fstat, open_beneath};

/// The largest ignore file read (1 MiB); a larger one is skipped with a WARN.
pub const MAX_IGNORE_FILE_BYTES: u64 = 1 << 20;

/// The bytes of the ignore file `rel` beneath `dir` (or the absolute `rel` when `dir` is
/// `None`), never following a symlink: `None` when it is missing, not a regular file (WARN),
/// over [`MAX_IGNORE_FILE_BYTES`] (WARN) or unreadable. `shown` names it in the log.
pub fn read(dir: Option<&OwnedFd>, rel: &Path, shown: &Path) -> Option<Vec<u8>> {
    let resolve = libc::RESOLVE_NO_SYMLINKS
        | libc::RESOLVE_NO_MAGICLINKS
        | if dir.is_some() {
            libc::RESOLVE_BENEATH
        } else {
            0
        };
    let handle = open_beneath(dir, rel, libc::O_PATH | libc::O_NOFOLLOW, resolve).ok()?;
    let st = fstat(&handle).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        tracing::warn!(path = %shown.display(), "an ignore file that is not a regular file was skipped (its patterns do not apply); replace it with a regular file");
        return None;
    }
    if st.st_size as u64 > MAX_IGNORE_FILE_BYTES {
        return too_big(shown, st.st_size as u64);
    }
    let file = reopen(&handle)?;
    let mut bytes = Vec::new();
    file.take(MAX_IGNORE_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > MAX_IGNORE_FILE_BYTES {
        // It grew since the stat.
        return too_big(shown, bytes.len() as u64);
    }
    Some(bytes)
}

fn too_big(shown: &Path, size: u64) -> Option<Vec<u8>> {
    tracing::warn!(path = %shown.display(), size, max = MAX_IGNORE_FILE_BYTES, "an ignore file over {MAX_IGNORE_FILE_BYTES} bytes was skipped (its patterns do not apply); shorten it");
    None
}

/// Opens the regular file an `O_PATH` handle names for reading: the same inode, whatever
/// its name holds by now (`/proc/self/fd`, non-blocking, no controlling terminal).
fn reopen(handle: &OwnedFd) -> Option<std::fs::File> {
    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", handle.as_raw_fd())).ok()?;
    // SAFETY: open of a NUL-terminated path; the descriptor returned is new and owned here.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The handle was a regular file; so is what it names (an inode does not change type).
    Some(std::fs::File::from(fd))
}

/// A matcher of `bytes` (an ignore file's content) for paths under `dir` (absolute): `None`
/// when it holds no pattern. Lines that are not valid globs are skipped, as git does.
pub fn matcher(dir: &Path, bytes: &[u8], shown: &Path) -> Option<Gitignore> {
    let mut b = GitignoreBuilder::new(dir);
    for line in lines(bytes) {
        let _ = b.add_line(Some(shown.to_path_buf()), line);
    }
    b.build().ok().filter(|g| !g.is_empty())
}

/// The lines of an ignore file's bytes, as git reads them (a leading UTF-8 BOM dropped).
pub fn lines(bytes: &[u8]) -> Vec<&str> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    bytes
        .split(|&b| b == b'\n')
        .filter_map(|l| std::str::from_utf8(l).ok())
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect()
}

/// [`read`] and [`matcher`] in one.
pub fn load(dir_fd: Option<&OwnedFd>, rel: &Path, dir: &Path, shown: &Path) -> Option<Gitignore> {
    read(dir_fd, rel, shown).and_then(|b| matcher(dir, &b, shown))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_fd(p: &Path) -> OwnedFd {
        open_beneath(None, p, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap()
    }

    #[test]
    fn a_regular_file_is_read_and_anything_else_is_skipped_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let fd = dir_fd(d.path());
        std::fs::write(d.path().join(".gitignore"), "*.log\n!keep.log\n").unwrap();
        let g = load(Some(&fd), Path::new(".gitignore"), d.path(), Path::new("x")).unwrap();
        assert!(g.matched(d.path().join("a.log"), false).is_ignore());
        assert!(g.matched(d.path().join("keep.log"), false).is_whitelist());
        // A FIFO: skipped at once (opening it for reading would wait for a writer).
        let fifo = std::ffi::CString::new(d.path().join(".ignore").as_os_str().as_encoded_bytes())
            .unwrap();
        // SAFETY: mkfifo of a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        assert!(read(Some(&fd), Path::new(".ignore"), Path::new("x")).is_none());
        // A symlink to a good file: not followed.
        std::os::unix::fs::symlink(".gitignore", d.path().join("link")).unwrap();
        assert!(read(Some(&fd), Path::new("link"), Path::new("x")).is_none());
        // Sparse and over the bound: skipped, without reading it.
        let big = std::fs::File::create(d.path().join("big")).unwrap();
        big.set_len(64 << 30).unwrap();
        assert!(read(Some(&fd), Path::new("big"), Path::new("x")).is_none());
        // Exactly at the bound: read.
        let at = std::fs::File::create(d.path().join("at")).unwrap();
        at.set_len(MAX_IGNORE_FILE_BYTES).unwrap();
        assert_eq!(
            read(Some(&fd), Path::new("at"), Path::new("x")).map(|b| b.len() as u64),
            Some(MAX_IGNORE_FILE_BYTES)
        );
        assert!(read(Some(&fd), Path::new("missing"), Path::new("x")).is_none());
    }
}
