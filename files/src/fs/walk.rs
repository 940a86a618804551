//! An iterative, depth-bounded walk of a directory tree through directory fds, shared by
//! `fs::rm` and `fs::chmod` (grep and sed walk with the `ignore` crate, which is iterative
//! too and addresses entries by path, so it stops where the path outgrows `PATH_MAX`).
//!
//! * **Iterative**: an explicit stack of open directories, never recursion, so no tree a
//!   command can build overflows the executor's stack.
//! * **Bounded**: a directory more than [`MAX_TREE_DEPTH`] levels below the root is refused
//!   with S218. The stack holds one fd per level, so the bound also bounds the fds one walk
//!   holds. Callers scan first and act second, so a refusal changes nothing.
//! * **No links followed**: every entry is `lstat`ed, every directory is opened beneath its
//!   parent with `O_NOFOLLOW` and `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, and one swapped for
//!   another inode between the `lstat` and the open is treated as gone. Symlink loops are
//!   therefore plain entries.

use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::entry::{is_dir, statat};
use crate::error::ExecError;
use crate::jail::{fstat, map_errno, open_beneath};

/// Deepest directory a recursive `rm` or `chmod` enters (the root's children are level 1).
pub const MAX_TREE_DEPTH: usize = 256;

/// One entry met by the walk.
pub struct Node<'a> {
    /// The directory holding the entry.
    pub dir: &'a OwnedFd,
    /// The entry's name in `dir`.
    pub name: &'a CString,
    /// Its absolute path (root path + names; no link was followed to get there).
    pub path: &'a Path,
    /// Its `lstat`.
    pub st: &'a libc::stat,
    /// The entry itself, opened `O_RDONLY | O_DIRECTORY`, when it is a directory the walk
    /// entered (in [`Visitor::leave`] only).
    pub own: Option<&'a OwnedFd>,
}

/// What the walk does with the entries it meets.
pub trait Visitor {
    /// A directory, before its children. `Ok(false)`: do not enter it (it still gets
    /// [`Visitor::leave`] only when entered, so a pruned directory gets no more calls).
    fn enter(&mut self, node: &Node<'_>) -> Result<bool, ExecError>;
    /// Every entry: a directory after its children, anything else once.
    fn leave(&mut self, node: &Node<'_>) -> Result<(), ExecError>;
    /// A directory that could not be opened or listed (no permission, say). By default the
    /// walk fails with the wording of a missing path; `Ok(())` skips the directory.
    fn unreadable(&mut self, _node: &Node<'_>, e: ExecError) -> Result<(), ExecError> {
        Err(e)
    }
}

struct Frame {
    fd: OwnedFd,
    path: PathBuf,
    names: Vec<OsString>,
    next: usize,
    /// The name and lstat of this directory in its parent (None for the root).
    me: Option<(CString, libc::stat)>,
}

fn list(fd: &OwnedFd, display: &str) -> Result<Vec<OsString>, ExecError> {
    let rd = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| map_errno(display, e))?;
    Ok(rd.flatten().map(|e| e.file_name()).collect())
}

/// Counts the entries a walk met, for its span.
struct Counted<'v, V> {
    inner: &'v mut V,
    entries: u64,
}

impl<V: Visitor> Visitor for Counted<'_, V> {
    fn enter(&mut self, node: &Node<'_>) -> Result<bool, ExecError> {
        self.inner.enter(node)
    }
    fn leave(&mut self, node: &Node<'_>) -> Result<(), ExecError> {
        self.entries += 1;
        self.inner.leave(node)
    }
    fn unreadable(&mut self, node: &Node<'_>, e: ExecError) -> Result<(), ExecError> {
        self.inner.unreadable(node, e)
    }
}

/// Walks everything below `root` (an `O_RDONLY | O_DIRECTORY` fd at `root_path`). The root
/// itself is not visited. `display` is the caller's path, for error messages. In a traced
/// request the walk is an `fs.walk` span with the number of entries it met.
pub fn walk(
    root: OwnedFd,
    root_path: &Path,
    display: &str,
    max_depth: usize,
    v: &mut impl Visitor,
) -> Result<(), ExecError> {
    let Some(mut span) = iii_shell_protocol::call_trace::start("fs.walk") else {
        return walk_tree(root, root_path, display, max_depth, v);
    };
    let mut counted = Counted {
        inner: v,
        entries: 0,
    };
    let r = walk_tree(root, root_path, display, max_depth, &mut counted);
    span.attr("iii.shell.entries", counted.entries);
    if let Err(e) = &r {
        span.fail(e.code().as_str());
    }
    r
}

fn walk_tree(
    root: OwnedFd,
    root_path: &Path,
    display: &str,
    max_depth: usize,
    v: &mut impl Visitor,
) -> Result<(), ExecError> {
    let names = list(&root, display)?;
    let mut stack = vec![Frame {
        fd: root,
        path: root_path.to_path_buf(),
        names,
        next: 0,
        me: None,
    }];
    loop {
        let level = stack.len();
        let Some(top) = stack.last_mut() else { break };
        if top.next < top.names.len() {
            let name = std::mem::take(&mut top.names[top.next]);
            top.next += 1;
            let Ok(c) = CString::new(name.as_encoded_bytes()) else {
                continue;
            };
            let path = top.path.join(&name);
            let Ok(st) = statat(&top.fd, &c, true) else {
                continue; // gone since the listing
            };
            let node = Node {
                dir: &top.fd,
                name: &c,
                path: &path,
                st: &st,
                own: None,
            };
            if !is_dir(&st) {
                v.leave(&node)?;
                continue;
            }
            if !v.enter(&node)? {
                continue;
            }
            if level > max_depth {
                return Err(ExecError::TooLarge(format!(
                    "{display}: the tree is deeper than {max_depth} levels, the most a recursive operation walks; nothing was changed"
                )));
            }
            let fd = match open_beneath(
                Some(&top.fd),
                Path::new(&name),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
            ) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => continue, // now a link
                Err(e) => {
                    v.unreadable(&node, map_errno(display, e))?;
                    continue;
                }
            };
            match fstat(&fd) {
                Ok(now) if now.st_dev == st.st_dev && now.st_ino == st.st_ino => {}
                _ => continue, // swapped since the lstat
            }
            let names = match list(&fd, display) {
                Ok(n) => n,
                Err(e) => {
                    v.unreadable(&node, e)?;
                    continue;
                }
            };
            stack.push(Frame {
                fd,
                path,
                names,
                next: 0,
                me: Some((c, st)),
            });
        } else {
            let Some(done) = stack.pop() else { break };
            if let (Some((c, st)), Some(parent)) = (&done.me, stack.last()) {
                v.leave(&Node {
                    dir: &parent.fd,
                    name: c,
                    path: &done.path,
                    st,
                    own: Some(&done.fd),
                })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count {
        entered: usize,
        left: usize,
    }

    impl Visitor for Count {
        fn enter(&mut self, _: &Node<'_>) -> Result<bool, ExecError> {
            self.entered += 1;
            Ok(true)
        }
        fn leave(&mut self, _: &Node<'_>) -> Result<(), ExecError> {
            self.left += 1;
            Ok(())
        }
    }

    fn open(p: &Path) -> OwnedFd {
        open_beneath(None, p, libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap()
    }

    /// Builds `depth` nested directories below `root` with fd-relative mkdirat, so the depth
    /// is not limited by PATH_MAX.
    fn nest(root: &Path, depth: usize) {
        let mut cur = open(root);
        for _ in 0..depth {
            // SAFETY: mkdirat on a directory fd we own with a NUL-terminated name.
            assert_eq!(
                unsafe { libc::mkdirat(cur.as_raw_fd(), c"d".as_ptr(), 0o755) },
                0
            );
            cur = open_beneath(Some(&cur), Path::new("d"), libc::O_RDONLY, 0).unwrap();
        }
    }

    #[test]
    fn counts_every_entry_and_never_follows_links() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        std::fs::write(t.path().join("a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink("..", t.path().join("a/b/loop")).unwrap();
        std::os::unix::fs::symlink("/", t.path().join("a/out")).unwrap();
        let mut c = Count {
            entered: 0,
            left: 0,
        };
        walk(open(t.path()), t.path(), "t", MAX_TREE_DEPTH, &mut c).unwrap();
        assert_eq!((c.entered, c.left), (2, 5));
    }

    #[test]
    fn refuses_past_the_depth_bound_and_walks_up_to_it() {
        let t = tempfile::tempdir().unwrap();
        nest(t.path(), 5);
        let mut c = Count {
            entered: 0,
            left: 0,
        };
        walk(open(t.path()), t.path(), "t", 5, &mut c).unwrap();
        assert_eq!((c.entered, c.left), (5, 5));
        let e = walk(open(t.path()), t.path(), "t", 4, &mut c).unwrap_err();
        assert!(matches!(e, ExecError::TooLarge(_)), "{e}");
    }
}
