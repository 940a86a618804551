//! The turn history's state and limits: the [`Turns`] value the executor holds (its store,
//! the sub-agent links, the open turns), the caller's [`TurnCtx`] and the size bounds. A leaf of
//! `turns`: every role module (calls, hooks, pre-images, undo, sessions) extends [`Turns`] from
//! here, and nothing here names them.

use std::sync::{Arc, Mutex};

use iii_shell_files::error::ExecError;
use iii_shell_policy::sync::lock;

use super::lru::Lru;
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
/// Sessions whose sub-agent parent link, and whose newest turn, the hooks remember (each map
/// forgets its least recently used session first).
pub const MAX_HOOK_SESSIONS: usize = 4096;

/// Who is calling: the top-level session/turn the change is recorded under.
#[derive(Debug, Clone)]
pub struct TurnCtx {
    pub session: String,
    pub turn: String,
    pub root: Option<String>,
    pub agent: Option<AgentRef>,
}

pub struct Turns {
    /// The open store. Its lock is held only to open (or reopen) it and take a handle: reads
    /// and folds run on the handle, outside it, and appends serialize per session in the store.
    pub(super) store: Mutex<Option<Arc<Store>>>,
    /// Sub-agent session → (parent session, parent turn), at most [`MAX_HOOK_SESSIONS`].
    pub(super) parents: Mutex<Lru<(String, Option<String>)>>,
    /// Session → its newest turn, at most [`MAX_HOOK_SESSIONS`].
    pub(super) active: Mutex<Lru<String>>,
    /// Top-level turns started and not completed (`calls`: where requests record).
    pub(super) open: Mutex<Vec<OpenTurn>>,
    pub(super) seen: std::sync::atomic::AtomicU64,
}

impl Default for Turns {
    fn default() -> Turns {
        Turns {
            store: Mutex::new(None),
            parents: Mutex::new(Lru::new(MAX_HOOK_SESSIONS)),
            active: Mutex::new(Lru::new(MAX_HOOK_SESSIONS)),
            open: Mutex::new(Vec::new()),
            seen: Default::default(),
        }
    }
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
    /// Runs `f` on the store of `policy`'s `turns.data_dir` (opened on first use, and again
    /// when the directory changed). The lock is released before `f` runs: a fold of a long
    /// log never holds up another session's (or this one's) recording.
    pub(super) fn with_store<R>(
        &self,
        policy: &Policy,
        f: impl FnOnce(&Store) -> R,
    ) -> Result<R, ExecError> {
        let store = self.store_handle(policy)?;
        Ok(f(&store))
    }

    /// The open store of `policy`, as a handle that outlives the lock. Where the state lives
    /// (`iii_shell_files::state_place`): the configured `turns.data_dir`, or the worker's state
    /// directory when that lies in commands' reach.
    pub(super) fn store_handle(&self, policy: &Policy) -> Result<Arc<Store>, ExecError> {
        let dir = policy.state.turns.clone();
        let mut g = lock(&self.store);
        if let Some(s) = g.as_ref().filter(|s| s.dir() == dir.as_path()) {
            return Ok(Arc::clone(s));
        }
        let s = Store::open(&dir, policy.config.turns.max_blob_bytes).map_err(|e| {
            ExecError::Internal(format!(
                "cannot open the turn store {}: {e}; make it writable by the command user (or set turns.data_dir, see docs/configuration.md)",
                dir.display()
            ))
        })?;
        let s = Arc::new(s);
        *g = Some(Arc::clone(&s));
        Ok(s)
    }
}
