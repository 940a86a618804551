//! `coder::tree`: a breadth-first, bounded snapshot of a folder.
//!
//! Bounds: `max_depth` (clamped to [`TREE_MAX_DEPTH`]), `per_folder_limit`, and a node budget
//! of [`TREE_MAX_NODES`] for the whole snapshot. The walk is iterative and breadth-first, so
//! the budget is spent on the shallow levels first, and it stops expanding folders once the
//! budget is gone: its cost follows what it returns, not the size of the tree.
//!
//! Every folder below the root is opened with `openat2(root_fd, rel,
//! RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`: symlinks are listed as `symlink` and never
//! followed (so symlink loops cannot loop), and a folder swapped for a symlink mid-walk fails
//! to open instead of leading elsewhere. Non-accessible folders are listed but not entered;
//! denylisted entries are left out.

use std::collections::VecDeque;
use std::path::PathBuf;

use iii_shell_protocol::coder::*;

use super::list::{base_name, cname, is_hidden_name, kind_of, names, open_dir};
use super::paths::{display, CErr, Ctx};
use crate::fs::entry::statat;
use crate::jail::{fstat, open_beneath};

struct Slot {
    node: TreeNode,
    children: Option<Vec<usize>>,
}

fn to_node(kind: EntryKind) -> NodeKind {
    match kind {
        EntryKind::File => NodeKind::File,
        EntryKind::Dir => NodeKind::Dir,
        EntryKind::Symlink => NodeKind::Symlink,
        EntryKind::Other => NodeKind::Other,
    }
}

fn trunc(reason: &str, shown: u32, total: Option<u32>) -> Option<TruncationInfo> {
    let hint = match reason {
        "per_folder_limit" => "more children than per_folder_limit: page through this folder with coder::list-folder",
        "max_depth" => "not expanded (max_depth): call coder::tree on this folder or coder::list-folder",
        "default_exclude" => "entries hidden by default_exclude_globs: pass use_default_excludes: false, or use coder::list-folder",
        _ => "the snapshot's node budget ran out: call coder::tree on this folder, or coder::list-folder",
    };
    Some(TruncationInfo {
        reason: reason.to_string(),
        shown,
        total,
        hint: hint.to_string(),
    })
}

pub fn tree(ctx: &Ctx<'_>, req: &TreeInput) -> Result<TreeOutput, CErr> {
    let root = open_dir(ctx, &req.path)?;
    let max_depth = req
        .max_depth
        .unwrap_or(TREE_DEFAULT_DEPTH)
        .min(TREE_MAX_DEPTH);
    let limit = req.per_folder_limit.unwrap_or(TREE_PER_FOLDER_LIMIT);
    let st = fstat(&root.fd).map_err(|e| CErr::io(format!("stat {}: {e}", req.path)))?;
    let mut slots = vec![Slot {
        node: TreeNode {
            name: base_name(&root.path),
            kind: NodeKind::Dir,
            size: st.st_size as u64,
            mtime: st.st_mtime,
            non_accessible: false,
            children: None,
            truncated: None,
        },
        children: None,
    }];
    let mut budget: u32 = TREE_MAX_NODES.saturating_sub(1);
    // (slot, path relative to the root, depth)
    let mut queue: VecDeque<(usize, PathBuf, u32)> = VecDeque::new();
    queue.push_back((0, PathBuf::new(), 0));
    while let Some((idx, rel, depth)) = queue.pop_front() {
        if depth >= max_depth {
            slots[idx].node.truncated = trunc("max_depth", 0, None);
            continue;
        }
        if budget == 0 {
            slots[idx].node.truncated = trunc("max_nodes", 0, None);
            continue;
        }
        let fd = if rel.as_os_str().is_empty() {
            root.fd.try_clone().ok()
        } else {
            open_beneath(
                Some(&root.fd),
                &rel,
                libc::O_RDONLY | libc::O_DIRECTORY,
                libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
            )
            .ok()
        };
        let Some(fd) = fd else {
            // Unreadable or swapped away since it was listed: no children.
            continue;
        };
        let dir_path = root.path.join(&rel);
        let Ok(listing) = names(&fd) else { continue };
        let mut omitted_excluded = false;
        let mut eligible = Vec::with_capacity(listing.len());
        for (name, ft) in listing {
            if !req.include_hidden && is_hidden_name(&name) {
                continue;
            }
            let full = dir_path.join(&name);
            if ctx.is_hidden_by_denylist(&full) {
                continue;
            }
            let is_dir = ft.is_some_and(|t| t.is_dir());
            if req.use_default_excludes && !is_dir && ctx.is_excluded(&full, false) {
                omitted_excluded = true;
                continue;
            }
            eligible.push(name);
        }
        eligible.sort_by(|a, b| {
            use std::os::unix::ffi::OsStrExt;
            a.as_bytes().cmp(b.as_bytes())
        });
        let total = u32::try_from(eligible.len()).unwrap_or(u32::MAX);
        let shown = total.min(limit).min(budget);
        let mut kids = Vec::with_capacity(shown as usize);
        for name in eligible.iter().take(shown as usize) {
            let full = dir_path.join(name);
            let Some(c) = cname(name) else { continue };
            let (kind, size, mtime) = match statat(&fd, &c, true) {
                Ok(st) => (kind_of(&st), st.st_size as u64, st.st_mtime),
                Err(_) => (EntryKind::Other, 0, 0),
            };
            let non_accessible = ctx.is_non_accessible(&full);
            let mut node = TreeNode {
                name: name.to_string_lossy().into_owned(),
                kind: to_node(kind),
                size,
                mtime,
                non_accessible,
                children: None,
                truncated: None,
            };
            let child = slots.len();
            if kind == EntryKind::Dir && !non_accessible {
                if req.use_default_excludes && ctx.is_excluded(&full, true) {
                    node.truncated = trunc("default_exclude", 0, None);
                } else {
                    queue.push_back((child, rel.join(name), depth + 1));
                }
            }
            slots.push(Slot {
                node,
                children: None,
            });
            kids.push(child);
        }
        budget -= shown;
        slots[idx].node.truncated = if shown < total && shown < limit {
            trunc("max_nodes", shown, None)
        } else if shown < total {
            trunc("per_folder_limit", shown, Some(total))
        } else if omitted_excluded {
            trunc("default_exclude", shown, None)
        } else {
            None
        };
        slots[idx].children = Some(kids);
    }
    Ok(TreeOutput {
        path: display(&root.path),
        root: assemble(&mut slots, 0),
    })
}

/// Builds the nested nodes out of the slots (depth is bounded by `TREE_MAX_DEPTH`).
fn assemble(slots: &mut [Slot], idx: usize) -> TreeNode {
    let kids = slots[idx].children.take();
    let mut node = slots[idx].node.clone();
    node.children = kids.map(|k| k.into_iter().map(|c| assemble(slots, c)).collect());
    node
}
