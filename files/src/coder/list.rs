//! `coder::list-folder`: one folder, sorted by name, paginated.
//!
//! Entries are read from the folder's fd and stat'ed relative to it (`fstatat`, never
//! following the entry). A `non_accessible_globs` match is listed with
//! `non_accessible: true`; a denylisted entry is left out (and not counted), as in
//! `shell::fs::ls`, so a denylisted path stays indistinguishable from a missing one.

use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use iii_shell_protocol::coder::*;

use super::paths::{display, CErr, Ctx};
use crate::fs::entry::{is_dir, is_file, is_symlink, statat};
use crate::jail::fstat;

pub fn kind_of(st: &libc::stat) -> EntryKind {
    if is_symlink(st) {
        EntryKind::Symlink
    } else if is_dir(st) {
        EntryKind::Dir
    } else if is_file(st) {
        EntryKind::File
    } else {
        EntryKind::Other
    }
}

/// Opens `input` as a directory (C210 when it is something else).
pub fn open_dir(ctx: &Ctx<'_>, input: &str) -> Result<crate::jail::Resolved, CErr> {
    let r = ctx.resolve(input, libc::O_RDONLY | libc::O_NONBLOCK)?;
    let st = fstat(&r.fd).map_err(|e| CErr::io(format!("stat {input}: {e}")))?;
    if !is_dir(&st) {
        return Err(CErr::invalid(format!(
            "not a directory: {input}; read a file with coder::read-file"
        )));
    }
    Ok(r)
}

/// The names in the directory `fd` (without `.` and `..`), unsorted.
pub fn names(fd: &OwnedFd) -> std::io::Result<Vec<(OsString, Option<std::fs::FileType>)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))? {
        let Ok(e) = e else { continue };
        out.push((e.file_name(), e.file_type().ok()));
    }
    Ok(out)
}

pub fn cname(name: &OsString) -> Option<CString> {
    CString::new(name.as_bytes()).ok()
}

pub fn list_folder(ctx: &Ctx<'_>, req: &ListFolderInput) -> Result<ListFolderOutput, CErr> {
    if req.page == 0 {
        return Err(CErr::invalid(
            "page is 1-based: pass page: 1 for the first page",
        ));
    }
    let page_size = req
        .page_size
        .unwrap_or(LIST_DEFAULT_PAGE_SIZE)
        .clamp(1, LIST_MAX_PAGE_SIZE);
    let dir = open_dir(ctx, &req.path)?;
    let mut all: Vec<OsString> = names(&dir.fd)
        .map_err(|e| CErr::io(format!("list {}: {e}", req.path)))?
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| !ctx.is_hidden_by_denylist(&dir.path.join(n)))
        .collect();
    all.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    let total = all.len() as u64;
    let start = (req.page as usize - 1).saturating_mul(page_size as usize);
    let mut entries = Vec::new();
    for name in all.iter().skip(start).take(page_size as usize) {
        let Some(c) = cname(name) else { continue };
        let full = dir.path.join(name);
        let (kind, size, mtime) = match statat(&dir.fd, &c, true) {
            Ok(st) => (kind_of(&st), st.st_size as u64, st.st_mtime),
            // Gone since it was listed: still report the name, as `other`.
            Err(_) => (EntryKind::Other, 0, 0),
        };
        entries.push(DirEntry {
            name: name.to_string_lossy().into_owned(),
            kind,
            size,
            mtime,
            non_accessible: ctx.is_non_accessible(&full),
        });
    }
    let shown_end = start.saturating_add(entries.len()) as u64;
    Ok(ListFolderOutput {
        path: display(&dir.path),
        entries,
        total,
        page: req.page,
        page_size,
        has_more: shown_end < total,
    })
}

/// A dot entry.
pub fn is_hidden_name(name: &OsString) -> bool {
    name.as_bytes().first() == Some(&b'.')
}

/// The basename of a canonical path (`/` for the root).
pub fn base_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".to_string())
}
