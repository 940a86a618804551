//! Who may take a terminal slot, and who may adopt a session: pure decisions over counts and
//! caller ids, with exact-value tests.
//!
//! A *caller* is the engine worker the engine names in `_caller_worker_id`
//! ([`caller_of`](iii_shell_protocol::pty::caller_of)); calls without one all count as one
//! caller. A session's *holder* is the caller that opened it, or the last to attach to it
//! with its reconnect token or to adopt it.

use iii_shell_policy::config::{PtyAdopt, PtyConfig};

/// The sessions held when an `open` arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Census {
    /// Sessions whose program has not exited.
    pub running: usize,
    /// Of those, the ones the caller holds.
    pub running_of_caller: usize,
    /// Sessions whose program exited and that are still kept for replay.
    pub exited: usize,
}

/// What an `open` gets.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// A free slot.
    Open,
    /// Every slot is held, some by exited sessions: the one whose program exited first is
    /// removed (its output with it) to make room.
    EvictOldestExited,
    /// Refused, with the message.
    Refuse(String),
}

/// Whether `caller` may open one more session. Only running sessions hold a slot for good:
/// an exited one keeps its output replayable until an open needs its slot. One caller holds
/// at most `max_sessions_per_caller` running sessions, so no caller can take every slot.
pub fn admit(cfg: &PtyConfig, caller: &str, c: &Census) -> Admission {
    if let Err(m) = may_hold_one_more(cfg, caller, c.running_of_caller) {
        return Admission::Refuse(m);
    }
    let max = cfg.max_sessions as usize;
    if c.running >= max {
        return Admission::Refuse(format!(
            "max pty sessions reached ({} of pty.max_sessions = {max}): close one with shell::pty::close, or raise pty.max_sessions",
            c.running
        ));
    }
    if c.running + c.exited >= max {
        Admission::EvictOldestExited
    } else {
        Admission::Open
    }
}

/// Whether `caller`, who holds `running_of_caller` running sessions, may hold one more: by
/// opening it, or by adopting a running one (adoption counts against the cap as opening
/// does, so a caller cannot collect every slot by adopting).
pub fn may_hold_one_more(
    cfg: &PtyConfig,
    caller: &str,
    running_of_caller: usize,
) -> Result<(), String> {
    let per_caller = cfg.max_sessions_per_caller as usize;
    if running_of_caller >= per_caller {
        return Err(format!(
            "max pty sessions per caller reached ({running_of_caller} running for caller {caller:?} of pty.max_sessions_per_caller = {per_caller}): close one with shell::pty::close, or raise pty.max_sessions_per_caller"
        ));
    }
    Ok(())
}

/// Whether `caller` may adopt session `id`, which `holder` holds (`pty.adopt`). The refusal
/// is an S210, like adopt's other rules.
pub fn may_adopt(mode: PtyAdopt, id: &str, holder: &str, caller: &str) -> Result<(), String> {
    match mode {
        PtyAdopt::Any => Ok(()),
        PtyAdopt::Opener if holder == caller => Ok(()),
        PtyAdopt::Opener => Err(format!(
            "pty session {id} is held by another engine worker: with pty.adopt: opener only the worker that opened it (or last attached to it) may adopt it"
        )),
        PtyAdopt::Off => Err(
            "shell::pty::adopt is turned off on this worker (pty.adopt: off): a session is taken back only with its reconnect token (shell::pty::attach)".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(max: u32, per: u32) -> PtyConfig {
        PtyConfig {
            max_sessions: max,
            max_sessions_per_caller: per,
            ..PtyConfig::default()
        }
    }

    fn census(running: usize, mine: usize, exited: usize) -> Census {
        Census {
            running,
            running_of_caller: mine,
            exited,
        }
    }

    #[test]
    fn admission() {
        let c = cfg(4, 2);
        assert_eq!(admit(&c, "w", &census(0, 0, 0)), Admission::Open);
        assert_eq!(admit(&c, "w", &census(1, 1, 2)), Admission::Open);
        // Exited sessions make room.
        assert_eq!(
            admit(&c, "w", &census(1, 1, 3)),
            Admission::EvictOldestExited
        );
        assert_eq!(
            admit(&c, "w", &census(3, 1, 1)),
            Admission::EvictOldestExited
        );
        // The caller's own cap comes first.
        assert_eq!(
            admit(&c, "w", &census(2, 2, 0)),
            Admission::Refuse("max pty sessions per caller reached (2 running for caller \"w\" of pty.max_sessions_per_caller = 2): close one with shell::pty::close, or raise pty.max_sessions_per_caller".into())
        );
        assert_eq!(
            admit(&c, "x", &census(4, 1, 0)),
            Admission::Refuse("max pty sessions reached (4 of pty.max_sessions = 4): close one with shell::pty::close, or raise pty.max_sessions".into())
        );
        // A cap above the total is the total.
        assert_eq!(
            admit(&cfg(2, 16), "", &census(2, 2, 0)),
            Admission::Refuse("max pty sessions reached (2 of pty.max_sessions = 2): close one with shell::pty::close, or raise pty.max_sessions".into())
        );
        assert!(matches!(
            admit(&cfg(0, 1), "", &census(0, 0, 0)),
            Admission::Refuse(_)
        ));
    }

    #[test]
    fn one_more() {
        let c = cfg(4, 2);
        assert_eq!(may_hold_one_more(&c, "w", 1), Ok(()));
        assert_eq!(
            may_hold_one_more(&c, "w", 2),
            Err("max pty sessions per caller reached (2 running for caller \"w\" of pty.max_sessions_per_caller = 2): close one with shell::pty::close, or raise pty.max_sessions_per_caller".into())
        );
    }

    #[test]
    fn adoption() {
        assert_eq!(may_adopt(PtyAdopt::Any, "s", "a", "b"), Ok(()));
        assert_eq!(may_adopt(PtyAdopt::Opener, "s", "a", "a"), Ok(()));
        assert_eq!(may_adopt(PtyAdopt::Opener, "s", "", ""), Ok(()));
        assert_eq!(
            may_adopt(PtyAdopt::Opener, "s", "a", "b"),
            Err("pty session s is held by another engine worker: with pty.adopt: opener only the worker that opened it (or last attached to it) may adopt it".into())
        );
        assert_eq!(
            may_adopt(PtyAdopt::Off, "s", "a", "a"),
            Err("shell::pty::adopt is turned off on this worker (pty.adopt: off): a session is taken back only with its reconnect token (shell::pty::attach)".into())
        );
    }
}
