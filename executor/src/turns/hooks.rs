//! The harness hooks' side of the turn history: which top-level session and turn a hook
//! input records under (sub-agents follow their parent links), and a turn's start and end.

use iii_shell_policy::sync::lock;
use iii_shell_protocol::clock::now_ms;
use serde_json::json;

use super::model::*;
use super::state::{TurnCtx, Turns, MAX_HOPS, TITLE_CHARS};
use crate::policy::Policy;
use iii_shell_files::error::ExecError;

impl Turns {
    /// The top-level session/turn a hook input records under (TURNS-03).
    pub fn ctx(&self, h: &HookInput) -> Option<TurnCtx> {
        let session = h.session_id.clone()?;
        if let Some(p) = h.parent() {
            lock(&self.parents).insert(session.clone(), p);
        }
        let (top, top_turn) = self.top_of(&session, h.turn_id.clone());
        let turn = top_turn.or_else(|| lock(&self.active).get(&top).cloned())?;
        let agent = (top != session).then(|| AgentRef {
            session_id: session.clone(),
            name: h.agent_name(),
        });
        self.mark_seen(&top, &turn, h.scope_root().as_deref());
        Some(TurnCtx {
            session: top,
            turn,
            root: h.scope_root(),
            agent,
        })
    }

    pub(super) fn top_of(&self, session: &str, turn: Option<String>) -> (String, Option<String>) {
        let mut parents = lock(&self.parents);
        let (mut s, mut t) = (session.to_string(), turn);
        for _ in 0..MAX_HOPS {
            match parents.get(&s) {
                Some((ps, pt)) => {
                    s = ps.clone();
                    t = pt.clone().or(t);
                }
                None => break,
            }
        }
        (s, t)
    }

    pub(super) fn turn_started(&self, policy: &Policy, ev: &TurnEvent) -> Result<(), ExecError> {
        let (Some(session), Some(turn)) = (ev.session_id.clone(), ev.turn_id.clone()) else {
            return Ok(());
        };
        if let Some(p) = &ev.parent {
            if let Some(ps) = p.session_id.clone() {
                lock(&self.parents).insert(session, (ps, p.turn_id.clone()));
                return Ok(());
            }
        }
        lock(&self.active).insert(session.clone(), turn.clone());
        self.mark_open(&session, &turn);
        let title: Option<String> = ev
            .message_preview
            .as_deref()
            .map(|m| m.trim().chars().take(TITLE_CHARS).collect());
        self.with_store(policy, |s| {
            s.append(
                &session,
                &json!({"t": "start", "turn_id": turn, "started_at": now_ms(), "title": title}),
            )
        })?
        .map_err(|e| ExecError::Internal(format!("turn store: {e}")))
    }

    pub(super) fn turn_completed(&self, policy: &Policy, ev: &TurnEvent) -> Result<(), ExecError> {
        let (Some(session), Some(turn)) = (ev.session_id.clone(), ev.turn_id.clone()) else {
            return Ok(());
        };
        if ev.parent.as_ref().is_some_and(|p| p.session_id.is_some()) {
            return Ok(());
        }
        self.mark_closed(&session, &turn);
        self.with_store(policy, |s| {
            s.append(
                &session,
                &json!({"t": "end", "turn_id": turn, "ended_at": now_ms()}),
            )
        })?
        .map_err(|e| ExecError::Internal(format!("turn store: {e}")))
    }
}
