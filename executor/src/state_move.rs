//! Settles the executor's own state where `iii_shell_files::state_place` put it: creates the
//! directories (0700) and, the first time the state moves away from its configured place
//! (an upgrade of a worker whose `turns.data_dir` lies inside a root), moves what is there, so
//! no history is lost. Said at INFO.
//!
//! The move is a `rename` of the whole directory when both places are on one filesystem; else
//! a copy of the regular files of ours (links, special files and other users' files are left
//! behind: they are what a command could have planted), each unlinked from the old tree
//! through its directory's descriptor, and the emptied directories removed. The old
//! place's directories are opened without following a link (its path is canonical, so a link
//! on the way is one a command made), and a place that already holds a store is never
//! overwritten.

use std::os::fd::AsRawFd;
use std::path::Path;

use iii_shell_files::state_place::Place;

use crate::private_dir::PrivateDir;

/// Largest file the cross-filesystem copy carries (a pre-image body is at most
/// `turns.max_blob_bytes`; a log larger than this is left in place, and said).
const MAX_COPIED_FILE: u64 = 1 << 30;

/// Deepest directory the copy descends into (`objects/<hh>/<blob>` is two).
const MAX_COPY_DEPTH: usize = 2;

/// Set by [`leave_alone`].
static LEFT_ALONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes [`settle`] do nothing in this process (`doctor`'s executor, started from an
/// operator's shell whose environment may name another state directory than the service's).
pub fn leave_alone() {
    LEFT_ALONE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Creates the state's directories when jailed (so the command ruleset denies what exists),
/// moving a store found at the configured place once. Unjailed, the stores are made when
/// first used, as before.
pub fn settle(place: &Place, jailed: bool) {
    if LEFT_ALONE.load(std::sync::atomic::Ordering::Relaxed) || !jailed {
        return;
    }
    if let Some(legacy) = &place.legacy {
        adopt(&legacy.turns, &place.turns, "turn store");
        adopt(&legacy.ui_state, &place.ui_state, "pane store");
    }
    for dir in place.dirs() {
        if let Err(e) = PrivateDir::open(dir, true) {
            tracing::error!(dir = %dir.display(), error = %e, "cannot make the executor's state directory; turn history and pane state are not kept: make its parent writable by the command user, or set turns.data_dir (docs/configuration.md)");
        }
    }
}

/// The standing warning of a state that stays inside a root or scratch path (no state
/// directory outside them was found).
pub fn gap(place: &Place) -> Option<String> {
    place.exposed.then(|| {
        format!(
            "the executor's state ({}) lies inside a root or scratch path and no state directory outside them was found ($STATE_DIRECTORY, $XDG_STATE_HOME, $HOME): commands cannot open its files, but can list and remove them; set turns.data_dir to a directory outside fs.host_roots and confinement.scratch_paths",
            place.turns.display()
        )
    })
}

/// Moves the directory `from` to `to` when `to` does not exist yet and `from` is a real
/// directory.
fn adopt(from: &Path, to: &Path, what: &str) {
    if std::fs::symlink_metadata(to).is_ok() {
        return;
    }
    let Some(src) = open_old(from) else {
        return;
    };
    if let Some(parent) = to.parent() {
        if let Err(e) = PrivateDir::open(parent, true) {
            tracing::error!(to = %to.display(), error = %e, "cannot make the executor's state directory to move the {what} into; it stays where it was and is not used: make the directory writable by the command user");
            return;
        }
    }
    match rename(&src, to) {
        Ok(()) => {
            tracing::info!(from = %from.display(), to = %to.display(), "moved the {what} out of the commands' reach (it was inside a root or scratch path)");
        }
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => copy_then_remove(&src, from, to, what),
        Err(e) => {
            tracing::error!(from = %from.display(), to = %to.display(), error = %e, "cannot move the {what} out of the commands' reach; its history is not used: move the directory there by hand");
        }
    }
}

/// The old place, as a directory of ours reached without following a link.
fn open_old(from: &Path) -> Option<PrivateDir> {
    // The path is canonical: a link anywhere on the way is one made since, by a command.
    iii_shell_files::jail::open_beneath(
        None,
        from.parent()?,
        libc::O_PATH | libc::O_DIRECTORY,
        libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    )
    .ok()?;
    match PrivateDir::open(from, false) {
        Ok(d) => Some(d),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!(from = %from.display(), error = %e, "the executor's old state directory is not one of its own (a link, or another user's): it is not moved");
            None
        }
    }
}

/// `rename(2)` of the directory `src` (by its parent's descriptor) to `to`, never replacing.
fn rename(src: &PrivateDir, to: &Path) -> std::io::Result<()> {
    let from = src.path();
    let (Some(parent), Some(name)) = (from.parent(), from.file_name()) else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    let dir = iii_shell_files::jail::open_beneath(
        None,
        parent,
        libc::O_PATH | libc::O_DIRECTORY,
        libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    )?;
    use std::os::unix::ffi::OsStrExt;
    let old = std::ffi::CString::new(name.as_bytes())?;
    let new = std::ffi::CString::new(to.as_os_str().as_bytes())?;
    // SAFETY: renameat2 with NUL-terminated names, relative to a directory fd we own (the new
    // name is absolute); RENAME_NOREPLACE never overwrites a store that appeared meanwhile.
    let rc = unsafe {
        libc::renameat2(
            dir.as_raw_fd(),
            old.as_ptr(),
            libc::AT_FDCWD,
            new.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The cross-filesystem move: copy, then remove the old tree.
fn copy_then_remove(src: &PrivateDir, from: &Path, to: &Path, what: &str) {
    let copied = PrivateDir::open(to, true).and_then(|dst| copy_dir(src, &dst, 0));
    match copied {
        Ok(n) => {
            if let Err(e) = remove_old(src) {
                tracing::warn!(from = %from.display(), error = %e, "the {what} was copied out of the commands' reach, but its old directory could not be removed: remove it by hand");
            }
            tracing::info!(from = %from.display(), to = %to.display(), files = n, "moved the {what} out of the commands' reach (it was inside a root or scratch path)");
        }
        Err(e) => {
            tracing::error!(from = %from.display(), to = %to.display(), error = %e, "cannot copy the {what} out of the commands' reach; its history is not used: copy the directory there by hand");
        }
    }
}

/// Removes the old top directory (emptied by the copy) through its parent's descriptor,
/// reached without following a link.
fn remove_old(src: &PrivateDir) -> std::io::Result<()> {
    let from = src.path();
    let (Some(parent), Some(name)) = (from.parent(), from.file_name().and_then(|n| n.to_str()))
    else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    let dir = iii_shell_files::jail::open_beneath(
        None,
        parent,
        libc::O_PATH | libc::O_DIRECTORY,
        libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    )?;
    let c = std::ffi::CString::new(name)?;
    // SAFETY: unlinkat relative to a directory fd we own, with a NUL-terminated name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Moves the regular files of ours and the directories of `src` into `dst` (each copied,
/// then unlinked from `src` through its descriptor; what is left behind keeps its directory);
/// how many files.
fn copy_dir(src: &PrivateDir, dst: &PrivateDir, depth: usize) -> std::io::Result<usize> {
    let mut n = 0;
    for e in src.entries()? {
        if e.is_dir && depth < MAX_COPY_DEPTH {
            if let Ok(from) = src.sub(&e.name, false) {
                n += copy_dir(&from, &dst.sub(&e.name, true)?, depth + 1)?;
                let _ = src.remove_dir(&e.name);
            }
        } else if e.is_file {
            match src.read(&e.name, MAX_COPIED_FILE) {
                Ok(Some(data)) => {
                    dst.replace(&e.name, &data)?;
                    src.remove(&e.name)?;
                    n += 1;
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(file = %src.path().join(&e.name).display(), error = %err, "not carried to the executor's new state directory");
                }
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iii_shell_files::state_place::Legacy;

    #[test]
    fn a_store_at_the_old_place_moves_once_and_a_new_one_is_never_overwritten() {
        let t = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(t.path()).unwrap();
        let old = base.join("w/data/shell");
        std::fs::create_dir_all(old.join("turns/sessions")).unwrap();
        std::fs::create_dir_all(old.join("ui-state")).unwrap();
        std::fs::write(old.join("turns/sessions/s.jsonl"), "{}\n").unwrap();
        std::fs::write(old.join("ui-state/p.json"), "{}").unwrap();
        let place = Place {
            turns: base.join("state/ab/turns"),
            ui_state: base.join("state/ab/ui-state"),
            legacy: Some(Legacy {
                turns: old.join("turns"),
                ui_state: old.join("ui-state"),
            }),
            exposed: false,
        };
        settle(&place, true);
        assert_eq!(
            std::fs::read_to_string(place.turns.join("sessions/s.jsonl")).unwrap(),
            "{}\n"
        );
        assert!(place.ui_state.join("p.json").is_file());
        assert!(!old.join("turns").exists() && !old.join("ui-state").exists());
        // A store made at the old place again later is not moved over the one in use.
        std::fs::create_dir_all(old.join("turns/sessions")).unwrap();
        std::fs::write(old.join("turns/sessions/s.jsonl"), "new\n").unwrap();
        settle(&place, true);
        assert_eq!(
            std::fs::read_to_string(place.turns.join("sessions/s.jsonl")).unwrap(),
            "{}\n"
        );
    }

    #[test]
    fn the_copy_carries_only_regular_files_of_ours() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("objects/ab")).unwrap();
        std::fs::write(src.join("objects/ab/blob"), "b").unwrap();
        std::fs::write(t.path().join("outside"), "secret").unwrap();
        std::os::unix::fs::symlink(t.path().join("outside"), src.join("objects/ab/link")).unwrap();
        std::fs::hard_link(t.path().join("outside"), src.join("hard")).unwrap();
        let from = PrivateDir::open(&src, false).unwrap();
        let to = PrivateDir::open(&t.path().join("dst"), true).unwrap();
        assert_eq!(copy_dir(&from, &to, 0).unwrap(), 1);
        assert_eq!(
            std::fs::read_to_string(t.path().join("dst/objects/ab/blob")).unwrap(),
            "b"
        );
        assert!(!t.path().join("dst/hard").exists());
        assert!(std::fs::symlink_metadata(t.path().join("dst/objects/ab/link")).is_err());
        // Moved, not copied: the blob left the old tree; what was left behind stays there.
        assert!(!src.join("objects/ab/blob").exists());
        assert!(src.join("hard").exists());
        assert_eq!(
            std::fs::read_to_string(t.path().join("outside")).unwrap(),
            "secret"
        );
        assert!(remove_old(&from).is_err(), "not empty: kept");
    }
}
