//! What `respect_gitignore: true` hides in a `coder::search` walk, decided here rather than
//! by the `ignore` crate's own ignore-file loading (which opens whatever a command put under
//! those names, with no bound on size and a blocking open). Every ignore file is read
//! through [`crate::ignore_files`] (regular files only, at most its documented size).
//!
//! The rules are ripgrep's with `require_git`: a directory's `.ignore` always applies, its
//! `.gitignore` only inside a Git repository (a `.git` in it or above it), and the
//! repository's `.git/info/exclude`; for a path, the deepest match of each kind decides
//! that kind, and `.ignore` outranks `.gitignore`, which outranks the exclude file. The
//! directories between the walk root and the root of the jail that holds it count too (their
//! ignore files are read beneath that root); nothing above a jail root is read.
//!
//! Matchers are cached per directory, within [`MAX_CACHED_BYTES`] (and [`MAX_CACHED_DIRS`])
//! per search: past it the cache starts over (the files are read again when needed), so memory
//! stays bounded however many ignore files a tree holds.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ignore::gitignore::Gitignore;
use ignore::Match;
use iii_shell_policy::sync::lock;

use crate::ignore_files::load;
use crate::jail::open_beneath;

/// Ignore-file text kept in one search's cache at most (16 MiB).
pub const MAX_CACHED_BYTES: usize = 16 << 20;

/// One directory's ignore files.
#[derive(Default)]
struct Layer {
    ignore: Option<Gitignore>,
    git: Option<Gitignore>,
    exclude: Option<Gitignore>,
    /// The directory holds `.git`.
    has_git: bool,
}

impl Layer {
    fn bytes(&self) -> usize {
        // The pattern count stands in for the text it came from (a cheap upper bound).
        [&self.ignore, &self.git, &self.exclude]
            .into_iter()
            .flatten()
            .map(|g| g.num_ignores() as usize + g.num_whitelists() as usize)
            .sum::<usize>()
            .saturating_mul(64)
            + 64
    }
}

const BENEATH: u64 =
    libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

/// Directories cached at most per search.
pub const MAX_CACHED_DIRS: usize = 65_536;

/// The rules in force in one directory: its own layer when it has one (else it shares its
/// parent's node), the nearest ancestor's, and whether it lies in a repository.
struct Node {
    layer: Option<Arc<Layer>>,
    up: Option<Arc<Node>>,
    in_repo: bool,
}

#[derive(Default)]
struct Cache {
    nodes: HashMap<PathBuf, Arc<Node>>,
    bytes: usize,
}

/// The ignore rules of one walk.
pub struct Ignores {
    /// The jail root (or `/`) the walk lies in, and its descriptor.
    top: PathBuf,
    top_fd: OwnedFd,
    /// A `.git` above `top` (looked at by name only).
    git_above: bool,
    cache: Mutex<Cache>,
}

impl Ignores {
    /// Rules for a walk inside `top` (absolute, canonical), read beneath `top_fd`.
    pub fn new(top: PathBuf, top_fd: OwnedFd) -> Ignores {
        let git_above = top
            .ancestors()
            .skip(1)
            .any(|a| a.join(".git").symlink_metadata().is_ok());
        Ignores {
            top,
            top_fd,
            git_above,
            cache: Mutex::default(),
        }
    }

    /// The node of directory `dir` (absolute, under `top`), building the missing ones from
    /// the nearest cached ancestor down (no recursion: trees may be deep).
    fn node(&self, dir: &Path) -> Option<Arc<Node>> {
        if !dir.starts_with(&self.top) {
            return None;
        }
        if let Some(n) = lock(&self.cache).nodes.get(dir) {
            return Some(n.clone());
        }
        let mut missing = vec![dir];
        let mut base: Option<Arc<Node>> = None;
        let mut cur = dir;
        while let Some(p) = cur.parent().filter(|p| p.starts_with(&self.top)) {
            if let Some(n) = lock(&self.cache).nodes.get(p) {
                base = Some(n.clone());
                break;
            }
            missing.push(p);
            cur = p;
        }
        for d in missing.into_iter().rev() {
            let layer = self.read_layer(d);
            let in_repo = base.as_ref().map_or(self.git_above, |b| b.in_repo);
            let node = match layer {
                None => match &base {
                    Some(b) => b.clone(),
                    None => Arc::new(Node {
                        layer: None,
                        up: None,
                        in_repo,
                    }),
                },
                Some(l) => Arc::new(Node {
                    in_repo: in_repo || l.has_git,
                    layer: Some(Arc::new(l)),
                    up: base.clone(),
                }),
            };
            let cost = node.layer.as_ref().map_or(0, |l| l.bytes()) + d.as_os_str().len() + 64;
            let mut c = lock(&self.cache);
            if c.bytes + cost > MAX_CACHED_BYTES || c.nodes.len() >= MAX_CACHED_DIRS {
                c.nodes.clear();
                c.bytes = 0;
            }
            c.bytes += cost;
            c.nodes.insert(d.to_path_buf(), node.clone());
            base = Some(node);
        }
        base
    }

    /// The ignore files of `dir`, or `None` when it has none and no `.git`.
    fn read_layer(&self, dir: &Path) -> Option<Layer> {
        let rel = dir.strip_prefix(&self.top).ok()?;
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let fd = open_beneath(
            Some(&self.top_fd),
            rel,
            libc::O_PATH | libc::O_DIRECTORY,
            BENEATH,
        )
        .ok()?;
        let has_git = open_beneath(Some(&fd), Path::new(".git"), libc::O_PATH, BENEATH).is_ok();
        let file = |name: &str| load(Some(&fd), Path::new(name), dir, &dir.join(name));
        let l = Layer {
            ignore: file(".ignore"),
            git: file(".gitignore"),
            exclude: if has_git {
                file(".git/info/exclude")
            } else {
                None
            },
            has_git,
        };
        (l.has_git || l.ignore.is_some() || l.git.is_some()).then_some(l)
    }

    /// True when `path` (absolute, under `top`; a directory when `is_dir`) is ignored.
    pub fn is_ignored(&self, path: &Path, is_dir: bool) -> bool {
        let Some(start) = path.parent().and_then(|p| self.node(p)) else {
            return false;
        };
        let in_repo = start.in_repo;
        let (mut ignore, mut git, mut exclude) = (Match::None, Match::None, Match::None);
        let mut saw_git = false;
        let mut cur = Some(start);
        while let Some(n) = cur {
            if let Some(l) = &n.layer {
                if ignore.is_none() {
                    ignore = matched(&l.ignore, path, is_dir);
                }
                if in_repo && !saw_git {
                    if git.is_none() {
                        git = matched(&l.git, path, is_dir);
                    }
                    if exclude.is_none() {
                        exclude = matched(&l.exclude, path, is_dir);
                    }
                }
                saw_git |= l.has_git;
            }
            cur = n.up.clone();
        }
        let decided = if !ignore.is_none() {
            ignore
        } else if !git.is_none() {
            git
        } else {
            exclude
        };
        decided.is_ignore()
    }
}

fn matched(g: &Option<Gitignore>, path: &Path, is_dir: bool) -> Match<()> {
    match g {
        Some(g) => match g.matched(path, is_dir) {
            Match::None => Match::None,
            Match::Ignore(_) => Match::Ignore(()),
            Match::Whitelist(_) => Match::Whitelist(()),
        },
        None => Match::None,
    }
}
