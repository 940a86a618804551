//! The `HOME` commands get under a policy ([`iii_shell_policy::home`] decides which), and
//! the per-worker default directory, which this module creates.
//!
//! The default lives in the first existing scratch path (usually `/tmp`, a directory every
//! local user can write), so it is made the way a shared directory must be used:
//! * the scratch directory itself must be root's or the command user's, and not writable by
//!   others unless it is sticky (else another user could rename our directory away);
//! * `mkdirat(scratch_fd, name, 0700)`, then `openat(O_DIRECTORY | O_NOFOLLOW)`: a symlink or
//!   file planted under the name is refused, never followed;
//! * the directory must belong to the command user (the executor runs as that user by then,
//!   so a fresh one does): one another user made first is refused, not used or chowned;
//! * its mode is set to exactly 0700 through the descriptor.
//!
//! It is kept, so what commands write to `~` (git configuration, caches) outlives calls and
//! restarts of the worker.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use iii_shell_policy::home::{self, HomeChoice};
use iii_shell_protocol::config::Config;

use crate::jail::{fd_path, fstat, open_beneath};

/// The `HOME` of a policy, as settled when it was installed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Home {
    /// What commands get (`None`: no `HOME` at all).
    pub path: Option<String>,
    /// Where it comes from, for `doctor`.
    pub source: String,
    /// Why commands cannot use it, with what to do (logged once, shown by `doctor`).
    pub warning: Option<String>,
}

impl Home {
    /// The forwarded `HOME`, before [`settle`] ran (a policy built but not installed:
    /// `check-config`, tests).
    pub fn unsettled(forwarded: Option<&str>) -> Home {
        Home {
            path: forwarded.map(str::to_string),
            source: "the worker's own HOME (not settled: no policy installed)".into(),
            warning: None,
        }
    }
}

/// This worker's identity ([`home::worker_identity`]): `III_NAMESPACE` and
/// `III_WORKER_NAME` from the executor's environment (blank = unset), and `turns.data_dir`.
pub fn identity(config: &Config) -> String {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    home::worker_identity(
        var("III_NAMESPACE").as_deref(),
        var("III_WORKER_NAME").as_deref(),
        &config.turns.data_dir,
    )
}

/// What [`settle`] would decide, creating nothing (`check-config`): the per-worker default
/// is named, in the first scratch path that is a directory now.
pub fn preview(config: &Config, forwarded: Option<&str>, uid: u32) -> Home {
    let roots = &config.fs.host_roots;
    let scratch = &config.confinement.scratch_paths;
    let writable = forwarded.is_some_and(|h| writable_by(h, uid));
    let choice = home::choose(
        config.env.home.as_deref(),
        forwarded,
        writable,
        roots,
        scratch,
    );
    if !matches!(choice, HomeChoice::PerWorker | HomeChoice::Unwritable(_)) {
        return settle(config, forwarded, uid, "");
    }
    let name = home::default_home_name(uid, &identity(config));
    match scratch.iter().find(|s| Path::new(s).is_dir()) {
        Some(s) => {
            let path = Path::new(s).join(name).to_string_lossy().into_owned();
            Home {
                warning: instead(&choice, uid, &path),
                path: Some(path),
                source: format!(
                    "the per-worker default, made for uid {uid} with mode 0700 when the executor takes this policy"
                ),
            }
        }
        None => unavailable(&choice, forwarded, uid, NO_SCRATCH.into()),
    }
}

/// Whether `uid` (the command user) may create entries in the directory `path`. For the
/// executor's own effective uid (it acts as the command user by the time it settles a
/// policy) the kernel answers (`faccessat` with `AT_EACCESS`); for another (`check-config`,
/// run before any switch) its owner, group and mode bits do ([`home::mode_lets_write`]).
pub fn writable_by(path: &str, uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(cpath) = CString::new(path) else {
        return false;
    };
    // SAFETY: geteuid cannot fail.
    if uid == unsafe { libc::geteuid() } {
        // SAFETY: `cpath` is a valid NUL-terminated string that outlives the call.
        return std::fs::metadata(path).is_ok_and(|m| m.is_dir())
            && unsafe {
                libc::faccessat(
                    libc::AT_FDCWD,
                    cpath.as_ptr(),
                    libc::W_OK | libc::X_OK,
                    libc::AT_EACCESS,
                )
            } == 0;
    }
    let Ok(md) = std::fs::metadata(path) else {
        return false;
    };
    let gid = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or(uid, |u| u.gid.as_raw());
    md.is_dir() && home::mode_lets_write(md.uid(), md.gid(), md.mode(), uid, &[gid])
}

/// The warning of a per-worker default used instead of the worker's own `HOME`.
fn instead(choice: &HomeChoice, uid: u32, per_worker: &str) -> Option<String> {
    match choice {
        HomeChoice::Unwritable(h) => Some(format!(
            "the worker's HOME ({h}) is not writable by uid {uid} that commands run as: commands get the per-worker home {per_worker} instead; set env.home to a directory uid {uid} can write, or give it {h}"
        )),
        _ => None,
    }
}

const NO_SCRATCH: &str = "confinement.scratch_paths names no existing directory to keep a per-worker home in; add one (e.g. /tmp) or set env.home to a directory under a root";

/// The per-worker default could not be made: commands keep the forwarded `HOME` (unusable in
/// the jail) unless the command user cannot write it (then they get none), and the warning
/// says why.
fn unavailable(choice: &HomeChoice, forwarded: Option<&str>, uid: u32, why: String) -> Home {
    if let HomeChoice::Unwritable(h) = choice {
        return Home {
            path: None,
            source: "none (the worker's HOME is not writable by the command user, and the per-worker default is unavailable)".into(),
            warning: Some(format!(
                "commands get no HOME: the worker's HOME ({h}) is not writable by uid {uid} that commands run as, and the per-worker default is unavailable: {why}"
            )),
        };
    }
    let now = match forwarded {
        Some(h) => format!("HOME={h}, which they cannot use"),
        None => "no HOME".into(),
    };
    Home {
        path: forwarded.map(str::to_string),
        source: "the worker's own HOME (the per-worker default is unavailable)".into(),
        warning: Some(format!("jailed commands get {now}: {why}")),
    }
}

/// Decides the `HOME` of `config` for commands acting as `uid` and, for the per-worker
/// default, creates it. `forwarded` is `HOME` in the forwarded environment, `identity` the
/// worker's ([`home::worker_identity`]).
pub fn settle(config: &Config, forwarded: Option<&str>, uid: u32, identity: &str) -> Home {
    let roots = &config.fs.host_roots;
    let scratch = &config.confinement.scratch_paths;
    let writable = forwarded.is_some_and(|h| writable_by(h, uid));
    let choice = home::choose(
        config.env.home.as_deref(),
        forwarded,
        writable,
        roots,
        scratch,
    );
    let gap = home::gap(&choice, roots, scratch);
    match choice.clone() {
        HomeChoice::Configured(h) => {
            let warning = gap.or_else(|| {
                (!Path::new(&h).is_dir()).then(|| {
                    format!(
                        "env.home ({h}) is not an existing directory: commands cannot use ~; create it, owned by uid {uid}, or set env.home to one that exists"
                    )
                })
            });
            Home {
                path: Some(h),
                source: "env.home".into(),
                warning,
            }
        }
        HomeChoice::Forwarded(h) => Home {
            path: Some(h),
            source: "the worker's own HOME".into(),
            warning: None,
        },
        HomeChoice::Unset => Home {
            path: None,
            source: "none (the worker has no HOME to forward)".into(),
            warning: None,
        },
        HomeChoice::PerWorker | HomeChoice::Unwritable(_) => {
            let name = home::default_home_name(uid, identity);
            match per_worker(scratch, &name, uid) {
                Ok(p) => {
                    let path = p.to_string_lossy().into_owned();
                    Home {
                        warning: instead(&choice, uid, &path),
                        path: Some(path),
                        source: format!(
                            "the per-worker default: owned by uid {uid}, mode 0700, kept across calls and restarts"
                        ),
                    }
                }
                Err(why) => unavailable(&choice, forwarded, uid, why),
            }
        }
    }
}

/// The per-worker default under the first scratch path that exists: created or checked
/// (see the module doc). The error says what to do.
fn per_worker(scratch: &[String], name: &str, uid: u32) -> Result<PathBuf, String> {
    let Some((parent, dir)) = scratch.iter().find_map(|s| {
        open_beneath(None, Path::new(s), libc::O_PATH | libc::O_DIRECTORY, 0)
            .ok()
            .map(|fd| (s, fd))
    }) else {
        return Err(NO_SCRATCH.into());
    };
    let fix = "or set env.home to a directory under a root or a scratch path";
    let st = fstat(&dir).map_err(|e| format!("cannot stat {parent}: {e}; {fix}"))?;
    if st.st_uid != 0 && st.st_uid != uid {
        return Err(format!(
            "{parent} belongs to uid {}, who could replace a home made in it; make the first of confinement.scratch_paths a directory of root's, {fix}",
            st.st_uid
        ));
    }
    if st.st_mode & 0o022 != 0 && st.st_mode & libc::S_ISVTX == 0 {
        return Err(format!(
            "{parent} is writable by other users and not sticky, so another user could replace a home made in it; make it sticky (chmod +t {parent}), {fix}"
        ));
    }
    let path = Path::new(parent).join(name);
    let shown = path.display();
    let cname = CString::new(name).map_err(|_| format!("bad home name {name:?}"))?;
    // SAFETY: `cname` is a valid NUL-terminated string that outlives the call; `dir` is an
    // open directory descriptor.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), cname.as_ptr(), 0o700) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(format!("cannot create {shown}: {e}; {fix}"));
        }
    }
    // SAFETY: as above; the returned descriptor is fresh and owned by us.
    let raw = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            cname.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if raw < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR) => format!(
                "{shown} is not a directory (a symlink or a file was put there, and is not followed); remove it, {fix}"
            ),
            _ => format!("cannot open {shown}: {e}; {fix}"),
        });
    }
    // SAFETY: openat returned a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let st = fstat(&fd).map_err(|e| format!("cannot stat {shown}: {e}; {fix}"))?;
    if st.st_uid != uid {
        return Err(format!(
            "{shown} belongs to uid {}, not to uid {uid} that commands run as (someone else made it first); remove it, {fix}",
            st.st_uid
        ));
    }
    if st.st_mode & 0o7777 != 0o700 {
        // SAFETY: fchmod on a descriptor we own; no memory is passed.
        if unsafe { libc::fchmod(fd.as_raw_fd(), 0o700) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!(
                "cannot set the mode of {shown} to 0700: {e}; {fix}"
            ));
        }
    }
    Ok(fd_path(&fd).unwrap_or(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn me() -> u32 {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() }
    }

    fn jailed(root: &Path, scratch: &Path) -> Config {
        let mut c = Config::builtin_default();
        c.fs.host_roots = vec![root.to_string_lossy().into_owned()];
        c.confinement.scratch_paths = vec![
            "/nonexistent-iii-scratch".into(),
            scratch.to_string_lossy().into_owned(),
        ];
        c
    }

    #[test]
    fn the_per_worker_default_is_created_0700_and_kept() {
        let t = tempfile::tempdir().unwrap();
        let (root, scratch) = (t.path().join("root"), t.path().join("scratch"));
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&scratch).unwrap();
        std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let c = jailed(&root, &scratch);
        let h = settle(&c, Some("/root"), me(), "id");
        let want = scratch.join(home::default_home_name(me(), "id"));
        assert_eq!(h.path.as_deref(), Some(want.to_str().unwrap()));
        assert_eq!(h.warning, None);
        let md = std::fs::metadata(&want).unwrap();
        assert_eq!(md.mode() & 0o7777, 0o700);
        assert_eq!(md.uid(), me());
        // Kept: what was written survives the next settle, which tightens a loosened mode.
        std::fs::write(want.join(".gitconfig"), "x").unwrap();
        std::fs::set_permissions(&want, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(settle(&c, Some("/root"), me(), "id"), h);
        assert_eq!(std::fs::read(want.join(".gitconfig")).unwrap(), b"x");
        assert_eq!(std::fs::metadata(&want).unwrap().mode() & 0o7777, 0o700);
    }

    #[test]
    fn a_planted_symlink_or_a_foreign_directory_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let (root, scratch) = (t.path().join("root"), t.path().join("scratch"));
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&scratch).unwrap();
        let c = jailed(&root, &scratch);
        let name = home::default_home_name(me(), "id");
        // A symlink to a directory of the command user's: not followed.
        let target = t.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        std::os::unix::fs::symlink(&target, scratch.join(&name)).unwrap();
        let h = settle(&c, Some("/root"), me(), "id");
        assert_eq!(h.path.as_deref(), Some("/root"));
        let w = h.warning.unwrap();
        assert!(
            w.starts_with("jailed commands get HOME=/root, which they cannot use: ")
                && w.contains("is not a directory (a symlink or a file was put there, and is not followed); remove it, or set env.home"),
            "{w}"
        );
        assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o7777, 0o755);
        std::fs::remove_file(scratch.join(&name)).unwrap();
        // A dangling symlink (one that would make the directory where it points), and a FIFO
        // (opened, it would block until a writer came): refused at once, nothing made.
        std::os::unix::fs::symlink(t.path().join("made-there"), scratch.join(&name)).unwrap();
        let w = settle(&c, None, me(), "id").warning.unwrap();
        assert!(
            w.contains("is not a directory (a symlink or a file was put there"),
            "{w}"
        );
        assert!(!t.path().join("made-there").exists());
        std::fs::remove_file(scratch.join(&name)).unwrap();
        nix::unistd::mkfifo(
            &scratch.join(&name),
            nix::sys::stat::Mode::from_bits_truncate(0o666),
        )
        .unwrap();
        let w = settle(&c, None, me(), "id").warning.unwrap();
        assert!(
            w.contains("is not a directory (a symlink or a file was put there"),
            "{w}"
        );
        std::fs::remove_file(scratch.join(&name)).unwrap();
        if me() != 0 {
            return;
        }
        // A directory another user made first.
        std::fs::create_dir(scratch.join(&name)).unwrap();
        std::os::unix::fs::chown(scratch.join(&name), Some(4242), Some(4242)).unwrap();
        let w = settle(&c, None, 0, "id").warning.unwrap();
        assert!(
            w.starts_with("jailed commands get no HOME: ")
                && w.contains("belongs to uid 4242, not to uid 0 that commands run as"),
            "{w}"
        );
        // A scratch path others may write that is not sticky.
        std::fs::remove_dir(scratch.join(&name)).unwrap();
        std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o777)).unwrap();
        let w = settle(&c, None, 0, "id").warning.unwrap();
        assert!(
            w.contains("is writable by other users and not sticky"),
            "{w}"
        );
        assert!(!scratch.join(&name).exists());
    }

    #[test]
    fn env_home_and_the_unjailed_home_are_used_as_they_are() {
        let t = tempfile::tempdir().unwrap();
        let mut c = Config::builtin_default();
        c.env.home = Some(t.path().to_string_lossy().into_owned());
        let h = settle(&c, Some("/root"), me(), "id");
        assert_eq!(h.path, c.env.home);
        assert_eq!((h.source.as_str(), h.warning), ("env.home", None));
        c.env.home = Some("/nonexistent-iii-home".into());
        assert_eq!(
            settle(&c, Some("/root"), 7, "id").warning.as_deref(),
            Some("env.home (/nonexistent-iii-home) is not an existing directory: commands cannot use ~; create it, owned by uid 7, or set env.home to one that exists")
        );
        c.env.home = None;
        let own = t.path().to_string_lossy().into_owned();
        let h = settle(&c, Some(&own), me(), "id");
        assert_eq!((h.path.as_deref(), h.warning), (Some(own.as_str()), None));
    }

    /// A worker `HOME` in a scratch path (`HOME=/tmp/w`, as in many containers) that the
    /// command user cannot write is not handed on: the per-worker default is, with a warning
    /// saying why; when that cannot be had either, commands get no `HOME` at all.
    #[test]
    fn a_home_the_command_user_cannot_write_is_replaced_by_the_per_worker_one() {
        if me() != 0 {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let (root, scratch) = (t.path().join("root"), t.path().join("scratch"));
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&scratch).unwrap();
        std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let worker_home = scratch.join("w");
        std::fs::create_dir(&worker_home).unwrap();
        std::fs::set_permissions(&worker_home, std::fs::Permissions::from_mode(0o755)).unwrap();
        let w = worker_home.to_string_lossy().into_owned();
        let c = jailed(&root, &scratch);
        assert!(!writable_by(&w, 4242) && writable_by(&w, 0));
        // The per-worker default cannot be made for uid 4242 by this (root) process: no HOME.
        let h = settle(&c, Some(&w), 4242, "id");
        assert_eq!(h.path, None);
        assert!(
            h.warning.as_deref().is_some_and(|x| x.starts_with(&format!(
                "commands get no HOME: the worker's HOME ({w}) is not writable by uid 4242 that commands run as, and the per-worker default is unavailable: "
            ))),
            "{h:?}"
        );
        // Made by uid 4242 (as the executor acting as it does): used, and the warning says why.
        // (The failed attempt above made it, as root: it stays refused until it is 4242's.)
        let mine = scratch.join(home::default_home_name(4242, "id"));
        std::os::unix::fs::chown(&mine, Some(4242), Some(4242)).unwrap();
        let h = settle(&c, Some(&w), 4242, "id");
        let m = mine.to_string_lossy().into_owned();
        assert_eq!(h.path.as_deref(), Some(m.as_str()));
        assert_eq!(
            h.warning,
            Some(format!("the worker's HOME ({w}) is not writable by uid 4242 that commands run as: commands get the per-worker home {m} instead; set env.home to a directory uid 4242 can write, or give it {w}"))
        );
        let p = preview(&c, Some(&w), 4242).warning.unwrap_or_default();
        assert!(
            p.starts_with(&format!("the worker's HOME ({w}) is not writable by uid 4242 that commands run as: commands get the per-worker home ")),
            "{p}"
        );
        // Writable by the command user: kept, as before.
        std::os::unix::fs::chown(&worker_home, Some(4242), None).unwrap();
        let h = settle(&c, Some(&w), 4242, "id");
        assert_eq!((h.path.as_deref(), h.warning), (Some(w.as_str()), None));
    }
}
