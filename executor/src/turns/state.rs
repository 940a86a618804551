//! The turn history's state and limits: the [`Turns`] value the executor holds (its store,
//! the sub-agent links, the open turns), the caller's [`TurnCtx`] and the size bounds. A leaf of
//! `turns`: every role module (calls, hooks, pre-images, undo, sessions) extends [`Turns`] from
//! here, and nothing here names them.

use std::collections::HashMap;
use std::sync::Mutex;

use iii_shell_files::error::ExecError;
use iii_shell_policy::sync::lock;

use super::model::AgentRef;
use super::store::Store;
use crate::policy::Policy;

/// Bodies up to this size are kept whole in the blob store (UTF-8 or not).
pub const MAX_STORED_BODY: u64 = 16 * 1024 * 1024;
/// `get` fills in at most this much of one body (`MAX_PRE_IMAGE_BYTES`)…
pub const MAX_PRE_IMAGE_BYTES: usize = 64 * 1024;
/// …and this much across one response.
pub const MAX_RESPONSE_BODIES: usize = 1024 * 1024;
/// Sub-agent parent links followed at most this far.
pub(super) const MAX_HOPS: usize = 16;
/// `title` is the first characters of the message preview.
pub(super) const TITLE_CHARS: usize = 80;

/// Who is calling: the top-level session/turn the change is recorded under.
#[derive(Debug, Clone)]
pub struct TurnCtx {
    pub session: String,
    pub turn: String,
    pub root: Option<String>,
    pub agent: Option<AgentRef>,
}

#[derive(Default)]
pub struct Turns {
    pub(super) store: Mutex<Option<Store>>,
    /// Sub-agent session → (parent session, parent turn).
    pub(super) parents: Mutex<HashMap<String, (String, Option<String>)>>,
    /// Session → its newest turn.
    pub(super) active: Mutex<HashMap<String, String>>,
    /// Top-level turns started and not completed (`calls`: where requests record).
    pub(super) open: Mutex<Vec<OpenTurn>>,
    pub(super) seen: std::sync::atomic::AtomicU64,
}

/// One top-level turn between `on-turn-started` and `on-turn-completed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTurn {
    pub session: String,
    pub turn: String,
    /// `metadata.fs_scope.root` from the turn's hooks, once seen.
    pub root: Option<String>,
    /// Ordinal of the last start or hook seen for the turn (larger = more recent).
    pub seen: u64,
}

impl Turns {
    pub(super) fn with_store<R>(
        &self,
        policy: &Policy,
        f: impl FnOnce(&Store) -> R,
    ) -> Result<R, ExecError> {
        // Where the state lives (`iii_shell_files::state_place`): the configured
        // `turns.data_dir`, or the worker's state directory when that lies in commands' reach.
        let dir = policy.state.turns.clone();
        let mut g = lock(&self.store);
        let reopen = g.as_ref().is_none_or(|s| s.dir() != dir.as_path());
        if reopen {
            let s = Store::open(&dir, policy.config.turns.max_blob_bytes).map_err(|e| {
                ExecError::Internal(format!(
                    "cannot open the turn store {}: {e}; make it writable by the command user (or set turns.data_dir, see docs/configuration.md)",
                    dir.display()
                ))
            })?;
            *g = Some(s);
        }
        match g.as_ref() {
            Some(s) => Ok(f(s)),
            None => Err(ExecError::Internal("turn store unavailable".into())),
        }
    }
}
