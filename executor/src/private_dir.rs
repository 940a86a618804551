//! A directory of the executor's own state (the turn store, the pane store), reached only
//! through a descriptor: the directory is opened once, and every file beneath it is opened,
//! created, listed, renamed and removed relative to that descriptor, never by path.
//!
//! * Opening never follows a link: `openat2(dir, name, …, RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS)` with `O_NOFOLLOW`, so a symlink planted at a name (or anywhere
//!   on the way) is refused, not followed.
//! * A file is used only when it is a regular file with one link, owned by the executor's
//!   user: a hardlink of a file elsewhere, a FIFO or a device planted at a name is refused
//!   (opened `O_NONBLOCK`, so a FIFO never blocks the open, and checked with `fstat` on the
//!   descriptor that is then read). Reads are bounded by the caller's cap.
//! * New files are created `O_EXCL | O_NOFOLLOW` with mode 0600, new directories 0700;
//!   existing ones with looser modes are tightened when they are opened ([`PrivateDir::open`],
//!   [`PrivateDir::tighten_files`]): what a store keeps is never readable by another user.
//! * Replacing a file is a temp file, fsync, rename and directory fsync, relative to the
//!   descriptor (`iii_shell_files::fs::atomic::write_atomic`).

use std::ffi::{CString, OsStr};
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use iii_shell_files::jail::{fstat, nlink, open_beneath, open_beneath_mode};

/// Private modes: directories and files of the executor's own state.
pub const DIR_MODE: u32 = 0o700;
pub const FILE_MODE: u32 = 0o600;

/// Most entries one listing returns (a store directory holds 256 buckets or one file per
/// session / pane / blob; a directory a command filled with names cannot grow memory past it).
pub const MAX_ENTRIES: usize = 1_000_000;

const BENEATH: u64 =
    libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

/// One directory of the executor's own state, held open.
#[derive(Debug)]
pub struct PrivateDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// An entry of a listing: its name and what `fstatat` (not following links) says of it.
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: String,
    pub is_file: bool,
    pub is_dir: bool,
    pub size: u64,
    /// Modification time in nanoseconds since the epoch (0 before it).
    pub mtime_ns: u64,
}

fn refused(what: &str, path: &Path) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "{} is not a {what} of the executor's own (a link, a special file or another user's): it is not used",
            path.display()
        ),
    )
}

fn c_name(name: &str) -> std::io::Result<CString> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{name:?} is not a file name"),
        ));
    }
    CString::new(name).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

fn is_ours(st: &libc::stat, kind: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == kind
        && st.st_uid == euid()
        && (kind == libc::S_IFDIR || nlink(st) == 1)
}

/// `fchmod(fd, mode)` when the mode on disk is looser (or other) than `mode`.
fn tighten(fd: &OwnedFd, st: &libc::stat, mode: u32) -> std::io::Result<()> {
    if st.st_mode & 0o7777 == mode {
        return Ok(());
    }
    // SAFETY: fchmod on a descriptor we own.
    if unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `mkdirat(dir, name, 0700)`; an existing entry is not an error (the open after it checks
/// what it is).
fn mkdir_at(dir: &OwnedFd, name: &OsStr) -> std::io::Result<()> {
    let c = CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: mkdirat relative to a directory fd we own, with a NUL-terminated name.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), DIR_MODE) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    Ok(())
}

impl PrivateDir {
    /// Opens the directory at `path` (absolute and canonical, as `state_place` gives it),
    /// creating it and its missing ancestors (0700) when `create`. Every component is opened
    /// without following a link (`RESOLVE_NO_SYMLINKS`): a directory on the way that a command
    /// swapped for a link fails the open, it is never followed. The last component must be a
    /// directory owned by the executor's user, and its mode becomes 0700. Missing and not
    /// `create`: `NotFound`.
    pub fn open(path: &Path, create: bool) -> std::io::Result<PrivateDir> {
        use std::path::Component;
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} names no directory in a directory", path.display()),
            ));
        };
        let mut cur = open_beneath(None, Path::new("/"), libc::O_PATH | libc::O_DIRECTORY, 0)?;
        for comp in parent.components() {
            let n = match comp {
                Component::RootDir => continue,
                Component::Normal(n) => n,
                _ => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("{} is not an absolute, normal path", path.display()),
                    ))
                }
            };
            if create {
                mkdir_at(&cur, n)?;
            }
            cur = open_beneath(
                Some(&cur),
                Path::new(n),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                BENEATH,
            )?;
        }
        let base = PrivateDir {
            fd: cur,
            path: parent.to_path_buf(),
        };
        base.sub_os(name, create)
    }

    /// The subdirectory `name`, created (0700) when missing and `create`.
    pub fn sub(&self, name: &str, create: bool) -> std::io::Result<PrivateDir> {
        self.sub_os(OsStr::new(name), create)
    }

    fn sub_os(&self, name: &OsStr, create: bool) -> std::io::Result<PrivateDir> {
        let path = self.path.join(name);
        c_name(&name.to_string_lossy())?;
        if create {
            mkdir_at(&self.fd, name)?;
        }
        let fd = open_beneath(
            Some(&self.fd),
            Path::new(name),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            BENEATH,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR) => refused("directory", &path),
            _ => e,
        })?;
        let st = fstat(&fd)?;
        if !is_ours(&st, libc::S_IFDIR) {
            return Err(refused("directory", &path));
        }
        tighten(&fd, &st, DIR_MODE)?;
        Ok(PrivateDir { fd, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Another descriptor on the same directory (for a reader that runs outside a lock).
    pub fn try_clone(&self) -> std::io::Result<PrivateDir> {
        Ok(PrivateDir {
            fd: self.fd.try_clone()?,
            path: self.path.clone(),
        })
    }

    /// Opens the file `name` with `flags` (never following a link, never blocking on a FIFO)
    /// and checks it is a regular file of ours with one link. `NotFound` when missing.
    fn open_file(&self, name: &str, flags: i32) -> std::io::Result<(std::fs::File, libc::stat)> {
        let _ = c_name(name)?;
        let fd = open_beneath(
            Some(&self.fd),
            Path::new(name),
            flags | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
            BENEATH,
        )
        .map_err(|e| match e.raw_os_error() {
            // A symlink (ELOOP), a FIFO without a reader opened for writing (ENXIO): refused.
            Some(libc::ELOOP | libc::ENXIO | libc::EISDIR) => {
                refused("file", &self.path.join(name))
            }
            _ => e,
        })?;
        let st = fstat(&fd)?;
        if !is_ours(&st, libc::S_IFREG) {
            return Err(refused("file", &self.path.join(name)));
        }
        tighten(&fd, &st, FILE_MODE)?;
        Ok((std::fs::File::from(fd), st))
    }

    /// The bytes of the file `name`, at most `max` of them: `Ok(None)` when missing; an error
    /// when it is not a file of ours or is longer than `max` (it is not read past that).
    pub fn read(&self, name: &str, max: u64) -> std::io::Result<Option<Vec<u8>>> {
        let (f, st) = match self.open_file(name, libc::O_RDONLY) {
            Ok(v) => v,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let too_long = || {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} is longer than {max} bytes",
                    self.path.join(name).display()
                ),
            )
        };
        if st.st_size as u64 > max {
            return Err(too_long());
        }
        let mut data = Vec::with_capacity(st.st_size as usize);
        f.take(max + 1).read_to_end(&mut data)?;
        if data.len() as u64 > max {
            return Err(too_long());
        }
        Ok(Some(data))
    }

    /// The file `name` opened for appending: created new (0600, `O_EXCL`) when missing, and
    /// then `true`.
    pub fn append(&self, name: &str) -> std::io::Result<(std::fs::File, bool)> {
        let _ = c_name(name)?;
        match open_beneath_mode(
            Some(&self.fd),
            Path::new(name),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            FILE_MODE,
            BENEATH,
        ) {
            Ok(fd) => {
                // The exact mode (the umask may have narrowed it; it never widens it).
                let st = fstat(&fd)?;
                tighten(&fd, &st, FILE_MODE)?;
                Ok((std::fs::File::from(fd), true))
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => self
                .open_file(name, libc::O_WRONLY | libc::O_APPEND)
                .map(|(f, _)| (f, false)),
            Err(e) => Err(e),
        }
    }

    /// Replaces (or creates) the file `name` with `data`: temp file (0600), fsync, rename,
    /// directory fsync. A link at `name` is replaced, never followed.
    pub fn replace(&self, name: &str, data: &[u8]) -> std::io::Result<()> {
        let _ = c_name(name)?;
        let parent = iii_shell_files::jail::Parent {
            dir: self.fd.try_clone()?,
            dir_path: self.path.clone(),
            name: name.into(),
            path: self.path.join(name),
            made: Vec::new(),
        };
        iii_shell_files::fs::atomic::write_atomic(&parent, data, FILE_MODE, None)
            .map(|_| ())
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// True when `name` is a regular file of ours (not followed).
    pub fn has_file(&self, name: &str) -> bool {
        self.open_file(name, libc::O_RDONLY).is_ok()
    }

    /// Sets the modification time of the file `name` to now (when it is a file of ours).
    pub fn touch(&self, name: &str) -> bool {
        let Ok((f, _)) = self.open_file(name, libc::O_RDONLY) else {
            return false;
        };
        f.set_modified(std::time::SystemTime::now()).is_ok()
    }

    /// Removes the entry `name` (a file or a link; never what a link points to).
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        let c = c_name(name)?;
        // SAFETY: unlinkat relative to a directory fd we own, with a NUL-terminated name.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Removes the empty subdirectory `name` (a link there is not a directory: refused).
    pub fn remove_dir(&self, name: &str) -> std::io::Result<()> {
        let c = c_name(name)?;
        // SAFETY: unlinkat relative to a directory fd we own, with a NUL-terminated name.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// fsync of the directory itself.
    pub fn sync(&self) -> std::io::Result<()> {
        // SAFETY: fsync on a descriptor we own.
        if unsafe { libc::fsync(self.fd.as_raw_fd()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The entries of the directory (not `.`/`..`), each `fstatat`ed without following a
    /// link; names that are not UTF-8 are skipped. At most [`MAX_ENTRIES`].
    pub fn entries(&self) -> std::io::Result<Vec<DirEntry>> {
        use nix::dir::Dir;
        use nix::fcntl::{AtFlags, OFlag};
        use nix::sys::stat::{fstatat, Mode};
        // A descriptor of its own (a duplicate would share the read offset).
        let mut dir = Dir::openat(
            &self.fd,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let mut out = Vec::new();
        for e in dir.iter() {
            let e = e?;
            let Ok(name) = e.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            if out.len() >= MAX_ENTRIES {
                break;
            }
            let Ok(st) = fstatat(&self.fd, e.file_name(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            let fmt = st.st_mode & libc::S_IFMT;
            let ns = u64::try_from(st.st_mtime)
                .unwrap_or(0)
                .saturating_mul(1_000_000_000)
                .saturating_add(u64::try_from(st.st_mtime_nsec).unwrap_or(0));
            out.push(DirEntry {
                name: name.to_string(),
                is_file: fmt == libc::S_IFREG,
                is_dir: fmt == libc::S_IFDIR,
                size: st.st_size as u64,
                mtime_ns: ns,
            });
        }
        Ok(out)
    }

    /// Tightens every regular file of ours in the directory to 0600 (a store an older
    /// version wrote 0644 keeps no loose file). Returns how many were tightened.
    pub fn tighten_files(&self) -> usize {
        let Ok(entries) = self.entries() else {
            return 0;
        };
        entries
            .iter()
            .filter(|e| e.is_file)
            .filter(|e| self.loose(&e.name))
            .filter(|e| self.open_file(&e.name, libc::O_RDONLY).is_ok())
            .count()
    }

    fn loose(&self, name: &str) -> bool {
        use nix::fcntl::AtFlags;
        nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| st.st_mode & 0o7777 != FILE_MODE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn created_private_and_loose_modes_are_tightened() {
        let t = tempfile::tempdir().unwrap();
        let d = PrivateDir::open(&t.path().join("a/b"), true).unwrap();
        assert_eq!(mode(&t.path().join("a/b")), 0o700);
        let (mut f, created) = d.append("log").unwrap();
        assert!(created);
        std::io::Write::write_all(&mut f, b"x\n").unwrap();
        assert_eq!(mode(&t.path().join("a/b/log")), 0o600);
        d.replace("r", b"y").unwrap();
        assert_eq!(mode(&t.path().join("a/b/r")), 0o600);
        std::fs::set_permissions(t.path().join("a/b/r"), PermissionsExt::from_mode(0o644)).unwrap();
        std::fs::set_permissions(t.path().join("a/b"), PermissionsExt::from_mode(0o755)).unwrap();
        let d = PrivateDir::open(&t.path().join("a/b"), false).unwrap();
        assert_eq!(mode(&t.path().join("a/b")), 0o700);
        assert_eq!(d.tighten_files(), 1);
        assert_eq!(mode(&t.path().join("a/b/r")), 0o600);
    }

    #[test]
    fn links_fifos_and_long_files_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = PrivateDir::open(&t.path().join("s"), true).unwrap();
        let outside = t.path().join("outside");
        std::fs::write(&outside, "{\"secret\":1}").unwrap();
        std::os::unix::fs::symlink(&outside, t.path().join("s/sym")).unwrap();
        std::fs::hard_link(&outside, t.path().join("s/hard")).unwrap();
        nix::unistd::mkfifo(&t.path().join("s/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        for n in ["sym", "hard", "fifo"] {
            assert!(d.read(n, 100).is_err(), "{n} was read");
            assert!(d.append(n).is_err(), "{n} was opened for append");
            assert!(!d.has_file(n));
        }
        assert!(d.sub("sym", true).is_err(), "a link is no directory");
        std::os::unix::fs::symlink(t.path(), t.path().join("s/dirlink")).unwrap();
        assert!(d.sub("dirlink", false).is_err());
        d.replace("big", &[b'x'; 64]).unwrap();
        assert!(d.read("big", 63).is_err());
        assert_eq!(d.read("big", 64).unwrap().unwrap().len(), 64);
        assert_eq!(d.read("missing", 64).unwrap(), None);
        d.remove("sym").unwrap();
        d.remove("hard").unwrap();
        assert_eq!(std::fs::read(&outside).unwrap(), b"{\"secret\":1}");
        let names: Vec<String> = d.entries().unwrap().into_iter().map(|e| e.name).collect();
        assert!(names.contains(&"fifo".to_string()) && !names.contains(&"sym".to_string()));
        // The directory itself, as a link, is refused; so is a link on the way to it, and
        // nothing is made where it points.
        std::os::unix::fs::symlink(t.path().join("s"), t.path().join("link")).unwrap();
        assert!(PrivateDir::open(&t.path().join("link"), true).is_err());
        assert!(PrivateDir::open(&t.path().join("link/inner"), true).is_err());
        assert!(!t.path().join("s/inner").exists());
    }
}
