//! `shell::workspace::*`: the console's working-directory picker and chunked byte reads.

use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::{Component, Path, PathBuf};

use base64::Engine;
use iii_shell_protocol::fs::{
    WorkspaceEntry, WorkspaceEntryKind, WorkspaceListResponse, WorkspaceReadBytesResponse,
    WorkspaceRootsResponse, WorkspaceValidateResponse, READ_BYTES_MAX_CHUNK,
};

use super::entry::{is_dir, statat};
use super::ops::open_for_read;
use crate::error::ExecError;
use crate::jail::{fstat, map_errno, normalize};
use crate::FsPolicy;

/// Default and largest page of `workspace::list`.
pub const LIST_DEFAULT_PAGE: usize = 500;
pub const LIST_MAX_PAGE: usize = 5000;

/// Jailed: the roots. Unjailed: the executor's home, its working directory and /tmp — the
/// places an operator usually starts from — minus denied ones.
pub fn roots(policy: &FsPolicy) -> WorkspaceRootsResponse {
    let mut roots: Vec<String> = if policy.jail.is_jailed() {
        policy
            .jail
            .roots()
            .iter()
            .map(|r| r.path.to_string_lossy().into_owned())
            .collect()
    } else {
        let mut v = Vec::new();
        for cand in [
            std::env::var("HOME").ok(),
            std::env::current_dir()
                .ok()
                .map(|p| p.to_string_lossy().into_owned()),
            Some("/tmp".into()),
        ]
        .into_iter()
        .flatten()
        {
            if let Ok(r) = policy.jail.resolve(&cand) {
                if fstat(&r.fd).is_ok_and(|st| is_dir(&st)) {
                    v.push(r.path.to_string_lossy().into_owned());
                }
            }
        }
        v
    };
    let mut seen = std::collections::HashSet::new();
    roots.retain(|r| seen.insert(r.clone()));
    WorkspaceRootsResponse { roots }
}

/// Child directories (never files) of an existing directory, canonical, sorted, paginated.
pub fn list(
    policy: &FsPolicy,
    input: &str,
    page_size: Option<usize>,
) -> Result<WorkspaceListResponse, ExecError> {
    let limit = match page_size {
        None => LIST_DEFAULT_PAGE,
        Some(0) => {
            return Err(ExecError::Invalid(format!(
                "page_size must be at least 1 (omit it for the default of {LIST_DEFAULT_PAGE}; at most {LIST_MAX_PAGE})"
            )))
        }
        Some(n) => n.min(LIST_MAX_PAGE),
    };
    let dir = validate_dir(policy, input)?;
    let listing = std::fs::read_dir(format!("/proc/self/fd/{}", dir.fd.as_raw_fd()))
        .map_err(|e| map_errno(input, e))?;
    let mut entries = Vec::new();
    for item in listing.flatten() {
        let name = item.file_name();
        let full = dir.path.join(&name);
        if policy.jail.is_denied(&full) {
            continue;
        }
        let Ok(c) = std::ffi::CString::new(name.as_encoded_bytes()) else {
            continue;
        };
        // Every path is canonical: a symlinked child is listed (under its own name) at the
        // directory it resolves to, and only when that is a directory inside the jail that
        // is not denied; any other link is skipped.
        let path = match statat(&dir.fd, &c, true) {
            Ok(st) if is_dir(&st) => full,
            Ok(_) => match policy.jail.resolve(&full.to_string_lossy()) {
                Ok(r) if fstat(&r.fd).is_ok_and(|st| is_dir(&st)) => r.path,
                _ => continue,
            },
            Err(_) => continue,
        };
        entries.push(WorkspaceEntry {
            name: name.to_string_lossy().into_owned(),
            path: path.to_string_lossy().into_owned(),
            kind: WorkspaceEntryKind::Dir,
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries.truncate(limit);
    Ok(WorkspaceListResponse {
        path: dir.path.to_string_lossy().into_owned(),
        entries,
    })
}

fn validate_dir(policy: &FsPolicy, input: &str) -> Result<crate::jail::Resolved, ExecError> {
    let dir = policy
        .jail
        .resolve_with(input, libc::O_RDONLY | libc::O_NONBLOCK)?;
    let st = fstat(&dir.fd).map_err(|e| map_errno(input, e))?;
    if !is_dir(&st) {
        return Err(ExecError::WrongType(format!("not a directory: {input}")));
    }
    Ok(dir)
}

pub fn validate(policy: &FsPolicy, input: &str) -> Result<WorkspaceValidateResponse, ExecError> {
    let dir = validate_dir(policy, input)?;
    Ok(WorkspaceValidateResponse {
        path: dir.path.to_string_lossy().into_owned(),
    })
}

/// Where `coder::*` anchors relative paths when unjailed: the executor's working directory,
/// then `/tmp` (the seed's fallback roots; they anchor relative paths only).
fn fallback_roots() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::env::current_dir().into_iter().collect();
    v.push(PathBuf::from("/tmp"));
    v
}

/// A relative `read-bytes` path, anchored as `coder::*` anchors it. Jailed, the jail
/// already resolves it beneath the primary root. Unjailed, it is tried beneath each fallback
/// root in order and the first that holds it wins; a path that climbs out of them (`..`) is
/// S215, one that is in none of them S211.
fn anchor_relative(policy: &FsPolicy, input: &str) -> Result<String, ExecError> {
    if policy.jail.is_jailed() || input.starts_with('/') || input.is_empty() {
        return Ok(input.to_string());
    }
    let rel = normalize(&Path::new("/").join(input));
    if Path::new(input)
        .components()
        .scan(0i64, |depth, c| {
            *depth += match c {
                Component::ParentDir => -1,
                Component::Normal(_) => 1,
                _ => 0,
            };
            Some(*depth)
        })
        .any(|d| d < 0)
    {
        return Err(ExecError::Escape(input.to_string()));
    }
    let rel = rel.strip_prefix("/").unwrap_or(&rel).to_path_buf();
    let roots = fallback_roots();
    for root in &roots {
        let cand = root.join(&rel);
        let cand = cand.to_string_lossy();
        if policy.jail.resolve(&cand).is_ok() {
            return Ok(cand.into_owned());
        }
    }
    Err(ExecError::NotFound(input.to_string()))
}

/// One base64 chunk of a file, at most [`READ_BYTES_MAX_CHUNK`] raw bytes.
pub fn read_bytes(
    policy: &FsPolicy,
    input: &str,
    offset: u64,
    length: u64,
) -> Result<WorkspaceReadBytesResponse, ExecError> {
    let anchored = anchor_relative(policy, input)?;
    let (mut file, st, path) =
        open_for_read(policy, &anchored, false).map_err(|e| super::ops::echo_input(e, input))?;
    let size = st.st_size as u64;
    let want = length.min(READ_BYTES_MAX_CHUNK);
    let mut buf = Vec::new();
    if offset < size {
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| map_errno(input, e))?;
        file.take(want)
            .read_to_end(&mut buf)
            .map_err(|e| map_errno(input, e))?;
    }
    let length = buf.len() as u64;
    Ok(WorkspaceReadBytesResponse {
        path: path.to_string_lossy().into_owned(),
        offset,
        length,
        content: base64::engine::general_purpose::STANDARD.encode(&buf),
        size,
        mtime: st.st_mtime,
        eof: offset.saturating_add(length) >= size,
    })
}
