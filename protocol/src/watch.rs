//! The change feed (`shell::changed`) on the broker↔executor socket.
//!
//! The broker asks the executor to start one recursive watcher per trigger binding
//! ([`WatchOp::Start`], keyed by the engine's binding id, idempotent) and to stop it
//! ([`WatchOp::Stop`]). The executor coalesces the kernel's events per path and pushes them as
//! [`crate::messages::Event::Changed`] batches; the broker fires the bound function.

use serde::{Deserialize, Serialize};

/// Watch requests (`Request::Watch`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WatchOp {
    /// Start (or keep) the watcher of `binding_id` on `path`. A second `Start` for a live
    /// binding with the same path and flags keeps the running watcher (a replay after a
    /// reconnect); with different ones the watcher is replaced.
    Start {
        binding_id: String,
        path: String,
        include_ignored: bool,
    },
    /// Stop the watcher of `binding_id` (no error when there is none).
    Stop { binding_id: String },
}

/// Replies to [`WatchOp`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WatchReply {
    /// The watcher runs on `root`, the canonical directory. `kept` is true when a live
    /// watcher with the same settings was kept.
    Started {
        root: String,
        kept: bool,
    },
    Stopped {
        existed: bool,
    },
}

/// `created` | `modified` | `deleted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    Created,
    Modified,
    Deleted,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Created => "created",
            ChangeKind::Modified => "modified",
            ChangeKind::Deleted => "deleted",
        }
    }

    /// Merges a later raw event into the pending kind of a path, toward the visible outcome
    /// (TRIG-07): a deletion supersedes anything; after a deletion, a creation is `created`
    /// (and a modification of a path that came back is `created` too: it exists again); a
    /// `created` stays `created` through later writes; otherwise `modified`.
    pub fn merge(self, later: ChangeKind) -> ChangeKind {
        use ChangeKind::*;
        match (self, later) {
            (_, Deleted) => Deleted,
            (Deleted, Created | Modified) => Created,
            (Created, _) => Created,
            (Modified, Created) => Created,
            (Modified, Modified) => Modified,
        }
    }
}

/// One coalesced change of a watched tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// Relative to the watched root; `.` for the root itself.
    pub path: String,
    pub kind: ChangeKind,
    /// True for a directory; always false for a deleted path.
    pub dir: bool,
    /// The overflow signal: events were lost (kernel queue overflow, watch limit, the
    /// executor's own bounds). Always the root with kind `modified`; rescan the tree.
    pub overflow: bool,
}

#[cfg(test)]
mod tests {
    use super::ChangeKind::*;

    #[test]
    fn kinds_merge_toward_the_visible_outcome() {
        assert_eq!(Created.merge(Modified), Created);
        assert_eq!(Created.merge(Deleted), Deleted);
        assert_eq!(Modified.merge(Deleted), Deleted);
        assert_eq!(Deleted.merge(Created), Created);
        assert_eq!(Deleted.merge(Modified), Created);
        assert_eq!(Modified.merge(Modified), Modified);
        assert_eq!(Modified.merge(Created), Created);
        assert_eq!(Deleted.merge(Deleted), Deleted);
        assert_eq!(Created.merge(Created), Created);
    }
}
