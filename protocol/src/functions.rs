//! The function table: every function id this worker registers, in registration order, with
//! the family of broker handlers that serves it and the executor request it maps to. Both
//! halves link this crate; the broker's registration (`functions::catalogue`) and dispatch
//! (`functions::dispatch`) are checked against it, so a function cannot be registered
//! without a handler nor handled without being registered:
//!
//! * the broker's dispatch looks the id up here first (an id not in the table is S210
//!   `unknown function`) and then matches [`Family`] exhaustively;
//! * `broker::functions::tests` walk the table against the registered definitions (same ids,
//!   same order) and dispatch every id, which never answers `unknown function`.
//!
//! Adding a function: its entry here, its definition (description and schemas, from its
//! request and response types) and its handler in the broker's `functions/<family>.rs`; the
//! executor's side is the [`ExecutorOp`]'s arm of its one exhaustive `match` on `Request`.

/// The broker module whose handlers serve a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Exec,
    ConfigStatus,
    Fs,
    Workspace,
    Coder,
    Pty,
    Turns,
    Ui,
    Job,
}

/// The executor request a function is served by (`Broker`: answered by the broker alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorOp {
    Broker,
    Exec,
    ExecBg,
    JobStatus,
    JobList,
    JobKill,
    Fs,
    Coder,
    Pty,
    Turns,
    UiState,
    JobStart,
    JobWrite,
    JobRead,
    JobSignal,
    JobWait,
}

impl ExecutorOp {
    /// The [`Request::kind`] of the request it sends (`None` for the broker's own). The
    /// match is exhaustive: a new operation does not compile until it names its request.
    pub fn request_kind(self) -> Option<&'static str> {
        Some(match self {
            ExecutorOp::Broker => return None,
            ExecutorOp::Exec => "exec",
            ExecutorOp::ExecBg => "exec_bg",
            ExecutorOp::JobStatus => "job_status",
            ExecutorOp::JobList => "job_list",
            ExecutorOp::JobKill => "job_kill",
            ExecutorOp::Fs => "fs",
            ExecutorOp::Coder => "coder",
            ExecutorOp::Pty => "pty",
            ExecutorOp::Turns => "turns",
            ExecutorOp::UiState => "ui_state",
            ExecutorOp::JobStart => "job_start",
            ExecutorOp::JobWrite => "job_write",
            ExecutorOp::JobRead => "job_read",
            ExecutorOp::JobSignal => "job_signal",
            ExecutorOp::JobWait => "job_wait",
        })
    }
}

/// One registered function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionEntry {
    pub id: &'static str,
    pub family: Family,
    pub executor: ExecutorOp,
}

const fn f(id: &'static str, family: Family, executor: ExecutorOp) -> FunctionEntry {
    FunctionEntry {
        id,
        family,
        executor,
    }
}

use ExecutorOp as X;
use Family as F;

/// Every function, in registration order.
pub const FUNCTIONS: &[FunctionEntry] = &[
    f("shell::exec", F::Exec, X::Exec),
    f("shell::exec_bg", F::Exec, X::ExecBg),
    f("shell::status", F::Exec, X::JobStatus),
    f("shell::list", F::Exec, X::JobList),
    f("shell::kill", F::Exec, X::JobKill),
    f("shell::config-status", F::ConfigStatus, X::Broker),
    f("shell::fs::ls", F::Fs, X::Fs),
    f("shell::fs::stat", F::Fs, X::Fs),
    f("shell::fs::mkdir", F::Fs, X::Fs),
    f("shell::fs::rm", F::Fs, X::Fs),
    f("shell::fs::chmod", F::Fs, X::Fs),
    f("shell::fs::mv", F::Fs, X::Fs),
    f("shell::fs::grep", F::Fs, X::Fs),
    f("shell::fs::sed", F::Fs, X::Fs),
    f("shell::fs::write", F::Fs, X::Fs),
    f("shell::fs::read", F::Fs, X::Fs),
    f("shell::workspace::roots", F::Workspace, X::Fs),
    f("shell::workspace::list", F::Workspace, X::Fs),
    f("shell::workspace::validate", F::Workspace, X::Fs),
    f("shell::workspace::read-bytes", F::Workspace, X::Fs),
    f("coder::info", F::Coder, X::Coder),
    f("coder::read-file", F::Coder, X::Coder),
    f("coder::search", F::Coder, X::Coder),
    f("coder::list-folder", F::Coder, X::Coder),
    f("coder::tree", F::Coder, X::Coder),
    f("coder::create-file", F::Coder, X::Coder),
    f("coder::update-file", F::Coder, X::Coder),
    f("coder::delete-file", F::Coder, X::Coder),
    f("coder::move", F::Coder, X::Coder),
    f("coder::change-diff", F::Coder, X::Coder),
    f("shell::pty::adopt", F::Pty, X::Pty),
    f("shell::pty::attach", F::Pty, X::Pty),
    f("shell::pty::close", F::Pty, X::Pty),
    f("shell::pty::detach", F::Pty, X::Pty),
    f("shell::pty::open", F::Pty, X::Pty),
    f("shell::pty::resize", F::Pty, X::Pty),
    f("shell::pty::sessions", F::Pty, X::Pty),
    f("shell::pty::write", F::Pty, X::Pty),
    f("shell::turns::on-turn-started", F::Turns, X::Turns),
    f("shell::turns::on-turn-completed", F::Turns, X::Turns),
    f("shell::turns::on-pre-trigger", F::Turns, X::Turns),
    f("shell::turns::on-post-trigger", F::Turns, X::Turns),
    f("shell::turns::list", F::Turns, X::Turns),
    f("shell::turns::get", F::Turns, X::Turns),
    f("shell::turns::revert", F::Turns, X::Turns),
    f("shell::turns::adopt-root", F::Turns, X::Turns),
    f("shell::turns::sessions", F::Turns, X::Turns),
    f("shell::ui-content", F::Ui, X::Broker),
    f("shell::ui-state::get", F::Ui, X::UiState),
    f("shell::ui-state::set", F::Ui, X::UiState),
    f("shell::job::start", F::Job, X::JobStart),
    f("shell::job::write", F::Job, X::JobWrite),
    f("shell::job::read", F::Job, X::JobRead),
    f("shell::job::signal", F::Job, X::JobSignal),
    f("shell::job::wait", F::Job, X::JobWait),
];

/// The entry of `id`, if this worker registers it.
pub fn find(id: &str) -> Option<&'static FunctionEntry> {
    FUNCTIONS.iter().find(|e| e.id == id)
}

/// A request of each kind an [`ExecutorOp`] names, for the test that the kinds are real.
#[cfg(test)]
fn sample(op: ExecutorOp) -> Option<crate::messages::Request> {
    use crate::messages::{ExecSpec, Request};
    let spec = || ExecSpec {
        argv: vec!["true".into()],
        cwd: None,
        env: Vec::new(),
        stdin: None,
        timeout_ms: 0,
        network: None,
        limits: Default::default(),
    };
    Some(match op {
        ExecutorOp::Broker => return None,
        ExecutorOp::Exec => Request::Exec(spec()),
        ExecutorOp::ExecBg => Request::ExecBg(spec()),
        ExecutorOp::JobStatus => Request::JobStatus { job_id: "j".into() },
        ExecutorOp::JobList => Request::JobList,
        ExecutorOp::JobKill => Request::JobKill { job_id: "j".into() },
        ExecutorOp::Fs => Request::Fs(crate::fs::FsOp::Stat { path: "/".into() }),
        ExecutorOp::Coder => Request::Coder(Box::new(crate::coder::CoderCall {
            scope: Default::default(),
            op: crate::coder::CoderOp::Info,
        })),
        ExecutorOp::Pty => Request::Pty(crate::pty::PtyOp::Sessions),
        ExecutorOp::Turns => Request::Turns(crate::turns::TurnsCall {
            function: "shell::turns::list".into(),
            payload_json: "{}".into(),
        }),
        ExecutorOp::UiState => Request::UiState(crate::ui_state::UiStateOp::Get {
            key: "k".into(),
            legacy_key: None,
        }),
        ExecutorOp::JobStart => Request::JobStart(spec()),
        ExecutorOp::JobWrite => Request::JobWrite {
            job_id: "j".into(),
            data: Vec::new(),
            close: true,
        },
        ExecutorOp::JobRead => Request::JobRead {
            job_id: "j".into(),
            stream: crate::job::JobStream::Merged,
            offset: 0,
            max_bytes: 1,
            wait_ms: 0,
        },
        ExecutorOp::JobSignal => Request::JobSignal {
            job_id: "j".into(),
            signal: crate::job::JobSignal::Term,
        },
        ExecutorOp::JobWait => Request::JobWait {
            job_id: "j".into(),
            timeout_ms: 0,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::Request;

    #[test]
    fn ids_are_unique_and_found() {
        for (i, e) in FUNCTIONS.iter().enumerate() {
            assert_eq!(find(e.id), Some(e), "{}", e.id);
            assert!(
                FUNCTIONS[..i].iter().all(|o| o.id != e.id),
                "{} twice",
                e.id
            );
        }
        assert_eq!(find("shell::nope"), None);
        assert_eq!(FUNCTIONS.len(), 55);
    }

    /// Each operation names the kind of the request it is served by.
    #[test]
    fn executor_ops_name_real_requests() {
        for e in FUNCTIONS {
            let kind = sample(e.executor).map(|r| match r {
                Request::Pty(_) => "pty",
                other => other.kind(),
            });
            assert_eq!(kind, e.executor.request_kind(), "{}", e.id);
        }
    }
}
