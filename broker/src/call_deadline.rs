//! How long the broker waits for the executor's answer to one request.
//!
//! Every broker → executor call has a deadline, so a stopped (SIGSTOP), wedged or lost
//! executor can never hold a caller for good: a call with its own timeout (a foreground
//! command) gets that timeout plus [`CallBounds::margin`] (the kill, the pipe drain and the
//! reply); every other call gets the fixed [`CallBounds::fixed`]. The one request without a
//! deadline is the terminal-output subscription, which lives as long as the connection.
//! Streams are bounded by the same fixed bound per chunk: an output stream whose next chunk
//! does not come, or an input stream whose next credit does not come, within it fails.
//!
//! Past its deadline a call fails with S216 ([`no_answer`]) and is cancelled on the executor
//! (a foreground command is killed once the executor runs again).

use std::time::Duration;

use iii_shell_protocol::messages::Request;
use iii_shell_protocol::{Code, WireError};

/// The deadlines of broker → executor calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallBounds {
    /// The deadline of a call that has no timeout of its own, and the longest wait for one
    /// chunk (or one credit) of a stream.
    pub fixed: Duration,
    /// Added to a foreground command's own timeout: the kill of its tree, the drain of its
    /// pipes (at most 2.2 s) and the reply.
    pub margin: Duration,
}

impl CallBounds {
    /// 60 s for calls without a timeout (a search of a large tree, the first command after a
    /// policy change waiting for the walk of one,
    /// `doctor`'s probes), 10 s beyond a command's own timeout.
    pub const DEFAULT: CallBounds = CallBounds {
        fixed: Duration::from_secs(60),
        margin: Duration::from_secs(10),
    };

    /// The deadline of `request`, or `None` for the one request that has none.
    pub fn deadline(&self, request: &Request) -> Option<Duration> {
        match request {
            Request::Exec(spec) => Some(Duration::from_millis(spec.timeout_ms) + self.margin),
            Request::PtySubscribe => None,
            _ => Some(self.fixed),
        }
    }
}

impl Default for CallBounds {
    fn default() -> Self {
        CallBounds::DEFAULT
    }
}

/// The error of a call whose deadline passed.
pub fn no_answer(kind: &str, bound: Duration) -> WireError {
    WireError::new(
        Code::S216,
        format!(
            "the executor did not answer this {kind} request within {} ms, so it was cancelled: \
             the executor is stopped, wedged or overloaded (check its process, e.g. \
             `iii-shell doctor` or `systemctl status iii-shell-executor`)",
            bound.as_millis()
        ),
    )
}

/// The error of a call that waited its whole deadline for a restarting executor to come
/// back, and none did.
pub fn no_executor(kind: &str, bound: Duration) -> WireError {
    WireError::new(
        Code::S216,
        format!(
            "no executor took this {kind} request within {} ms: the executor went away and \
             its replacement has not started (check the worker's log for why the executor \
             died and whether a new one is starting)",
            bound.as_millis()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use iii_shell_protocol::fs::FsOp;
    use iii_shell_protocol::messages::ExecSpec;
    use iii_shell_protocol::pty::PtyOp;

    fn exec(timeout_ms: u64) -> Request {
        Request::Exec(ExecSpec {
            argv: vec!["true".into()],
            cwd: None,
            env: vec![],
            stdin: None,
            timeout_ms,
            network: None,
            limits: Default::default(),
        })
    }

    #[test]
    fn deadlines_by_request() {
        let b = CallBounds::DEFAULT;
        assert_eq!(b.deadline(&exec(30_000)), Some(Duration::from_secs(40)));
        assert_eq!(b.deadline(&exec(0)), Some(Duration::from_secs(10)));
        assert_eq!(b.deadline(&Request::Ping), Some(Duration::from_secs(60)));
        assert_eq!(
            b.deadline(&Request::Fs(FsOp::Stat { path: "/x".into() })),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            b.deadline(&Request::Pty(PtyOp::Sessions)),
            Some(Duration::from_secs(60))
        );
        assert_eq!(b.deadline(&Request::PtySubscribe), None);
        // A background job's timeout is the job's, not the call's: its start is bounded.
        let Request::Exec(spec) = exec(3_600_000) else {
            unreachable!()
        };
        assert_eq!(
            b.deadline(&Request::ExecBg(spec)),
            Some(Duration::from_secs(60))
        );
        let short = CallBounds {
            fixed: Duration::from_millis(300),
            margin: Duration::from_millis(50),
        };
        assert_eq!(
            short.deadline(&exec(1_000)),
            Some(Duration::from_millis(1_050))
        );
        assert_eq!(
            short.deadline(&Request::JobList),
            Some(Duration::from_millis(300))
        );
    }

    #[test]
    fn the_error_names_the_request_and_the_bound() {
        let e = no_answer("fs", Duration::from_millis(1500));
        assert_eq!(e.code, Code::S216);
        assert!(
            e.message
                .starts_with("the executor did not answer this fs request within 1500 ms"),
            "{}",
            e.message
        );
    }
}
