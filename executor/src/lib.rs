//! The executor: the half of iii-shell that acts.
//!
//! It accepts typed requests from the broker over a Unix socket, re-checks every one of them
//! against the policy it was given (argv rules, denylist, dangerous env keys, the path jail),
//! and only then runs commands and background jobs. It never talks to the network.

pub mod capture;
pub mod clone3;
pub mod coder;
pub mod command;
pub mod confine;
pub mod denylist;
pub mod doctor;
pub mod env_policy;
pub mod error;
pub mod fs;
pub mod jail;
pub mod jobs;
pub mod policy;
pub mod procfs;
pub mod pty;
pub mod run;
pub mod run_as;
pub mod running;
pub mod server;
pub mod spawn;
pub mod tree;
pub mod turns;
pub mod ui_state;
pub mod warm;
pub mod watch;

use std::sync::Arc;

use iii_shell_protocol::exec::StatusResponse;
use iii_shell_protocol::messages::{Event, Reply, Request};
use iii_shell_protocol::{Code, WireError};
use tokio::sync::{broadcast, Notify};

use crate::error::ExecError;
use crate::jobs::Jobs;
use crate::policy::{Policy, PolicyStore};

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
    /// The console page's per-pane state.
    pub ui_state: Arc<ui_state::UiState>,
    /// The pinned envelope: the widest policy this executor accepts.
    pub envelope: Option<iii_shell_protocol::config::Config>,
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

    pub fn with_envelope(envelope: Option<iii_shell_protocol::config::Config>) -> Self {
        let (events, _) = broadcast::channel(1024);
        Executor {
            policy: PolicyStore::default(),
            jobs: Jobs::new(events.clone()),
            pty: pty::Table::default(),
            watches: watch::Watches::new(events.clone()),
            turns: Arc::default(),
            ui_state: Arc::default(),
            events,
            envelope,
        }
    }

    fn current(&self) -> Result<Arc<Policy>, ExecError> {
        self.policy
            .get()
            .ok_or_else(|| ExecError::Internal("executor has no policy yet".into()))
    }

    /// Handles one request against one policy snapshot. Streaming requests also return the
    /// work that follows the reply.
    pub async fn handle(
        &self,
        request: Request,
        cancel: Arc<Notify>,
        io: &mut fs::RequestIo,
    ) -> (Result<Reply, WireError>, Option<fs::Continuation>) {
        if let Request::Pty(op) = request {
            return pty::handle(self, op, cancel, io).await;
        }
        if let Request::Fs(op) = request {
            return match self.current() {
                Ok(p) => {
                    // Pre-images into the open turn, if any (`turns::calls`).
                    let rec = match turns::calls::fs_call(&p, &op) {
                        Some((f, args)) if self.turns.any_open() => {
                            let (t, pp) = (self.turns.clone(), p.clone());
                            tokio::task::spawn_blocking(move || t.begin(&pp, f, args))
                                .await
                                .ok()
                                .flatten()
                        }
                        _ => None,
                    };
                    let out = fs::handle(p.clone(), op, io).await;
                    if let Some(rec) = rec {
                        let t = self.turns.clone();
                        let _ = tokio::task::spawn_blocking(move || t.finish(&p, rec)).await;
                    }
                    match out {
                        Ok((reply, cont)) => (Ok(Reply::Fs(reply)), cont),
                        Err(e) => (Err(e.to_wire()), None),
                    }
                }
                Err(e) => (Err(e.to_wire()), None),
            };
        }
        if let Request::Coder(call) = request {
            let turns = self.turns.clone();
            let result = match self.current() {
                Ok(p) => tokio::task::spawn_blocking(move || {
                    // change-diff snapshots and the open turn's pre-images live in the turn
                    // store (`coder::changes`, `turns::calls`).
                    let _bound = coder::changes::bind(turns.clone(), p.clone());
                    let rec = match turns::calls::coder_call(&p, &call) {
                        Some((f, args)) if turns.any_open() => turns.begin(&p, f, args),
                        _ => None,
                    };
                    let out = coder::handle(&p, *call);
                    if let Some(rec) = rec {
                        turns.finish(&p, rec);
                    }
                    out
                })
                .await
                .unwrap_or_else(|e| {
                    Err(WireError::new(
                        Code::C216,
                        format!("coder task failed: {e}"),
                    ))
                }),
                Err(e) => Err(iii_shell_protocol::coder::to_coder(e.to_wire())),
            };
            return (result.map(|r| Reply::Coder(Box::new(r))), None);
        }
        if let Request::Exec(spec) = request {
            let p = match self.current() {
                Ok(p) => p,
                Err(e) => return (Err(e.to_wire()), None),
            };
            let (result, spent) = run::run_then_release(p.clone(), spec, cancel).await;
            // After the reply is on its way: the command's descriptors are closed, its job's
            // cgroup goes back to the pool, and the next command process is pre-started (not
            // under a policy replaced meanwhile).
            let cont: Option<fs::Continuation> = Some(Box::pin(async move {
                spent.release();
                p.refill_warm();
            }));
            return (result.map(Reply::Exec).map_err(|e| e.to_wire()), cont);
        }
        if let Request::Turns(call) = request {
            let p = match self.current() {
                Ok(p) => p,
                Err(e) => return (Err(e.to_wire()), None),
            };
            // Store I/O (fsyncs) runs on the blocking pool, off the request path's thread.
            let turns = self.turns.clone();
            let out = tokio::task::spawn_blocking(move || {
                turns.call(&p, &call.function, &call.payload_json)
            })
            .await
            .unwrap_or_else(|e| Err(ExecError::Internal(format!("turns call failed: {e}"))))
            .map(|v| {
                Reply::Turns(iii_shell_protocol::turns::TurnsReply {
                    json: v.to_string(),
                })
            })
            .map_err(|e| e.to_wire());
            return (out, None);
        }
        if let Request::UiState(op) = request {
            let p = match self.current() {
                Ok(p) => p,
                Err(e) => return (Err(e.to_wire()), None),
            };
            let store = self.ui_state.clone();
            let out = tokio::task::spawn_blocking(move || {
                let dir = ui_state::store_dir(&p.config.turns.data_dir);
                store.handle(&dir, op)
            })
            .await
            .unwrap_or_else(|e| Err(ExecError::Internal(format!("ui-state call failed: {e}"))))
            .map(Reply::UiState)
            .map_err(|e| e.to_wire());
            return (out, None);
        }
        if let Request::Doctor = request {
            let envelope = self.envelope.as_ref().map(|e| {
                let roots = if e.fs.host_roots.is_empty() {
                    "unjailed".to_string()
                } else {
                    e.fs.host_roots.join(", ")
                };
                format!(
                    "pinned: roots {roots}; capabilities {:?}; seccomp_allow {:?}; mode {:?}",
                    e.confinement.capabilities, e.confinement.seccomp_allow, e.confinement.mode
                )
            });
            let mut report = doctor::report(self.policy.get(), envelope).await;
            let r = self.jobs.retained();
            report.jobs = iii_shell_protocol::doctor::JobsReport {
                running: r.running as u64,
                finished: r.finished as u64,
                finished_bytes: r.finished_bytes as u64,
                finished_max: jobs::FINISHED_MAX as u64,
                finished_max_bytes: jobs::FINISHED_MAX_BYTES as u64,
                evicted: r.evicted,
            };
            return (Ok(Reply::Doctor(Box::new(report))), None);
        }
        (self.handle_simple(request).await, None)
    }

    async fn handle_simple(&self, request: Request) -> Result<Reply, WireError> {
        let r = match request {
            Request::Fs(_)
            | Request::Doctor
            | Request::Exec(_)
            | Request::Coder(_)
            | Request::Pty(_)
            | Request::Turns(_)
            | Request::UiState(_) => Err(ExecError::Internal("unreachable".into())),
            Request::Watch(op) => match op {
                iii_shell_protocol::watch::WatchOp::Start {
                    binding_id,
                    path,
                    include_ignored,
                } => match self.current() {
                    Ok(p) => self
                        .watches
                        .start(p, &binding_id, &path, include_ignored)
                        .map(Reply::Watch),
                    Err(e) => Err(e),
                },
                iii_shell_protocol::watch::WatchOp::Stop { binding_id } => {
                    Ok(Reply::Watch(self.watches.stop(&binding_id)))
                }
            },
            Request::Ping => Ok(Reply::Pong),
            Request::SetPolicy { generation, .. }
                if self.policy.get().is_some_and(|p| p.generation > generation) =>
            {
                // A stale policy (a respawn racing a reload): keep the newer one.
                let current = self
                    .policy
                    .get()
                    .map(|p| p.generation)
                    .unwrap_or(generation);
                tracing::debug!(generation, current, "ignoring a stale policy");
                Ok(Reply::PolicyAccepted {
                    generation: current,
                })
            }
            Request::SetPolicy {
                generation,
                config_json,
            } => {
                match Policy::build(generation, &config_json)
                    .and_then(|p| self.within_envelope(p))
                    .and_then(|p| run_as::apply(&p.config).map(|()| p))
                    .and_then(|mut p| {
                        // The first policy decides whether the executor's own filter holds
                        // the special-bits rule (then no child loads it); place it again.
                        let allow = p.config.fs.allow_special_bits;
                        let seccomp = p.config.confinement.seccomp;
                        confine::special_bits::settle(confine::special_bits::wanted(
                            allow, seccomp,
                        ));
                        p.commands.replace_special_bits(allow, seccomp).map(|()| p)
                    }) {
                    Ok(p) => {
                        tracing::info!(generation, jailed = p.jail.is_jailed(), "policy accepted");
                        self.policy.set(p);
                        if let Some(p) = self.policy.get() {
                            p.refill_warm();
                        }
                        Ok(Reply::PolicyAccepted { generation })
                    }
                    Err(e) => {
                        tracing::warn!(generation, error = %e, "policy refused");
                        return Err(WireError::new(
                            Code::S210,
                            format!("policy refused by the executor: {e}"),
                        ));
                    }
                }
            }
            Request::ExecBg(spec) => match self.current() {
                Ok(p) => self.jobs.spawn(p, spec).await.map(Reply::ExecBg),
                Err(e) => Err(e),
            },
            Request::JobStatus { job_id } => self
                .jobs
                .status(&job_id)
                .map(|job| Reply::JobStatus(StatusResponse { job })),
            Request::JobList => Ok(Reply::JobList(self.jobs.list())),
            Request::JobKill { job_id } => self.jobs.kill(&job_id).await.map(Reply::JobKill),
        };
        r.map_err(|e| e.to_wire())
    }

    fn within_envelope(&self, p: Policy) -> Result<Policy, String> {
        if let Some(env) = &self.envelope {
            let beyond = p.config.exceeds(env);
            if !beyond.is_empty() {
                return Err(format!(
                    "the pinned envelope forbids widening: {}",
                    beyond.join("; ")
                ));
            }
        }
        Ok(p)
    }

    /// Kills every job and removes job cgroups (shutdown).
    pub fn shutdown(&self) {
        self.jobs.kill_all();
        self.pty.kill_all();
        tree::kill_all_cgroups();
    }
}

/// Process-level setup shared by every way of running the executor.
pub fn prepare_process() {
    if let Err(e) = tree::become_subreaper() {
        tracing::warn!(error = %e, "cannot become a child subreaper: orphans of jobs go to init");
    }
    ensure_std_fds();
    let _ = tree::cgroup_base();
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
/// finds nothing ([`tree::reap_exited_orphans`]). Only when a job root that its supervisor has
/// not reaped yet hides the queue is it retried a little later, and then the `/proc` scan
/// ([`tree::reap_orphans`]) settles it.
pub fn spawn_orphan_reaper() {
    tokio::spawn(async {
        let Ok(mut sig) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        else {
            return;
        };
        while sig.recv().await.is_some() {
            let mut settled = false;
            for _ in 0..ORPHAN_RETRIES {
                if tree::reap_exited_orphans() == tree::OrphanCheck::Clear {
                    settled = true;
                    break;
                }
                tokio::time::sleep(ORPHAN_RETRY_PAUSE).await;
            }
            if !settled {
                let _ = tokio::task::spawn_blocking(tree::reap_orphans).await;
            }
        }
    });
}

/// How often, and how far apart, a SIGCHLD is re-checked while a job root hides the queue.
const ORPHAN_RETRIES: usize = 4;
const ORPHAN_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);
