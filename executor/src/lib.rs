//! The executor: the half of iii-shell that acts.
//!
//! It accepts typed requests from the broker over a Unix socket, re-checks every one of them
//! against the policy it was given (argv rules, denylist, dangerous env keys, the path jail),
//! and only then runs commands and background jobs. It never talks to the network.

pub mod capture;
pub mod command_ruleset;
pub mod confine;
mod dispatch;
pub mod doctor;
pub mod foreground;
pub mod job_drive;
pub mod job_io;
pub mod jobs;
pub mod limit_reason;
pub mod log_relay;
pub mod panic_reply;
pub mod policy;
pub mod prepare;
pub mod private_dir;
pub mod pty;
pub mod server;
pub mod started;
pub mod state_move;
pub mod turns;
pub mod ui_state;
pub mod usage;
pub mod warnings;
pub mod watch;

use std::sync::Arc;

use iii_shell_protocol::messages::Event;
use tokio::sync::broadcast;

use iii_shell_files::coder;
use iii_shell_launch::{reaper, Launcher, Settings};

use crate::jobs::Jobs;
use crate::policy::{Policy, PolicyStore};
use iii_shell_files::error::ExecError;

/// Shared state of one executor process.
pub struct Executor {
    pub policy: PolicyStore,
    pub jobs: Jobs,
    /// Terminal sessions.
    pub pty: pty::Table,
    pub events: broadcast::Sender<Event>,
    /// The `shell::changed` watchers, by binding id.
    pub watches: watch::Watches,
    /// The turn history store and its in-memory links.
    pub turns: Arc<turns::Turns>,
    /// The per-path locks of coder writers.
    pub edit_locks: Arc<coder::EditLocks>,
    /// The console page's per-pane state.
    pub ui_state: Arc<ui_state::UiState>,
    /// The pinned envelope: the widest policy this executor accepts.
    pub envelope: Option<iii_shell_protocol::config::Config>,
    /// The `serve` supervisor that started this executor, whose memory and CPU count in the
    /// worker's gauges (unset when it runs on its own).
    pub supervisor: std::sync::OnceLock<u32>,
    /// What the policy in force is warned about, so a policy pushed again (every
    /// `iii-shell call --socket`, every reload) does not repeat it.
    pub warnings: warnings::Standing,
    /// The same for what the policy in force is noted for at INFO (terminal sessions that
    /// are not root's, and their shell).
    pub notes: warnings::Standing,
    /// What starts every command, job and terminal: job cgroups, pre-started processes, the
    /// command user. Each accepted policy is handed it.
    pub launcher: Arc<Launcher>,
    /// The WARN and ERROR events for the broker (the relay the process's `RelayLayer` fills;
    /// a default one, which nothing fills, otherwise).
    pub log_relay: log_relay::Relay,
}

impl Default for Executor {
    fn default() -> Self {
        Self::new()
    }
}

impl Executor {
    pub fn new() -> Self {
        Self::with_envelope(None)
    }

    /// An executor with a launcher of its own ([`Settings::private`]: a job-cgroup base no
    /// other launcher of this process uses).
    pub fn with_envelope(envelope: Option<iii_shell_protocol::config::Config>) -> Self {
        Self::with_launcher(envelope, Arc::new(Launcher::new(Settings::private())))
    }

    /// An executor whose commands `launcher` starts (`iii-shell executor`: the one made at
    /// start-up, [`Settings::executor`]).
    pub fn with_launcher(
        envelope: Option<iii_shell_protocol::config::Config>,
        launcher: Arc<Launcher>,
    ) -> Self {
        let (events, _) = broadcast::channel(1024);
        Executor {
            policy: PolicyStore::default(),
            jobs: Jobs::new(events.clone()),
            pty: pty::Table::default(),
            watches: watch::Watches::new(events.clone()),
            turns: Arc::default(),
            edit_locks: Arc::default(),
            ui_state: Arc::default(),
            events,
            envelope,
            supervisor: std::sync::OnceLock::new(),
            warnings: Default::default(),
            notes: Default::default(),
            launcher,
            log_relay: Default::default(),
        }
    }

    fn current(&self) -> Result<Arc<Policy>, ExecError> {
        self.policy
            .get()
            .ok_or_else(|| ExecError::Internal("executor has no policy yet".into()))
    }

    fn within_envelope(&self, p: Policy) -> Result<Policy, String> {
        if let Some(env) = &self.envelope {
            let beyond = iii_shell_policy::widening::widening(env, &p.config);
            if !beyond.is_empty() {
                return Err(format!(
                    "the pinned envelope forbids widening: {}",
                    iii_shell_policy::widening::describe(&beyond)
                ));
            }
        }
        Ok(p)
    }

    /// Kills every job and removes job cgroups (shutdown).
    pub fn shutdown(&self) {
        self.jobs.kill_all();
        self.pty.kill_all();
        self.launcher.kill_all();
    }
}

/// Process-level setup shared by every way of running the executor; `launcher`'s job-cgroup
/// base is found or made now, while the executor still holds its capabilities.
pub fn prepare_process(launcher: &Launcher) {
    if let Err(e) = reaper::become_subreaper() {
        tracing::warn!(error = %e, "cannot become a child subreaper: orphans of jobs go to init");
    }
    ensure_std_fds();
    launcher.settle();
}

/// Makes sure fds 0, 1 and 2 are open, so no pipe we create can take one of those numbers
/// (the spawn path relies on it when it dup2s the child's stdio).
fn ensure_std_fds() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only queries; opening /dev/null has no memory effects.
        unsafe {
            if libc::fcntl(fd, libc::F_GETFD) < 0 {
                let flags = if fd == 0 {
                    libc::O_RDONLY
                } else {
                    libc::O_WRONLY
                };
                libc::open(c"/dev/null".as_ptr(), flags);
            }
        }
    }
}

/// Reaps orphans re-parented to us whenever SIGCHLD arrives.
///
/// Every command's exit raises SIGCHLD, so the common case must be cheap: one `waitid` that
/// finds nothing ([`reaper::reap_exited_orphans`]). Only when a job root that its supervisor has
/// not reaped yet hides the queue is it retried a little later, and then the `/proc` scan
/// ([`reaper::reap_orphans`]) settles it.
pub fn spawn_orphan_reaper() {
    tokio::spawn(async {
        let Ok(mut sig) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        else {
            return;
        };
        while sig.recv().await.is_some() {
            let mut settled = false;
            for _ in 0..ORPHAN_RETRIES {
                if reaper::reap_exited_orphans() == reaper::OrphanCheck::Clear {
                    settled = true;
                    break;
                }
                tokio::time::sleep(ORPHAN_RETRY_PAUSE).await;
            }
            if !settled {
                let _ = tokio::task::spawn_blocking(reaper::reap_orphans).await;
            }
        }
    });
}

/// How often, and how far apart, a SIGCHLD is re-checked while a job root hides the queue.
const ORPHAN_RETRIES: usize = 4;
const ORPHAN_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);
