//! A started command: its root process, tree, and output collectors.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::AsyncWriteExt;

use crate::capture::Collector;
use crate::prepare::{spawn_error, Prepared, PreparedForPrestarted};
use iii_shell_files::error::ExecError;
use iii_shell_launch::cgroups::JobCgroup;
use iii_shell_launch::prestarted::{ChildMemory, Outcome, Prestarted, CONFIRM_EXEC};
use iii_shell_launch::reaper::ROOTS;
use iii_shell_launch::reaper::{self, ExitStatus};
use iii_shell_launch::spawn::Child;
use iii_shell_launch::tree::JobTree;

pub struct Running {
    pid: i32,
    pidfd: AsyncFd<OwnedFd>,
    pub tree: Arc<JobTree>,
    pub status: Option<ExitStatus>,
    /// What a pre-started process needs until it has exec'd (see `prestarted`).
    prestarted: Option<ChildMemory>,
    /// Set when the root has been reaped and it was a pre-started process that failed to
    /// exec the command (the spawn error a plain spawn would have returned).
    pub exec_failure: Option<std::io::Error>,
    /// Set when the root was a pre-started process that died before it received the
    /// command: nothing ran.
    pub never_started: bool,
    /// A pre-started root's hand-over socket: end-of-file once it has exec'd or exited (see
    /// [`Running::confirm_exec`]).
    handover: Option<OwnedFd>,
}

/// What became of a command handed to a pre-started process, once it has exec'd or exited.
#[derive(Debug)]
pub enum Confirmed {
    /// The command runs (or ran).
    Running,
    /// The exec failed: the spawn error; the process has been reaped.
    ExecFailed(std::io::Error),
    /// The process died before it received the command: nothing ran; it has been reaped.
    NeverStarted,
}

/// Hands a command to the pre-started process `prestarted`. `None` when it could not take it (the
/// caller starts the command the ordinary way then; nothing has run). With `confirm`, the
/// returned root keeps its hand-over socket for [`Running::confirm_exec`].
pub fn start_in_prestarted(
    prestarted: Prestarted,
    prepared: PreparedForPrestarted,
    cap: usize,
    confirm: bool,
) -> Option<Result<(Running, Collector, Collector), ExecError>> {
    let PreparedForPrestarted {
        image,
        cwd,
        stdin_child,
        stdin,
    } = prepared;
    let l = prestarted.launch(image, stdin_child, cwd)?;
    tracing::trace!(pid = l.pid, "command handed to a pre-started process");
    let child = Child {
        pid: l.pid,
        pidfd: l.pidfd,
        cgroup_refused_clone3: false,
    };
    Some(
        supervise(
            child,
            l.cgroup,
            Some(l.memory),
            l.stdout,
            l.stderr,
            stdin,
            cap,
        )
        .map(|(mut running, out, err)| {
            running.handover = confirm.then_some(l.handover);
            (running, out, err)
        }),
    )
}

/// Starts a prepared command the ordinary way. Returns the running root and its two output
/// pipes.
pub fn start(
    prepared: Prepared,
    program: &str,
    cap: usize,
) -> Result<(Running, Collector, Collector), ExecError> {
    let Prepared {
        plan,
        stdout,
        stderr,
        stdin,
        cgroup,
        launcher,
    } = prepared;
    let child = {
        // Hold the roots lock across the spawn so the orphan reaper never reaps a job root
        // before it is registered.
        let mut roots = ROOTS
            .lock()
            .map_err(|_| ExecError::Internal("job table poisoned".into()))?;
        let child = match launcher.spawn(&plan) {
            Ok(c) => c,
            Err(e) => {
                if let Some(cg) = cgroup {
                    let _ = cg.recycle();
                }
                return Err(spawn_error(program, &e));
            }
        };
        roots.push(child.pid);
        child
    };
    // Closes the child's ends of the pipes (and its cwd/cgroup fds) in the parent.
    drop(plan);
    if child.cgroup_refused_clone3 {
        if let Some(cg) = &cgroup {
            cg.retire();
        }
    }
    supervise(child, cgroup, None, stdout, stderr, stdin, cap)
}

/// Watches a started root: its pidfd, its tree, and its output pipes.
fn supervise(
    child: Child,
    cgroup: Option<JobCgroup>,
    prestarted: Option<ChildMemory>,
    stdout: OwnedFd,
    stderr: OwnedFd,
    stdin: Option<(OwnedFd, Vec<u8>)>,
    cap: usize,
) -> Result<(Running, Collector, Collector), ExecError> {
    let Child { pid, pidfd, .. } = child;
    let tree = Arc::new(JobTree::new(pid, cgroup));
    // The command is already running. If it cannot be watched (epoll refusing a descriptor),
    // it must not go on unwatched: its tree is killed and its root reaped before the error
    // is returned.
    let abandon = |pidfd: &OwnedFd, prestarted: Option<ChildMemory>, e: std::io::Error| {
        tracing::error!(pid, error = %e, "cannot watch a started command; killing it. The executor is short of descriptors or memory: raise LimitNOFILE, or lower max_concurrent_jobs");
        tree.kill();
        let reaped = reaper::try_reap_blocking(pidfd).is_ok();
        if let Ok(mut roots) = ROOTS.lock() {
            roots.retain(|&p| p != pid);
        }
        if let (Some(mut memory), true) = (prestarted, reaped) {
            // Reaped: the memory it ran on may be freed now.
            let _ = memory.outcome();
        }
        if reaped {
            tree.reaped.store(true, Ordering::SeqCst);
        }
        release_later(tree.clone());
        ExecError::Internal(format!("supervise: {e}"))
    };
    let collectors =
        Collector::new(stdout, cap).and_then(|out| Ok((out, Collector::new(stderr, cap)?)));
    let (out, err) = match collectors {
        Ok(c) => c,
        Err(e) => return Err(abandon(&pidfd, prestarted, e)),
    };
    // SAFETY: an OwnedFd keeps its descriptor open and unchanged for as long as the AsyncFd
    // owns it, which is what `register_with_interest` requires.
    let pidfd =
        match unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) } {
            Ok(fd) => fd,
            Err(e) => {
                let (pidfd, e) = e.into_parts();
                return Err(abandon(&pidfd, prestarted, e));
            }
        };
    let running = Running {
        pid,
        pidfd,
        tree: tree.clone(),
        status: None,
        prestarted,
        exec_failure: None,
        never_started: false,
        handover: None,
    };
    if let Some((fd, bytes)) = stdin {
        match tokio::net::unix::pipe::Sender::from_owned_fd(fd) {
            Ok(mut tx) => {
                tokio::spawn(async move {
                    // A child that exits without reading gives EPIPE; that is not an error.
                    let _ = tx.write_all(&bytes).await;
                });
            }
            Err(e) => tracing::warn!(error = %e, "stdin pipe"),
        }
    }
    Ok((running, out, err))
}

impl Running {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits for the root process to exit and reaps it. Cancel-safe.
    ///
    /// Every poll tries to reap before it looks at the pidfd's readiness, so a call made after
    /// the output pipes reached EOF reaps a root whose exit is already reported at once, with
    /// no further wake-up. The kernel closes a process's files before it reports its exit, so
    /// that is not always the case; then this blocks on the pidfd. It deliberately never
    /// spins for the exit: a spin that yielded the CPU between tries (up to 50 µs) cost on
    /// every kind of host. On a busy one a yield puts the executor behind a CPU-bound process
    /// until the next tick (calls 0.5 ms slower at p50 with a busy loop per vCPU); on a quiet
    /// one spaced calls were 50–70 µs slower at p50 (BENCHMARKS.md, sixth session).
    pub async fn wait(&mut self) -> ExitStatus {
        if let Some(st) = self.status {
            return st;
        }
        let (pid, pidfd) = (self.pid, &self.pidfd);
        let st: (ExitStatus, bool) = std::future::poll_fn(|cx| loop {
            match reaper::try_reap(pidfd.get_ref()) {
                Ok(Some(st)) => return Poll::Ready((st, true)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(pid, error = %e, "cannot reap a command");
                    return Poll::Ready((ExitStatus::Signaled(0), false));
                }
            }
            match pidfd.poll_read_ready(cx) {
                Poll::Ready(Ok(mut guard)) => guard.clear_ready(),
                Poll::Ready(Err(e)) => {
                    tracing::warn!(pid, error = %e, "cannot wait for a command");
                    return Poll::Ready((ExitStatus::Signaled(0), false));
                }
                Poll::Pending => return Poll::Pending,
            }
        })
        .await;
        self.finish(st.0, st.1);
        st.0
    }

    /// Records the root's end. `reaped` is false when waiting failed instead: a pre-started
    /// root's memory is then never freed (see `prestarted::ChildMemory`).
    fn finish(&mut self, st: ExitStatus, reaped: bool) {
        self.status = Some(st);
        if let (Some(memory), true) = (self.prestarted.as_mut(), reaped) {
            match memory.outcome() {
                Outcome::Took => {}
                Outcome::ExecFailed(e) => self.exec_failure = Some(e),
                Outcome::NeverStarted => self.never_started = true,
            }
        }
        self.tree.reaped.store(true, Ordering::SeqCst);
        if let Ok(mut roots) = ROOTS.lock() {
            roots.retain(|&p| p != self.pid);
        }
    }

    /// For a root that is a pre-started process: waits until it has exec'd the command or
    /// exited (its hand-over socket reaches end-of-file, at most
    /// [`iii_shell_launch::prestarted::CONFIRM_EXEC`]), and says which. A plain spawn reports a
    /// failed exec before it returns, so its root is `Running` at once, and so is a root with no
    /// end-of-file in time (still in `execve`, or stopped before it took the command): its
    /// block is not final then, so it is not read, its memory stays with this root until it is
    /// reaped, and a failure shows as its exit.
    pub async fn confirm_exec(&mut self) -> Confirmed {
        let Some(sock) = self.handover.take() else {
            return Confirmed::Running;
        };
        if !handover_closed(sock).await {
            return Confirmed::Running;
        }
        match self.prestarted.as_ref().map(ChildMemory::peek) {
            Some(Outcome::ExecFailed(_) | Outcome::NeverStarted) => {}
            Some(Outcome::Took) | None => return Confirmed::Running,
        }
        // It is exiting: reap it, and let `finish` read its block once more.
        self.wait().await;
        if let Some(e) = self.exec_failure.take() {
            return Confirmed::ExecFailed(e);
        }
        if self.never_started {
            return Confirmed::NeverStarted;
        }
        Confirmed::Running
    }

    /// Waits at most `limit` for the root to exit.
    pub async fn wait_for(&mut self, limit: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(limit, self.wait()).await.ok()
    }
}

/// Waits for a pre-started process's hand-over socket to reach end-of-file (it has exec'd or
/// exited: its end is close-on-exec, and it never writes), at most
/// [`iii_shell_launch::prestarted::CONFIRM_EXEC`]. False when that passed first or the socket
/// cannot be watched: the child may still be on the memory it was started on.
pub async fn handover_closed(sock: OwnedFd) -> bool {
    // SAFETY: the OwnedFd keeps its descriptor open and unchanged for as long as the AsyncFd
    // owns it, which is what `register_with_interest` requires.
    match unsafe { AsyncFd::register_with_interest(sock, tokio::io::Interest::READABLE) } {
        Ok(fd) => tokio::time::timeout(CONFIRM_EXEC, fd.readable())
            .await
            .is_ok_and(|r| r.is_ok()),
        Err(e) => {
            let (_, e) = e.into_parts();
            tracing::debug!(error = %e, "cannot watch a hand-over socket");
            false
        }
    }
}

/// Removes the job's cgroup once its processes are gone, retrying in the background.
pub fn release_later(tree: Arc<JobTree>) {
    if tree.release() {
        return;
    }
    tokio::spawn(async move {
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if tree.release() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use iii_shell_launch::spawn::{open_dev_null, pipe, SpawnPlan};
    use iii_shell_launch::{Launcher, Settings};

    /// A command that cannot be watched (here: epoll refuses a regular file as its stdout
    /// pipe) is killed and reaped, not left running unwatched.
    #[tokio::test]
    async fn a_command_that_cannot_be_watched_is_killed_and_reaped() {
        let (_out_r, out_w) = pipe().unwrap();
        let plan = SpawnPlan::new(
            "/bin/sleep",
            &["sleep".to_string(), "30".to_string()],
            Vec::<(String, String)>::new(),
            open_dev_null().unwrap(),
            out_w,
            open_dev_null().unwrap(),
        )
        .unwrap();
        let child = Launcher::new(Settings::plain()).spawn(&plan).unwrap();
        drop(plan);
        let pid = child.pid;
        let unwatchable: OwnedFd = std::fs::File::open("/proc/self/exe").unwrap().into();
        let (err_r, err_w) = pipe().unwrap();
        drop(err_w);
        let r = supervise(child, None, None, unwatchable, err_r, None, 1024);
        let Err(e) = r else {
            panic!("a regular file cannot be watched with epoll")
        };
        assert!(e.to_string().contains("supervise"), "{e}");
        // Killed and reaped: the pid is gone (not even a zombie).
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} is still there"
        );
        assert!(ROOTS.lock().unwrap().iter().all(|&p| p != pid));
    }
}
