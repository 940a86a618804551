//! `coder::search`: content and path search over a folder, on ripgrep's crates (`ignore`
//! for the parallel walk, `grep-searcher` + `grep-regex` for the content), the engine of
//! `shell::fs::grep`.
//!
//! * `query` is literal unless `regex: true`; content matching records the FIRST match per
//!   line, considers only the first `max_line_bytes` of each line, never spans newlines, and
//!   skips binary files (a NUL byte), non-regular files and files over `max_read_bytes`.
//!   `line` and `column` are 1-based (`column` counts bytes).
//! * Walk: symlinks are never followed; `include_hidden: false` skips dot entries;
//!   `respect_gitignore: true` honours `.gitignore` (inside a Git repository), `.ignore` and
//!   `.git/info/exclude`, nested ones included, read only as regular files of at most
//!   [`crate::ignore_files::MAX_IGNORE_FILE_BYTES`] ([`super::search_ignores`]). Denied entries are skipped (denied folders
//!   not entered), and so are `default_exclude_globs` (unless `use_default_excludes: false`)
//!   and `exclude_globs`. A glob with a `/` matches the root-relative path, one without
//!   matches the entry's name (ripgrep style; `*` never crosses `/`). `include_globs`
//!   restrict files (and directories listed as path matches).
//! * Every file is opened with `openat2(root_fd, rel, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`
//!   and `O_NOFOLLOW`, so a folder swapped for a symlink mid-walk cannot lead outside.
//! * Budgets are kept while results are collected: at most `max_matches` per list and at
//!   most `search_response_budget_bytes` of payload (paths + text + context), dropping from
//!   the end of the path order, so the answer does not depend on thread scheduling and
//!   memory never exceeds the budget. `truncated` says something was dropped.
//! * `fuzzy_paths`: path matches are ranked by [`fuzzy_score`], best first (ties: shorter,
//!   then lexicographic); with an empty query, shallow then short paths come first.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use globset::GlobSet;

use crate::globs::{GlobError, NameOrPath};
use grep_matcher::Matcher;
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{
    BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkContextKind, SinkMatch,
};
use ignore::{WalkBuilder, WalkState};
use iii_shell_policy::sync::lock;
use iii_shell_protocol::coder::*;

use super::paths::{display, CErr, Ctx, RootedGlobs};
use super::search_ignores::Ignores;
use crate::fs::entry::is_file;
use crate::jail::{fstat, open_beneath, Jail};

/// User globs (`include_globs`, `exclude_globs`): name globs (no `/`) and path globs.
fn user_globs(globs: &[String], what: &str) -> Result<NameOrPath, CErr> {
    NameOrPath::from_user(globs, |g| g.trim_start_matches("./")).map_err(|e| match e {
        GlobError::Bad { glob, source } => {
            CErr::invalid(format!("{what}: bad glob {glob:?}: {source}"))
        }
        GlobError::Set(e) => CErr::invalid(format!("{what}: {e}")),
        GlobError::Limit(why) => CErr::invalid(format!("{what}: {why}")),
    })
}

/// What the walker prunes before it opens a folder (`'static`: owned copies).
#[derive(Clone)]
struct Prune {
    deny: Option<Arc<Jail>>,
    noise: Option<RootedGlobs>,
    exclude: NameOrPath,
    root_len: usize,
}

impl Prune {
    fn prunes_dir(&self, abs: &Path) -> bool {
        if self.deny.as_ref().is_some_and(|j| j.is_denied(abs)) {
            return true;
        }
        if self.noise.as_ref().is_some_and(|n| n.is_match_dir(abs)) {
            return true;
        }
        rel_of(abs, self.root_len).is_some_and(|rel| self.exclude.is_match(rel))
    }
}

/// True when one of `a` and `b` is the other or lies under it.
fn related(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// `globs` split into those of the form `G/**` and the rest. A path matches `G/**` exactly
/// when `G` matches one of its proper prefixes that ends before a `/`, i.e. the path of one of
/// its ancestors; so `G/**` matches an entry if and only if it matches `<parent>/x`.
fn split_suffix(globs: &[String]) -> (Vec<String>, Vec<String>) {
    globs
        .iter()
        .cloned()
        .partition(|g| g.strip_suffix("/**").is_some_and(|head| !head.is_empty()))
}

/// The path rules a walk under `w` applies to its files, cut down to what can match below
/// `w`, with exactly the policy's answers there:
///
/// * the denylist entries and roots that are `w`, above it or below it (any other cannot be
///   a prefix of a path under `w`);
/// * the `G/**` non-accessible and default-exclude globs are decided once per folder (a
///   folder whose `<folder>/x` matches one is listed but not entered: everything in it would
///   be refused) and once for `w` itself, so a file is matched only against the others. When
///   `w` is itself inside such a glob, files are matched against every glob.
///
/// This keeps the per-file cost of the policy to the globs that can only match a file: the
/// difference between this walk and rg's.
struct WalkRules<'a> {
    policy: &'a crate::FsPolicy,
    /// The file globs that start with `**/`: matched once, on the absolute path (a match on
    /// a root-relative path implies one on the absolute path, which ends with it).
    file_anywhere: GlobSet,
    file_deny: Option<Jail>,
    content_denied: Option<Jail>,
    file_noise: Option<RootedGlobs>,
}

impl<'a> WalkRules<'a> {
    fn new(ctx: &Ctx<'a>, w: &Path, use_noise: bool) -> WalkRules<'a> {
        let c = &ctx.policy.config;
        let roots: Vec<String> = ctx
            .policy
            .jail
            .roots()
            .iter()
            .filter(|r| related(&r.path, w))
            .map(|r| display(&r.path))
            .collect();
        let deny: Vec<String> =
            c.fs.denylist_paths
                .iter()
                .filter(|d| {
                    let lexical = crate::jail::normalize(Path::new(d));
                    related(&lexical, w)
                        || std::fs::canonicalize(&lexical).is_ok_and(|canon| related(&canon, w))
                })
                .cloned()
                .collect();
        let probe = w.join("x");
        let (suffix, rest) = split_suffix(&c.code.non_accessible_globs);
        let content_denied = Jail::new(&roots, &[], &suffix).ok();
        let whole = content_denied
            .as_ref()
            .is_none_or(|j| j.is_denied_by_name(&probe));
        let file_globs = if whole {
            c.code.non_accessible_globs.clone()
        } else {
            rest
        };
        let (anywhere, file_globs): (Vec<String>, Vec<String>) =
            file_globs.into_iter().partition(|g| g.starts_with("**/"));
        let file_anywhere = crate::globs::set(
            anywhere.iter().map(String::as_str),
            crate::globs::Syntax::Config,
        )
        .ok();
        let file_noise = use_noise.then(|| {
            let (suffix, rest) = split_suffix(&c.code.default_exclude_globs);
            if RootedGlobs::new(&suffix, &ctx.bases).is_match_dir(w) {
                ctx.excludes()
            } else {
                RootedGlobs::new(&rest, &ctx.bases)
            }
        });
        WalkRules {
            policy: ctx.policy,
            file_deny: file_anywhere
                .as_ref()
                .and_then(|_| Jail::new(&roots, &deny, &file_globs).ok()),
            file_anywhere: file_anywhere.unwrap_or_else(GlobSet::empty),
            content_denied: content_denied.filter(|_| !whole),
            file_noise,
        }
    }

    /// A file the policy refuses by name (the identity check is the caller's).
    fn file_denied(&self, abs: &Path) -> bool {
        match &self.file_deny {
            Some(j) => self.file_anywhere.is_match(abs) || j.is_denied_by_name(abs),
            None => self.policy.jail.is_denied_by_name(abs),
        }
    }

    fn file_excluded(&self, abs: &Path) -> bool {
        self.file_noise.as_ref().is_some_and(|n| n.is_match(abs))
    }

    /// A folder (already listed) whose whole content is non-accessible: not entered.
    fn content_denied(&self, abs: &Path) -> bool {
        self.content_denied
            .as_ref()
            .is_some_and(|j| j.is_denied_by_name(&abs.join("x")))
    }
}

fn rel_of(abs: &Path, root_len: usize) -> Option<&Path> {
    let rel = abs.as_os_str().as_bytes().get(root_len..)?;
    Some(Path::new(OsStr::from_bytes(rel)))
}

fn sort_key(path: &Path) -> Vec<u8> {
    path.as_os_str()
        .as_bytes()
        .iter()
        .map(|&b| if b == b'/' { 0 } else { b })
        .collect()
}

/// Cuts a line (without its terminator) to at most `max` bytes on a char boundary, as text.
fn cut(line: &[u8], max: usize) -> String {
    let l = line.strip_suffix(b"\n").unwrap_or(line);
    let l = l.strip_suffix(b"\r").unwrap_or(l);
    let mut end = l.len().min(max);
    // Step back over a split UTF-8 sequence (continuation bytes 0b10xxxxxx).
    while end > 0 && end < l.len() && (l[end] & 0xC0) == 0x80 {
        end -= 1;
    }
    String::from_utf8_lossy(&l[..end]).into_owned()
}

fn match_cost(m: &ContentMatch) -> u64 {
    let ctx = |v: &Option<Vec<String>>| v.iter().flatten().map(|s| s.len()).sum::<usize>();
    (m.path.len() + m.text.len() + ctx(&m.before) + ctx(&m.after)) as u64
}

/// Content matches per file, in path order, within `limit` matches and `budget` bytes.
struct ContentSet {
    files: BTreeMap<Vec<u8>, Vec<ContentMatch>>,
    count: usize,
    bytes: u64,
    limit: usize,
    budget: u64,
    truncated: bool,
}

impl ContentSet {
    fn full(&self) -> bool {
        self.count >= self.limit || self.bytes >= self.budget
    }
    fn beyond(&self, key: &[u8]) -> bool {
        self.full()
            && self
                .files
                .last_key_value()
                .is_none_or(|(k, _)| key > k.as_slice())
    }
    fn add(&mut self, key: Vec<u8>, matches: Vec<ContentMatch>, more: bool) {
        self.truncated |= more;
        if matches.is_empty() {
            return;
        }
        self.count += matches.len();
        self.bytes += matches.iter().map(match_cost).sum::<u64>();
        self.files.insert(key, matches);
        while self.count > self.limit || self.bytes > self.budget {
            let Some(mut last) = self.files.last_entry() else {
                break;
            };
            if let Some(m) = last.get_mut().pop() {
                self.count -= 1;
                self.bytes -= match_cost(&m);
                self.truncated = true;
            }
            if last.get().is_empty() {
                last.remove();
            }
        }
    }
}

/// Path matches: in path order (or ranked, fuzzy), within `limit` and `budget`.
struct PathSet {
    by_path: BTreeMap<Vec<u8>, PathMatch>,
    ranked: Vec<(i64, usize, PathMatch)>,
    fuzzy: bool,
    bytes: u64,
    limit: usize,
    budget: u64,
    truncated: bool,
}

fn rank_order(a: &(i64, usize, PathMatch), b: &(i64, usize, PathMatch)) -> std::cmp::Ordering {
    b.0.cmp(&a.0)
        .then(a.1.cmp(&b.1))
        .then(a.2.path.len().cmp(&b.2.path.len()))
        .then(a.2.path.cmp(&b.2.path))
}

impl PathSet {
    fn add(&mut self, score: i64, depth: usize, m: PathMatch) {
        if self.fuzzy {
            self.ranked.push((score, depth, m));
            if self.ranked.len() >= self.limit.saturating_mul(2).max(1024) {
                self.trim_ranked();
            }
            return;
        }
        self.bytes += m.path.len() as u64;
        self.by_path.insert(sort_key(Path::new(&m.path)), m);
        while self.by_path.len() > self.limit || self.bytes > self.budget {
            match self.by_path.pop_last() {
                Some((_, m)) => {
                    self.bytes -= m.path.len() as u64;
                    self.truncated = true;
                }
                None => break,
            }
        }
    }
    fn trim_ranked(&mut self) {
        self.ranked.sort_by(rank_order);
        let mut bytes = 0u64;
        let mut keep = 0;
        for (_, _, m) in &self.ranked {
            if keep >= self.limit || bytes + m.path.len() as u64 > self.budget {
                break;
            }
            bytes += m.path.len() as u64;
            keep += 1;
        }
        if keep < self.ranked.len() {
            self.truncated = true;
            self.ranked.truncate(keep);
        }
    }
    fn into_list(mut self) -> (Vec<PathMatch>, bool) {
        if self.fuzzy {
            self.trim_ranked();
            let t = self.truncated;
            return (self.ranked.into_iter().map(|r| r.2).collect(), t);
        }
        (self.by_path.into_values().collect(), self.truncated)
    }
}

/// Collects one file's matches. Every match gets its own context lines, as the seed
/// describes them (the lines immediately before and after it, in file order), even when
/// matches are near each other: a line can then be context of two matches, and a matched
/// line context of its neighbour. The searcher reports each line once (as a match or as
/// context), so the sink keeps the last `before_n` lines it saw and hands each later line
/// to the matches still waiting for their `after` lines.
struct FileSink<'a> {
    matcher: &'a RegexMatcher,
    path: &'a Path,
    max_line: usize,
    cap: usize,
    before_n: usize,
    after_n: usize,
    /// The last `before_n` lines reported, with their numbers (contiguous: a break clears).
    recent: VecDeque<(u64, String)>,
    /// Matches (index in `out`) still taking `after` lines, up to the line number given.
    pending: Vec<(usize, u64)>,
    out: Vec<ContentMatch>,
    more: bool,
}

impl FileSink<'_> {
    fn new<'a>(
        matcher: &'a RegexMatcher,
        path: &'a Path,
        max_line: usize,
        cap: usize,
        context: (usize, usize),
    ) -> FileSink<'a> {
        FileSink {
            matcher,
            path,
            max_line,
            cap,
            before_n: context.0,
            after_n: context.1,
            recent: VecDeque::new(),
            pending: Vec::new(),
            out: Vec::new(),
            more: false,
        }
    }

    /// Line `no` was reported: it is `after` context of the matches still waiting, and may
    /// be `before` context of the next ones.
    fn saw(&mut self, no: u64, text: String) {
        for &(i, until) in &self.pending {
            if no <= until {
                self.out[i]
                    .after
                    .get_or_insert_with(Vec::new)
                    .push(text.clone());
            }
        }
        self.pending.retain(|&(_, until)| until > no);
        if self.before_n > 0 {
            if self.recent.len() == self.before_n {
                self.recent.pop_front();
            }
            self.recent.push_back((no, text));
        }
    }
}

impl Sink for FileSink<'_> {
    type Error = std::io::Error;

    fn matched(&mut self, _s: &Searcher, m: &SinkMatch<'_>) -> Result<bool, std::io::Error> {
        let line = m.bytes();
        let no = m.line_number().unwrap_or(0);
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        let considered = &body[..body.len().min(self.max_line)];
        let found = self
            .matcher
            .find(considered)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let text = cut(body, self.max_line);
        let Some(found) = found else {
            // The match lies past max_line_bytes: not a match for coder::search, but a line
            // of context for its neighbours.
            self.saw(no, text);
            return Ok(true);
        };
        if self.out.len() >= self.cap {
            self.more = true;
            return Ok(false);
        }
        let first = no.saturating_sub(self.before_n as u64);
        let before: Vec<String> = self
            .recent
            .iter()
            .filter(|(n, _)| *n >= first && *n < no)
            .map(|(_, t)| t.clone())
            .collect();
        self.saw(no, text.clone());
        self.out.push(ContentMatch {
            path: display(self.path),
            line: u32::try_from(no).unwrap_or(u32::MAX),
            column: u32::try_from(found.start() + 1).unwrap_or(u32::MAX),
            text,
            before: (!before.is_empty()).then_some(before),
            after: None,
        });
        if self.after_n > 0 {
            self.pending
                .push((self.out.len() - 1, no + self.after_n as u64));
        }
        Ok(true)
    }

    fn context(&mut self, _s: &Searcher, c: &SinkContext<'_>) -> Result<bool, std::io::Error> {
        if matches!(c.kind(), SinkContextKind::Other) {
            return Ok(true);
        }
        let text = cut(c.bytes(), self.max_line);
        self.saw(c.line_number().unwrap_or(0), text);
        Ok(true)
    }

    fn context_break(&mut self, _s: &Searcher) -> Result<bool, std::io::Error> {
        self.recent.clear();
        self.pending.clear();
        Ok(true)
    }
}

/// Opens a regular file `rel` beneath `root` without following any symlink; with its
/// (device, inode).
fn open_regular(root: &OwnedFd, rel: &Path, max: u64) -> Option<(File, (u64, u64), u64)> {
    let fd = open_beneath(
        Some(root),
        rel,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    )
    .ok()?;
    let st = fstat(&fd).ok()?;
    if !is_file(&st) || st.st_size as u64 > max {
        return None;
    }
    Some((
        File::from(fd),
        (st.st_dev, st.st_ino),
        crate::jail::nlink(&st),
    ))
}

/// Quick-open score of `cand` (a root-relative path) for `query`: `None` when the query's
/// characters do not all appear in order (case-insensitively). Consecutive runs, matches at
/// the start of a path segment or word, and matches in the file name score higher; long
/// paths score a little lower.
pub fn fuzzy_score(query: &str, cand: &str) -> Option<i64> {
    let q: Vec<u8> = query.bytes().map(|b| b.to_ascii_lowercase()).collect();
    fuzzy_score_lower(&q, cand)
}

/// [`fuzzy_score`] with the query already lower-cased (once per search, not per path).
fn fuzzy_score_lower(q: &[u8], cand: &str) -> Option<i64> {
    if q.is_empty() {
        return Some(0);
    }
    let c = cand.as_bytes();
    // Most paths do not hold the query at all: one greedy pass says so.
    let mut qi = 0;
    for &b in c {
        if b.to_ascii_lowercase() == q[qi] {
            qi += 1;
            if qi == q.len() {
                break;
            }
        }
    }
    if qi < q.len() {
        return None;
    }
    // Greedy from every place the first character occurs; the best alignment wins.
    (0..c.len())
        .filter(|&i| c[i].to_ascii_lowercase() == q[0])
        .filter_map(|start| align(q, c, start))
        .max()
        .map(|s| s * 4 - c.len() as i64)
}

fn align(q: &[u8], c: &[u8], start: usize) -> Option<i64> {
    let base_start = c.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let mut score: i64 = 0;
    let mut qi = 0;
    let mut prev: Option<usize> = None;
    for (i, &b) in c.iter().enumerate().skip(start) {
        if qi == q.len() {
            break;
        }
        if b.to_ascii_lowercase() != q[qi] {
            continue;
        }
        score += 10;
        if prev.is_some_and(|p| p + 1 == i) {
            score += 15;
        }
        let boundary = i == 0
            || matches!(c[i - 1], b'/' | b'_' | b'-' | b'.' | b' ')
            || (c[i - 1].is_ascii_lowercase() && b.is_ascii_uppercase());
        if boundary {
            score += 20;
        }
        if i >= base_start {
            score += 5;
        }
        if let Some(p) = prev {
            score -= ((i - p - 1) as i64).min(10);
        }
        prev = Some(i);
        qi += 1;
    }
    (qi == q.len()).then_some(score)
}

/// The ignore rules of a walk under `walk_root`: read beneath the jail root that holds it
/// (unjailed: beneath `/`).
fn ignores_for(ctx: &Ctx<'_>, walk_root: &Path) -> Option<Ignores> {
    let jail = &ctx.policy.jail;
    if !jail.is_jailed() {
        let fd =
            crate::jail::open_beneath(None, Path::new("/"), libc::O_PATH | libc::O_DIRECTORY, 0)
                .ok()?;
        return Some(Ignores::new(PathBuf::from("/"), fd));
    }
    let root = jail
        .roots()
        .iter()
        .filter(|r| walk_root.starts_with(&r.path))
        .max_by_key(|r| r.path.as_os_str().len())?;
    Some(Ignores::new(root.path.clone(), root.fd.try_clone().ok()?))
}

pub fn search(ctx: &Ctx<'_>, req: &SearchInput) -> Result<SearchOutput, CErr> {
    search_with_threads(ctx, req, 0)
}

/// [`search`] with an explicit number of walker threads (0 = the `ignore` default).
pub fn search_with_threads(
    ctx: &Ctx<'_>,
    req: &SearchInput,
    threads: usize,
) -> Result<SearchOutput, CErr> {
    let before = req.context_lines_before.unwrap_or(0);
    let after = req.context_lines_after.unwrap_or(0);
    if before > SEARCH_MAX_CONTEXT_LINES || after > SEARCH_MAX_CONTEXT_LINES {
        return Err(CErr::invalid(format!(
            "context_lines_before/after allow at most {SEARCH_MAX_CONTEXT_LINES} lines (got {before}/{after})"
        )));
    }
    if req.query.is_empty() && req.search_content {
        return Err(CErr::invalid(
            "query is empty: pass a query, or search_content: false to list paths",
        ));
    }
    if !req.search_content && !req.search_paths {
        return Ok(SearchOutput::default());
    }
    let pattern = if req.regex {
        req.query.clone()
    } else {
        regex::escape(&req.query)
    };
    // The caller's pattern is compiled on its own first, so a bad one is reported as the
    // caller wrote it (the content matcher wraps it in a group of its own).
    regex::RegexBuilder::new(&pattern)
        .case_insensitive(req.ignore_case)
        .build()
        .map_err(|e| CErr::invalid(format!("invalid regex: {e}")))?;
    let content = if req.search_content {
        Some(
            RegexMatcherBuilder::new()
                .case_insensitive(req.ignore_case)
                .line_terminator(Some(b'\n'))
                .build(&pattern)
                .map_err(|e| CErr::invalid(format!("invalid regex: {e}")))?,
        )
    } else {
        None
    };
    let path_re = if req.search_paths && !req.fuzzy_paths && !req.query.is_empty() {
        Some(
            regex::RegexBuilder::new(&pattern)
                .case_insensitive(req.ignore_case)
                .build()
                .map_err(|e| CErr::invalid(format!("invalid regex: {e}")))?,
        )
    } else {
        None
    };
    let include = user_globs(&req.include_globs, "include_globs")?;
    let exclude = user_globs(&req.exclude_globs, "exclude_globs")?;
    let limit = req.max_matches.unwrap_or(SEARCH_DEFAULT_MAX_MATCHES) as usize;
    let max_line = req
        .max_line_bytes
        .unwrap_or(SEARCH_DEFAULT_MAX_LINE_BYTES)
        .max(1) as usize;
    let budget = SEARCH_RESPONSE_BUDGET_BYTES;
    let max_read = ctx.max_read();

    let root = ctx.resolve(&req.path, libc::O_RDONLY | libc::O_NONBLOCK)?;
    let root_st = fstat(&root.fd).map_err(|e| CErr::io(format!("stat {}: {e}", req.path)))?;
    let (walk_root, root_fd) = if is_file(&root_st) {
        // A single file: search it (its parent is the walk's anchor).
        let parent = root
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        let pfd = ctx.resolve(&display(&parent), libc::O_PATH | libc::O_DIRECTORY)?;
        (parent, pfd.fd)
    } else {
        (root.path.clone(), root.fd)
    };
    let root_len = walk_root.as_os_str().len()
        + usize::from(!walk_root.as_os_str().as_bytes().ends_with(b"/"));
    let noise = req.use_default_excludes.then(|| ctx.excludes());
    let rules = WalkRules::new(ctx, &walk_root, req.use_default_excludes);
    let query_lower: Vec<u8> = req.query.bytes().map(|b| b.to_ascii_lowercase()).collect();
    let c = &ctx.policy.config;
    let prune = Prune {
        deny: Jail::new(
            &c.fs.host_roots,
            &c.fs.denylist_paths,
            &c.code.non_accessible_globs,
        )
        .ok()
        .map(Arc::new),
        noise: noise.clone(),
        exclude: exclude.clone(),
        root_len,
    };
    let contents = Mutex::new(ContentSet {
        files: BTreeMap::new(),
        count: 0,
        bytes: 0,
        limit,
        budget,
        truncated: false,
    });
    let paths = Mutex::new(PathSet {
        by_path: BTreeMap::new(),
        ranked: Vec::new(),
        fuzzy: req.fuzzy_paths,
        bytes: 0,
        limit,
        budget,
        truncated: false,
    });

    // The walker reads no ignore file itself (it would open whatever a command put there,
    // unbounded and blocking): `respect_gitignore` is decided by `search_ignores`.
    let mut b = WalkBuilder::new(&root.path);
    b.standard_filters(false)
        .hidden(!req.include_hidden)
        .follow_links(false)
        .threads(threads);
    let p2 = prune.clone();
    let ignores = if req.respect_gitignore {
        ignores_for(ctx, &walk_root).map(Arc::new)
    } else {
        None
    };
    b.filter_entry(move |e| {
        if e.depth() == 0 {
            return true;
        }
        let is_dir = e.file_type().is_some_and(|t| t.is_dir());
        if is_dir && p2.prunes_dir(e.path()) {
            return false;
        }
        !ignores
            .as_ref()
            .is_some_and(|i| i.is_ignored(e.path(), is_dir))
    });
    let single_file = is_file(&root_st);
    // The per-file identity check: against the record when it has anything in it, or (until
    // the walk has made it) a hardlink check for files with several links.
    let protected = ctx.policy.jail.has_records() || ctx.policy.jail.protected().is_none();
    b.build_parallel().run(|| {
        let mut searcher: Searcher = SearcherBuilder::new()
            .line_number(true)
            .binary_detection(BinaryDetection::quit(b'\0'))
            .before_context(before as usize)
            .after_context(after as usize)
            .build();
        let (content, path_re, include, exclude, rules, query_lower) = (
            &content,
            &path_re,
            &include,
            &exclude,
            &rules,
            query_lower.as_slice(),
        );
        let (contents, paths, root_fd, policy) = (&contents, &paths, &root_fd, ctx.policy);
        Box::new(move |entry| {
            let Ok(entry) = entry else {
                return WalkState::Continue;
            };
            if entry.depth() == 0 && !single_file {
                return WalkState::Continue;
            }
            let Some(ft) = entry.file_type() else {
                return WalkState::Continue;
            };
            let abs = entry.path();
            let Some(rel) = rel_of(abs, root_len) else {
                return WalkState::Continue;
            };
            let is_dir = ft.is_dir();
            if !is_dir && !ft.is_file() {
                return WalkState::Continue;
            }
            // Folders reaching here passed `Prune` (the same rules); files are checked here,
            // by name against the policy itself, and by identity (a protected inode under
            // another name, see `Jail::is_denied`) where they are used: a path match is
            // checked with an lstat, a content search on the fstat of the opened file. So
            // the walk costs no syscall per entry beyond rg's own.
            if !is_dir && rules.file_denied(abs) {
                return WalkState::Continue;
            }
            if !is_dir
                && (rules.file_excluded(abs)
                    || (!exclude.is_empty() && exclude.is_match(rel))
                    || (!include.is_empty() && !include.is_match(rel)))
            {
                return WalkState::Continue;
            }
            if req.search_paths && (!is_dir || include.is_empty() || include.is_match(rel)) {
                let rel_s = rel.to_string_lossy();
                let subject: &str = if is_dir && !req.fuzzy_paths {
                    abs.file_name().and_then(|n| n.to_str()).unwrap_or(&rel_s)
                } else {
                    &rel_s
                };
                let hit = if req.fuzzy_paths {
                    fuzzy_score_lower(query_lower, subject)
                } else if let Some(re) = path_re {
                    re.is_match(subject).then_some(0)
                } else {
                    Some(0)
                };
                if let Some(score) = hit.filter(|_| !protected || !policy.jail.is_denied(abs)) {
                    let depth = rel.components().count();
                    lock(paths).add(
                        score,
                        depth,
                        PathMatch {
                            path: display(abs),
                            kind: if is_dir {
                                PathMatchKind::Dir
                            } else {
                                PathMatchKind::File
                            },
                        },
                    );
                }
            }
            if is_dir {
                return if rules.content_denied(abs) {
                    WalkState::Skip
                } else {
                    WalkState::Continue
                };
            }
            let Some(matcher) = content else {
                return WalkState::Continue;
            };
            let beyond = {
                let c = lock(contents);
                c.full() && c.beyond(&sort_key(abs))
            };
            let Some((file, id, nlink)) = open_regular(root_fd, rel, max_read) else {
                return WalkState::Continue;
            };
            if protected && policy.jail.inode_is_protected(abs, id, nlink, false) {
                return WalkState::Continue;
            }
            let mut sink = FileSink::new(
                matcher,
                abs,
                max_line,
                if beyond { 0 } else { limit },
                (before as usize, after as usize),
            );
            if searcher.search_file(matcher, &file, &mut sink).is_ok()
                && (sink.more || !sink.out.is_empty())
            {
                let (out, more) = (std::mem::take(&mut sink.out), sink.more);
                lock(contents).add(sort_key(abs), out, more);
            }
            WalkState::Continue
        })
    });
    let contents = contents.into_inner().unwrap_or_else(|p| p.into_inner());
    let (mut path_list, paths_truncated) = paths
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_list();
    let mut truncated = contents.truncated || paths_truncated;
    // One budget for the whole response: content first, then paths with what is left.
    let mut left = budget;
    let mut content_list = Vec::with_capacity(contents.count);
    'outer: for (_, ms) in contents.files {
        for m in ms {
            let cost = match_cost(&m);
            if cost > left {
                truncated = true;
                break 'outer;
            }
            left -= cost;
            content_list.push(m);
        }
    }
    let mut keep = 0;
    for p in &path_list {
        let cost = p.path.len() as u64;
        if cost > left {
            break;
        }
        left -= cost;
        keep += 1;
    }
    if keep < path_list.len() {
        truncated = true;
        path_list.truncate(keep);
    }
    Ok(SearchOutput {
        content_matches: content_list,
        path_matches: path_list,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_user_glob_is_c210_named_as_the_caller_wrote_it() {
        let e =
            user_globs(&["*.rs".into(), "./a[".into()], "include_globs").expect_err("a bad glob");
        assert_eq!(e.code, iii_shell_protocol::Code::C210);
        assert_eq!(
            e.message,
            "include_globs: bad glob \"./a[\": error parsing glob 'a[': unclosed character class; missing ']'"
        );
        let many = vec!["x".to_string(); crate::globs::MAX_CALLER_GLOBS + 1];
        let e = user_globs(&many, "exclude_globs").expect_err("too many");
        assert_eq!(e.code, iii_shell_protocol::Code::C210);
        assert!(
            e.message
                .starts_with("exclude_globs: 1001 globs, at most 1000"),
            "{}",
            e.message
        );
    }

    #[test]
    fn fuzzy_ranks_quick_open_style() {
        assert_eq!(fuzzy_score("xyz", "src/main.rs"), None);
        assert!(fuzzy_score("main", "src/main.rs").is_some());
        let a = fuzzy_score("mr", "src/main.rs").unwrap();
        let b = fuzzy_score("mr", "src/my_very_long_module/thing/array.rs").unwrap();
        assert!(a > b, "{a} {b}");
        // Consecutive and boundary matches beat scattered ones.
        let c = fuzzy_score("conf", "src/config.rs").unwrap();
        let d = fuzzy_score("conf", "src/cold_online_fix.rs").unwrap();
        assert!(c > d, "{c} {d}");
        assert_eq!(fuzzy_score("", "anything"), Some(0));
        assert!(fuzzy_score("MAIN", "src/main.rs").is_some());
    }

    #[test]
    fn split_suffix_keeps_only_folder_globs_aside() {
        let g = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (suffix, rest) = split_suffix(&g(&[
            "**/secrets/**",
            "**/.env",
            "vendor/**",
            "/**",
            "**",
            "**/*.pem",
            "a/**/b",
        ]));
        assert_eq!(suffix, g(&["**/secrets/**", "vendor/**"]));
        assert_eq!(rest, g(&["**/.env", "/**", "**", "**/*.pem", "a/**/b"]));
    }

    /// The cut-down rules answer exactly as the policy does for every entry below the walk
    /// root: a file is refused by `file_denied` or by a folder on its way that is not entered
    /// (`content_denied`) exactly when the policy's jail refuses its name; the same for the
    /// default excludes. Checked for walks at the root, inside a `secrets` folder and below
    /// it, with rooted, `**/` and `G/**` globs and denylist entries inside and outside.
    #[test]
    fn walk_rules_answer_as_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        for d in ["a/secrets/deep", "a/b", "vendor/x", "node_modules/p", "c"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let mut config = iii_shell_protocol::config::Config::default();
        config.fs.host_roots = vec![display(&root)];
        config.fs.allow_unjailed = false;
        config.fs.denylist_paths = vec![display(&root.join("a/b/deny")), "/etc/shadow".into()];
        config.code.non_accessible_globs = vec![
            "**/secrets/**".into(),
            "vendor/**".into(),
            "**/.env".into(),
            "**/*.pem".into(),
            "c/private*".into(),
        ];
        config.code.default_exclude_globs = vec!["**/node_modules/**".into(), "**/*.min.js".into()];
        let policy = crate::FsPolicy::build(config).unwrap();
        let ctx = Ctx::new(&policy, &FsScope::default()).unwrap();
        let noise = ctx.excludes();
        let files = [
            "f.txt",
            ".env",
            "k.pem",
            "a/f.txt",
            "a/secrets/f.txt",
            "a/secrets/deep/f.txt",
            "a/b/deny",
            "a/b/deny/x",
            "a/b/ok.txt",
            "vendor/x/y.rs",
            "vendor/v.rs",
            "node_modules/p/i.js",
            "c/private.txt",
            "c/public.txt",
            "c/app.min.js",
        ];
        for walk in [
            "",
            "a",
            "a/secrets",
            "a/secrets/deep",
            "vendor",
            "node_modules",
            "c",
        ] {
            let w = root.join(walk);
            let rules = WalkRules::new(&ctx, &w, true);
            for f in files.iter().filter(|f| Path::new(f).starts_with(walk)) {
                let abs = root.join(f);
                // The folders on the way from `w` (not `w` itself) to `f`: the walker's
                // prune (unchanged: the policy's name check and the excludes on folders) and
                // the new "listed, not entered" rule.
                let (mut pruned_deny, mut pruned_noise, mut skipped) = (false, false, false);
                let mut d = abs.parent().unwrap().to_path_buf();
                while d != w && d.starts_with(&w) {
                    pruned_deny |= policy.jail.is_denied_by_name(&d);
                    pruned_noise |= noise.is_match_dir(&d);
                    skipped |= rules.content_denied(&d);
                    d = d.parent().unwrap().to_path_buf();
                }
                // Refused by name: the same answer as checking every file against the policy.
                assert_eq!(
                    pruned_deny || skipped || rules.file_denied(&abs),
                    pruned_deny || policy.jail.is_denied_by_name(&abs),
                    "walk {walk:?}, file {f}"
                );
                // Reached and kept: the same as before the rules were cut down.
                let before = !(pruned_deny
                    || pruned_noise
                    || policy.jail.is_denied_by_name(&abs)
                    || noise.is_match(&abs));
                let now = !(pruned_deny
                    || pruned_noise
                    || skipped
                    || rules.file_denied(&abs)
                    || rules.file_excluded(&abs));
                assert_eq!(now, before, "walk {walk:?}, file {f} (kept)");
            }
        }
    }

    #[test]
    fn cut_respects_char_boundaries() {
        assert_eq!(cut(b"abc\r\n", 10), "abc");
        assert_eq!(cut("ééé\n".as_bytes(), 5), "éé");
        assert_eq!(cut(b"abcdef", 3), "abc");
    }
}
