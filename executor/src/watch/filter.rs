//! Which paths of a watched tree a binding is told about (TRIG-08, TRIG-09).
//!
//! `.git` internals are always dropped. Without `include_ignored`, ignored paths are dropped
//! too: inside a Git repository the git-ignored ones (the repository's top-level
//! `.gitignore`, `.git/info/exclude`, and the `.gitignore` of every directory from the
//! repository's top down to the watched root); outside one `/data/`, `/config/`, `/.iii/`,
//! `node_modules/` and the root's `.gitignore`. `.gitignore` files below the watched root are
//! not read (a documented limit); the root's own `.gitignore` is re-read when it changes.

use std::path::{Component, Path, PathBuf};

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use iii_shell_files::fs::own_temps;
use iii_shell_files::ignore_files;

/// Patterns that stand in for `.gitignore` outside a repository.
pub const OUTSIDE_REPO_PATTERNS: &[&str] = &["/data/", "/config/", "/.iii/", "node_modules/"];

/// True when any component of `rel` is `.git`.
pub fn is_git_internal(rel: &Path) -> bool {
    rel.components()
        .any(|c| matches!(c, Component::Normal(n) if n == ".git"))
}

/// True for the executor's own temp files (`fs/atomic.rs`) under a name that exists in the
/// directory (the link just before a rename, a batch's pre-image, the named fallback): an
/// atomic write's visible outcome is the target's event alone. Decided by the executor's
/// record of its own temp names (`fs::own_temps`), not by their shape, so a user's file that
/// looks like one is still reported. (The unnamed ones' pseudo-names are the watcher's:
/// [`super::is_own_unnamed`].)
pub fn is_own_temp(rel: &Path) -> bool {
    rel.file_name()
        .is_some_and(|n| !own_temps::looks_unnamed(n) && own_temps::is_own(n))
}

/// Adds the patterns of the ignore file `path` to `b`, read the one safe way (a regular file
/// of at most `ignore_files::MAX_IGNORE_FILE_BYTES`, never a FIFO or a symlink: see
/// `iii_shell_files::ignore_files`); a file that does not qualify is skipped with a WARN.
fn add_file(b: &mut GitignoreBuilder, path: &Path) {
    if let Some(bytes) = ignore_files::read(None, path, path) {
        for line in ignore_files::lines(&bytes) {
            let _ = b.add_line(Some(path.to_path_buf()), line);
        }
    }
}

pub struct Filter {
    include_ignored: bool,
    /// Matchers with the prefix to put before a root-relative path.
    matchers: Vec<(Gitignore, PathBuf)>,
}

impl Filter {
    /// `root` is the canonical watched directory (used to find the repository); `read_root`
    /// the path through which its files are read.
    pub fn build(root: &Path, read_root: &Path, include_ignored: bool) -> Filter {
        let mut matchers = Vec::new();
        if include_ignored {
            return Filter {
                include_ignored,
                matchers,
            };
        }
        let repo_top = root.ancestors().find(|a| a.join(".git").exists());
        match repo_top {
            Some(top) => {
                let prefix = root
                    .strip_prefix(top)
                    .unwrap_or(Path::new(""))
                    .to_path_buf();
                let mut b = GitignoreBuilder::new("");
                add_file(&mut b, &top.join(".git/info/exclude"));
                // Every .gitignore from the top down to the root's parent, with patterns
                // relative to the top (prefixes applied per file by the builder's root).
                let mut dir = top.to_path_buf();
                add_file(&mut b, &dir.join(".gitignore"));
                if let Ok(g) = b.build() {
                    matchers.push((g, prefix.clone()));
                }
                for c in prefix.components() {
                    dir.push(c);
                    if dir == root {
                        break;
                    }
                    let mut b = GitignoreBuilder::new("");
                    add_file(&mut b, &dir.join(".gitignore"));
                    if let Ok(g) = b.build() {
                        let sub = root
                            .strip_prefix(&dir)
                            .unwrap_or(Path::new(""))
                            .to_path_buf();
                        matchers.push((g, sub));
                    }
                }
                if root != top {
                    let mut b = GitignoreBuilder::new("");
                    add_file(&mut b, &read_root.join(".gitignore"));
                    if let Ok(g) = b.build() {
                        matchers.push((g, PathBuf::new()));
                    }
                }
            }
            None => {
                let mut b = GitignoreBuilder::new("");
                for p in OUTSIDE_REPO_PATTERNS {
                    let _ = b.add_line(None, p);
                }
                add_file(&mut b, &read_root.join(".gitignore"));
                if let Ok(g) = b.build() {
                    matchers.push((g, PathBuf::new()));
                }
            }
        }
        Filter {
            include_ignored,
            matchers,
        }
    }

    /// True when a change of `rel` (relative to the root) is delivered.
    pub fn delivers(&self, rel: &Path, is_dir: bool) -> bool {
        if is_git_internal(rel) || is_own_temp(rel) {
            return false;
        }
        if self.include_ignored {
            return true;
        }
        !self.matchers.iter().any(|(g, prefix)| {
            g.matched_path_or_any_parents(prefix.join(rel), is_dir)
                .is_ignore()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_internals_are_filtered_even_when_ignored_paths_are_included() {
        let d = tempfile::tempdir().unwrap();
        let f = Filter::build(d.path(), d.path(), true);
        assert!(!f.delivers(Path::new(".git/index"), false));
        assert!(!f.delivers(Path::new("sub/.git/HEAD"), false));
        assert!(!f.delivers(Path::new(".git"), true));
        assert!(f.delivers(Path::new(".gitignore"), false));
        assert!(f.delivers(Path::new("data/x"), false));
    }

    /// Exactly the names the executor holds as its own temp files are left out; files that
    /// merely look like them (the same shape, another random part) are delivered.
    #[test]
    fn the_executors_staging_files_are_not_changes() {
        let d = tempfile::tempdir().unwrap();
        let f = Filter::build(d.path(), d.path(), true);
        let own = ".a.rs.iii-0123456789abcdef0123456789abcde0.tmp";
        own_temps::hold(own.as_bytes());
        assert!(!f.delivers(&Path::new("src").join(own), false));
        own_temps::release(own.as_bytes());
        assert!(
            !f.delivers(&Path::new("src").join(own), false),
            "a released name is still known while its events may arrive"
        );
        for lookalike in [
            "src/.a.rs.iii-0123456789abcdef0123456789abcdef.tmp",
            "src/.a.rs.iii-coder-0123456789abcdef0123456789abcdef.tmp",
            "src/.a.rs.iii-0123.tmp",
            "src/a.rs.iii-0123456789abcdef0123456789abcdef.tmp",
        ] {
            assert!(f.delivers(Path::new(lookalike), false), "{lookalike}");
        }
    }

    /// A command controls the ignore files: a FIFO (whose open would block the watcher's
    /// task forever) and a sparse 64 GiB file are skipped at once; the rest still applies.
    #[test]
    fn hostile_ignore_files_are_skipped_without_blocking_or_reading_them() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("repo");
        std::fs::create_dir_all(root.join(".git/info")).unwrap();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        let fifo = std::ffi::CString::new(
            root.join(".git/info/exclude")
                .as_os_str()
                .as_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: mkfifo of a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        std::fs::write(root.join(".gitignore"), "*.log\n").unwrap();
        let big = std::fs::File::create(root.join("sub/.gitignore")).unwrap();
        big.set_len(64 << 30).unwrap();
        let f = Filter::build(&root, &root, false);
        assert!(!f.delivers(Path::new("a.log"), false));
        assert!(f.delivers(Path::new("a.txt"), false));
        let sub = Filter::build(&root.join("sub"), &root.join("sub"), false);
        assert!(!sub.delivers(Path::new("b.log"), false));
        assert!(sub.delivers(Path::new("b.txt"), false));
    }

    #[test]
    fn outside_a_repository_the_fixed_list_and_the_root_gitignore_apply() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(".gitignore"), "*.log\n").unwrap();
        let f = Filter::build(d.path(), d.path(), false);
        assert!(!f.delivers(Path::new("data/observability/x.json"), false));
        assert!(!f.delivers(Path::new("config/a"), false));
        assert!(!f.delivers(Path::new(".iii/state"), false));
        assert!(!f.delivers(Path::new("web/node_modules/x/index.js"), false));
        assert!(!f.delivers(Path::new("build.log"), false));
        assert!(f.delivers(Path::new("src/data/x"), false));
        assert!(f.delivers(Path::new("src/main.rs"), false));
    }

    #[test]
    fn inside_a_repository_gitignored_paths_are_skipped() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join(".git/info")).unwrap();
        std::fs::write(d.path().join(".git/info/exclude"), "secret.txt\n").unwrap();
        std::fs::write(d.path().join(".gitignore"), "target/\n").unwrap();
        std::fs::create_dir_all(d.path().join("crate")).unwrap();
        let f = Filter::build(d.path(), d.path(), false);
        assert!(!f.delivers(Path::new("target/debug/x"), false));
        assert!(!f.delivers(Path::new("secret.txt"), false));
        assert!(
            f.delivers(Path::new("data/x"), false),
            "the fixed list is for non-repositories"
        );
        let sub = Filter::build(&d.path().join("crate"), &d.path().join("crate"), false);
        assert!(!sub.delivers(Path::new("target/x"), false));
        assert!(sub.delivers(Path::new("src/lib.rs"), false));
    }
}
