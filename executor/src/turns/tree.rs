//! The structure around the files a call changes: what a recursive `rm`/`sed`/`chmod` reaches
//! inside a directory, which directories a call is about to create, and the modes and links
//! the seed's `FileRecord` has no place for.
//!
//! Bodies still go through the pre-image path (`pre`/`post` records, one per regular file).
//! Everything else is a `meta` record (`{t: "meta", path, kind: "dir"|"file"|"link",
//! existed, mode, link}`), folded first-wins per path (the state before the turn) into
//! [`super::model::TurnRecord::metas`]; it never appears in `list`/`get`, and revert applies it
//! after the bodies ([`super::revert_metas`]).
//!
//! The walk is the executor's iterative, depth-bounded, link-refusing walk (`fs::walk`);
//! denied entries are pruned, unreadable directories skipped, and at most
//! [`MAX_TREE_ENTRIES`] entries are recorded per call (past that an ERROR is logged: the rest
//! of the tree is not in the history).

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde_json::Value;

use crate::policy::Policy;
use iii_shell_files::error::ExecError;
use iii_shell_files::fs::walk::{walk, Node, Visitor, MAX_TREE_DEPTH};

/// Entries recorded at most from one directory tree.
pub const MAX_TREE_ENTRIES: usize = 100_000;

/// One entry below (or at) a walked directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub kind: &'static str,
    pub mode: u32,
    /// A symlink's target.
    pub link: Option<String>,
}

fn kind_of(st: &libc::stat) -> Option<&'static str> {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => Some("dir"),
        libc::S_IFREG => Some("file"),
        libc::S_IFLNK => Some("link"),
        _ => None,
    }
}

fn readlinkat(dir: &std::os::fd::OwnedFd, name: &CString) -> Option<String> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: readlinkat on a directory fd we own, a NUL-terminated name and a buffer of the
    // length passed; it writes at most that many bytes and returns how many.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return None;
    }
    buf.truncate(n as usize);
    String::from_utf8(buf).ok()
}

struct Collect<'a> {
    policy: &'a Policy,
    out: Vec<Entry>,
    full: bool,
}

impl Visitor for Collect<'_> {
    fn enter(&mut self, node: &Node<'_>) -> Result<bool, ExecError> {
        Ok(!self.full && !self.policy.jail.is_denied(node.path))
    }
    fn leave(&mut self, node: &Node<'_>) -> Result<(), ExecError> {
        if self.out.len() >= MAX_TREE_ENTRIES {
            self.full = true;
            return Ok(());
        }
        if self.policy.jail.is_denied(node.path) {
            return Ok(());
        }
        let Some(kind) = kind_of(node.st) else {
            return Ok(());
        };
        self.out.push(Entry {
            path: node.path.to_string_lossy().into_owned(),
            kind,
            mode: node.st.st_mode & 0o7777,
            link: (kind == "link")
                .then(|| readlinkat(node.dir, node.name))
                .flatten(),
        });
        Ok(())
    }
    fn unreadable(&mut self, _node: &Node<'_>, _e: ExecError) -> Result<(), ExecError> {
        Ok(())
    }
}

/// `path` and everything below it when it is a directory (the directory first, then its
/// entries, each directory after its children); `None` when it is not a directory.
pub fn scan(policy: &Policy, path: &str) -> Option<Vec<Entry>> {
    let r = policy
        .jail
        .resolve_with(path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .ok()?;
    let st = iii_shell_files::jail::fstat(&r.fd).ok()?;
    let mut c = Collect {
        policy,
        out: vec![Entry {
            path: path.to_string(),
            kind: "dir",
            mode: st.st_mode & 0o7777,
            link: None,
        }],
        full: false,
    };
    let root = r.path.clone();
    if let Err(e) = walk(r.fd, &root, path, MAX_TREE_DEPTH, &mut c) {
        tracing::warn!(path, error = %e, "turn history: the tree walk stopped early; entries past it are not recorded");
    }
    if c.full {
        tracing::error!(path, max = MAX_TREE_ENTRIES, "turn history: the tree holds more entries than one call records; the rest are not in the turn history and revert cannot restore them: change smaller trees per call");
    }
    Some(c.out)
}

/// The entry at `path` itself (not followed), `None` when missing or unreadable.
pub fn stat_one(policy: &Policy, path: &str) -> Option<Entry> {
    let parent = policy.jail.parent(path, false).ok()?;
    let st = iii_shell_files::fs::entry::statat(&parent.dir, &parent.c_name(), true).ok()?;
    let kind = kind_of(&st)?;
    Some(Entry {
        path: path.to_string(),
        kind,
        mode: st.st_mode & 0o7777,
        link: (kind == "link")
            .then(|| readlinkat(&parent.dir, &parent.c_name()))
            .flatten(),
    })
}

/// The directories that creating `path` (and, with `include_self`, `path` itself as a
/// directory) would make: its missing ancestors inside the jail, outermost first. A denied
/// ancestor ends the list (it is never recorded).
pub fn missing_dirs(policy: &Policy, path: &str, include_self: bool) -> Vec<String> {
    let mut out = Vec::new();
    let p = Path::new(path);
    let mut cur: Option<&Path> = if include_self { Some(p) } else { p.parent() };
    while let Some(c) = cur {
        if c.as_os_str().as_bytes() == b"/" || policy.jail.is_denied(c) {
            break;
        }
        match policy
            .jail
            .resolve_with(&c.to_string_lossy(), libc::O_PATH | libc::O_NOFOLLOW)
        {
            Err(ExecError::NotFound(_)) => out.push(c.to_string_lossy().into_owned()),
            _ => break,
        }
        cur = c.parent();
    }
    out.reverse();
    out
}

/// Whether `function`/`args` reaches into a directory tree at `path` (recursive `rm`, `sed`
/// over a `path`, recursive `chmod`, a recursive `coder::delete-file` of its `paths`): a
/// pure function of the call.
pub fn recursive_call(function: &str, args: &Value) -> bool {
    let rec = args
        .get("recursive")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    match function {
        "shell::fs::rm" | "shell::fs::chmod" | "coder::delete-file" => rec,
        "shell::fs::sed" => args
            .get("files")
            .and_then(Value::as_array)
            .is_none_or(|f| f.is_empty()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn which_calls_reach_into_a_tree() {
        assert!(recursive_call(
            "shell::fs::rm",
            &json!({"path": "/a", "recursive": true})
        ));
        assert!(!recursive_call("shell::fs::rm", &json!({"path": "/a"})));
        assert!(recursive_call(
            "shell::fs::sed",
            &json!({"files": [], "path": "/a"})
        ));
        assert!(!recursive_call(
            "shell::fs::sed",
            &json!({"files": ["/a/x"], "path": null})
        ));
        assert!(recursive_call(
            "shell::fs::chmod",
            &json!({"path": "/a", "recursive": true})
        ));
        assert!(recursive_call(
            "coder::delete-file",
            &json!({"paths": ["/a"], "recursive": true})
        ));
        assert!(!recursive_call(
            "coder::delete-file",
            &json!({"paths": ["/a"]})
        ));
    }

    #[test]
    fn the_directories_a_create_would_make_and_a_tree_scan() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(root.join("have/sub")).unwrap();
        std::fs::create_dir_all(root.join("private")).unwrap();
        std::fs::write(root.join("have/sub/f"), "x").unwrap();
        std::os::unix::fs::symlink("f", root.join("have/sub/l")).unwrap();
        let v = json!({"fs": {"host_roots": [root.to_string_lossy()],
            "denylist_paths": [root.join("private").to_string_lossy()]}});
        let p = Policy::build(1, &v.to_string()).unwrap();
        let r = root.to_string_lossy();
        assert_eq!(
            missing_dirs(&p, &format!("{r}/a/b/c.txt"), false),
            [format!("{r}/a"), format!("{r}/a/b")]
        );
        assert_eq!(
            missing_dirs(&p, &format!("{r}/have/n"), true),
            [format!("{r}/have/n")]
        );
        assert!(missing_dirs(&p, &format!("{r}/have/sub/g"), false).is_empty());
        assert!(
            missing_dirs(&p, &format!("{r}/private/x/y"), false).is_empty(),
            "a denied ancestor is never recorded"
        );
        let mut got: Vec<(String, &str, Option<String>)> = scan(&p, &format!("{r}/have"))
            .unwrap()
            .into_iter()
            .map(|e| {
                (
                    e.path.trim_start_matches(r.as_ref()).to_string(),
                    e.kind,
                    e.link,
                )
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("/have".to_string(), "dir", None),
                ("/have/sub".to_string(), "dir", None),
                ("/have/sub/f".to_string(), "file", None),
                ("/have/sub/l".to_string(), "link", Some("f".to_string())),
            ]
        );
        assert!(
            scan(&p, &format!("{r}/have/sub/f")).is_none(),
            "not a directory"
        );
        assert!(scan(&p, &format!("{r}/private")).is_none(), "denied");
    }
}
