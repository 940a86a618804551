//! Atomic file replacement, the one way every write of the executor lands (`shell::fs::write`
//! in all its forms, `sed`, `coder::*` writes, a turn's revert): a temp file beside the
//! target → write → what the replaced file keeps ([`super::keep`]) → fsync → rename over the
//! target → fsync of the directory. A reader sees the old content or the new, never a mix, and
//! two concurrent writers leave exactly one of their payloads.
//!
//! The temp file is unnamed (`O_TMPFILE`, opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` on the target's directory descriptor, which the jail resolved): no
//! other call can see, open or replace it while it is written, and the kernel frees it when
//! its descriptor closes, so an error, a cancelled call or a killed executor leaves nothing
//! behind. It gets a name (`.<name>.iii-<32 hex>.tmp`, `linkat` through `/proc/self/fd`)
//! only just before its rename. On a filesystem without `O_TMPFILE` it is created under that
//! name at once (`O_CREAT | O_EXCL`, never following a symlink) and unlinked on every error.
//!
//! A batch ([`install_all`]) renames its staged temp files in order and can be undone: a
//! target that existed is swapped with its temp file (`RENAME_EXCHANGE`), so its pre-image
//! stays under the temp name until the whole batch is in; a rename that fails part-way puts
//! every earlier target back (swapping again, or removing a file the batch created) before
//! the error is returned.
//!
//! The executor's own state (the turn store's blobs, the console's pane state) is written the
//! same way by path, outside any jail: [`replace_own_file`].

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::entry::{is_dir, statat};
use super::keep::Keep;
use super::own_temps;
use crate::error::ExecError;
use crate::jail::{open_beneath_mode, Parent};

/// An open temp file beside its target; removed (or freed) on drop unless installed.
pub struct TempFile {
    dir: OwnedFd,
    /// The temp file's name in `dir` once it has one (empty while unnamed and once
    /// installed).
    name: CString,
    target: CString,
    path: PathBuf,
    file: std::fs::File,
    mode: u32,
    keep: Option<Keep>,
    pub written: u64,
    /// Complete, given what it keeps, and fsynced.
    staged: bool,
    /// The names it shows up under in inotify events, held in [`super::own_temps`].
    own: Vec<Vec<u8>>,
}

/// `.<name>.iii-<random>.tmp`, within NAME_MAX (255 bytes) however long the target's name
/// is: `.` + stem + `.iii-` + 32 hex + `.tmp` leaves 213 bytes for the stem.
fn temp_name(target: &str) -> Result<CString, ExecError> {
    CString::new(temp_file_name(target)).map_err(|_| ExecError::Invalid("bad file name".into()))
}

/// [`temp_name`] as a plain string.
fn temp_file_name(target: &str) -> String {
    let mut cut = target.len().min(213);
    while !target.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(
        ".{}.iii-{}.tmp",
        &target[..cut],
        uuid::Uuid::new_v4().simple()
    )
}

const BENEATH: u64 =
    libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

impl TempFile {
    /// A temp file for the parent's entry with `mode`: unnamed where the filesystem allows
    /// it, else named. A directory the executor may not write to reads like a missing one
    /// (S211), never as an I/O failure that would reveal it exists; callers re-echo their own
    /// input path.
    pub fn create(parent: &Parent, mode: u32) -> Result<TempFile, ExecError> {
        let dir = parent.dir.try_clone().map_err(io("dup dir"))?;
        let denied = || ExecError::NotFound(parent.path.to_string_lossy().into_owned());
        let unnamed = open_beneath_mode(
            Some(&dir),
            Path::new("."),
            libc::O_TMPFILE | libc::O_WRONLY,
            mode & 0o777,
            BENEATH,
        );
        let (fd, name) = match unnamed {
            Ok(fd) => (fd, CString::default()),
            Err(e) => match e.raw_os_error() {
                Some(libc::EACCES | libc::EPERM) => return Err(denied()),
                // No O_TMPFILE on this filesystem (or kernel): a named temp file.
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL) => {
                    let name = temp_name(&parent.name.to_string_lossy())?;
                    let path = Path::new(std::ffi::OsStr::from_bytes(name.as_bytes()));
                    match open_beneath_mode(
                        Some(&dir),
                        path,
                        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                        mode & 0o777,
                        BENEATH,
                    ) {
                        Ok(fd) => (fd, name),
                        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
                            return Err(denied())
                        }
                        Err(e) => return Err(io("create temp file")(e)),
                    }
                }
                _ => return Err(io("create temp file")(e)),
            },
        };
        let t = TempFile {
            dir,
            name,
            target: parent.c_name(),
            path: parent.path.clone(),
            file: std::fs::File::from(fd),
            mode,
            keep: None,
            written: 0,
            staged: false,
            own: Vec::new(),
        };
        let mut t = t;
        let own = if t.name.as_bytes().is_empty() {
            let st = super::keep::fstat_of(t.file.as_fd()).map_err(io("stat temp file"))?;
            own_temps::unnamed(st.st_ino)
        } else {
            t.name.as_bytes().to_vec()
        };
        own_temps::hold(&own);
        t.own.push(own);
        // The exact mode now (the umask may have narrowed it); a named temp file is removed
        // by the drop if this fails.
        // SAFETY: fchmod on a descriptor we own.
        if unsafe { libc::fchmod(t.file.as_raw_fd(), mode as libc::mode_t) } != 0 {
            return Err(io("chmod temp file")(std::io::Error::last_os_error()));
        }
        Ok(t)
    }

    /// Gives the file, once complete, what the replaced file keeps (its mode becomes
    /// `keep.mode`).
    pub fn keeping(mut self, keep: Option<Keep>) -> TempFile {
        if let Some(k) = &keep {
            self.mode = k.mode;
        }
        self.keep = keep;
        self
    }

    pub fn write(&mut self, data: &[u8]) -> Result<(), ExecError> {
        self.file.write_all(data).map_err(io("write"))?;
        self.written += data.len() as u64;
        Ok(())
    }

    /// fsync, rename over the target, fsync the directory.
    pub fn commit(self) -> Result<u64, ExecError> {
        self.install(false)
    }

    /// Completes the temp file: the ACL and mode it keeps (else its exact mode once more:
    /// without CAP_FSETID every write() cleared setuid/setgid), fsynced; the owner it keeps
    /// comes when it is installed. The target is untouched.
    pub fn stage(&mut self) -> Result<(), ExecError> {
        if self.staged {
            return Ok(());
        }
        if let Some(k) = &self.keep {
            k.apply_access(self.file.as_fd(), &self.path)?;
        } else if self.mode & 0o6000 != 0 {
            // SAFETY: fchmod on a descriptor we own.
            if unsafe { libc::fchmod(self.file.as_raw_fd(), self.mode as libc::mode_t) } != 0 {
                return Err(io("chmod temp file")(std::io::Error::last_os_error()));
            }
        }
        self.file.sync_all().map_err(io("fsync"))?;
        self.staged = true;
        Ok(())
    }

    /// Names the staged file (when unnamed) and then gives it the owner it keeps: after the
    /// link, since a file that belongs to another user may not be linked by us.
    fn ready(&mut self) -> Result<(), ExecError> {
        self.stage()?;
        self.link()?;
        if let Some(k) = &self.keep {
            if k.apply_owner(self.file.as_fd(), &self.path)? {
                self.file.sync_all().map_err(io("fsync"))?;
            }
        }
        Ok(())
    }

    /// Gives an unnamed temp file its temp name in the directory (a no-op for a named one).
    fn link(&mut self) -> Result<(), ExecError> {
        if !self.name.as_bytes().is_empty() {
            return Ok(());
        }
        let name = temp_name(&self.target.to_string_lossy())?;
        own_temps::hold(name.as_bytes());
        self.own.push(name.as_bytes().to_vec());
        let proc = CString::new(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
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
        Ok(())
    }

    /// Renames the staged temp file over the target (with `no_replace`, only where no entry
    /// is: S213 otherwise) and fsyncs the directory.
    pub fn install(mut self, no_replace: bool) -> Result<u64, ExecError> {
        self.ready()?;
        let flags = if no_replace {
            libc::RENAME_NOREPLACE
        } else {
            0
        };
        // SAFETY: renameat2 within one directory fd we own, with NUL-terminated names. The
        // target is replaced atomically; a symlink at the target is replaced, not followed.
        let rc = unsafe {
            libc::renameat2(
                self.dir.as_raw_fd(),
                self.name.as_ptr(),
                self.dir.as_raw_fd(),
                self.target.as_ptr(),
                flags,
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EEXIST) if no_replace => {
                    ExecError::Exists(self.path.to_string_lossy().into_owned())
                }
                _ => self.rename_error(e),
            });
        }
        // The temp name is gone now; do not unlink it on drop.
        self.name = CString::default();
        fsync_dir(&self.dir);
        Ok(self.written)
    }

    fn rename_error(&self, e: std::io::Error) -> ExecError {
        match e.raw_os_error() {
            Some(libc::EISDIR) | Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => {
                ExecError::WrongType(format!("is a directory: {}", self.target.to_string_lossy()))
            }
            _ => io("rename")(e),
        }
    }

    /// Installs as one entry of a batch: a target that exists is swapped with the temp file,
    /// whose name then holds the pre-image; a missing one is created without replacing
    /// anything that appears meanwhile.
    fn install_undoably(mut self) -> Result<Installed, ExecError> {
        self.ready()?;
        let ino = {
            let st = super::keep::fstat_of(self.file.as_fd()).map_err(io("stat temp file"))?;
            (st.st_dev, st.st_ino)
        };
        let dir = self.dir.as_raw_fd();
        let rename = |flags: libc::c_uint| {
            // SAFETY: renameat2 within one directory fd we own, with NUL-terminated names.
            let rc = unsafe {
                libc::renameat2(dir, self.name.as_ptr(), dir, self.target.as_ptr(), flags)
            };
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        // A target that comes and goes meanwhile is looked at again (at most a few times).
        for _ in 0..4 {
            let undo = match statat(&self.dir, &self.target, true) {
                Ok(st) if is_dir(&st) => {
                    return Err(self.rename_error(std::io::Error::from_raw_os_error(libc::EISDIR)))
                }
                Ok(_) => match rename(libc::RENAME_EXCHANGE) {
                    Ok(()) => {
                        // The temp name now holds what the target was. A directory swapped in
                        // since the stat goes straight back.
                        if statat(&self.dir, &self.name, true).is_ok_and(|st| is_dir(&st)) {
                            let _ = rename(libc::RENAME_EXCHANGE);
                            return Err(
                                self.rename_error(std::io::Error::from_raw_os_error(libc::EISDIR))
                            );
                        }
                        Undo::Exchanged {
                            preimage: std::mem::take(&mut self.name),
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    // No RENAME_EXCHANGE on this filesystem: replaced without a pre-image.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => match rename(0) {
                        Ok(()) => Undo::Lost,
                        Err(e) => return Err(self.rename_error(e)),
                    },
                    Err(e) => return Err(self.rename_error(e)),
                },
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    match rename(libc::RENAME_NOREPLACE) {
                        Ok(()) => Undo::Created,
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => match rename(0) {
                            Ok(()) => Undo::Created,
                            Err(e) => return Err(self.rename_error(e)),
                        },
                        Err(e) => return Err(self.rename_error(e)),
                    }
                }
                Err(e) => return Err(io("stat target")(e)),
            };
            // Installed: the drop must not unlink anything now.
            self.name = CString::default();
            fsync_dir(&self.dir);
            return Ok(Installed {
                dir: self.dir.try_clone().map_err(io("dup dir"))?,
                target: self.target.clone(),
                path: self.path.clone(),
                ino,
                undo,
                written: self.written,
            });
        }
        Err(ExecError::Internal(format!(
            "{}: the target kept appearing and disappearing during the rename",
            self.path.display()
        )))
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
        for name in self.own.drain(..) {
            own_temps::release(&name);
        }
    }
}

/// How an installed batch entry is undone.
enum Undo {
    /// The target existed: its pre-image is under this name in the same directory.
    Exchanged { preimage: CString },
    /// The target did not exist: remove it again.
    Created,
    /// The target existed, but the filesystem cannot exchange: nothing to put back.
    Lost,
}

/// A batch entry that is in place.
struct Installed {
    dir: OwnedFd,
    target: CString,
    path: PathBuf,
    /// The (device, inode) the target is now, so an undo never touches another writer's.
    ino: (libc::dev_t, libc::ino_t),
    undo: Undo,
    written: u64,
}

impl Installed {
    fn still_ours(&self) -> bool {
        statat(&self.dir, &self.target, true).is_ok_and(|st| (st.st_dev, st.st_ino) == self.ino)
    }

    /// Puts the target back as it was; on failure, says what is left where.
    fn undo(self) -> Result<(), String> {
        let dir = self.dir.as_raw_fd();
        let ours = self.still_ours();
        let restored = match &self.undo {
            // Someone replaced it since: their write stands, ours is already gone.
            _ if !ours => true,
            Undo::Exchanged { preimage } => {
                // SAFETY: renameat2 within one directory fd we own, NUL-terminated names.
                unsafe {
                    libc::renameat2(
                        dir,
                        preimage.as_ptr(),
                        dir,
                        self.target.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    ) == 0
                }
            }
            // SAFETY: unlinkat of the file this batch created, in a directory fd we own.
            Undo::Created => unsafe { libc::unlinkat(dir, self.target.as_ptr(), 0) == 0 },
            Undo::Lost => false,
        };
        if restored {
            self.finish();
            return Ok(());
        }
        let path = self.path.display();
        Err(match &self.undo {
            // The pre-image stays on disk for the operator.
            Undo::Exchanged { preimage } => format!(
                "{path} (its previous content is kept beside it as {})",
                preimage.to_string_lossy()
            ),
            Undo::Created => format!("{path} (created by the batch)"),
            Undo::Lost => format!(
                "{path} (replaced without a pre-image: the filesystem has no RENAME_EXCHANGE)"
            ),
        })
    }

    /// Removes the pre-image (or, after an undo, the new content that took its name).
    fn finish(self) {
        if let Undo::Exchanged { preimage } = &self.undo {
            // SAFETY: unlinkat of our own temp name in a directory fd we own.
            unsafe {
                libc::unlinkat(self.dir.as_raw_fd(), preimage.as_ptr(), 0);
            }
        }
        fsync_dir(&self.dir);
    }
}

/// Why a batch did not land: entry `index` failed with `error`; the entries before it were
/// put back, except those named in `not_restored` (which keep their new content).
#[derive(Debug)]
pub struct BatchFailure {
    pub index: usize,
    pub error: ExecError,
    pub not_restored: Vec<String>,
}

/// Installs staged temp files in order, all or nothing: when one cannot be renamed into
/// place, those before it are put back first. Returns the bytes written of each.
pub fn install_all(temps: Vec<TempFile>) -> Result<Vec<u64>, BatchFailure> {
    let mut done: Vec<Installed> = Vec::with_capacity(temps.len());
    for (index, t) in temps.into_iter().enumerate() {
        match t.install_undoably() {
            Ok(i) => done.push(i),
            Err(error) => {
                let mut not_restored = Vec::new();
                for d in done.into_iter().rev() {
                    if let Err(left) = d.undo() {
                        not_restored.push(left);
                    }
                }
                not_restored.reverse();
                if !not_restored.is_empty() {
                    tracing::error!(
                        ?not_restored,
                        "a files[] batch failed at entry {index} and these targets could not be put back (they keep the batch's content); check them and write them again: {error}"
                    );
                }
                return Err(BatchFailure {
                    index,
                    error,
                    not_restored,
                });
            }
        }
    }
    Ok(done
        .into_iter()
        .map(|d| {
            let n = d.written;
            d.finish();
            n
        })
        .collect())
}

fn fsync_dir(dir: &OwnedFd) {
    // SAFETY: fsync on a directory fd we own (opened O_RDONLY by Jail::parent).
    unsafe {
        libc::fsync(dir.as_raw_fd());
    }
}

/// Writes `data` to the parent's entry atomically with `mode` and what the replaced file
/// keeps. Returns the bytes written.
pub fn write_atomic(
    parent: &Parent,
    data: &[u8],
    mode: u32,
    keep: Option<Keep>,
) -> Result<u64, ExecError> {
    let mut t = TempFile::create(parent, mode)?.keeping(keep);
    t.write(data)?;
    t.commit()
}

/// Replaces `target`, a file of the executor's own state (not a caller's path: it is not
/// resolved beneath a jail), with `data`: a temp file beside it (named as [`temp_name`]
/// names one, created new with `mode`, never following a symlink) → write → fsync → rename over the
/// target → fsync of the directory. A failed write leaves no temp file behind.
pub fn replace_own_file(target: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let (Some(dir), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} names no file in a directory", target.display()),
        ));
    };
    let tmp_name = temp_file_name(&name.to_string_lossy());
    let tmp = dir.join(&tmp_name);
    own_temps::hold(tmp_name.as_bytes());
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, target)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    own_temps::release(tmp_name.as_bytes());
    result
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> ExecError {
    move |e| match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
            ExecError::Internal(format!("{what}: no space left: {e}"))
        }
        _ => ExecError::Internal(format!("{what}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jail::Jail;

    fn jail(root: &Path) -> Jail {
        Jail::new(&[root.to_string_lossy().into()], &[], &[]).unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn staged(j: &Jail, path: &str, data: &[u8]) -> TempFile {
        let parent = j.parent(path, false).unwrap();
        let mut t = TempFile::create(&parent, 0o640).unwrap();
        t.write(data).unwrap();
        t.stage().unwrap();
        t
    }

    /// A staged file has no name: nothing of a batch is visible before its commit.
    #[test]
    fn staged_files_are_invisible() {
        let dir = tempfile::tempdir().unwrap();
        let j = jail(dir.path());
        let t = staged(&j, "a", b"A");
        assert!(names(dir.path()).is_empty());
        drop(t);
        assert!(names(dir.path()).is_empty());
    }

    /// A batch lands whole: a replaced target gets the new bytes and mode, a new one is
    /// created, and no pre-image or temp name is left.
    #[test]
    fn a_batch_lands_whole() {
        let dir = tempfile::tempdir().unwrap();
        let j = jail(dir.path());
        std::fs::write(dir.path().join("old"), "OLD").unwrap();
        let temps = vec![staged(&j, "old", b"new old"), staged(&j, "new", b"new")];
        assert_eq!(install_all(temps).unwrap(), vec![7, 3]);
        assert_eq!(std::fs::read(dir.path().join("old")).unwrap(), b"new old");
        assert_eq!(std::fs::read(dir.path().join("new")).unwrap(), b"new");
        assert_eq!(names(dir.path()), ["new", "old"]);
    }

    /// The last target became a directory after its entry was staged: its rename fails, and
    /// the entries before it are put back (the replaced file's bytes, the new file gone).
    #[test]
    fn a_rename_failing_part_way_puts_the_batch_back() {
        let dir = tempfile::tempdir().unwrap();
        let j = jail(dir.path());
        std::fs::write(dir.path().join("old"), "OLD").unwrap();
        let temps = vec![
            staged(&j, "old", b"new old"),
            staged(&j, "new", b"new"),
            staged(&j, "late", b"late"),
        ];
        std::fs::create_dir(dir.path().join("late")).unwrap();
        std::fs::write(dir.path().join("late/x"), "x").unwrap();
        let f = install_all(temps).unwrap_err();
        assert_eq!(f.index, 2);
        assert!(
            matches!(&f.error, ExecError::WrongType(m) if m == "is a directory: late"),
            "{:?}",
            f.error
        );
        assert!(f.not_restored.is_empty(), "{:?}", f.not_restored);
        assert_eq!(std::fs::read(dir.path().join("old")).unwrap(), b"OLD");
        assert_eq!(names(dir.path()), ["late", "old"]);
        assert_eq!(names(&dir.path().join("late")), ["x"]);
    }

    /// An undo never touches a target another writer replaced meanwhile: its write stands.
    #[test]
    fn an_undo_leaves_another_writers_file() {
        let dir = tempfile::tempdir().unwrap();
        let j = jail(dir.path());
        std::fs::write(dir.path().join("old"), "OLD").unwrap();
        let done = staged(&j, "old", b"ours").install_undoably().unwrap();
        std::fs::write(dir.path().join("other"), "theirs").unwrap();
        std::fs::rename(dir.path().join("other"), dir.path().join("old")).unwrap();
        assert!(done.undo().is_ok());
        assert_eq!(std::fs::read(dir.path().join("old")).unwrap(), b"theirs");
        assert_eq!(names(dir.path()), ["old"]);
    }

    #[test]
    fn an_own_file_is_replaced_whole_and_a_failed_write_leaves_no_temp_file() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("state.json");
        std::fs::write(&target, "old").unwrap();
        replace_own_file(&target, b"new", 0o600).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A directory where the file should go: the rename fails, the target stays, and no
        // temp file is left beside it.
        let taken = d.path().join("taken");
        std::fs::create_dir(&taken).unwrap();
        std::fs::write(taken.join("inside"), "x").unwrap();
        assert!(replace_own_file(&taken, b"new", 0o600).is_err());
        let mut names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["state.json", "taken"]);
        assert!(taken.join("inside").exists());
        // A target name as long as a file name may be: the temp name is cut to fit.
        let long = d.path().join("l".repeat(255));
        replace_own_file(&long, b"long", 0o600).unwrap();
        assert_eq!(std::fs::read(&long).unwrap(), b"long");
        std::fs::remove_file(&long).unwrap();
        let e = replace_own_file(Path::new("/"), b"x", 0o600).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }
}
