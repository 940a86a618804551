//! A started command: its root process, tree, and output collectors.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::AsyncWriteExt;

use crate::capture::Collector;
use crate::command::{spawn_error, Prepared};
use crate::error::ExecError;
use crate::spawn::{self, Child, ExitStatus};
use crate::tree::{JobTree, ROOTS};

pub struct Running {
    pid: i32,
    pidfd: AsyncFd<OwnedFd>,
    pub tree: Arc<JobTree>,
    pub status: Option<ExitStatus>,
}

/// Starts a prepared command. Returns the running root and its two output pipes.
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
    } = prepared;
    let child = {
        // Hold the roots lock across the spawn so the orphan reaper never reaps a job root
        // before it is registered.
        let mut roots = ROOTS
            .lock()
            .map_err(|_| ExecError::Internal("job table poisoned".into()))?;
        let child = match spawn::spawn(&plan) {
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
    let Child { pid, pidfd } = child;
    let io = |e: std::io::Error| ExecError::Internal(format!("supervise: {e}"));
    let tree = Arc::new(JobTree::new(pid, cgroup));
    let running = Running {
        pid,
        // SAFETY: an OwnedFd keeps its descriptor open and unchanged for as long as the
        // AsyncFd owns it, which is what `register_with_interest` requires.
        pidfd: unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
            .map_err(|e| io(e.into()))?,
        tree: tree.clone(),
        status: None,
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
    let out = Collector::new(stdout, cap).map_err(io)?;
    let err = Collector::new(stderr, cap).map_err(io)?;
    Ok((running, out, err))
}

impl Running {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits for the root process to exit and reaps it. Cancel-safe.
    pub async fn wait(&mut self) -> ExitStatus {
        if let Some(st) = self.status {
            return st;
        }
        loop {
            let mut guard = match self.pidfd.readable().await {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(pid = self.pid, error = %e, "cannot wait for a command");
                    break;
                }
            };
            match spawn::try_reap(self.pidfd.get_ref()) {
                Ok(Some(st)) => {
                    self.finish(st);
                    return st;
                }
                Ok(None) => guard.clear_ready(),
                Err(e) => {
                    tracing::warn!(pid = self.pid, error = %e, "cannot reap a command");
                    break;
                }
            }
        }
        let st = ExitStatus::Signaled(0);
        self.finish(st);
        st
    }

    fn finish(&mut self, st: ExitStatus) {
        self.status = Some(st);
        self.tree.reaped.store(true, Ordering::SeqCst);
        if let Ok(mut roots) = ROOTS.lock() {
            roots.retain(|&p| p != self.pid);
        }
    }

    /// Waits at most `limit` for the root to exit.
    pub async fn wait_for(&mut self, limit: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(limit, self.wait()).await.ok()
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
