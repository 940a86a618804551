//! `shell::fs::sed`: find-and-replace over a list of files or a directory tree.
//!
//! Semantics:
//! * Exactly one of `files` (non-empty) and `path` is given; both or neither is S210. An empty
//!   pattern is S210, a regex that does not compile S217 (for the whole call).
//! * `regex: true`: `pattern` is a Rust regex over the file's bytes (non-UTF-8 files work),
//!   with multi-line anchors (`^`/`$` match at every line, and `$` also before `\r\n`), and
//!   `$1` / `${name}` in `replacement` expand to groups. `regex: false`: both `pattern` and
//!   `replacement` are literal. `first_only` replaces the first match of each file only.
//! * A file with a match is rewritten atomically (temp file + rename in its directory)
//!   keeping its owner, group, mode and ACL where it can (`super::keep`); every other byte, CRLF and invalid UTF-8 included, is
//!   unchanged. A file without a match is not touched (its mtime stays).
//! * `files` form: each entry is resolved through the jail (a symlink inside the jail is
//!   followed, and the file it names is edited) and has one result, in the order given:
//!   `success: true` with its count (0 when nothing matched), or `success: false` with the
//!   error (missing and denied read the same, S211 wording; outside the jail S215; not a
//!   regular file; over `fs.max_read_bytes`; result over `fs.max_write_bytes`). `path` is the
//!   canonical path when the entry resolved, else the entry as given. `recursive` and the
//!   globs do not apply.
//! * `path` form: the tree is walked exactly like `shell::fs::grep` walks it (same globs,
//!   `recursive`, no symlinks, denied entries skipped silently; a root that is a single file
//!   is a one-file tree). Binary files (a NUL byte) and files over `fs.max_read_bytes` are
//!   skipped. **Only files with at least one match are listed** (sorted by path), so a sweep
//!   over a large tree returns the edited files, not every file it read; a matched file
//!   whose rewrite failed is listed with `success: false`. A root that is missing, denied or
//!   outside the jail fails the whole call (S211 / S215).
//! * `fs.max_write_bytes` (0 = unlimited): a file whose result would exceed it fails with an
//!   S218-style message and is left untouched. The result is built against the cap (see
//!   `substitute`), so it is never allocated past it; with no cap, a refused allocation fails
//!   the file the same way instead of aborting the executor.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use iii_shell_protocol::fs::{FsSedFileResult, SedResponse, SedSpec};
use regex::bytes::{Regex, RegexBuilder};

use crate::error::ExecError;
use crate::fs::atomic::write_atomic;
use crate::fs::grep::{open_regular, open_root, walk, Filters, Root};
use crate::fs::keep::Replaced;
use crate::jail::{fstat, map_errno, open_beneath, Parent};
use crate::FsPolicy;

/// Find-and-replace across `spec.files` or the tree under `spec.path` (see the module docs).
pub fn sed(policy: &FsPolicy, spec: &SedSpec) -> Result<SedResponse, ExecError> {
    if spec.pattern.is_empty() {
        return Err(ExecError::Invalid("pattern is empty".into()));
    }
    match (spec.files.is_empty(), &spec.path) {
        (false, Some(_)) => {
            return Err(ExecError::Invalid(
                "give either `files` or `path`, not both".into(),
            ));
        }
        (true, None) => {
            return Err(ExecError::Invalid(
                "give either `files` (a non-empty list) or `path`".into(),
            ));
        }
        _ => {}
    }
    let pattern = if spec.regex {
        spec.pattern.clone()
    } else {
        regex::escape(&spec.pattern)
    };
    let re = RegexBuilder::new(&pattern)
        .case_insensitive(spec.ignore_case)
        .multi_line(true)
        .crlf(true)
        .build()
        .map_err(|e| ExecError::BadRegex(format!("invalid regex: {e}")))?;
    let edit = Edit {
        re,
        replacement: spec.replacement.as_bytes(),
        expand: spec.regex,
        limit: usize::from(spec.first_only),
        max_read: policy.config.fs.max_read_bytes,
        max_write: policy.config.fs.max_write_bytes,
        allow_special_bits: policy.config.fs.allow_special_bits,
    };

    let results = match &spec.path {
        None => spec
            .files
            .iter()
            .map(|f| edit_listed(policy, &edit, f))
            .collect(),
        Some(path) => edit_tree(policy, &edit, spec, path)?,
    };
    let total_replacements = results.iter().map(|r| r.replacements).sum();
    Ok(SedResponse {
        results,
        total_replacements,
    })
}

/// One compiled substitution and the size caps.
struct Edit<'a> {
    re: Regex,
    replacement: &'a [u8],
    expand: bool,
    /// 0 = every match, 1 = first only.
    limit: usize,
    max_read: u64,
    max_write: u64,
    allow_special_bits: bool,
}

/// Why a substitution stopped before its end.
#[derive(Debug, PartialEq)]
pub(crate) enum Overflow {
    /// The result would pass the budget (`fs.max_write_bytes`).
    Budget,
    /// The allocator refused the memory (only reachable with no budget: 0 = unlimited).
    Memory,
}

/// Appends `bytes` to `out` unless that passes `budget`; never aborts on allocation failure.
fn push(out: &mut Vec<u8>, bytes: &[u8], budget: usize) -> Result<(), Overflow> {
    if out.len().saturating_add(bytes.len()) > budget {
        return Err(Overflow::Budget);
    }
    out.try_reserve(bytes.len()).map_err(|_| Overflow::Memory)?;
    out.extend_from_slice(bytes);
    Ok(())
}

/// `re.replacen(data, limit, replacement)`, with `$1` / `${name}` expanded when `expand`,
/// but building the result within `budget` bytes: it stops (and returns the overflow) as
/// soon as the next piece would pass it, so no input can make it allocate past the budget
/// (plus one replacement's literal text). Returns the result and the number of replacements.
fn substitute(
    re: &Regex,
    data: &[u8],
    limit: usize,
    replacement: &[u8],
    expand: bool,
    budget: usize,
) -> Result<(Vec<u8>, u64), Overflow> {
    substitute_sites(re, data, limit, replacement, expand, budget, |_, _| {})
}

/// [`substitute`], telling `site` where each replacement landed in the result (start and
/// end offsets), in order.
pub(crate) fn substitute_sites(
    re: &Regex,
    data: &[u8],
    limit: usize,
    replacement: &[u8],
    expand: bool,
    budget: usize,
    mut site: impl FnMut(usize, usize),
) -> Result<(Vec<u8>, u64), Overflow> {
    let mut out = Vec::new();
    let mut count = 0u64;
    let mut last = 0;
    let mut scratch = Vec::new();
    for caps in re.captures_iter(data) {
        if limit > 0 && count as usize >= limit {
            break;
        }
        let Some(m) = caps.get(0) else { continue };
        push(&mut out, &data[last..m.start()], budget)?;
        let start = out.len();
        if expand {
            let room = budget.saturating_sub(out.len());
            let mut over = false;
            scratch.clear();
            regex_automata::util::interpolate::bytes(
                replacement,
                |i, dst: &mut Vec<u8>| {
                    if let Some(g) = caps.get(i) {
                        if dst.len() + g.len() > room || dst.try_reserve(g.len()).is_err() {
                            over = true;
                        } else {
                            dst.extend_from_slice(g.as_bytes());
                        }
                    }
                },
                |name| re.capture_names().position(|n| n == Some(name)),
                &mut scratch,
            );
            if over {
                return Err(Overflow::Budget);
            }
            push(&mut out, &scratch, budget)?;
        } else {
            push(&mut out, replacement, budget)?;
        }
        site(start, out.len());
        count += 1;
        last = m.end();
    }
    if count == 0 {
        return Ok((Vec::new(), 0));
    }
    push(&mut out, &data[last..], budget)?;
    Ok((out, count))
}

/// What happened to one file.
enum Outcome {
    /// Skipped in a tree walk: binary, over the read cap, or unreadable.
    Skipped,
    /// `n` replacements made (0: nothing matched, file untouched).
    Replaced(u64),
}

impl Edit<'_> {
    /// Reads `file`, substitutes, and when anything matched writes the result over the
    /// entry that `parent()` yields (called only then). `skip_unfit` skips binary and
    /// oversized files instead of failing them.
    fn apply(
        &self,
        file: std::fs::File,
        st: &libc::stat,
        display: &str,
        skip_unfit: bool,
        parent: impl FnOnce() -> Result<Parent, ExecError>,
    ) -> Result<Outcome, ExecError> {
        let too_big = |size: u64| {
            ExecError::TooLarge(format!(
                "{display}: file of {size} bytes exceeds fs.max_read_bytes ({})",
                self.max_read
            ))
        };
        let size = st.st_size as u64;
        if self.max_read > 0 && size > self.max_read {
            return if skip_unfit {
                Ok(Outcome::Skipped)
            } else {
                Err(too_big(size))
            };
        }
        let mut data = Vec::with_capacity(size as usize);
        let cap = if self.max_read > 0 {
            self.max_read + 1
        } else {
            u64::MAX
        };
        if let Err(e) = file.take(cap).read_to_end(&mut data) {
            // An unreadable file in a tree walk is skipped, like grep skips it.
            return if skip_unfit {
                Ok(Outcome::Skipped)
            } else {
                Err(ExecError::Internal(format!("read {display}: {e}")))
            };
        }
        if self.max_read > 0 && data.len() as u64 > self.max_read {
            // It grew since the stat.
            return if skip_unfit {
                Ok(Outcome::Skipped)
            } else {
                Err(too_big(data.len() as u64))
            };
        }
        if skip_unfit && data.contains(&0) {
            return Ok(Outcome::Skipped);
        }
        let budget = if self.max_write > 0 {
            usize::try_from(self.max_write).unwrap_or(usize::MAX)
        } else {
            usize::MAX
        };
        let (new, count) = match substitute(
            &self.re,
            &data,
            self.limit,
            self.replacement,
            self.expand,
            budget,
        ) {
            Ok(r) => r,
            Err(Overflow::Budget) => {
                return Err(ExecError::TooLarge(format!(
                    "{display}: the result would exceed fs.max_write_bytes ({}); file left unchanged",
                    self.max_write
                )))
            }
            Err(Overflow::Memory) => {
                return Err(ExecError::TooLarge(format!(
                    "{display}: the result does not fit in memory; file left unchanged (set fs.max_write_bytes to bound it)"
                )))
            }
        };
        if count == 0 {
            return Ok(Outcome::Replaced(0));
        }
        let parent = parent()?;
        let now = same_file(&parent, st, display)?;
        // The rewritten file keeps the owner, group, mode and ACL it had (setuid/setgid only
        // as fs.allow_special_bits and the kept owner allow).
        let keep = Replaced::of_fd(now.as_fd(), Path::new(display))?.keep(self.allow_special_bits);
        write_atomic(&parent, &new, keep.mode, Some(keep))?;
        Ok(Outcome::Replaced(count))
    }
}

/// Checks that the entry about to be replaced is still the file that was read (not
/// swapped for another file or a symlink in between), and returns an `O_PATH` handle on it.
fn same_file(parent: &Parent, st: &libc::stat, display: &str) -> Result<OwnedFd, ExecError> {
    let fd = open_beneath(
        Some(&parent.dir),
        Path::new(&parent.name),
        libc::O_PATH | libc::O_NOFOLLOW,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
    )
    .map_err(|e| map_errno(display, e))?;
    let now = fstat(&fd).map_err(|e| map_errno(display, e))?;
    if now.st_dev != st.st_dev || now.st_ino != st.st_ino {
        return Err(ExecError::Internal(format!(
            "{display}: file changed during the edit; left unchanged"
        )));
    }
    Ok(fd)
}

/// The `files` form: one result per entry, failures included.
fn edit_listed(policy: &FsPolicy, edit: &Edit<'_>, input: &str) -> FsSedFileResult {
    let mut shown = input.to_string();
    let outcome = (|| {
        let resolved = policy.jail.resolve(input)?;
        shown = resolved.path.to_string_lossy().into_owned();
        let canon = resolved
            .path
            .to_str()
            .ok_or_else(|| ExecError::Invalid(format!("path is not valid UTF-8: {input}")))?;
        let parent = policy.jail.parent(canon, false)?;
        let fd = open_beneath(
            Some(&parent.dir),
            Path::new(&parent.name),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
        )
        .map_err(|e| map_errno(input, e))?;
        let st = fstat(&fd).map_err(|e| ExecError::Internal(format!("stat {input}: {e}")))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(ExecError::WrongType(format!("not a regular file: {input}")));
        }
        edit.apply(std::fs::File::from(fd), &st, input, false, || Ok(parent))
    })();
    match outcome {
        Ok(Outcome::Replaced(n)) => FsSedFileResult {
            path: shown,
            replacements: n,
            success: true,
            error: None,
        },
        Ok(Outcome::Skipped) => FsSedFileResult {
            path: shown,
            replacements: 0,
            success: true,
            error: None,
        },
        Err(e) => FsSedFileResult {
            path: shown,
            replacements: 0,
            success: false,
            error: Some(e.to_string()),
        },
    }
}

/// The `path` form: edits every eligible file of the tree; lists the files that matched.
fn edit_tree(
    policy: &FsPolicy,
    edit: &Edit<'_>,
    spec: &SedSpec,
    input: &str,
) -> Result<Vec<FsSedFileResult>, ExecError> {
    let filters = Filters::new(&spec.include_glob, &spec.exclude_glob)?;
    let results = Mutex::new(Vec::new());
    let record = |path: &Path, outcome: Result<Outcome, ExecError>| {
        let r = match outcome {
            Ok(Outcome::Skipped | Outcome::Replaced(0)) => return,
            Ok(Outcome::Replaced(n)) => FsSedFileResult {
                path: path.to_string_lossy().into_owned(),
                replacements: n,
                success: true,
                error: None,
            },
            Err(e) => FsSedFileResult {
                path: path.to_string_lossy().into_owned(),
                replacements: 0,
                success: false,
                error: Some(e.to_string()),
            },
        };
        results
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((path.to_path_buf(), r));
    };
    match open_root(policy, input)? {
        Root::File { file, path, st } => {
            let name = path.file_name().map(Path::new).unwrap_or(Path::new(""));
            if filters.file_ok(name) {
                let canon = path.to_string_lossy().into_owned();
                let outcome = edit.apply(file, &st, &canon, true, || match path.to_str() {
                    Some(p) => policy.jail.parent(p, false),
                    None => Err(ExecError::Invalid(format!(
                        "path is not valid UTF-8: {input}"
                    ))),
                });
                record(&path, outcome);
            }
        }
        Root::Dir { fd, path: root } => {
            walk(policy, &root, spec.recursive, &filters, 0, || {
                let (fd, root, record) = (&fd, &root, &record);
                move |abs: &Path, rel: &Path| {
                    let Some((file, st)) = open_regular(fd, rel) else {
                        return;
                    };
                    if policy.jail.stat_is_protected(abs, &st) {
                        return;
                    }
                    let display = abs.to_string_lossy();
                    let outcome = edit.apply(file, &st, &display, true, || {
                        tree_parent(fd, root, rel, &display)
                    });
                    record(abs, outcome);
                }
            });
        }
    }
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(results.into_iter().map(|(_, r)| r).collect())
}

/// The directory holding `rel`, opened beneath the root without following any symlink.
fn tree_parent(
    root_fd: &OwnedFd,
    root: &Path,
    rel: &Path,
    display: &str,
) -> Result<Parent, ExecError> {
    let name: OsString = rel
        .file_name()
        .map(|n| n.to_os_string())
        .ok_or_else(|| ExecError::Internal(format!("{display}: no file name")))?;
    let dir_rel = rel
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir = open_beneath(
        Some(root_fd),
        dir_rel,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
    )
    .map_err(|e| map_errno(display, e))?;
    let dir_path: PathBuf = if dir_rel == Path::new(".") {
        root.to_path_buf()
    } else {
        root.join(dir_rel)
    };
    let path = dir_path.join(&name);
    Ok(Parent {
        dir,
        dir_path,
        name,
        path,
        made: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn re(p: &str) -> Regex {
        RegexBuilder::new(p).multi_line(true).build().unwrap()
    }

    #[test]
    fn substitute_matches_replacen() {
        let r = re("(a)(?P<n>b)?");
        for (data, rep, expand, limit) in [
            (&b"abxaab"[..], &b"<$1|${n}|$$>"[..], true, 0),
            (b"abxaab", b"<$1>", false, 0),
            (b"abxaab", b"$2$2", true, 1),
            (b"nothing", b"x", true, 0),
            (b"", b"x", true, 0),
        ] {
            let want = if expand {
                r.replacen(data, limit, rep)
            } else {
                r.replacen(data, limit, regex::bytes::NoExpand(rep))
            };
            let (got, n) = substitute(&r, data, limit, rep, expand, usize::MAX).unwrap();
            if n > 0 {
                assert_eq!(got, want.as_ref(), "{data:?} {rep:?}");
            } else {
                assert_eq!(want.as_ref(), data);
            }
        }
        // Empty matches, as replacen does them.
        let e = re("x*");
        assert_eq!(
            substitute(&e, b"ab", 0, b"-", false, usize::MAX).unwrap(),
            (b"-a-b-".to_vec(), 3)
        );
    }

    #[test]
    fn substitute_stops_at_the_budget() {
        let r = re("a");
        let data = vec![b'a'; 1000];
        assert_eq!(
            substitute(&r, &data, 0, &[b'R'; 100], false, 10_000),
            Err(Overflow::Budget)
        );
        assert_eq!(
            substitute(&re("a+"), &data, 0, b"$0$0$0", true, 2999),
            Err(Overflow::Budget)
        );
        assert_eq!(
            substitute(&re("a+"), &data, 0, b"$0$0$0", true, 3000).map(|(v, n)| (v.len(), n)),
            Ok((3000, 1))
        );
        // Exactly at the budget is fine.
        assert_eq!(
            substitute(&r, &data, 0, b"bb", false, 2000).map(|(v, n)| (v.len(), n)),
            Ok((2000, 1000))
        );
    }
}
