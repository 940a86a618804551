//! Path policy: every caller path becomes an fd opened relative to a jail root.
//!
//! * **Jailed** (`fs.host_roots` set): a relative path resolves against the primary root; an
//!   absolute path must lie lexically inside one of the roots. Resolution is
//!   `openat2(root_fd, rest, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, so a `..` or a symlink
//!   that leads outside, anywhere in the path, fails in the kernel (EXDEV → S215), and a
//!   directory swapped for a symlink mid-call cannot escape either.
//! * **Unjailed** (`fs.allow_unjailed`, no roots): only absolute paths are accepted.
//!
//! After resolution the canonical path (read back from the fd) is checked against
//! `fs.denylist_paths` and `code.non_accessible_globs`; a hit reads exactly like a missing
//! path (S211).
//!
//! **Identity.** A name check alone is beaten by a hardlink or a rename (a command runs
//! `ln private.txt pub.txt`, or `mv secrets public`). Two checks cover that, neither of which
//! holds up a policy:
//! * **At resolution:** a resolved non-directory with more than one link is refused when it
//!   is the same inode as a `fs.denylist_paths` entry, or as a sibling in its own directory
//!   that is protected by name ([`Jail::fd_is_protected`]). Same-directory links are the
//!   ones a confined command can make: linking a protected entry into another directory
//!   would give it rights, which Landlock refuses.
//! * **The record:** the device and inode of every protected entry that exists ([`Protected`]:
//!   the `fs.denylist_paths` entries with everything under them, and every entry inside a
//!   root that matches `code.non_accessible_globs`, with everything under it), found by one
//!   walk ([`Jail::scan_protected`]) that the executor runs off the call path after a policy
//!   is built. [`Jail::is_denied`] refuses a path whose inode is one of them, whatever it is
//!   called now. Commands wait for the walk (their Landlock carve-out comes from it), so no
//!   command of the policy can rename a protected entry before it is recorded. Entries
//!   created after the walk are protected by name only. `shell::fs::mv` also refuses a source
//!   that holds a protected entry ([`Jail::holds_denied`]).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use globset::GlobSet;

use crate::error::ExecError;
use crate::globs;
use crate::ready::Ready;

#[derive(Debug)]
pub struct Root {
    pub path: PathBuf,
    pub fd: OwnedFd,
}

#[derive(Debug)]
pub struct Jail {
    roots: Vec<Root>,
    /// `/`, the anchor of unjailed resolution.
    host_root: OwnedFd,
    denylist: Vec<PathBuf>,
    non_accessible: GlobSet,
    /// Empty until the walk for this policy is done ([`Jail::set_protected`]); shared by the
    /// policies that walk the same tree the same way ([`Jail::share_protected`]).
    protected: std::sync::Arc<Ready<std::sync::Arc<Protected>>>,
    /// A per-call scope ([`Jail::scoped`]): every path resolves beneath it.
    scope: Option<Root>,
}

/// Most entries [`Jail::scan_protected`] visits. Past it the walk stops (and says so in the
/// policy's gaps). It runs off the call path, so the bound is about time and memory only.
pub const SCAN_LIMIT: usize = 2_000_000;

/// Most entries [`Jail::holds_denied`] visits for one `shell::fs::mv`; past it the answer is
/// "yes" (the move is refused).
pub const MOVE_SCAN_LIMIT: usize = 200_000;

/// Most entries of one directory [`Jail::fd_is_protected`] lists to look for a protected
/// sibling of a hardlinked file; past it the file is treated as protected.
pub const SIBLING_LIMIT: usize = 100_000;

/// The protected entries that existed when the roots were walked (after the policy was built).
#[derive(Debug, Default)]
pub struct Protected {
    /// (device, inode) of every protected entry and of everything under a protected directory.
    pub ids: std::collections::HashSet<(u64, u64)>,
    /// The entries inside the roots that match `code.non_accessible_globs` (top-most only),
    /// and the `fs.denylist_paths` entries inside the roots: what commands are denied too.
    pub in_roots: Vec<PathBuf>,
    /// True when the scan stopped at [`SCAN_LIMIT`] (or was given up).
    pub truncated: bool,
    /// How many entries the walk visited.
    pub walked: usize,
}

/// True when a listing failed for a reason other than the directory being gone (or no longer
/// a directory): a permission, a loop, an I/O error.
fn unlistable(e: &std::io::Error) -> bool {
    !matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
}

fn lstat_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Pushes the ids of `dir`'s whole tree (not following symlinks), at most `budget` entries.
fn ids_below(dir: &Path, ids: &mut std::collections::HashSet<(u64, u64)>, budget: &mut usize) {
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if *budget == 0 {
                return;
            }
            *budget -= 1;
            let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            ids.insert((m.dev(), m.ino()));
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
}

/// Where a resolution starts: a root (or `/`) fd, the rest of the path, and the flags.
struct Anchor<'a> {
    base: &'a OwnedFd,
    rest: PathBuf,
    lexical: PathBuf,
    resolve: u64,
}

/// The directory holding an entry, and the entry's name (not followed).
#[derive(Debug)]
pub struct Parent {
    pub dir: OwnedFd,
    pub dir_path: PathBuf,
    pub name: std::ffi::OsString,
    pub path: PathBuf,
    /// The directories this resolution created (`create`), outermost first.
    pub made: Vec<MadeDir>,
}

/// A directory [`Jail::parent`] created: its name in the directory `at`, and its identity.
#[derive(Debug)]
pub struct MadeDir {
    at: OwnedFd,
    name: CString,
    id: (u64, u64),
}

impl Parent {
    pub fn c_name(&self) -> CString {
        // Names come from path components, which never contain NUL (checked in anchor()).
        CString::new(self.name.as_encoded_bytes()).unwrap_or_default()
    }

    /// Removes the directories this resolution created (innermost first), for a call that
    /// failed after it: each only while it is still that directory and empty (`rmdir`), so
    /// what another writer put there meanwhile stays.
    pub fn remove_made(&mut self) {
        remove_made(&mut self.made);
    }
}

/// [`Parent::remove_made`] of a list of created directories.
fn remove_made(made: &mut Vec<MadeDir>) {
    for m in made.drain(..).rev() {
        let same = crate::fs::entry::statat(&m.at, &m.name, true)
            .is_ok_and(|st| (st.st_dev, st.st_ino) == m.id);
        if same {
            // SAFETY: unlinkat(AT_REMOVEDIR) of a name in a directory fd we own; it removes
            // only an empty directory.
            unsafe {
                libc::unlinkat(m.at.as_raw_fd(), m.name.as_ptr(), libc::AT_REMOVEDIR);
            }
        }
    }
}

/// Maps an OS error of a resolution to the wire error: escapes are S215, and missing,
/// denied and looping paths all read the same (S211).
pub fn map_errno(input: &str, e: std::io::Error) -> ExecError {
    match e.raw_os_error() {
        Some(libc::EXDEV) => ExecError::Escape(input.to_string()),
        Some(
            libc::ENOENT
            | libc::EACCES
            | libc::EPERM
            | libc::ENOTDIR
            | libc::ELOOP
            | libc::ENAMETOOLONG,
        ) => ExecError::NotFound(input.to_string()),
        _ => ExecError::Internal(format!("{input}: {e}")),
    }
}

/// A resolved path: an `O_PATH` fd and the canonical absolute path it names.
#[derive(Debug)]
pub struct Resolved {
    pub fd: OwnedFd,
    pub path: PathBuf,
}

impl Jail {
    /// Opens the roots. A root that does not exist or is not a directory fails the policy.
    pub fn new(
        host_roots: &[String],
        denylist_paths: &[String],
        non_accessible_globs: &[String],
    ) -> Result<Jail, String> {
        let mut roots = Vec::new();
        for r in host_roots {
            let canon =
                std::fs::canonicalize(r).map_err(|e| format!("fs.host_roots entry {r}: {e}"))?;
            let fd = open_beneath(None, &canon, libc::O_PATH | libc::O_DIRECTORY, 0)
                .map_err(|e| format!("fs.host_roots entry {r}: {e}"))?;
            roots.push(Root { path: canon, fd });
        }
        let mut denylist = Vec::new();
        for d in denylist_paths {
            let lexical = normalize(Path::new(d));
            if let Ok(canon) = std::fs::canonicalize(&lexical) {
                if canon != lexical {
                    denylist.push(canon);
                }
            }
            denylist.push(lexical);
        }
        let non_accessible = globs::set(
            non_accessible_globs.iter().map(String::as_str),
            globs::Syntax::Config,
        )
        .map_err(|e| match e {
            globs::GlobError::Bad { glob, source } => format!("glob {glob}: {source}"),
            other => other.to_string(),
        })?;
        let host_root = open_beneath(None, Path::new("/"), libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| format!("open /: {e}"))?;
        Ok(Jail {
            roots,
            host_root,
            denylist,
            non_accessible,
            protected: Default::default(),
            scope: None,
        })
    }

    /// This jail confined further to `scope_root` (a directory it resolves; canonical path
    /// and descriptor taken now): a path whose lexical form lies outside it is
    /// [`ExecError::OutOfScope`] before anything is opened, and every other path is resolved
    /// beneath the scope's descriptor (`RESOLVE_BENEATH`), so a link inside the scope
    /// cannot lead out of it, however it is swapped meanwhile. What is denied, protected or a
    /// root stays exactly as in this jail.
    pub fn scoped(&self, scope_root: &str) -> Result<Jail, ExecError> {
        let bad = |why: String| {
            ExecError::Invalid(format!(
                "fs_scope.scope_root {scope_root:?} is not a usable directory ({why})"
            ))
        };
        let r = self
            .resolve_with(scope_root, libc::O_PATH | libc::O_DIRECTORY)
            .map_err(|e| bad(e.to_string()))?;
        let dup = |fd: &OwnedFd| {
            fd.try_clone()
                .map_err(|e| ExecError::Internal(e.to_string()))
        };
        Ok(Jail {
            roots: self
                .roots
                .iter()
                .map(|r| {
                    Ok(Root {
                        path: r.path.clone(),
                        fd: dup(&r.fd)?,
                    })
                })
                .collect::<Result<_, ExecError>>()?,
            host_root: dup(&self.host_root)?,
            denylist: self.denylist.clone(),
            non_accessible: self.non_accessible.clone(),
            protected: self.protected.clone(),
            scope: Some(Root {
                path: r.path,
                fd: r.fd,
            }),
        })
    }

    /// The scope root of a scoped jail.
    pub fn scope_root(&self) -> Option<&Path> {
        self.scope.as_ref().map(|r| r.path.as_path())
    }

    /// Scans for the protected entries that exist now (see the module doc): the denylisted
    /// paths (with their trees) and, inside every root, the entries the globs or the
    /// denylist protect. Iterative, symlinks not followed, at most [`SCAN_LIMIT`] entries. A
    /// directory inside a root that cannot be listed (other than one gone meanwhile) counts as
    /// protected.
    pub fn scan_protected(&self) -> Protected {
        self.scan_protected_until(&|| false)
    }

    /// [`Jail::scan_protected`], given up (and marked truncated) as soon as `stop` says so;
    /// it is asked once per directory.
    pub fn scan_protected_until(&self, stop: &dyn Fn() -> bool) -> Protected {
        use std::os::unix::fs::MetadataExt;
        let mut p = Protected::default();
        let mut budget = SCAN_LIMIT;
        for d in &self.denylist {
            let Ok(m) = std::fs::symlink_metadata(d) else {
                continue;
            };
            p.ids.insert((m.dev(), m.ino()));
            if let Ok(t) = std::fs::metadata(d) {
                p.ids.insert((t.dev(), t.ino()));
            }
            if m.is_dir() {
                ids_below(d, &mut p.ids, &mut budget);
            }
            if self.roots.iter().any(|r| d.starts_with(&r.path)) && !p.in_roots.contains(d) {
                p.in_roots.push(d.clone());
            }
        }
        for root in &self.roots {
            let mut stack = vec![root.path.clone()];
            while let Some(dir) = stack.pop() {
                if stop() {
                    p.truncated = true;
                    p.walked = SCAN_LIMIT - budget;
                    return p;
                }
                let rd = match std::fs::read_dir(&dir) {
                    Ok(rd) => rd,
                    Err(e) if unlistable(&e) => {
                        // What the walk cannot list it cannot vouch for (a caller could have
                        // made it unreadable just for the walk, and readable again after):
                        // it is protected like a match, until a walk can list it.
                        if let Some(id) = lstat_id(&dir) {
                            p.ids.insert(id);
                        }
                        if !p.in_roots.iter().any(|d| dir.starts_with(d)) {
                            p.in_roots.push(dir);
                        }
                        continue;
                    }
                    Err(_) => continue,
                };
                for e in rd.flatten() {
                    if budget == 0 {
                        p.truncated = true;
                        p.walked = SCAN_LIMIT;
                        return p;
                    }
                    budget -= 1;
                    let path = e.path();
                    if self.is_denied_by_name(&path) {
                        let Ok(m) = std::fs::symlink_metadata(&path) else {
                            continue;
                        };
                        p.ids.insert((m.dev(), m.ino()));
                        if m.is_dir() {
                            ids_below(&path, &mut p.ids, &mut budget);
                        }
                        if !p.in_roots.iter().any(|d| path.starts_with(d)) {
                            p.in_roots.push(path);
                        }
                    } else if e.file_type().is_ok_and(|t| t.is_dir()) {
                        // The type from the listing (`d_type`): no `lstat` for the entries
                        // nothing protects, which are nearly all of them.
                        stack.push(path);
                    }
                }
            }
        }
        if budget == 0 {
            p.truncated = true;
        }
        p.walked = SCAN_LIMIT - budget;
        p
    }

    /// Installs the result of [`Jail::scan_protected`] (once; a second call is ignored).
    pub fn set_protected(&self, p: std::sync::Arc<Protected>) {
        self.protected.set(p);
    }

    /// Each denylisted path (as written, and canonical where that differs) with the inode it
    /// names now, if any (symlinks not followed).
    pub fn denylisted_now(&self) -> Vec<(PathBuf, Option<(u64, u64)>)> {
        self.denylist
            .iter()
            .map(|d| (d.clone(), lstat_id(d)))
            .collect()
    }

    /// Where the record of protected entries is (or will be): a newer policy with the same
    /// [`crate::ScanKey`] shares it rather than walking the tree again.
    pub fn protected_cell(&self) -> &std::sync::Arc<Ready<std::sync::Arc<Protected>>> {
        &self.protected
    }

    /// Takes `cell` (another policy's, with the same [`crate::ScanKey`]) as this jail's record.
    pub fn share_protected(&mut self, cell: std::sync::Arc<Ready<std::sync::Arc<Protected>>>) {
        self.protected = cell;
    }

    /// The record of protected entries, once the walk is done.
    pub fn protected(&self) -> Option<&std::sync::Arc<Protected>> {
        self.protected.get()
    }

    /// The recorded ids, when there are any.
    fn recorded_ids(&self) -> Option<&std::collections::HashSet<(u64, u64)>> {
        self.protected
            .get()
            .map(|p| &p.ids)
            .filter(|ids| !ids.is_empty())
    }

    /// True when `id` is a recorded protected inode.
    pub fn is_recorded(&self, id: (u64, u64)) -> bool {
        self.recorded_ids().is_some_and(|ids| ids.contains(&id))
    }

    /// True when anything is recorded (a walk over a tree without protected entries
    /// records nothing, and then no per-entry id needs to be read).
    pub fn has_records(&self) -> bool {
        self.recorded_ids().is_some()
    }

    pub fn is_jailed(&self) -> bool {
        !self.roots.is_empty()
    }

    pub fn roots(&self) -> &[Root] {
        &self.roots
    }

    /// Resolves `input` to an `O_PATH` fd (following a final symlink only inside the jail).
    pub fn resolve(&self, input: &str) -> Result<Resolved, ExecError> {
        self.resolve_with(input, libc::O_PATH)
    }

    /// Resolves `input` and opens it with `flags` (`O_CLOEXEC` is always added).
    pub fn resolve_with(&self, input: &str, flags: i32) -> Result<Resolved, ExecError> {
        self.resolve_in(input, flags)
            .map_err(|e| self.scope_error(input, e))
    }

    /// An escape from a scoped jail's scope (through a link inside it) is S220 when the same
    /// path resolved in the whole jail stays inside it, S215 when it leaves the jail too.
    fn scope_error(&self, input: &str, e: ExecError) -> ExecError {
        if self.scope.is_none() || !matches!(e, ExecError::Escape(_)) {
            return e;
        }
        let escapes_jail = match self.anchor_in_jail(input) {
            Ok(a) => open_beneath(Some(a.base), &a.rest, libc::O_PATH, a.resolve)
                .is_err_and(|x| x.raw_os_error() == Some(libc::EXDEV)),
            Err(ExecError::Escape(_)) => true,
            Err(_) => false,
        };
        if escapes_jail {
            return e;
        }
        self.out_of_scope(input)
    }

    /// S220 for `input`, naming the scope root.
    fn out_of_scope(&self, input: &str) -> ExecError {
        let scope = self.scope_root().unwrap_or(Path::new("/"));
        ExecError::OutOfScope(format!(
            "path is outside this session's scope root {}: {input}; use a path inside it",
            scope.display()
        ))
    }

    fn resolve_in(&self, input: &str, flags: i32) -> Result<Resolved, ExecError> {
        let anchor = self.anchor(input)?;
        if self.is_denied(&anchor.lexical) {
            return Err(ExecError::NotFound(input.to_string()));
        }
        let fd = open_beneath(Some(anchor.base), &anchor.rest, flags, anchor.resolve)
            .map_err(|e| map_errno(input, e))?;
        let path =
            fd_path(&fd).map_err(|e| ExecError::Internal(format!("resolve {input}: {e}")))?;
        if self.is_denied(&path) || self.fd_is_protected(&fd, &path) {
            return Err(ExecError::NotFound(input.to_string()));
        }
        Ok(Resolved { fd, path })
    }

    /// Resolves the directory that contains `input` and names its last component, without
    /// following that component. With `create`, missing parent directories are made (mode
    /// 0755), one `mkdirat` at a time beneath the anchor, so nothing is ever created outside
    /// the jail. The parent is opened `O_RDONLY | O_DIRECTORY` (so it can be fsynced).
    pub fn parent(&self, input: &str, create: bool) -> Result<Parent, ExecError> {
        self.parent_in(input, create)
            .map_err(|e| self.scope_error(input, e))
    }

    fn parent_in(&self, input: &str, create: bool) -> Result<Parent, ExecError> {
        let anchor = self.anchor(input)?;
        if self.is_denied(&anchor.lexical) {
            return Err(ExecError::NotFound(input.to_string()));
        }
        let rest = anchor.rest.clone();
        let name = match rest.components().next_back() {
            Some(Component::Normal(n)) => n.to_os_string(),
            _ => {
                // `..` or `.` last: a path that leaves the jail is an escape, not a bad request.
                if let Err(e) = open_beneath(Some(anchor.base), &rest, libc::O_PATH, anchor.resolve)
                {
                    if e.raw_os_error() == Some(libc::EXDEV) {
                        return Err(ExecError::Escape(input.to_string()));
                    }
                }
                return Err(ExecError::Invalid(format!(
                    "path does not name an entry inside a directory: {input}"
                )));
            }
        };
        let dir_rel = rest.parent().map(Path::to_path_buf).unwrap_or_default();
        let dir_rel = if dir_rel.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir_rel
        };
        let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY;
        let mut made = Vec::new();
        let dir = match open_beneath(Some(anchor.base), &dir_rel, dir_flags, anchor.resolve) {
            Ok(fd) => fd,
            Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {
                self.create_dirs(input, &anchor, &dir_rel, &mut made)?
            }
            Err(e) => return Err(map_errno(input, e)),
        };
        let mut parent = Parent {
            dir,
            dir_path: PathBuf::new(),
            name,
            path: PathBuf::new(),
            made,
        };
        let dir_path = match fd_path(&parent.dir) {
            Ok(p) => p,
            Err(e) => {
                parent.remove_made();
                return Err(ExecError::Internal(format!("resolve {input}: {e}")));
            }
        };
        let path = dir_path.join(&parent.name);
        if self.is_denied(&dir_path) || self.is_denied(&path) {
            parent.remove_made();
            return Err(ExecError::NotFound(input.to_string()));
        }
        parent.dir_path = dir_path;
        parent.path = path;
        Ok(parent)
    }

    /// `mkdir -p` of `dir_rel` beneath the anchor: finds the deepest existing prefix, then
    /// creates each missing component with `mkdirat` and re-opens it with `O_NOFOLLOW`. What
    /// it created goes to `made`; on an error it removes those again.
    fn create_dirs(
        &self,
        input: &str,
        anchor: &Anchor<'_>,
        dir_rel: &Path,
        made: &mut Vec<MadeDir>,
    ) -> Result<OwnedFd, ExecError> {
        let r = self.create_dirs_in(input, anchor, dir_rel, made);
        if r.is_err() {
            remove_made(made);
        }
        r
    }

    fn create_dirs_in(
        &self,
        input: &str,
        anchor: &Anchor<'_>,
        dir_rel: &Path,
        made: &mut Vec<MadeDir>,
    ) -> Result<OwnedFd, ExecError> {
        let comps: Vec<Component<'_>> = dir_rel.components().collect();
        let mut split = comps.len();
        let mut base = None;
        while split > 0 {
            split -= 1;
            let prefix: PathBuf = comps[..split].iter().collect();
            let prefix = if prefix.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                prefix
            };
            match open_beneath(
                Some(anchor.base),
                &prefix,
                libc::O_RDONLY | libc::O_DIRECTORY,
                anchor.resolve,
            ) {
                Ok(fd) => {
                    base = Some(fd);
                    break;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(map_errno(input, e)),
            }
        }
        let mut cur = base.ok_or_else(|| ExecError::NotFound(input.to_string()))?;
        for comp in &comps[split..] {
            let Component::Normal(name) = comp else {
                // A `..` or `.` after a missing directory cannot be resolved safely.
                return Err(ExecError::NotFound(input.to_string()));
            };
            let cur_path = fd_path(&cur).map_err(|e| ExecError::Internal(e.to_string()))?;
            if self.is_denied(&cur_path.join(name)) {
                return Err(ExecError::NotFound(input.to_string()));
            }
            let c = CString::new(name.as_encoded_bytes())
                .map_err(|_| ExecError::Invalid("path contains a NUL byte".into()))?;
            // SAFETY: mkdirat on a directory fd we own with a NUL-terminated name.
            let rc = unsafe { libc::mkdirat(cur.as_raw_fd(), c.as_ptr(), 0o755) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(map_errno(input, e));
                }
            }
            let next = open_beneath(
                Some(&cur),
                Path::new(name),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
            )
            .map_err(|e| map_errno(input, e))?;
            if rc == 0 {
                let st = fstat(&next).map_err(|e| ExecError::Internal(e.to_string()))?;
                made.push(MadeDir {
                    at: cur,
                    name: c,
                    id: (st.st_dev, st.st_ino),
                });
            }
            cur = next;
        }
        Ok(cur)
    }

    /// Where resolution of `input` starts and what is left to walk: beneath the scope when
    /// the jail is scoped.
    fn anchor<'a>(&'a self, input: &str) -> Result<Anchor<'a>, ExecError> {
        let Some(scope) = &self.scope else {
            return self.anchor_in_jail(input);
        };
        // Outside the scope is S220 even when it is outside every root too (the scope is
        // what the caller was given).
        let lexical = match self.anchor_in_jail(input) {
            Ok(a) => a.lexical,
            Err(ExecError::Escape(_)) => normalize(Path::new(input)),
            Err(e) => return Err(e),
        };
        let Ok(rest) = lexical.strip_prefix(&scope.path) else {
            return Err(self.out_of_scope(input));
        };
        let rest = if rest.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            rest.to_path_buf()
        };
        Ok(Anchor {
            base: &scope.fd,
            rest,
            lexical,
            resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
        })
    }

    fn anchor_in_jail<'a>(&'a self, input: &str) -> Result<Anchor<'a>, ExecError> {
        if input.is_empty() {
            return Err(ExecError::Invalid("path is empty".into()));
        }
        if input.contains('\0') {
            return Err(ExecError::Invalid("path contains a NUL byte".into()));
        }
        if self.roots.is_empty() {
            if !input.starts_with('/') {
                return Err(ExecError::Invalid(format!(
                    "path must be absolute when unjailed (fs.host_roots is empty; `~` is not expanded): {input}"
                )));
            }
            let lexical = normalize(Path::new(input));
            let rest = lexical
                .strip_prefix("/")
                .map(Path::to_path_buf)
                .unwrap_or_default();
            let rest = if rest.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                rest
            };
            return Ok(Anchor {
                base: &self.host_root,
                rest,
                lexical,
                resolve: libc::RESOLVE_NO_MAGICLINKS,
            });
        }
        let lexical = if input.starts_with('/') {
            normalize(Path::new(input))
        } else {
            normalize(&self.roots[0].path.join(input))
        };
        let (base, rest) = self.root_for(input)?;
        Ok(Anchor {
            base,
            rest,
            lexical,
            resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
        })
    }

    /// The root an absolute or relative input belongs to, and the path relative to it.
    fn root_for(&self, input: &str) -> Result<(&OwnedFd, PathBuf), ExecError> {
        if !input.starts_with('/') {
            // Relative: resolved beneath the primary root, `..` included, by the kernel.
            return Ok((&self.roots[0].fd, PathBuf::from(input)));
        }
        let lexical = normalize(Path::new(input));
        for root in &self.roots {
            if lexical.starts_with(&root.path) {
                // Keep the caller's `..` components so the kernel judges them, not us; an
                // input whose literal prefix is not the root (it used `..` to get there) is
                // walked from its normalized form.
                let rest = raw_rest_after_root(input, &root.path).unwrap_or_else(|| {
                    let r = lexical
                        .strip_prefix(&root.path)
                        .map(Path::to_path_buf)
                        .unwrap_or_default();
                    if r.as_os_str().is_empty() {
                        PathBuf::from(".")
                    } else {
                        r
                    }
                });
                return Ok((&root.fd, rest));
            }
        }
        Err(ExecError::Escape(input.to_string()))
    }

    /// True when `path` is a jail root (or `/` when unjailed).
    pub fn is_root(&self, path: &Path) -> bool {
        if self.roots.is_empty() {
            return path == Path::new("/");
        }
        self.roots.iter().any(|r| r.path == path)
    }

    /// True when a protected entry lies strictly below `path`: moving `path` would carry that
    /// entry out from under the name that protects it. A `fs.denylist_paths` entry below it,
    /// or (when `path` is a directory) any entry of its tree that is denied by name or by
    /// identity. Past [`MOVE_SCAN_LIMIT`] entries the answer is yes.
    pub fn holds_denied(&self, path: &Path) -> bool {
        if self
            .denylist
            .iter()
            .any(|d| d.as_path() != path && d.starts_with(path))
        {
            return true;
        }
        let is_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
        if !is_dir {
            return false;
        }
        let mut budget = MOVE_SCAN_LIMIT;
        let mut stack = vec![path.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let rd = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                // A directory it cannot list may hold anything: the move is refused.
                Err(e) if unlistable(&e) => return true,
                Err(_) => continue,
            };
            for e in rd.flatten() {
                if budget == 0 {
                    return true;
                }
                budget -= 1;
                let child = e.path();
                if self.is_denied(&child) {
                    return true;
                }
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(child);
                }
            }
        }
        false
    }

    /// True when the inode `fd` (resolved as `path`) refers to is a protected one
    /// ([`Jail::stat_is_protected`]).
    pub fn fd_is_protected(&self, fd: &OwnedFd, path: &Path) -> bool {
        // A record with nothing in it leaves nothing to compare: no `fstat` per resolve.
        if self.protected().is_some() && !self.has_records() {
            return false;
        }
        fstat(fd).is_ok_and(|st| self.stat_is_protected(path, &st))
    }

    /// [`Jail::inode_is_protected`] of a `stat`.
    pub fn stat_is_protected(&self, path: &Path, st: &libc::stat) -> bool {
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        self.inode_is_protected(path, (st.st_dev, st.st_ino), nlink(st), is_dir)
    }

    /// True when the inode `id`, found at `path` with `nlink` links, is protected: a recorded
    /// one or, until the walk has made the record, a non-directory with several links that is
    /// also a `fs.denylist_paths` entry or a sibling of `path` protected by name (the record
    /// covers those links once it is made).
    pub fn inode_is_protected(
        &self,
        path: &Path,
        id: (u64, u64),
        nlink: u64,
        is_dir: bool,
    ) -> bool {
        if self.is_recorded(id) {
            return true;
        }
        if self.protected().is_some() || is_dir || nlink < 2 {
            return false;
        }
        self.linked_to_protected(path, id)
    }

    /// True when `id` (a file with several links, found at `path`) is also a denylisted entry,
    /// or a sibling of `path` that is protected by name. A directory too large to list reads
    /// as protected.
    fn linked_to_protected(&self, path: &Path, id: (u64, u64)) -> bool {
        if self.denylist.iter().any(|d| lstat_id(d) == Some(id)) {
            return true;
        }
        let Some(dir) = path.parent() else {
            return false;
        };
        // A directory that cannot be listed cannot be vouched for.
        let Ok(rd) = std::fs::read_dir(dir) else {
            return true;
        };
        for (n, e) in rd.flatten().enumerate() {
            if n >= SIBLING_LIMIT {
                return true;
            }
            let sibling = e.path();
            if sibling != path && self.is_denied_by_name(&sibling) && lstat_id(&sibling) == Some(id)
            {
                return true;
            }
        }
        false
    }

    /// True when `path` (absolute) is denied by name ([`Jail::is_denied_by_name`]) or is a
    /// protected inode under another name (a hardlink, a renamed entry; not followed).
    pub fn is_denied(&self, path: &Path) -> bool {
        if self.is_denied_by_name(path) {
            return true;
        }
        self.has_records() && lstat_id(path).is_some_and(|id| self.is_recorded(id))
    }

    /// True when `path` (absolute) is a denylisted path, lies under one, or matches a
    /// protected glob.
    pub fn is_denied_by_name(&self, path: &Path) -> bool {
        if self.denylist.iter().any(|d| path.starts_with(d)) {
            return true;
        }
        if self.non_accessible.is_match(path) {
            return true;
        }
        self.roots.iter().any(|r| {
            path.strip_prefix(&r.path)
                .map(|rel| !rel.as_os_str().is_empty() && self.non_accessible.is_match(rel))
                .unwrap_or(false)
        })
    }
}

/// The part of an absolute `input` after `root`, with `..` components kept verbatim, when the
/// input spells the root literally (after collapsing `//` and `.`).
fn raw_rest_after_root(input: &str, root: &Path) -> Option<PathBuf> {
    let mut comps = Path::new(input)
        .components()
        .filter(|c| !matches!(c, Component::CurDir));
    for rc in root.components() {
        let c = comps.next()?;
        if c != rc {
            return None;
        }
    }
    let rest: PathBuf = comps.collect();
    Some(if rest.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        rest
    })
}

/// Lexical normalization: collapses `//` and `.`, and applies `..` textually.
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::RootDir => out.push("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => {}
        }
    }
    if out.as_os_str().is_empty() {
        out.push("/");
    }
    out
}

/// `openat2(dirfd, path, flags|O_CLOEXEC, resolve)`; `dirfd` None means AT_FDCWD. The call
/// is nix's `openat2`; a path with a NUL byte is EINVAL, as before it reaches the kernel.
pub fn open_beneath(
    dirfd: Option<&OwnedFd>,
    path: &Path,
    flags: i32,
    resolve: u64,
) -> std::io::Result<OwnedFd> {
    open_beneath_mode(dirfd, path, flags, 0, resolve)
}

/// [`open_beneath`] with the `mode` a created file gets (`O_CREAT`, `O_TMPFILE`; the kernel
/// wants 0 otherwise).
pub fn open_beneath_mode(
    dirfd: Option<&OwnedFd>,
    path: &Path,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> std::io::Result<OwnedFd> {
    use nix::errno::Errno;
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag, AT_FDCWD};
    let how = OpenHow::new()
        .flags(OFlag::from_bits_retain(flags | libc::O_CLOEXEC))
        .mode(nix::sys::stat::Mode::from_bits_retain(mode))
        .resolve(ResolveFlag::from_bits_retain(resolve));
    let dir = dirfd.map(|f| f.as_fd()).unwrap_or(AT_FDCWD);
    let mut tries = 0u32;
    loop {
        match openat2(dir, path, how) {
            Ok(fd) => return Ok(fd),
            // EAGAIN: with RESOLVE_BENEATH the kernel could not rule out a `..` escape because
            // a rename (anywhere on the system) raced the walk. openat2(2) says to retry.
            Err(Errno::EAGAIN) if resolve & libc::RESOLVE_BENEATH != 0 && tries < 400 => {
                tries += 1;
                if tries < 32 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The absolute path an fd refers to, read from `/proc/self/fd`.
pub fn fd_path(fd: &OwnedFd) -> std::io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The link count of `st` (`nlink_t` is 64 bits on some targets and 32 on others).
#[allow(clippy::unnecessary_cast)]
pub fn nlink(st: &libc::stat) -> u64 {
    st.st_nlink as u64
}

/// `fstat` of an fd.
pub fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat fills the buffer on success; we only read it when it returned 0.
    let rc = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstat returned 0, so the struct is initialised.
    Ok(unsafe { st.assume_init() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jailed_resolution() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/.env"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("out")).unwrap();
        std::os::unix::fs::symlink("a/b", root.join("in")).unwrap();
        let jail = Jail::new(
            &[root.to_string_lossy().into()],
            &[],
            &["**/.env".to_string()],
        )
        .unwrap();
        let canon_root = std::fs::canonicalize(&root).unwrap();

        assert_eq!(jail.resolve("a/b").unwrap().path, canon_root.join("a/b"));
        assert_eq!(jail.resolve("in").unwrap().path, canon_root.join("a/b"));
        let abs = format!("{}//a/./b", root.display());
        assert_eq!(jail.resolve(&abs).unwrap().path, canon_root.join("a/b"));
        assert!(matches!(jail.resolve("out"), Err(ExecError::Escape(_))));
        assert!(matches!(
            jail.resolve("out/hostname"),
            Err(ExecError::Escape(_))
        ));
        assert!(matches!(jail.resolve("../"), Err(ExecError::Escape(_))));
        assert!(matches!(
            jail.resolve(&format!("{}/../x", root.display())),
            Err(ExecError::Escape(_))
        ));
        assert!(matches!(
            jail.resolve(&format!("{}-evil", root.display())),
            Err(ExecError::Escape(_))
        ));
        assert!(matches!(jail.resolve("/etc"), Err(ExecError::Escape(_))));
        assert!(matches!(
            jail.resolve("missing"),
            Err(ExecError::NotFound(_))
        ));
        assert!(matches!(
            jail.resolve("a/.env"),
            Err(ExecError::NotFound(_))
        ));
        assert!(matches!(jail.resolve(""), Err(ExecError::Invalid(_))));
    }

    /// Before any walk: a hardlink of a denylisted entry, or of a protected sibling, is
    /// refused where it is resolved; a hardlink of a plain file is not.
    #[test]
    fn a_hardlink_of_a_protected_entry_is_refused_without_a_record() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap().join("root");
        std::fs::create_dir_all(root.join("private")).unwrap();
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("private/key.txt"), "K").unwrap();
        std::fs::write(root.join("a/.env"), "E").unwrap();
        std::fs::write(root.join("a/plain"), "P").unwrap();
        std::fs::hard_link(root.join("private/key.txt"), root.join("a/key-link")).unwrap();
        std::fs::hard_link(root.join("a/.env"), root.join("a/env-link")).unwrap();
        std::fs::hard_link(root.join("a/plain"), root.join("a/plain-link")).unwrap();
        let jail = Jail::new(
            &[root.to_string_lossy().into()],
            &[root.join("private/key.txt").to_string_lossy().into()],
            &["**/.env".to_string()],
        )
        .unwrap();
        assert!(jail.protected().is_none());
        for p in ["a/key-link", "a/env-link", "a/.env", "private/key.txt"] {
            assert!(
                matches!(jail.resolve(p), Err(ExecError::NotFound(_))),
                "{p} was served"
            );
        }
        assert_eq!(
            jail.resolve("a/plain-link").unwrap().path,
            root.join("a/plain-link")
        );
        assert!(jail.resolve("a/plain").is_ok());
    }

    #[test]
    fn protected_entries_by_name_and_identity() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap().join("root");
        std::fs::create_dir_all(root.join("private")).unwrap();
        std::fs::create_dir_all(root.join("sub/secrets/deeper")).unwrap();
        std::fs::create_dir_all(root.join("clean")).unwrap();
        std::fs::write(root.join("private/key.txt"), "K").unwrap();
        std::fs::write(root.join(".env"), "E").unwrap();
        std::fs::write(root.join("sub/secrets/deeper/k"), "S").unwrap();
        std::fs::write(root.join("clean/ok"), "O").unwrap();
        let jail = Jail::new(
            &[root.to_string_lossy().into()],
            &[root.join("private/key.txt").to_string_lossy().into()],
            &["**/.env".to_string(), "**/secrets/**".to_string()],
        )
        .unwrap();
        let p = jail.scan_protected();
        let mut in_roots = p.in_roots.clone();
        in_roots.sort();
        assert_eq!(
            in_roots,
            [
                root.join(".env"),
                root.join("private/key.txt"),
                root.join("sub/secrets/deeper"),
            ]
        );
        assert!(!p.truncated);
        // root: private, sub, clean, .env; private: key.txt; sub: secrets; secrets: deeper;
        // deeper (protected, its ids): k; clean: ok.
        assert_eq!(p.walked, 9);
        // The key, .env, the deeper dir and its file.
        assert_eq!(p.ids.len(), 4);
        jail.set_protected(std::sync::Arc::new(p));
        std::fs::hard_link(root.join("private/key.txt"), root.join("clean/link")).unwrap();
        std::fs::rename(root.join("sub/secrets"), root.join("sub/open")).unwrap();
        assert!(jail.is_denied(&root.join("clean/link")));
        assert!(!jail.is_denied_by_name(&root.join("clean/link")));
        assert!(jail.is_denied(&root.join("sub/open/deeper/k")));
        assert!(!jail.is_denied(&root.join("clean/ok")));
        assert!(matches!(
            jail.resolve("clean/link"),
            Err(ExecError::NotFound(_))
        ));
        assert!(jail.resolve("clean/ok").is_ok());
        // Moving a tree that holds a protected entry is refused; a clean one is not.
        assert!(jail.holds_denied(&root.join("private")));
        assert!(jail.holds_denied(&root.join("sub")));
        assert!(jail.holds_denied(&root.join("clean"))); // holds the hardlink
        std::fs::remove_file(root.join("clean/link")).unwrap();
        assert!(!jail.holds_denied(&root.join("clean")));
    }

    /// The raw call's contract, errno for errno: close-on-exec always, EXDEV for a `..` or an
    /// absolute symlink out of the anchor, ELOOP for any symlink under RESOLVE_NO_SYMLINKS,
    /// EINVAL for a NUL byte (refused before the kernel), ENOENT for a missing name.
    #[test]
    fn open_beneath_flags_and_errnos() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("a/f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("a", root.join("rel")).unwrap();
        let anchor = open_beneath(None, &root, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap();
        let beneath = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
        let f = open_beneath(Some(&anchor), Path::new("rel/f"), libc::O_RDONLY, beneath).unwrap();
        // SAFETY: F_GETFD only reads the descriptor flags of an fd we own.
        let fd_flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(fd_flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        let errno = |p: &str, resolve: u64| {
            open_beneath(Some(&anchor), Path::new(p), libc::O_RDONLY, resolve)
                .map(|_| ())
                .map_err(|e| e.raw_os_error())
        };
        assert_eq!(errno("../root/a/f", beneath), Err(Some(libc::EXDEV)));
        assert_eq!(errno("abs/passwd", beneath), Err(Some(libc::EXDEV)));
        assert_eq!(
            errno("rel/f", libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS),
            Err(Some(libc::ELOOP))
        );
        assert_eq!(errno("a/f\0x", beneath), Err(Some(libc::EINVAL)));
        assert_eq!(errno("a/none", beneath), Err(Some(libc::ENOENT)));
        assert_eq!(errno("abs/passwd", 0), Ok(()));
    }

    #[test]
    fn unjailed_resolution() {
        let jail = Jail::new(&[], &["/etc/shadow".to_string()], &[]).unwrap();
        assert!(jail.resolve("/etc").is_ok());
        assert!(matches!(jail.resolve("etc"), Err(ExecError::Invalid(_))));
        assert!(matches!(jail.resolve("~/x"), Err(ExecError::Invalid(_))));
        let a = jail.resolve("/etc/shadow").unwrap_err().to_string();
        let b = jail.resolve("/etc/no-such-file").unwrap_err().to_string();
        assert_eq!(
            a.replace("/etc/shadow", "P"),
            b.replace("/etc/no-such-file", "P")
        );
    }
}
