//! `coder::*` in the executor: the agent-facing file surface, through the same path policy as
//! `shell::fs::*` (the jail's `openat2` beneath a root fd, `fs.denylist_paths`,
//! `code.non_accessible_globs`, existence redaction).
//!
//! * [`paths`]: where a caller path anchors (session root, primary root, fallback roots),
//!   the per-call scope (C220), and the C-coded errors.
//! * [`read`], [`list`], [`tree`], [`search`]: the read side.
//! * [`edit`], [`remove`], [`moves`]: the write side, committing every file through the
//!   executor's one atomic write (`crate::fs::atomic`, keeping what the replaced file had:
//!   `crate::fs::keep`), each handed the [`EditLocks`] that serialize writers of one path and
//!   the [`ChangeRecorder`] it reports its changes to ([`recorder`]), which also serves
//!   `coder::change-diff`.

pub mod edit;
pub mod lines;
pub mod list;
pub mod moves;
pub mod paths;
pub mod read;
pub mod recorder;
pub mod remove;
pub mod search;
pub mod search_ignores;
pub mod tree;

use iii_shell_protocol::coder::*;
use iii_shell_protocol::WireError;

use crate::FsPolicy;
pub use edit::EditLocks;
pub use paths::{CErr, Ctx};
pub use recorder::{ChangeRecorder, NoRecorder};

/// Runs one coder call against one policy snapshot (blocking: call it off the runtime):
/// writers take their per-path locks in `locks` and report their changes to `changes`.
pub fn handle(
    policy: &FsPolicy,
    call: CoderCall,
    locks: &EditLocks,
    changes: &dyn ChangeRecorder,
) -> Result<CoderReply, WireError> {
    let ctx = Ctx::new(policy, &call.scope).map_err(CErr::into_wire)?;
    let r = match call.op {
        CoderOp::Info => Ok(CoderReply::Info(ctx.info())),
        CoderOp::Read(spec) => read::read(&ctx, &spec).map(CoderReply::Read),
        CoderOp::Search(req) => search::search(&ctx, &req).map(CoderReply::Search),
        CoderOp::ListFolder(req) => list::list_folder(&ctx, &req).map(CoderReply::ListFolder),
        CoderOp::Tree(req) => tree::tree(&ctx, &req).map(CoderReply::Tree),
        CoderOp::Create(req) => Ok(CoderReply::Create(edit::create_files(
            &ctx, &req, locks, changes,
        ))),
        CoderOp::Update(specs) => Ok(CoderReply::Update(edit::update_files(
            &ctx, &specs, locks, changes,
        ))),
        CoderOp::Delete(req) => Ok(CoderReply::Delete(remove::delete_files(
            &ctx, &req, locks, changes,
        ))),
        CoderOp::Move(req) => Ok(CoderReply::Move(moves::move_files(&ctx, &req, locks))),
        CoderOp::ChangeDiff(req) => changes.diff(&req.change_id).map(CoderReply::ChangeDiff),
    };
    r.map_err(CErr::into_wire)
}
