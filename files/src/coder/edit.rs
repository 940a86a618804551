//! `coder::create-file` and `coder::update-file`.
//!
//! Every entry is independent (one failing never aborts the others) and commits atomically
//! through [`commit`] (the executor's one atomic write, `crate::fs::atomic`): a failed entry
//! leaves its file byte-identical.
//!
//! * **create-file**: `expected_revision` is compared with the current bytes under the same
//!   per-path lock as the write, so two concurrent creates carrying the same revision cannot
//!   both succeed (the second sees the first one's bytes). A revision implies the overwrite
//!   intent (`overwrite` may stay false); against a file that no longer exists it fails C221.
//!   Without `overwrite` a new file is renamed in with `RENAME_NOREPLACE`, so a file that
//!   appears meanwhile is never replaced (C213).
//! * **update-file**: line ops all refer to the ORIGINAL line numbers and apply bottom-up
//!   (equivalently: one forward merge over the original lines); then the `replace` ops run in
//!   request order over the whole body. Everything is validated before anything is applied,
//!   and nothing is written unless every op succeeded. The file keeps its owner, group, mode
//!   and ACL as far as the executor may keep them (`crate::fs::keep`), and its form
//!   ([`Form`]): its UTF-8 BOM stays first, untouched lines keep their line ends and new
//!   ones take the dominant end; a file that is not UTF-8 is refused ([`check_text`]).

use std::collections::HashSet;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::sync::Mutex;

use iii_shell_policy::sync::lock;
use iii_shell_protocol::coder::*;
use iii_shell_protocol::Code;
use regex::bytes::{Regex, RegexBuilder};

use super::lines::{count_lines, line_text, split_lines};
use super::paths::{display, revision, CErr, Ctx};
use super::read::open_file;
use super::recorder::ChangeRecorder;
use crate::fs::atomic::TempFile;
use crate::fs::entry::{is_dir, statat};
use crate::fs::keep::{Keep, Replaced};
use crate::fs::sed::{substitute_sites, Overflow};
use crate::jail::{fstat, Parent};

// ---- per-path locks ----

const STRIPES: usize = 64;

/// The per-path locks of coder writers: one value per executor (it holds it; a test makes
/// its own), so two executors in one process do not share them.
pub struct EditLocks([Mutex<()>; STRIPES]);

impl Default for EditLocks {
    fn default() -> Self {
        EditLocks([const { Mutex::new(()) }; STRIPES])
    }
}

impl std::fmt::Debug for EditLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EditLocks")
    }
}

fn stripe(path: &std::path::Path) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    (h.finish() as usize) % STRIPES
}

impl EditLocks {
    /// Serializes coder writers of one canonical path (striped; one stripe held at a time).
    pub fn lock_path(&self, path: &std::path::Path) -> std::sync::MutexGuard<'_, ()> {
        self.0[stripe(path)]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Locks two paths (a move) in stripe order, so two movers cannot deadlock.
    pub fn lock_two(
        &self,
        a: &std::path::Path,
        b: &std::path::Path,
    ) -> (
        std::sync::MutexGuard<'_, ()>,
        Option<std::sync::MutexGuard<'_, ()>>,
    ) {
        let (x, y) = (stripe(a), stripe(b));
        let get = |i: usize| lock(&self.0[i]);
        match x.cmp(&y) {
            std::cmp::Ordering::Equal => (get(x), None),
            std::cmp::Ordering::Less => {
                let g = get(x);
                (g, Some(get(y)))
            }
            std::cmp::Ordering::Greater => {
                let g = get(y);
                (g, Some(get(x)))
            }
        }
    }
}

/// Reads the entry `parent/name` without following it, up to `limit` bytes (`None` when it
/// is larger).
pub fn read_entry(parent: &Parent, limit: u64) -> Result<Option<Vec<u8>>, CErr> {
    let name = parent.c_name();
    // SAFETY: openat on a directory fd we own with a NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            parent.dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(CErr::io(format!("read {}: {e}", parent.path.display())));
    }
    // SAFETY: a new descriptor nothing else owns.
    let f = std::fs::File::from(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    let mut bytes = Vec::new();
    (&f).take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| CErr::io(format!("read {}: {e}", parent.path.display())))?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

// ---- create-file ----

pub fn create_files(
    ctx: &Ctx<'_>,
    req: &CreateFileInput,
    locks: &EditLocks,
    changes: &dyn ChangeRecorder,
) -> CreateFileOutput {
    CreateFileOutput {
        results: req
            .files
            .iter()
            .map(|f| match create_one(ctx, f, locks, changes) {
                Ok((path, bytes_written, rev)) => CreateFileResult {
                    path,
                    success: true,
                    bytes_written,
                    revision: Some(rev),
                    error: None,
                },
                Err((path, e)) => CreateFileResult {
                    path,
                    success: false,
                    bytes_written: 0,
                    revision: None,
                    error: Some(e.entry()),
                },
            })
            .collect(),
    }
}

fn create_one(
    ctx: &Ctx<'_>,
    spec: &CreateFileSpec,
    locks: &EditLocks,
    changes: &dyn ChangeRecorder,
) -> Result<(String, u64, String), (String, CErr)> {
    let input = spec.path.as_str();
    let fail = |e: CErr| (input.to_string(), e);
    let mode =
        iii_shell_protocol::fs::parse_mode(&spec.mode, ctx.policy.config.fs.allow_special_bits)
            .map_err(|m| fail(CErr::invalid(m)))?;
    let data = spec.content.as_bytes();
    if data.len() as u64 > ctx.max_write() {
        return Err(fail(CErr::too_large(format!(
            "content is {} bytes, over max_write_bytes ({}): no file call writes a file that large (shell::fs::write has the same limit); split it into smaller files, write it with a command through shell::exec, or raise fs.max_write_bytes",
            data.len(),
            ctx.max_write()
        ))));
    }
    // An existing leaf symlink is followed through the jail (the write lands on the file it
    // names, inside the policy); a missing path is created where it was named.
    let target = match ctx.resolve(input, libc::O_PATH) {
        Ok(r) => display(&r.path),
        Err(e) if e.code == Code::C211 => input.to_string(),
        Err(e) => return Err(fail(e)),
    };
    let mut parent = ctx.parent(&target, spec.parents).map_err(fail)?;
    let done = create_in(ctx, spec, locks, changes, &parent, mode);
    if done.is_err() {
        // A failed create leaves nothing behind, the folders it made included.
        parent.remove_made();
    }
    done
}

/// [`create_one`] once the parent folder is resolved (and made).
fn create_in(
    ctx: &Ctx<'_>,
    spec: &CreateFileSpec,
    locks: &EditLocks,
    changes: &dyn ChangeRecorder,
    parent: &Parent,
    mode: u32,
) -> Result<(String, u64, String), (String, CErr)> {
    let input = spec.path.as_str();
    let fail = |e: CErr| (input.to_string(), e);
    let data = spec.content.as_bytes();
    let canonical = display(&parent.path);
    let failc = |e: CErr| (canonical.clone(), e);
    let _guard = locks.lock_path(&parent.path);
    let limit = ctx.max_read().max(ctx.max_write());
    let (keep, old, existed) = match statat(&parent.dir, &parent.c_name(), true) {
        Ok(st) if is_dir(&st) => {
            return Err(failc(CErr::invalid(format!(
                "is a directory: {input}; pick a file path inside it"
            ))))
        }
        // A symlink still here did not resolve to a file the policy lets us reach (dangling,
        // or leading to a denied path): it reads like a missing one, and is not replaced.
        Ok(st) if crate::fs::entry::is_symlink(&st) => {
            return Err(fail(CErr::not_found(input)));
        }
        Ok(_) => {
            let current = read_entry(parent, limit).map_err(failc)?;
            if let Some(expected) = &spec.expected_revision {
                let now = current.as_deref().map(revision);
                if now.as_deref() != Some(expected.as_str()) {
                    return Err(failc(CErr::new(
                        Code::C221,
                        format!(
                            "{input} changed since it was read: expected revision {expected}, the file is now {}; nothing was written. Re-read it with coder::read-file and retry with the new revision",
                            now.unwrap_or_else(|| "too large to compare".into())
                        ),
                    )));
                }
            } else if !spec.overwrite {
                return Err(failc(CErr::new(
                    Code::C213,
                    format!("already exists: {input}; pass overwrite=true to replace it"),
                )));
            }
            // The replaced file's owner, group and ACL stay; the mode is the caller's.
            let keep =
                match Replaced::of_entry(parent).map_err(|e| failc(CErr::from_exec(e, input)))? {
                    Some(old) => {
                        let keep = old.keep_with_mode(mode);
                        if let Some(msg) = keep.owner_refusal(&parent.path, old.uid, old.gid) {
                            return Err(failc(CErr::io(msg)));
                        }
                        Some(keep)
                    }
                    None => None,
                };
            (keep, current, true)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            if let Some(expected) = &spec.expected_revision {
                return Err(failc(CErr::new(
                    Code::C221,
                    format!(
                        "{input} no longer exists (expected revision {expected}); nothing was written. Create it without expected_revision, or re-read first"
                    ),
                )));
            }
            (None, Some(Vec::new()), false)
        }
        Err(e) => return Err(failc(CErr::io(format!("stat {input}: {e}")))),
    };
    commit(parent, data, mode, keep, !existed, input).map_err(failc)?;
    let rev = revision(data);
    if let Some(old) = old {
        changes.record(rev.clone(), canonical.clone(), &old, data);
    }
    Ok((canonical, data.len() as u64, rev))
}

// ---- update-file ----

pub fn update_files(
    ctx: &Ctx<'_>,
    specs: &[EditSpec],
    locks: &EditLocks,
    changes: &dyn ChangeRecorder,
) -> UpdateFileOutput {
    UpdateFileOutput {
        results: specs
            .iter()
            .map(|f| match update_one(ctx, f, locks, changes) {
                Ok((path, a)) => UpdateFileResult {
                    path,
                    success: true,
                    applied: u32::try_from(f.ops.len()).unwrap_or(u32::MAX),
                    new_line_count: a.line_count,
                    echoes: a.echoes,
                    echoes_truncated: a.echoes_truncated,
                    error: None,
                },
                Err((path, e)) => UpdateFileResult {
                    path,
                    success: false,
                    applied: 0,
                    new_line_count: 0,
                    echoes: Vec::new(),
                    echoes_truncated: false,
                    error: Some(e.entry()),
                },
            })
            .collect(),
    }
}

fn update_one(
    ctx: &Ctx<'_>,
    spec: &EditSpec,
    locks: &EditLocks,
    changes: &dyn ChangeRecorder,
) -> Result<(String, Applied), (String, CErr)> {
    let input = spec.path.as_str();
    let fail = |e: CErr| (input.to_string(), e);
    if spec.ops.is_empty() {
        return Err(fail(CErr::invalid(format!(
            "{input}: no ops given; pass at least one op"
        ))));
    }
    let canonical = open_file(ctx, input).map_err(fail)?.path;
    let failc = |e: CErr| (canonical.clone(), e);
    let _guard = locks.lock_path(std::path::Path::new(&canonical));
    // Re-open under the lock: a writer that committed meanwhile replaced the inode.
    let mut f = open_file(ctx, &canonical).map_err(failc)?;
    let parent = ctx.parent(&canonical, false).map_err(failc)?;
    let now = statat(&parent.dir, &parent.c_name(), true)
        .map_err(|e| failc(CErr::io(format!("stat {input}: {e}"))))?;
    let st = fstat_file(&f.file).map_err(failc)?;
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
        return Err(failc(CErr::new(
            Code::C221,
            format!("{input} was replaced while it was being edited; nothing was written. Retry the edit"),
        )));
    }
    if st.st_size as u64 > ctx.max_read() {
        return Err(failc(CErr::too_large(format!(
            "{input} is {} bytes, over max_read_bytes ({}): no file call edits it (shell::fs::sed has the same limit); change it with a command through shell::exec (for example sed -i), or raise fs.max_read_bytes",
            st.st_size,
            ctx.max_read()
        ))));
    }
    let mut original = Vec::new();
    (&mut f.file)
        .take(ctx.max_read().saturating_add(1))
        .read_to_end(&mut original)
        .map_err(|e| failc(CErr::io(format!("read {input}: {e}"))))?;
    check_text(input, &original).map_err(failc)?;
    let applied = apply_ops(&original, &spec.ops, ctx.max_write()).map_err(failc)?;
    if applied.body.len() as u64 > ctx.max_write() {
        return Err(failc(CErr::too_large(format!(
            "the edited {input} would be {} bytes, over max_write_bytes ({}); nothing was written",
            applied.body.len(),
            ctx.max_write()
        ))));
    }
    let old = Replaced::of_fd(f.file.as_fd(), &parent.path)
        .map_err(|e| failc(CErr::from_exec(e, input)))?;
    let keep = old.keep(ctx.policy.config.fs.allow_special_bits);
    if let Some(msg) = keep.owner_refusal(&parent.path, old.uid, old.gid) {
        return Err(failc(CErr::io(msg)));
    }
    commit(&parent, &applied.body, keep.mode, Some(keep), false, input).map_err(failc)?;
    changes.record(
        revision(&applied.body),
        canonical.clone(),
        &original,
        &applied.body,
    );
    Ok((canonical, applied))
}

/// Writes `data` to the parent's entry atomically with `mode` and what the replaced file
/// keeps (`keep`). With `no_replace`, the rename refuses an entry that appeared meanwhile
/// (C213). Errors name `input`, the caller's own path.
pub(super) fn commit(
    parent: &Parent,
    data: &[u8],
    mode: u32,
    keep: Option<Keep>,
    no_replace: bool,
    input: &str,
) -> Result<(), CErr> {
    let write = || {
        let mut t = TempFile::create(parent, mode)?.keeping(keep);
        t.write(data)?;
        t.install(no_replace)
    };
    write().map(|_| ()).map_err(|e| match e {
        crate::error::ExecError::Exists(_) => CErr::new(
            Code::C213,
            format!(
                "already exists: {}; pass overwrite=true to replace it",
                parent.path.display()
            ),
        ),
        crate::error::ExecError::WrongType(_) => {
            CErr::invalid(format!("is a directory: {}", parent.path.display()))
        }
        other => CErr::from_exec(other, input),
    })
}

fn fstat_file(f: &std::fs::File) -> Result<libc::stat, CErr> {
    let fd = f.try_clone().map_err(|e| CErr::io(format!("dup: {e}")))?;
    let owned: std::os::fd::OwnedFd = fd.into();
    fstat(&owned).map_err(|e| CErr::io(format!("stat: {e}")))
}

// ---- the edit engine (pure) ----

/// The outcome of applying a file's ops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub body: Vec<u8>,
    pub echoes: Vec<OpEcho>,
    pub echoes_truncated: bool,
    pub line_count: u64,
}

struct Replace {
    idx: usize,
    re: Regex,
    replacement: Vec<u8>,
    pattern: String,
    expect: Option<u64>,
}

/// Checks `$` references in a replacement against the regex's groups (C210 on an unknown
/// one; the regex crate would silently expand it to nothing).
pub fn check_replacement(rep: &str, re: &Regex) -> Result<(), String> {
    let names: HashSet<&str> = re.capture_names().flatten().collect();
    let groups = re.captures_len();
    let check = |name: &str| -> Result<(), String> {
        let ok = match name.parse::<usize>() {
            Ok(n) => n < groups,
            Err(_) => names.contains(name),
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "replacement refers to ${{{name}}}, which the pattern does not define (groups 0..{}{}); write $$ for a literal $",
                groups.saturating_sub(1),
                if names.is_empty() {
                    String::new()
                } else {
                    format!(", names {:?}", {
                        let mut v: Vec<&&str> = names.iter().collect();
                        v.sort();
                        v
                    })
                }
            ))
        }
    };
    let b = rep.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'$' {
            i += 1;
            continue;
        }
        match b.get(i + 1) {
            Some(b'$') => i += 2,
            Some(b'{') => match b[i + 2..].iter().position(|&c| c == b'}') {
                Some(off) => {
                    check(&rep[i + 2..i + 2 + off])?;
                    i += off + 3;
                }
                None => i += 1,
            },
            _ => {
                let mut j = i + 1;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                    j += 1;
                }
                if j > i + 1 {
                    check(&rep[i + 1..j])?;
                }
                i = j.max(i + 1);
            }
        }
    }
    Ok(())
}

/// Lines of inserted or replacing content: split, each ending in the file's line end `eol`
/// (whatever end the caller wrote, `\n` or `\r\n`, or none on the last line).
fn content_lines(content: &str, eol: &[u8]) -> Vec<Vec<u8>> {
    split_lines(content.as_bytes())
        .into_iter()
        .map(|l| {
            let mut v = strip_eol(l).to_vec();
            v.extend_from_slice(eol);
            v
        })
        .collect()
}

/// A line without its `\n` or `\r\n`.
fn strip_eol(line: &[u8]) -> &[u8] {
    match line.strip_suffix(b"\n") {
        Some(l) => l.strip_suffix(b"\r").unwrap_or(l),
        None => line,
    }
}

/// The UTF-8 byte order mark, which stays first in an edited file.
pub const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The form of a text file that an edit keeps: its BOM and its dominant line end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Form {
    /// The file starts with a UTF-8 BOM.
    pub bom: bool,
    /// The line end new lines take: `\r\n` when more lines end in it than in a bare `\n`.
    pub eol: &'static [u8],
    /// Some line ends in `\r\n` (patterns then treat `\r` as a line end too).
    pub has_crlf: bool,
}

impl Form {
    /// The form of `text` (the file without its BOM) and whether it had a BOM.
    pub fn of(bom: bool, text: &[u8]) -> Form {
        let lf = memchr::memchr_iter(b'\n', text).count();
        let crlf = memchr::memmem::find_iter(text, b"\r\n").count();
        Form {
            bom,
            eol: if crlf > lf - crlf { b"\r\n" } else { b"\n" },
            has_crlf: crlf > 0,
        }
    }

    /// `replacement` with each of its line ends (`\n` or `\r\n`) written as the file's.
    fn line_ends(&self, replacement: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(replacement.len());
        for l in replacement.split_inclusive(|&b| b == b'\n') {
            if l.ends_with(b"\n") {
                out.extend_from_slice(strip_eol(l));
                out.extend_from_slice(self.eol);
            } else {
                out.extend_from_slice(l);
            }
        }
        out
    }
}

/// Splits a leading UTF-8 BOM off `bytes`.
pub fn split_bom(bytes: &[u8]) -> (bool, &[u8]) {
    match bytes.strip_prefix(BOM) {
        Some(rest) => (true, rest),
        None => (false, bytes),
    }
}

/// `update-file` edits UTF-8 text only: any other file is refused (C210) rather than
/// re-encoded, with the byte offset of the first byte that is not UTF-8.
pub fn check_text(input: &str, bytes: &[u8]) -> Result<(), CErr> {
    match std::str::from_utf8(bytes) {
        Ok(_) => Ok(()),
        Err(e) => Err(CErr::invalid(format!(
            "{input} is not UTF-8 text (byte {} is not valid UTF-8): coder::update-file edits UTF-8 text only, and nothing was written; replace bytes in it with shell::fs::sed, which leaves every other byte as it is",
            e.valid_up_to()
        ))),
    }
}

/// Applies `ops` to `original` (see the module doc). Errors are C210 and name the op; a
/// result that would pass `budget` bytes (`fs.max_write_bytes`) is C218, found while it is
/// built: no op ever holds more than `budget` bytes of result (plus one replacement's text).
pub fn apply_ops(original: &[u8], ops: &[EditOp], budget: u64) -> Result<Applied, CErr> {
    let (bom, text) = split_bom(original);
    let form = Form::of(bom, text);
    let cap = usize::try_from(budget).unwrap_or(usize::MAX);
    // The BOM stays first, so the text has the rest of the budget.
    let bom_len = if bom { BOM.len() } else { 0 };
    let budget = cap.saturating_sub(bom_len);
    let lines = split_lines(text);
    let n = lines.len() as u64;
    // Validate everything first.
    let mut inserts: Vec<(u64, usize, &str)> = Vec::new();
    let mut ranges: Vec<(u64, u64, usize, Option<&str>)> = Vec::new();
    let mut replaces: Vec<Replace> = Vec::new();
    for (idx, op) in ops.iter().enumerate() {
        match op {
            EditOp::Insert { at_line, content } => {
                let at = u64::from(*at_line);
                if at == 0 || at > n + 1 {
                    return Err(CErr::invalid(format!(
                        "op {idx} (insert): at_line {at} is out of range: the file has {n} lines, so at_line must be 1..={} ({} appends); nothing was written",
                        n + 1,
                        n + 1
                    )));
                }
                inserts.push((at, idx, content));
            }
            EditOp::Remove { from_line, to_line }
            | EditOp::UpdateLines {
                from_line, to_line, ..
            } => {
                let (f, t) = (u64::from(*from_line), u64::from(*to_line));
                let name = if matches!(op, EditOp::Remove { .. }) {
                    "remove"
                } else {
                    "update_lines"
                };
                if f == 0 || t == 0 || f > t || t > n {
                    return Err(CErr::invalid(format!(
                        "op {idx} ({name}): lines {f}..={t} are out of range: the file has {n} lines (1-based, inclusive, from_line <= to_line); nothing was written"
                    )));
                }
                let content = match op {
                    EditOp::UpdateLines { content, .. } => Some(content.as_str()),
                    _ => None,
                };
                ranges.push((f, t, idx, content));
            }
            EditOp::Replace {
                pattern,
                replacement,
                ignore_case,
                dot_matches_newline,
                expect_matches,
            } => {
                if pattern.is_empty() {
                    return Err(CErr::invalid(format!(
                        "op {idx} (replace): pattern is empty"
                    )));
                }
                let re = RegexBuilder::new(pattern)
                    .case_insensitive(*ignore_case)
                    .dot_matches_new_line(*dot_matches_newline)
                    .crlf(form.has_crlf)
                    .size_limit(1 << 23)
                    .build()
                    .map_err(|e| {
                        CErr::invalid(format!("op {idx} (replace): invalid regex: {e}"))
                    })?;
                check_replacement(replacement, &re)
                    .map_err(|e| CErr::invalid(format!("op {idx} (replace): {e}")))?;
                replaces.push(Replace {
                    idx,
                    re,
                    replacement: form.line_ends(replacement.as_bytes()),
                    pattern: pattern.clone(),
                    expect: *expect_matches,
                });
            }
        }
    }
    ranges.sort_by_key(|r| (r.0, r.2));
    for w in ranges.windows(2) {
        if w[1].0 <= w[0].1 {
            return Err(CErr::invalid(format!(
                "ops {} and {} overlap (lines {}..={} and {}..={} of the original): merge them into one op; nothing was written",
                w[0].2, w[1].2, w[0].0, w[0].1, w[1].0, w[1].1
            )));
        }
    }
    for (at, idx, _) in &inserts {
        if let Some(r) = ranges.iter().find(|r| r.0 < *at && *at <= r.1) {
            return Err(CErr::invalid(format!(
                "op {idx} (insert at line {at}) falls inside op {} (lines {}..={}): insert before line {} or after line {} instead; nothing was written",
                r.2, r.0, r.1, r.0, r.1
            )));
        }
    }
    inserts.sort_by_key(|i| (i.0, i.1));

    // Line ops: one forward merge over the original lines.
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(lines.len() + inserts.len());
    let mut regions: Vec<(usize, usize, usize)> = Vec::new(); // (op, start, end) in `out`
    let (mut ii, mut ri) = (0usize, 0usize);
    let mut line: u64 = 1;
    loop {
        while ii < inserts.len() && inserts[ii].0 == line {
            let start = out.len();
            out.extend(content_lines(inserts[ii].2, form.eol));
            regions.push((inserts[ii].1, start, out.len()));
            ii += 1;
        }
        if line > n {
            break;
        }
        if ri < ranges.len() && ranges[ri].0 == line {
            let (_, t, idx, content) = ranges[ri];
            let start = out.len();
            if let Some(c) = content {
                out.extend(content_lines(c, form.eol));
            }
            regions.push((idx, start, out.len()));
            ri += 1;
            line = t + 1;
            continue;
        }
        out.push(lines[(line - 1) as usize].to_vec());
        line += 1;
    }
    // A line that lost its place at the end (the original unterminated last line, now
    // followed by something) gets its terminator.
    let last = out.len().saturating_sub(1);
    for (i, l) in out.iter_mut().enumerate() {
        if i < last && !l.ends_with(b"\n") {
            l.extend_from_slice(form.eol);
        }
    }
    let mut echoes = Echoes::default();
    regions.sort_by_key(|r| r.0);
    for (idx, start, end) in regions {
        echoes.line_op(idx, &out, start, end);
    }
    let size: usize = out.iter().map(Vec::len).sum();
    if size > budget {
        return Err(over_budget("the line ops", Some(size + bom_len), cap));
    }
    let mut body: Vec<u8> = out.concat();
    drop(out);

    // Replace ops, in request order, over the whole body, each result built within budget.
    for r in replaces {
        let mut sites: Vec<(usize, usize)> = Vec::new();
        let (next, count) =
            substitute_sites(&r.re, &body, 0, &r.replacement, true, budget, |s, e| {
                if sites.len() < ECHO_MAX_REPLACE_SITES {
                    sites.push((s, e));
                }
            })
            .map_err(|o| match o {
                Overflow::Budget => over_budget(&format!("op {} (replace)", r.idx), None, cap),
                Overflow::Memory => CErr::too_large(format!(
                    "op {} (replace): the result does not fit in memory; nothing was written (set fs.max_write_bytes to bound it)",
                    r.idx
                )),
            })?;
        if let Some(e) = r.expect {
            if e != count {
                return Err(CErr::invalid(format!(
                    "op {} (replace): expected {e} matches of {:?}, found {count}; nothing was written",
                    r.idx, r.pattern
                )));
            }
        }
        if count == 0 {
            continue;
        }
        body = next;
        echoes.replace_sites(r.idx, &body, &sites, count);
    }
    if bom {
        body.splice(0..0, BOM.iter().copied());
    }
    Ok(Applied {
        line_count: count_lines(&body),
        body,
        echoes: echoes.list,
        echoes_truncated: echoes.truncated,
    })
}

/// C218 for a result that would pass `fs.max_write_bytes` (`budget`) while `what` built it
/// (`size`: the result's size when it is known).
fn over_budget(what: &str, size: Option<usize>, budget: usize) -> CErr {
    let size = size.map(|s| format!(" {s} bytes,")).unwrap_or_default();
    CErr::too_large(format!(
        "{what}: the edited file would be{size} over max_write_bytes ({budget}); nothing was written"
    ))
}

/// Echoes under the shared byte budget.
#[derive(Default)]
struct Echoes {
    list: Vec<OpEcho>,
    bytes: usize,
    truncated: bool,
}

impl Echoes {
    fn push(&mut self, e: OpEcho) {
        if self.truncated {
            return;
        }
        let cost: usize = e.lines.iter().map(|l| l.len() + 1).sum();
        if self.bytes + cost > ECHO_BUDGET_BYTES {
            self.truncated = true;
            return;
        }
        self.bytes += cost;
        self.list.push(e);
    }

    /// The region `start..end` of `out` (post-apply lines) with ±2 lines of context; the
    /// middle is elided beyond [`ECHO_MAX_LINES`].
    fn line_op(&mut self, idx: usize, out: &[Vec<u8>], start: usize, end: usize) {
        let from = start.saturating_sub(ECHO_CONTEXT_LINES);
        let to = (end + ECHO_CONTEXT_LINES).min(out.len());
        let all: Vec<String> = out[from..to].iter().map(|l| line_text(l)).collect();
        let (lines, elided) = if all.len() > ECHO_MAX_LINES {
            let head = ECHO_MAX_LINES / 2;
            let tail = ECHO_MAX_LINES - head;
            let mut v = all[..head].to_vec();
            v.extend_from_slice(&all[all.len() - tail..]);
            (v, Some((all.len() - ECHO_MAX_LINES) as u64))
        } else {
            (all, None)
        };
        self.push(OpEcho {
            op_index: idx as u32,
            from_line: from as u64 + 1,
            lines,
            elided,
            total_replacements: None,
        });
    }

    /// One echo per match site (its first and last post-replace line, no context).
    fn replace_sites(&mut self, idx: usize, body: &[u8], sites: &[(usize, usize)], total: u64) {
        let starts = line_starts(body);
        let line_of = |off: usize| match starts.binary_search(&off) {
            Ok(i) => i,
            Err(i) => i.saturating_sub(1),
        };
        let text = |i: usize| {
            let s = starts[i];
            let e = starts.get(i + 1).copied().unwrap_or(body.len());
            line_text(&body[s..e])
        };
        for &(s, e) in sites {
            let first = line_of(s);
            let last = if e > s { line_of(e - 1) } else { first };
            let (lines, elided) = if first == last {
                (vec![text(first)], None)
            } else {
                let span = last - first + 1;
                (
                    vec![text(first), text(last)],
                    (span > 2).then(|| (span - 2) as u64),
                )
            };
            self.push(OpEcho {
                op_index: idx as u32,
                from_line: first as u64 + 1,
                lines,
                elided,
                total_replacements: Some(total),
            });
        }
    }
}

/// Byte offsets where each line of `body` starts (at least one entry).
fn line_starts(body: &[u8]) -> Vec<usize> {
    let mut v = vec![0];
    for (i, &b) in body.iter().enumerate() {
        if b == b'\n' && i + 1 < body.len() {
            v.push(i + 1);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ins(at: u32, c: &str) -> EditOp {
        EditOp::Insert {
            at_line: at,
            content: c.into(),
        }
    }
    fn rm(f: u32, t: u32) -> EditOp {
        EditOp::Remove {
            from_line: f,
            to_line: t,
        }
    }
    fn upd(f: u32, t: u32, c: &str) -> EditOp {
        EditOp::UpdateLines {
            from_line: f,
            to_line: t,
            content: c.into(),
        }
    }
    fn rep(p: &str, r: &str, expect: Option<u64>, dot: bool) -> EditOp {
        EditOp::Replace {
            pattern: p.into(),
            replacement: r.into(),
            ignore_case: false,
            dot_matches_newline: dot,
            expect_matches: expect,
        }
    }
    fn apply(src: &[u8], ops: &[EditOp]) -> Result<Applied, CErr> {
        apply_ops(src, ops, u64::MAX)
    }

    /// A result past the budget is C218 naming the op (the memory bound itself is proven
    /// through the real executor, under an address-space limit, in the system suite).
    #[test]
    fn a_result_past_the_budget_is_c218() {
        let e = apply_ops(
            &[b'a'; 2000],
            &[rep("a", &"R".repeat(600), None, false)],
            100_000,
        )
        .unwrap_err();
        assert_eq!(e.code, Code::C218, "{e}");
        assert_eq!(
            e.message,
            "op 0 (replace): the edited file would be over max_write_bytes (100000); nothing was written"
        );
        let e = apply_ops(b"x\n", &[ins(1, &"y".repeat(100))], 50).unwrap_err();
        assert_eq!(e.code, Code::C218, "{e}");
        assert_eq!(
            e.message,
            "the line ops: the edited file would be 103 bytes, over max_write_bytes (50); nothing was written"
        );
        let a = apply_ops(b"ab\n", &[rep("b", "[$0$$]", None, false)], 7).unwrap();
        assert_eq!(body(&a), "a[b$]\n");
    }

    fn body(a: &Applied) -> &str {
        std::str::from_utf8(&a.body).unwrap()
    }

    #[test]
    fn line_ops_use_original_numbers() {
        let src = b"1\n2\n3\n4\n5\n";
        let a = apply(
            src,
            &[
                ins(1, "top"),
                rm(2, 3),
                upd(5, 5, "five\nFIVE"),
                ins(6, "end\n"),
            ],
        )
        .unwrap();
        assert_eq!(body(&a), "top\n1\n4\nfive\nFIVE\nend\n");
        assert_eq!(a.line_count, 6);
        // Same result whatever the request order.
        let b = apply(
            src,
            &[
                ins(6, "end\n"),
                upd(5, 5, "five\nFIVE"),
                rm(2, 3),
                ins(1, "top"),
            ],
        )
        .unwrap();
        assert_eq!(a.body, b.body);
        // Insert before a replaced range's first line lands before the new content.
        let c = apply(src, &[upd(2, 2, "two"), ins(2, "before")]).unwrap();
        assert_eq!(body(&c), "1\nbefore\ntwo\n3\n4\n5\n");
        // Appending to a file without a final newline.
        let d = apply(b"a", &[ins(2, "b")]).unwrap();
        assert_eq!(body(&d), "a\nb\n");
        let e = apply(b"", &[ins(1, "x")]).unwrap();
        assert_eq!(body(&e), "x\n");
    }

    /// Line ops and replace ops keep the file's line ends: untouched lines as they were, new
    /// lines with the dominant end (CRLF here), whatever end the caller wrote.
    #[test]
    fn edits_keep_the_line_ends() {
        let src = b"a\r\nb\r\nc\r\nd\n";
        let a = apply(src, &[upd(2, 2, "B")]).unwrap();
        assert_eq!(a.body, b"a\r\nB\r\nc\r\nd\n");
        let a = apply(src, &[ins(5, "e\nf\r\ng")]).unwrap();
        assert_eq!(a.body, b"a\r\nb\r\nc\r\nd\ne\r\nf\r\ng\r\n");
        // The unterminated last line that gets followed takes the file's end.
        let a = apply(b"x\r\ny", &[ins(3, "z")]).unwrap();
        assert_eq!(a.body, b"x\r\ny\r\nz\r\n");
        // A replacement's line ends become the file's; `.` stops before the `\r`.
        let a = apply(src, &[rep("b.*", "b1\nb2", None, false)]).unwrap();
        assert_eq!(a.body, b"a\r\nb1\r\nb2\r\nc\r\nd\n");
        // An LF file stays LF, even when the caller writes CRLF.
        let a = apply(b"a\nb\n", &[upd(1, 1, "A\r\nA2\r\n")]).unwrap();
        assert_eq!(a.body, b"A\nA2\nb\n");
        // A tie (one of each) is LF.
        assert_eq!(Form::of(false, b"a\r\nb\n").eol, b"\n");
        assert_eq!(Form::of(false, b"a\r\nb\r\nc\n").eol, b"\r\n");
    }

    /// A UTF-8 BOM stays first: an insert at line 1 goes after it, `^` matches after it.
    #[test]
    fn the_bom_stays_first() {
        let src = b"\xEF\xBB\xBFa\nb\n";
        let a = apply(src, &[ins(1, "top")]).unwrap();
        assert_eq!(a.body, b"\xEF\xBB\xBFtop\na\nb\n");
        let a = apply(src, &[upd(1, 1, "A")]).unwrap();
        assert_eq!(a.body, b"\xEF\xBB\xBFA\nb\n");
        assert_eq!(a.echoes[0].lines, vec!["A", "b"]);
        let a = apply(src, &[rep("^a", "Z", Some(1), false)]).unwrap();
        assert_eq!(a.body, b"\xEF\xBB\xBFZ\nb\n");
        let a = apply(src, &[rm(1, 2)]).unwrap();
        assert_eq!(a.body, b"\xEF\xBB\xBF");
        // The budget counts the BOM, and the message says the real sizes.
        let e = apply_ops(src, &[ins(1, "xyz")], 10).unwrap_err();
        assert_eq!(
            e.message,
            "the line ops: the edited file would be 11 bytes, over max_write_bytes (10); nothing was written"
        );
    }

    /// A file that is not UTF-8 is refused, never re-encoded.
    #[test]
    fn non_utf8_is_refused() {
        assert!(check_text("f", b"\xEF\xBB\xBFok\n").is_ok());
        let e = check_text("/r/latin1.txt", b"caf\xe9\n").unwrap_err();
        assert_eq!(e.code, Code::C210);
        assert_eq!(
            e.message,
            "/r/latin1.txt is not UTF-8 text (byte 3 is not valid UTF-8): coder::update-file edits UTF-8 text only, and nothing was written; replace bytes in it with shell::fs::sed, which leaves every other byte as it is"
        );
    }

    #[test]
    fn bad_line_ops_are_c210() {
        let src = b"1\n2\n3\n";
        for ops in [
            vec![ins(0, "x")],
            vec![ins(5, "x")],
            vec![rm(0, 1)],
            vec![rm(2, 1)],
            vec![rm(3, 4)],
            vec![rm(1, 2), upd(2, 3, "x")],
            vec![rm(1, 3), ins(2, "x")],
            vec![rep("(", "x", None, false)],
            vec![rep("a", "$2", None, false)],
            vec![rep("(?P<n>a)", "$m", None, false)],
            vec![rep("a", "x", Some(1), false)],
        ] {
            let e = apply(src, &ops).unwrap_err();
            assert_eq!(e.code, Code::C210, "{ops:?}");
            assert!(e.message.contains("op"), "{}", e.message);
        }
    }

    #[test]
    fn replace_ops_and_syntax() {
        let src = b"let a = 1;\nlet b = 2;\n// BEGIN\nx\ny\n// END\n";
        let a = apply(
            src,
            &[
                rep(
                    r"let (?P<v>\w) = (\d)",
                    "const ${v}: i32 = $2",
                    Some(2),
                    false,
                ),
                rep("// BEGIN.*?// END", "// gone", Some(1), true),
                rep("zzz", "q", Some(0), false),
                rep(r"\$", "$$", None, false),
            ],
        )
        .unwrap();
        assert_eq!(body(&a), "const a: i32 = 1;\nconst b: i32 = 2;\n// gone\n");
        type Echo = (u32, u64, Vec<String>, Option<u64>, Option<u64>);
        let ech: Vec<Echo> = a
            .echoes
            .iter()
            .map(|e| {
                (
                    e.op_index,
                    e.from_line,
                    e.lines.clone(),
                    e.elided,
                    e.total_replacements,
                )
            })
            .collect();
        assert_eq!(
            ech,
            vec![
                (0, 1, vec!["const a: i32 = 1;".to_string()], None, Some(2)),
                (0, 2, vec!["const b: i32 = 2;".to_string()], None, Some(2)),
                (1, 3, vec!["// gone".to_string()], None, Some(1)),
            ]
        );
        // Without dot_matches_newline a multi-line pattern matches nothing.
        let e = apply(src, &[rep("BEGIN.*END", "", Some(1), false)]).unwrap_err();
        assert!(e.message.contains("found 0"), "{}", e.message);
        // A multi-line replacement echoes first and last line, inner lines elided.
        let a = apply(b"x\n", &[rep("x", "a\nb\nc\nd", None, false)]).unwrap();
        assert_eq!(a.echoes[0].lines, vec!["a", "d"]);
        assert_eq!(a.echoes[0].elided, Some(2));
        // `$0` and `$$`.
        let a = apply(b"ab\n", &[rep("b", "[$0$$]", None, false)]).unwrap();
        assert_eq!(body(&a), "a[b$]\n");
    }

    #[test]
    fn echo_context_elision_and_budget() {
        let src: String = (1..=40).map(|i| format!("l{i}\n")).collect();
        let a = apply(src.as_bytes(), &[upd(10, 10, "X")]).unwrap();
        assert_eq!(a.echoes[0].from_line, 8);
        assert_eq!(a.echoes[0].lines, vec!["l8", "l9", "X", "l11", "l12"]);
        let big: String = (1..=30).map(|i| format!("n{i}\n")).collect();
        let a = apply(src.as_bytes(), &[upd(5, 5, &big)]).unwrap();
        assert_eq!(a.echoes[0].lines.len(), ECHO_MAX_LINES);
        assert_eq!(a.echoes[0].elided, Some((30 + 4 - ECHO_MAX_LINES) as u64));
        // The budget: many long echoes.
        let long = "y".repeat(1000);
        let ops: Vec<EditOp> = (1..=8).map(|i| upd(i * 4, i * 4, &long)).collect();
        let a = apply(src.as_bytes(), &ops).unwrap();
        assert!(a.echoes_truncated);
        let total: usize = a
            .echoes
            .iter()
            .flat_map(|e| &e.lines)
            .map(|l| l.len() + 1)
            .sum();
        assert!(total <= ECHO_BUDGET_BYTES);
        assert!(!a.echoes.is_empty());
    }
}
