//! `shell::exec`: run one command in the foreground under a deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use iii_shell_protocol::exec::ExecResponse;
use iii_shell_protocol::messages::ExecSpec;
use tokio::sync::Notify;

use crate::capture::Collector;
use crate::policy::Policy;
use crate::prepare;
use crate::started::{release_later, start, start_in_prestarted, Running};
use iii_shell_files::error::ExecError;
use iii_shell_launch::tree::JobTree;
use iii_shell_protocol::call_trace;

/// How long output is still collected after the tree was killed, for holders outside it.
const DRAIN_AFTER_KILL: Duration = Duration::from_millis(200);

/// How long the output pipes are still read once the root process has exited. A descendant
/// that still holds them after that (`sh -c 'sleep 20 & echo done'`) does not keep the call
/// going: the rest of the tree is killed and the call answers with the root's exit code and
/// the output read so far. (Codex uses the same 2 s.) Background jobs use it too.
pub const ROOT_EXIT_DRAIN: Duration = Duration::from_secs(2);

/// Marks a traced step failed with `e`'s code, and passes `e` on.
fn failed(span: Option<call_trace::Span>, e: ExecError) -> ExecError {
    if let Some(mut s) = span {
        s.fail(e.code().as_str());
    }
    e
}

enum Outcome {
    /// The root exited and both pipes reached EOF.
    Completed,
    /// The root exited, but something else still held a pipe after [`ROOT_EXIT_DRAIN`].
    RootExited,
    TimedOut,
    Cancelled,
}

impl Outcome {
    fn name(&self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::RootExited => "root_exited",
            Outcome::TimedOut => "timed_out",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// Runs `spec` to completion, timeout or cancellation.
///
/// The call completes when the root process has exited and both output pipes reached EOF,
/// or [`ROOT_EXIT_DRAIN`] after the root exited, whichever comes first. Either way, whatever
/// is left of the tree then is killed, as on a timeout (`shell::exec_bg` is the way to leave
/// something running).
pub async fn run(
    policy: Arc<Policy>,
    spec: ExecSpec,
    cancel: Arc<Notify>,
) -> Result<ExecResponse, ExecError> {
    let (result, spent) = run_then_release(policy, spec, cancel).await;
    spent.release();
    result
}

/// What a finished command still holds: its descriptors (pipes, pidfd), the memory a
/// pre-started process ran on, and its job's cgroup. [`Spent::release`] lets go of them; the
/// executor calls it after the reply has been written, so the reply does not wait for the
/// closes, the epoll removals and the cgroup's recycling.
#[derive(Default)]
pub struct Spent {
    tree: Option<Arc<JobTree>>,
    held: Option<Box<(Running, Collector, Collector)>>,
}

impl Spent {
    pub fn release(self) {
        drop(self.held);
        if let Some(tree) = self.tree {
            // The root has exited: nothing of its tree may outlive the call.
            tree.kill_leftovers(false);
            release_later(tree);
        }
    }
}

/// [`run`], leaving [`Spent::release`] to the caller.
pub async fn run_then_release(
    policy: Arc<Policy>,
    spec: ExecSpec,
    cancel: Arc<Notify>,
) -> (Result<ExecResponse, ExecError>, Spent) {
    // The first command of a policy waits for its ruleset (the walk for protected entries),
    // unless the call is cancelled meanwhile.
    let ready = tokio::select! {
        r = policy.commands_ready() => r,
        _ = cancel.notified() => Err(ExecError::Internal("call cancelled".into())),
    };
    if let Err(e) = ready {
        return (Err(e), Spent::default());
    }
    let mut allow_prestarted = true;
    loop {
        match run_inner(policy.clone(), &spec, cancel.clone(), allow_prestarted).await {
            Ok(Attempt::Done(r, spent)) => return (r, spent),
            Ok(Attempt::NeverStarted(tree)) => {
                // Killed while it waited, before it took the command: nothing ran, so the
                // command is started again, the ordinary way.
                tracing::debug!("a pre-started process died before it took the command");
                if let Some(tree) = tree {
                    release_later(tree);
                }
                allow_prestarted = false;
            }
            Err(e) => return (Err(e), Spent::default()),
        }
    }
}

/// One attempt at running the command.
enum Attempt {
    Done(Result<ExecResponse, ExecError>, Spent),
    /// The pre-started process it was handed to died before taking it (its tree), or could
    /// not be handed the command at all (None).
    NeverStarted(Option<Arc<JobTree>>),
}

async fn run_inner(
    policy: Arc<Policy>,
    spec: &ExecSpec,
    cancel: Arc<Notify>,
    allow_prestarted: bool,
) -> Result<Attempt, ExecError> {
    let timeout_ms = spec.timeout_ms.min(policy.config.max_timeout_ms);
    let cap = usize::try_from(policy.config.max_output_bytes).unwrap_or(usize::MAX);
    let entered = Instant::now();
    let prestarted =
        if timeout_ms == 0 || !allow_prestarted || !prepare::takes_prestarted(&policy, spec) {
            None
        } else {
            policy.take_prestarted()
        };
    let started;
    // Traced requests: the re-checks and confinement setup, the spawn, the wait.
    let mut prep_span = call_trace::start("exec.prepare");
    let mut spawn_span;
    let (mut running, mut out, mut err) = match prestarted {
        Some(w) => {
            if let Some(s) = prep_span.as_mut() {
                s.attr("iii.shell.prestarted", true);
            }
            let prepared = match prepare::prepare_for_prestarted(&policy, spec) {
                Ok(p) => p,
                Err(e) => {
                    policy.put_back_prestarted(w);
                    return Err(failed(prep_span, e));
                }
            };
            drop(prep_span);
            spawn_span = call_trace::start("exec.spawn");
            started = Instant::now();
            match start_in_prestarted(w, prepared, cap, false) {
                Some(r) => r.map_err(|e| failed(spawn_span.take(), e))?,
                None => {
                    // The pre-started process was gone: the call spawns afresh, under a
                    // second exec.spawn span. This one says why it has no process.
                    if let Some(s) = spawn_span.as_mut() {
                        s.attr("iii.shell.outcome", "never_started");
                    }
                    return Ok(Attempt::NeverStarted(None));
                }
            }
        }
        None => {
            if let Some(s) = prep_span.as_mut() {
                s.attr("iii.shell.prestarted", false);
            }
            let prepared =
                prepare::prepare(&policy, spec).map_err(|e| failed(prep_span.take(), e))?;
            drop(prep_span);
            if timeout_ms == 0 {
                if let Some(cg) = prepared.cgroup {
                    let _ = cg.recycle();
                }
                return Ok(Attempt::Done(
                    Ok(ExecResponse::timed_out_empty(0)),
                    Spent::default(),
                ));
            }
            spawn_span = call_trace::start("exec.spawn");
            started = Instant::now();
            start(prepared, &spec.argv[0], cap).map_err(|e| failed(spawn_span.take(), e))?
        }
    };
    if let Some(s) = spawn_span.as_mut() {
        s.attr("process.pid", running.pid());
    }
    drop(spawn_span);
    let mut wait_span = call_trace::start("exec.wait");
    let deadline = tokio::time::Instant::from_std(started + Duration::from_millis(timeout_ms));
    let spawned = started.elapsed();
    // When the root was reaped: `duration_ms` runs from spawn to the root's exit, not to the
    // end of the drain after it (a grandchild may hold the pipes for ROOT_EXIT_DRAIN more).
    let mut exited_after: Option<Duration> = None;

    let outcome = tokio::select! {
        // Output first: the pipes reach EOF when the whole tree has closed them, which for
        // almost every command is the moment the root exits; then the root is reaped, at once
        // if its exit is already reported, else on the pidfd's wake-up (see `Running::wait`).
        // If the root exits while something else still holds a pipe, the pipes get
        // ROOT_EXIT_DRAIN more.
        o = async {
            let pumps = async {
                tokio::join!(out.pump(), err.pump());
            };
            tokio::pin!(pumps);
            tokio::select! {
                biased;
                _ = &mut pumps => {
                    running.wait().await;
                    exited_after = Some(started.elapsed());
                    Outcome::Completed
                }
                _ = running.wait() => {
                    exited_after = Some(started.elapsed());
                    match tokio::time::timeout(ROOT_EXIT_DRAIN, &mut pumps).await {
                        Ok(()) => Outcome::Completed,
                        Err(_) => Outcome::RootExited,
                    }
                }
            }
        } => o,
        _ = tokio::time::sleep_until(deadline) => Outcome::TimedOut,
        _ = cancel.notified() => Outcome::Cancelled,
    };
    // The deadline came while the pipes were drained after the root's exit: the command
    // itself finished, so its exit code stands.
    let outcome = match outcome {
        Outcome::TimedOut if running.status.is_some() => Outcome::RootExited,
        o => o,
    };
    let mut duration = exited_after.unwrap_or_else(|| started.elapsed());
    tracing::trace!(
        prepare_us = started.duration_since(entered).as_micros() as u64,
        spawn_us = spawned.as_micros() as u64,
        run_us = duration.as_micros() as u64,
        "exec stages"
    );
    if !matches!(outcome, Outcome::Completed) {
        running.tree.kill();
        if running.wait_for(Duration::from_secs(5)).await.is_none() {
            tracing::error!(pid = running.pid(), "process did not die after SIGKILL; check for a process stuck in the kernel (state D) in its cgroup");
        }
        if !matches!(outcome, Outcome::RootExited) {
            duration = started.elapsed();
        }
        let _ = tokio::time::timeout(DRAIN_AFTER_KILL, async {
            tokio::join!(out.pump(), err.pump())
        })
        .await;
        out.abandon();
        err.abandon();
    }
    if running.never_started && matches!(outcome, Outcome::Completed | Outcome::RootExited) {
        return Ok(Attempt::NeverStarted(Some(running.tree.clone())));
    }
    let exec_failure = running.exec_failure.take();
    let spent = |running: Running, out, err| Spent {
        tree: Some(Arc::clone(&running.tree)),
        held: Some(Box::new((running, out, err))),
    };
    if let Some(e) = exec_failure {
        // A pre-started process could not exec the command: the same error a spawn gives.
        return Ok(Attempt::Done(
            Err(prepare::spawn_error(&spec.argv[0], &e)),
            spent(running, out, err),
        ));
    }
    if matches!(outcome, Outcome::Cancelled) {
        return Ok(Attempt::Done(
            Err(ExecError::Internal("call cancelled".into())),
            spent(running, out, err),
        ));
    }
    let timed_out = matches!(outcome, Outcome::TimedOut);
    if let Some(s) = wait_span.as_mut() {
        s.attr("iii.shell.outcome", outcome.name());
        s.attr("iii.shell.timed_out", timed_out);
        if let Some(c) = running
            .status
            .and_then(|st| st.code())
            .filter(|_| !timed_out)
        {
            s.attr("iii.shell.exit_code", c);
        }
    }
    drop(wait_span);
    let mut stderr = err.capture.text();
    // The kernel killed a process of it at its memory limit: the caller is told so.
    if let Some(limit) = running.tree.memory_limit_hit() {
        let line =
            crate::limit_reason::memory_killed(limit, spec.limits.memory_max_bytes.is_some());
        crate::limit_reason::append(&mut stderr, &line);
    }
    let response = ExecResponse {
        stdout: out.capture.text(),
        stderr,
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
    Ok(Attempt::Done(Ok(response), spent(running, out, err)))
}
