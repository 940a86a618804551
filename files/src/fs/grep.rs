//! `shell::fs::grep`: a regex search over a file or a directory tree, built on ripgrep's
//! crates (`ignore` for the parallel walk, `grep-searcher` + `grep-regex` for the search).
//!
//! Semantics:
//! * `pattern` is a Rust regex matched against each line (`\n` is never part of a line, so a
//!   class such as `\s` does not span lines; a literal `\n` in the pattern is refused, S217).
//!   An empty pattern is S210, a pattern that does not compile S217.
//! * The walk searches everything a plain `grep -r` would: hidden files and `.gitignore`d
//!   files included; symlinks are never followed (neither to files nor to directories), and
//!   only regular files are searched. Binary files (a NUL byte anywhere) are skipped, as are
//!   unreadable files. Entries that are denylisted (`fs.denylist_paths`) or protected
//!   (`code.non_accessible_globs`) are skipped silently; denied directories are not entered.
//! * Globs match the path relative to the search root (for a root that is a single file, its
//!   file name), ripgrep style: a glob without `/` matches the entry's name at any depth
//!   (`*.rs`), a glob with `/` matches the whole relative path, and `*` never crosses `/`
//!   (`src/**/*.rs`). A file must match one `include_glob` when any are given; a file or
//!   directory matching an `exclude_glob` is skipped (a directory is not entered).
//! * Matches are ordered by (path, line); `max_matches` keeps the first ones in that order,
//!   so the answer does not depend on the walk's thread scheduling. `line` is 1-based,
//!   `path` is absolute and canonical, `content` is the line without its `\n` / `\r\n`
//!   (non-UTF-8 bytes read as U+FFFD). A matching line longer than `max_line_bytes` (its raw
//!   bytes, terminator excluded) is skipped, as the seed's schema says: it is not returned,
//!   not even cut, and does not count toward `max_matches` (see `line_content`).
//! * The reply is budgeted while it is built: matches past `REPLY_BUDGET_BYTES` (32 MiB,
//!   estimated as their paths and contents) are dropped like those past `max_matches`, so a
//!   reply always fits a frame.
//! * `truncated` is true when a match was dropped by `max_matches` or the reply budget, or a
//!   line was skipped for `max_line_bytes`. Both caps are taken literally: `max_matches: 0` returns no match (and
//!   `truncated: true` when anything matched).
//!
//! Security: the root is resolved through the jail. Every file is then opened relative to the
//! root's directory fd with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` and `O_NOFOLLOW`,
//! so a directory swapped for a symlink during the walk makes the open fail instead of
//! leading outside the tree; the walker lists directories by path, but nothing it lists is
//! ever read except through such an fd.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkMatch};
use ignore::{WalkBuilder, WalkState};
use iii_shell_policy::sync::lock;
use iii_shell_protocol::frame::REPLY_BUDGET_BYTES;
use iii_shell_protocol::fs::{FsMatch, GrepResponse, GrepSpec};

use crate::error::ExecError;
use crate::globs::{GlobError, NameOrPath};
use crate::jail::{fstat, open_beneath, Jail};
use crate::FsPolicy;

/// Searches `spec.path` (a file or a directory tree) for `spec.pattern`.
pub fn grep(policy: &FsPolicy, spec: &GrepSpec) -> Result<GrepResponse, ExecError> {
    grep_with_threads(policy, spec, 0)
}

/// [`grep`] with an explicit number of walker threads (0 = one per core, at most 12: the
/// `ignore` crate's default, which is also ripgrep's).
pub fn grep_with_threads(
    policy: &FsPolicy,
    spec: &GrepSpec,
    threads: usize,
) -> Result<GrepResponse, ExecError> {
    if spec.pattern.is_empty() {
        return Err(ExecError::Invalid("pattern is empty".into()));
    }
    let matcher = RegexMatcherBuilder::new()
        .case_insensitive(spec.ignore_case)
        .line_terminator(Some(b'\n'))
        .build(&spec.pattern)
        .map_err(|e| ExecError::BadRegex(format!("invalid regex: {e}")))?;
    let filters = Filters::new(&spec.include_glob, &spec.exclude_glob)?;
    let limit = usize::try_from(spec.max_matches).unwrap_or(usize::MAX);
    let max_line = usize::try_from(spec.max_line_bytes).unwrap_or(usize::MAX);
    let collector = Mutex::new(Collector::new(limit));

    match open_root(policy, &spec.path)? {
        Root::File { file, path, .. } => {
            let name = path.file_name().map(Path::new).unwrap_or(Path::new(""));
            if filters.file_ok(name) {
                let mut searcher = new_searcher();
                let mut sink = FileSink::new(limit, max_line, &path);
                search_one(&mut searcher, &matcher, &file, &mut sink, &collector);
            }
        }
        Root::Dir { fd, path } => {
            walk(policy, &path, spec.recursive, &filters, threads, || {
                let mut searcher = new_searcher();
                let matcher = matcher.clone();
                let (fd, collector) = (&fd, &collector);
                move |abs: &Path, rel: &Path| {
                    let (beyond, done) = {
                        let c = lock(collector);
                        (c.beyond(abs), c.truncated)
                    };
                    if beyond && done {
                        // Every match this file could hold sorts after a full result set.
                        return;
                    }
                    let Some((file, st)) = open_regular(fd, rel) else {
                        return;
                    };
                    if policy.jail.stat_is_protected(abs, &st) {
                        return;
                    }
                    // A file past the end of a full result set is only searched to learn
                    // whether anything was dropped, so one match is enough.
                    let cap = if beyond { 0 } else { limit };
                    let mut sink = FileSink::new(cap, max_line, abs);
                    search_one(&mut searcher, &matcher, &file, &mut sink, collector);
                }
            });
        }
    }
    let c = collector.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok(GrepResponse {
        matches: c.files.into_values().flatten().collect(),
        truncated: c.truncated,
    })
}

fn new_searcher() -> Searcher {
    SearcherBuilder::new()
        .line_number(true)
        .binary_detection(BinaryDetection::quit(b'\0'))
        .build()
}

/// Searches one opened file and hands its matches to the collector; a binary or unreadable
/// file contributes nothing.
fn search_one(
    searcher: &mut Searcher,
    matcher: &RegexMatcher,
    file: &File,
    sink: &mut FileSink<'_>,
    collector: &Mutex<Collector>,
) {
    if searcher.search_file(matcher, file, &mut *sink).is_err() || sink.binary {
        return;
    }
    if sink.matches.is_empty() && !sink.more && !sink.skipped {
        return;
    }
    let matches = std::mem::take(&mut sink.matches);
    sink.bytes = 0;
    lock(collector).add(sink.path, matches, sink.more, sink.skipped);
}

/// The result set: matches per file in path order, never more than `limit` in total.
struct Collector {
    limit: usize,
    files: BTreeMap<Vec<u8>, Vec<FsMatch>>,
    count: usize,
    /// Estimated encoded size of what is kept, against `budget`.
    bytes: usize,
    budget: usize,
    truncated: bool,
}

/// The encoded size of one match, near enough to budget a reply (postcard: the strings and
/// a few bytes of lengths and the line number).
fn match_bytes(m: &FsMatch) -> usize {
    m.path.len() + m.content.len() + 16
}

/// A sort key that orders paths like `Path`'s component-wise order, but compares with one
/// `memcmp`: each `/` becomes NUL (which no file name contains), so a component that is a
/// prefix of another sorts first, exactly as in the component comparison.
fn sort_key(path: &Path) -> Vec<u8> {
    path.as_os_str()
        .as_bytes()
        .iter()
        .map(|&b| if b == b'/' { 0 } else { b })
        .collect()
}

impl Collector {
    fn new(limit: usize) -> Collector {
        Collector::with_budget(limit, REPLY_BUDGET_BYTES)
    }

    fn with_budget(limit: usize, budget: usize) -> Collector {
        Collector {
            limit,
            files: BTreeMap::new(),
            count: 0,
            bytes: 0,
            budget,
            truncated: false,
        }
    }

    fn full(&self) -> bool {
        self.count >= self.limit || self.bytes >= self.budget
    }

    /// True when the set is full and `path` sorts after every file in it, so none of its
    /// matches could be kept.
    fn beyond(&self, path: &Path) -> bool {
        self.full()
            && self
                .files
                .last_key_value()
                .is_none_or(|(k, _)| sort_key(path) > *k)
    }

    fn add(&mut self, path: &Path, matches: Vec<FsMatch>, more: bool, skipped: bool) {
        self.truncated |= more | skipped;
        if matches.is_empty() {
            return;
        }
        self.count += matches.len();
        self.bytes += matches.iter().map(match_bytes).sum::<usize>();
        self.files.insert(sort_key(path), matches);
        // Drop matches from the end (largest path, last lines) until the set fits both the
        // count and the reply budget.
        while self.count > self.limit || self.bytes > self.budget {
            let Some(mut last) = self.files.last_entry() else {
                break;
            };
            self.truncated = true;
            let v = last.get_mut();
            let Some(m) = v.pop() else {
                last.remove();
                continue;
            };
            self.count -= 1;
            self.bytes -= match_bytes(&m);
            if v.is_empty() {
                last.remove();
            }
        }
    }
}

/// Collects one file's matches: at most `cap`, noting whether more existed.
struct FileSink<'p> {
    cap: usize,
    max_line: usize,
    path: &'p Path,
    /// `path` as the wire string, made on the first match.
    shown: Option<String>,
    matches: Vec<FsMatch>,
    /// Estimated encoded size of `matches`: a file stops adding at the reply budget.
    bytes: usize,
    more: bool,
    /// A matching line was skipped for `max_line_bytes`.
    skipped: bool,
    binary: bool,
}

impl<'p> FileSink<'p> {
    fn new(cap: usize, max_line: usize, path: &'p Path) -> FileSink<'p> {
        FileSink {
            cap,
            max_line,
            path,
            shown: None,
            matches: Vec::new(),
            bytes: 0,
            more: false,
            skipped: false,
            binary: false,
        }
    }
}

impl Sink for FileSink<'_> {
    type Error = std::io::Error;

    fn matched(
        &mut self,
        _searcher: &Searcher,
        mat: &SinkMatch<'_>,
    ) -> Result<bool, std::io::Error> {
        let first = mat.line_number().unwrap_or(0);
        for (i, line) in mat.lines().enumerate() {
            if self.matches.len() >= self.cap || self.bytes >= REPLY_BUDGET_BYTES {
                self.more = true;
                return Ok(false);
            }
            let Some(content) = line_content(line, self.max_line) else {
                self.skipped = true;
                continue;
            };
            let path = self.path;
            let shown = self
                .shown
                .get_or_insert_with(|| path.to_string_lossy().into_owned());
            let m = FsMatch {
                path: shown.clone(),
                line: first + i as u64,
                content,
            };
            self.bytes += match_bytes(&m);
            self.matches.push(m);
        }
        Ok(true)
    }

    fn binary_data(&mut self, _searcher: &Searcher, _offset: u64) -> Result<bool, std::io::Error> {
        self.binary = true;
        Ok(false)
    }
}

/// The text of a matched line: terminator stripped, lossy UTF-8. `None` when the line (its
/// raw bytes without the terminator) is longer than `max`: such a line is skipped.
fn line_content(line: &[u8], max: usize) -> Option<String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.len() > max {
        return None;
    }
    Some(String::from_utf8_lossy(line).into_owned())
}

// ---- shared with sed ----

/// A resolved search root.
pub(crate) enum Root {
    /// A regular file, opened for reading, with its `stat`.
    File {
        file: File,
        path: PathBuf,
        st: libc::stat,
    },
    /// A directory, opened for reading (used as the anchor of every open beneath it).
    Dir { fd: OwnedFd, path: PathBuf },
}

/// Resolves `input` through the jail. Missing or denied is S211, outside the jail S215,
/// anything but a regular file or a directory S212.
pub(crate) fn open_root(policy: &FsPolicy, input: &str) -> Result<Root, ExecError> {
    // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below anyway).
    let r = policy
        .jail
        .resolve_with(input, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY)?;
    let st = fstat(&r.fd).map_err(|e| ExecError::Internal(format!("stat {input}: {e}")))?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Ok(Root::File {
            file: File::from(r.fd),
            path: r.path,
            st,
        }),
        libc::S_IFDIR => Ok(Root::Dir {
            fd: r.fd,
            path: r.path,
        }),
        _ => Err(ExecError::WrongType(format!(
            "not a regular file or a directory: {input}"
        ))),
    }
}

/// Opens `rel` (a path below the root) read-only beneath `root_fd`, refusing any symlink on
/// the way, and returns it only when it is a regular file, with its `stat`.
pub(crate) fn open_regular(root_fd: &OwnedFd, rel: &Path) -> Option<(File, libc::stat)> {
    let fd = open_beneath(
        Some(root_fd),
        rel,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
    )
    .ok()?;
    let st = fstat(&fd).ok()?;
    (st.st_mode & libc::S_IFMT == libc::S_IFREG).then(|| (File::from(fd), st))
}

/// Include/exclude globs, ripgrep style (see the module docs).
#[derive(Clone)]
pub(crate) struct Filters {
    include: Option<NameOrPath>,
    exclude: Option<NameOrPath>,
}

/// Globs without `/` (matched against the name) and with `/` (matched against the
/// root-relative path); `None` for none.
fn filter_globs<'a>(globs: &'a [String], what: &str) -> Result<Option<NameOrPath>, ExecError> {
    if globs.is_empty() {
        return Ok(None);
    }
    let trim = |g: &'a str| {
        g.strip_prefix("./")
            .or_else(|| g.strip_prefix('/'))
            .unwrap_or(g)
    };
    if let Some(g) = globs.iter().find(|g| trim(g).is_empty()) {
        return Err(ExecError::Invalid(format!("{what} entry {g:?} is empty")));
    }
    NameOrPath::from_user(globs, trim)
        .map(Some)
        .map_err(|e| match e {
            GlobError::Bad { glob, source } => {
                ExecError::Invalid(format!("{what} entry {glob:?}: {source}"))
            }
            GlobError::Set(e) => ExecError::Invalid(format!("{what}: {e}")),
            GlobError::Limit(why) => ExecError::Invalid(format!("{what}: {why}")),
        })
}

impl Filters {
    pub(crate) fn new(include: &[String], exclude: &[String]) -> Result<Filters, ExecError> {
        Ok(Filters {
            include: filter_globs(include, "include_glob")?,
            exclude: filter_globs(exclude, "exclude_glob")?,
        })
    }

    /// Whether a file at `rel` (relative to the root) is searched.
    pub(crate) fn file_ok(&self, rel: &Path) -> bool {
        self.include.as_ref().is_none_or(|g| g.is_match(rel))
            && !self.exclude.as_ref().is_some_and(|g| g.is_match(rel))
    }

    /// Whether the directory at `rel` is pruned.
    fn dir_excluded(&self, rel: &Path) -> bool {
        self.exclude.as_ref().is_some_and(|g| g.is_match(rel))
    }
}

/// Walks the tree under the canonical directory `root` in parallel and calls a per-thread
/// visitor (made by `make`) with `(absolute path, root-relative path)` for every regular
/// file that is neither denied nor filtered out. Symlinks are never followed, denied and
/// excluded directories are not entered (not even listed), and `recursive: false` stops at
/// the root's own entries. Walk errors (an unreadable directory) are skipped.
pub(crate) fn walk<'s, M, V>(
    policy: &'s FsPolicy,
    root: &'s Path,
    recursive: bool,
    filters: &'s Filters,
    threads: usize,
    mut make: M,
) where
    M: FnMut() -> V,
    V: FnMut(&Path, &Path) + Send + 's,
{
    // Every entry is `root` + `/` + its relative path (the walker joins names onto the root
    // it was given); slicing that off is much cheaper than `strip_prefix`.
    let root_len =
        root.as_os_str().len() + usize::from(!root.as_os_str().as_bytes().ends_with(b"/"));
    let mut b = WalkBuilder::new(root);
    b.standard_filters(false)
        .follow_links(false)
        .threads(threads)
        .max_depth(if recursive { None } else { Some(1) });
    // Prune denied and excluded directories before the walker opens them. The entry filter
    // must be `'static`, so it works on its own copy of the deny rules, compiled from the
    // same configuration as `policy.jail`; the visitor below re-checks every entry against
    // `policy.jail` itself, which stays the authority (and covers a copy that failed).
    let deny_copy = prune_jail(policy);
    let dir_filters = filters.clone();
    b.filter_entry(move |e| {
        if !e.file_type().is_some_and(|t| t.is_dir()) {
            return true;
        }
        if deny_copy.as_ref().is_some_and(|j| j.is_denied(e.path())) {
            return false;
        }
        rel_path(e.path(), root_len).is_none_or(|rel| !dir_filters.dir_excluded(rel))
    });
    b.build_parallel().run(|| {
        let mut visit = make();
        Box::new(move |entry| {
            let Ok(entry) = entry else {
                return WalkState::Continue;
            };
            if entry.depth() == 0 {
                return WalkState::Continue;
            }
            let Some(ft) = entry.file_type() else {
                return WalkState::Continue;
            };
            let abs = entry.path();
            let Some(rel) = rel_path(abs, root_len) else {
                return WalkState::Continue;
            };
            if ft.is_dir() {
                if policy.jail.is_denied(abs) || filters.dir_excluded(rel) {
                    return WalkState::Skip;
                }
            } else if ft.is_file() && filters.file_ok(rel) && !policy.jail.is_denied(abs) {
                visit(abs, rel);
            }
            WalkState::Continue
        })
    });
}

/// `abs` without its first `root_len` bytes (the root and its `/`).
fn rel_path(abs: &Path, root_len: usize) -> Option<&Path> {
    let rel = abs.as_os_str().as_bytes().get(root_len..)?;
    Some(Path::new(OsStr::from_bytes(rel)))
}

/// An owned copy of the policy's deny rules (see [`walk`]); `None` when it cannot be built
/// (a root vanished since the policy was loaded), in which case only the visitor checks.
fn prune_jail(policy: &FsPolicy) -> Option<std::sync::Arc<Jail>> {
    let c = &policy.config;
    Jail::new(
        &c.fs.host_roots,
        &c.fs.denylist_paths,
        &c.code.non_accessible_globs,
    )
    .ok()
    .map(std::sync::Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Before the walk has made the record, a same-directory hardlink of a protected file is
    /// not searched, and the plain files beside it are.
    #[test]
    fn before_the_record_a_hardlink_of_a_protected_file_is_not_searched() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("a/.env"), "NEEDLE=secret\n").unwrap();
        std::fs::hard_link(root.join("a/.env"), root.join("a/copy.txt")).unwrap();
        std::fs::write(root.join("a/plain.txt"), "NEEDLE=plain\n").unwrap();
        let mut config = iii_shell_protocol::config::Config::default();
        config.fs.host_roots = vec![root.to_string_lossy().into_owned()];
        config.fs.allow_unjailed = false;
        config.code.non_accessible_globs = vec!["**/.env".into()];
        let policy = crate::FsPolicy::build(config).unwrap();
        assert!(policy.jail.protected().is_none());
        let spec = GrepSpec {
            path: ".".into(),
            pattern: "NEEDLE".into(),
            recursive: true,
            ignore_case: false,
            include_glob: vec![],
            exclude_glob: vec![],
            max_matches: 100,
            max_line_bytes: 1000,
        };
        let r = grep_with_threads(&policy, &spec, 1).unwrap();
        let found: Vec<_> = r.matches.iter().map(|m| m.content.as_str()).collect();
        assert_eq!(found, ["NEEDLE=plain"], "{r:?}");
    }

    #[test]
    fn a_bad_or_empty_filter_glob_is_s210_named_as_the_caller_wrote_it() {
        let bad = |inc: &[&str], exc: &[&str]| {
            let s = |v: &[&str]| v.iter().map(|g| g.to_string()).collect::<Vec<_>>();
            match Filters::new(&s(inc), &s(exc)) {
                Err(ExecError::Invalid(m)) => m,
                other => panic!("{:?}", other.map(|_| ())),
            }
        };
        assert_eq!(
            bad(&["*.rs", "./a["], &[]),
            "include_glob entry \"./a[\": error parsing glob 'a[': unclosed character class; missing ']'"
        );
        assert_eq!(bad(&[], &["/"]), "exclude_glob entry \"/\" is empty");
        let many = vec!["*.rs"; crate::globs::MAX_CALLER_GLOBS + 1];
        assert_eq!(
            bad(&many, &[]),
            "include_glob: 1001 globs, at most 1000 are accepted; combine them (`*.{rs,toml}`) or search a narrower path"
        );
        assert!(Filters::new(&["./src/*.rs".into()], &[]).is_ok());
    }

    #[test]
    fn long_lines_are_skipped_not_cut() {
        assert_eq!(line_content(b"abc\r\n", 3), Some("abc".to_string()));
        assert_eq!(line_content("ééé\n".as_bytes(), 5), None);
        assert_eq!(line_content("ééé".as_bytes(), 6), Some("ééé".to_string()));
        assert_eq!(line_content(b"abcd", 3), None);
        assert_eq!(line_content(b"a\xffb", 3), Some("a\u{fffd}b".to_string()));
        assert_eq!(line_content(b"a\xffb", 2), None);
    }

    #[test]
    fn collector_keeps_first_in_path_order() {
        let m = |p: &str, l| FsMatch {
            path: p.into(),
            line: l,
            content: String::new(),
        };
        let mut c = Collector::new(3);
        c.add(Path::new("/b"), vec![m("/b", 1), m("/b", 2)], false, false);
        assert!(!c.beyond(Path::new("/c")));
        c.add(Path::new("/c"), vec![m("/c", 1), m("/c", 2)], false, false);
        assert!(c.truncated);
        assert!(c.beyond(Path::new("/d")));
        assert!(!c.beyond(Path::new("/b.x")));
        c.add(Path::new("/a"), vec![m("/a", 7)], false, false);
        let got: Vec<_> = c
            .files
            .into_values()
            .flatten()
            .map(|m| (m.path, m.line))
            .collect();
        assert_eq!(
            got,
            vec![("/a".into(), 7), ("/b".into(), 1), ("/b".into(), 2)]
        );
    }

    #[test]
    fn sort_key_orders_like_path() {
        let mut paths = [
            "/a/b", "/a.b", "/a", "/a/b/c", "/a-b/c", "/ab", "/a/ba", "/a/b.c",
        ]
        .map(PathBuf::from)
        .to_vec();
        let mut by_key = paths.clone();
        paths.sort();
        by_key.sort_by_key(|p| sort_key(p));
        assert_eq!(paths, by_key);
    }

    /// What the walk does for every file: a path whose directory was swapped for a symlink
    /// (here: is one) cannot be opened, inside the jail or out of it.
    #[test]
    fn open_regular_refuses_symlinks_anywhere_on_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), "s").unwrap();
        std::fs::write(root.join("real/f.txt"), "f").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("swapped")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("inner")).unwrap();
        std::os::unix::fs::symlink(root.join("real/f.txt"), root.join("link.txt")).unwrap();
        let fd = open_beneath(None, &root, libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
        assert!(open_regular(&fd, Path::new("real/f.txt")).is_some());
        assert!(open_regular(&fd, Path::new("swapped/secret.txt")).is_none());
        assert!(open_regular(&fd, Path::new("inner/f.txt")).is_none());
        assert!(open_regular(&fd, Path::new("link.txt")).is_none());
        assert!(open_regular(&fd, Path::new("../outside/secret.txt")).is_none());
        assert!(open_regular(&fd, Path::new("real")).is_none());
    }
}
