//! `shell::workspace::*`: the console's working-directory picker and chunked byte reads.

use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;

use base64::Engine;
use iii_shell_protocol::fs::{
    WorkspaceEntry, WorkspaceEntryKind, WorkspaceListResponse, WorkspaceReadBytesResponse,
    WorkspaceRootsResponse, WorkspaceValidateResponse, READ_BYTES_MAX_CHUNK,
};

use super::entry::{is_dir, statat};
use super::ops::open_for_read;
use crate::error::ExecError;
use crate::jail::{fstat, map_errno};
use crate::policy::Policy;

/// Default and largest page of `workspace::list`.
pub const LIST_DEFAULT_PAGE: usize = 500;
pub const LIST_MAX_PAGE: usize = 5000;

/// Jailed: the roots. Unjailed: the executor's home, its working directory and /tmp — the
/// places an operator usually starts from — minus denied ones.
pub fn roots(policy: &Policy) -> WorkspaceRootsResponse {
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
    policy: &Policy,
    input: &str,
    page_size: Option<usize>,
) -> Result<WorkspaceListResponse, ExecError> {
    let dir = validate_dir(policy, input)?;
    let limit = page_size
        .unwrap_or(LIST_DEFAULT_PAGE)
        .clamp(1, LIST_MAX_PAGE);
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
        // Symlinked directories are listed only when they lead to a directory in the jail.
        let is_directory = match statat(&dir.fd, &c, true) {
            Ok(st) if is_dir(&st) => true,
            Ok(_) => policy
                .jail
                .resolve(&full.to_string_lossy())
                .ok()
                .and_then(|r| fstat(&r.fd).ok())
                .is_some_and(|st| is_dir(&st)),
            Err(_) => false,
        };
        if is_directory {
            entries.push(WorkspaceEntry {
                name: name.to_string_lossy().into_owned(),
                path: full.to_string_lossy().into_owned(),
                kind: WorkspaceEntryKind::Dir,
            });
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries.truncate(limit);
    Ok(WorkspaceListResponse {
        path: dir.path.to_string_lossy().into_owned(),
        entries,
    })
}

fn validate_dir(policy: &Policy, input: &str) -> Result<crate::jail::Resolved, ExecError> {
    let dir = policy
        .jail
        .resolve_with(input, libc::O_RDONLY | libc::O_NONBLOCK)?;
    let st = fstat(&dir.fd).map_err(|e| map_errno(input, e))?;
    if !is_dir(&st) {
        return Err(ExecError::WrongType(format!("not a directory: {input}")));
    }
    Ok(dir)
}

pub fn validate(policy: &Policy, input: &str) -> Result<WorkspaceValidateResponse, ExecError> {
    let dir = validate_dir(policy, input)?;
    Ok(WorkspaceValidateResponse {
        path: dir.path.to_string_lossy().into_owned(),
    })
}

/// One base64 chunk of a file, at most [`READ_BYTES_MAX_CHUNK`] raw bytes.
pub fn read_bytes(
    policy: &Policy,
    input: &str,
    offset: u64,
    length: u64,
) -> Result<WorkspaceReadBytesResponse, ExecError> {
    let (mut file, st, path) = open_for_read(policy, input, false)?;
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
