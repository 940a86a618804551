//! `shell::exec`: run one command in the foreground under a deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use iii_shell_protocol::exec::ExecResponse;
use iii_shell_protocol::messages::ExecSpec;
use tokio::sync::Notify;

use crate::command;
use crate::error::ExecError;
use crate::policy::Policy;
use crate::running::{release_later, start};
use crate::tree::JobTree;

/// How long output is still collected after the tree was killed, for holders outside it.
const DRAIN_AFTER_KILL: Duration = Duration::from_millis(200);

enum Outcome {
    Completed,
    TimedOut,
    Cancelled,
}

/// Runs `spec` to completion, timeout or cancellation.
///
/// The call completes when the root process has exited **and** both output pipes reached
/// EOF. A descendant that keeps a pipe open keeps the call going until the deadline; then the
/// whole tree is killed and the result says `timed_out`.
pub async fn run(
    policy: Arc<Policy>,
    spec: ExecSpec,
    cancel: Arc<Notify>,
) -> Result<ExecResponse, ExecError> {
    let (result, tree) = run_then_release(policy, spec, cancel).await;
    if let Some(tree) = tree {
        release_later(tree);
    }
    result
}

/// [`run`], leaving the release of the job's cgroup to the caller: the executor does it after
/// the reply has been written, so the reply does not wait for it.
pub async fn run_then_release(
    policy: Arc<Policy>,
    spec: ExecSpec,
    cancel: Arc<Notify>,
) -> (Result<ExecResponse, ExecError>, Option<Arc<JobTree>>) {
    let mut allow_warm = true;
    loop {
        match run_inner(policy.clone(), &spec, cancel.clone(), allow_warm).await {
            Ok(Attempt::Done(r, tree)) => return (r, tree),
            Ok(Attempt::NeverStarted(tree)) => {
                // Killed while it waited, before it took the command: nothing ran, so the
                // command is started again, the ordinary way.
                tracing::debug!("a pre-started process died before it took the command");
                release_later(tree);
                allow_warm = false;
            }
            Err(e) => return (Err(e), None),
        }
    }
}

/// One attempt at running the command.
enum Attempt {
    Done(Result<ExecResponse, ExecError>, Option<Arc<JobTree>>),
    /// The pre-started process it was handed to died before taking it.
    NeverStarted(Arc<JobTree>),
}

async fn run_inner(
    policy: Arc<Policy>,
    spec: &ExecSpec,
    cancel: Arc<Notify>,
    allow_warm: bool,
) -> Result<Attempt, ExecError> {
    let timeout_ms = spec.timeout_ms.min(policy.config.max_timeout_ms);
    let cap = usize::try_from(policy.config.max_output_bytes).unwrap_or(usize::MAX);
    let entered = Instant::now();
    let warm = if timeout_ms == 0 || !allow_warm {
        None
    } else {
        policy.take_warm()
    };
    let prepared = match command::prepare_with(&policy, spec, warm.is_none()) {
        Ok(p) => p,
        Err(e) => {
            if let Some(w) = warm {
                policy.put_back_warm(w);
            }
            return Err(e);
        }
    };
    if timeout_ms == 0 {
        if let Some(cg) = prepared.cgroup {
            let _ = cg.recycle();
        }
        return Ok(Attempt::Done(Ok(ExecResponse::timed_out_empty(0)), None));
    }
    let started = Instant::now();
    let deadline = tokio::time::Instant::from_std(started + Duration::from_millis(timeout_ms));
    let (mut running, mut out, mut err) = start(prepared, &spec.argv[0], cap, warm)?;
    let spawned = started.elapsed();

    let outcome = tokio::select! {
        // Output first: the pipes reach EOF when the whole tree has closed them, which for
        // almost every command is the moment the root exits; then the root is reaped, most
        // often without another wake-up (see `reap_soon`).
        _ = async {
            tokio::join!(out.pump(), err.pump());
            if !running.reap_soon() {
                running.wait().await;
            }
        } => Outcome::Completed,
        _ = tokio::time::sleep_until(deadline) => Outcome::TimedOut,
        _ = cancel.notified() => Outcome::Cancelled,
    };
    let mut duration = started.elapsed();
    tracing::trace!(
        prepare_us = started.duration_since(entered).as_micros() as u64,
        spawn_us = spawned.as_micros() as u64,
        run_us = duration.as_micros() as u64,
        "exec stages"
    );
    if !matches!(outcome, Outcome::Completed) {
        running.tree.kill();
        if running.wait_for(Duration::from_secs(5)).await.is_none() {
            tracing::error!(pid = running.pid(), "process did not die after SIGKILL");
        }
        duration = started.elapsed();
        let _ = tokio::time::timeout(DRAIN_AFTER_KILL, async {
            tokio::join!(out.pump(), err.pump())
        })
        .await;
        out.abandon();
        err.abandon();
    }
    if running.never_started && matches!(outcome, Outcome::Completed) {
        return Ok(Attempt::NeverStarted(running.tree.clone()));
    }
    let tree = Some(running.tree.clone());
    if let Some(e) = running.exec_failure.take() {
        // A pre-started process could not exec the command: the same error a spawn gives.
        return Ok(Attempt::Done(
            Err(command::spawn_error(&spec.argv[0], &e)),
            tree,
        ));
    }
    if matches!(outcome, Outcome::Cancelled) {
        return Ok(Attempt::Done(
            Err(ExecError::Internal("call cancelled".into())),
            tree,
        ));
    }
    let timed_out = matches!(outcome, Outcome::TimedOut);
    let response = ExecResponse {
        stdout: out.capture.text(),
        stderr: err.capture.text(),
        exit_code: if timed_out {
            None
        } else {
            running.status.and_then(|s| s.code())
        },
        timed_out,
        stdout_truncated: out.capture.truncated,
        stderr_truncated: err.capture.truncated,
        duration_ms: duration.as_millis() as u64,
    };
    Ok(Attempt::Done(Ok(response), tree))
}
