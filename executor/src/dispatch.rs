//! The executor's dispatch: every [`Request`] in one exhaustive `match`, each arm checking
//! its request against the current policy and then acting. A new request kind does not
//! compile until it has an arm here.

use std::sync::Arc;

use iii_shell_protocol::coder::CoderCall;
use iii_shell_protocol::exec::StatusResponse;
use iii_shell_protocol::fs::FsOp;
use iii_shell_protocol::messages::{ExecSpec, Reply, Request};
use iii_shell_protocol::pty::{PtyOp, PtyReply};
use iii_shell_protocol::turns::TurnsCall;
use iii_shell_protocol::ui_state::UiStateOp;
use iii_shell_protocol::watch::WatchOp;
use iii_shell_protocol::{Code, WireError};
use tokio::sync::Notify;

use crate::policy::Policy;
use crate::{confine, doctor, foreground, jobs, turns, Executor};
use iii_shell_files::error::ExecError;
use iii_shell_files::fs;

/// A reply, and for streaming requests the work that follows it.
type Handled = (Result<Reply, WireError>, Option<fs::Continuation>);

/// A reply with nothing to do after it.
fn done(r: Result<Reply, ExecError>) -> Handled {
    (r.map_err(|e| e.to_wire()), None)
}

/// After a call that may have used a pre-started process: top `policy`'s pool up, off the
/// reply's path (not under a policy replaced meanwhile: a retired one starts none).
fn refill(policy: Option<Arc<Policy>>) -> Option<fs::Continuation> {
    let p = policy?;
    Some(Box::pin(async move { p.refill_prestarted() }))
}

impl Executor {
    /// Handles one request against one policy snapshot.
    pub async fn handle(
        &self,
        request: Request,
        cancel: Arc<Notify>,
        io: &mut fs::RequestIo,
    ) -> Handled {
        match request {
            Request::SetPolicy {
                generation,
                config_json,
            } => (self.set_policy(generation, &config_json), None),
            Request::Exec(spec) => self.exec(spec, cancel).await,
            Request::ExecBg(spec) => match self.current() {
                Ok(p) => {
                    let r = self.jobs.spawn(p.clone(), spec).await;
                    (
                        r.map(Reply::ExecBg).map_err(|e| e.to_wire()),
                        refill(Some(p)),
                    )
                }
                Err(e) => done(Err(e)),
            },
            Request::JobStatus { job_id } => done(
                self.jobs
                    .status(&job_id)
                    .map(|job| Reply::JobStatus(StatusResponse { job })),
            ),
            Request::JobList => done(Ok(Reply::JobList(self.jobs.list()))),
            Request::JobKill { job_id } => done(self.jobs.kill(&job_id).await.map(Reply::JobKill)),
            Request::JobStart(spec) => match self.current() {
                Ok(p) => {
                    let r = self.jobs.start_job(p.clone(), spec, true).await;
                    (
                        r.map(Reply::JobStart).map_err(|e| e.to_wire()),
                        refill(Some(p)),
                    )
                }
                Err(e) => done(Err(e)),
            },
            Request::JobWrite {
                job_id,
                data,
                close,
            } => match self.current() {
                Ok(p) => done(
                    self.jobs
                        .write(&p, &job_id, &data, close)
                        .await
                        .map(Reply::JobWrite),
                ),
                Err(e) => done(Err(e)),
            },
            Request::JobRead {
                job_id,
                stream,
                offset,
                max_bytes,
                wait_ms,
            } => match self.current() {
                Ok(p) => {
                    let ask = crate::job_drive::ReadAsk {
                        stream,
                        offset,
                        max_bytes,
                        wait_ms,
                    };
                    done(self.jobs.read(&p, &job_id, ask).await.map(Reply::JobRead))
                }
                Err(e) => done(Err(e)),
            },
            Request::JobSignal { job_id, signal } => {
                done(self.jobs.signal(&job_id, signal).map(Reply::JobSignal))
            }
            Request::JobWait { job_id, timeout_ms } => match self.current() {
                Ok(p) => done(
                    self.jobs
                        .wait(&p, &job_id, timeout_ms)
                        .await
                        .map(|job| Reply::JobWait(StatusResponse { job })),
                ),
                Err(e) => done(Err(e)),
            },
            Request::Fs(op) => match self.current() {
                Ok(p) => {
                    let fs = p.fs.clone();
                    self.fs_call(p, fs, op, io).await
                }
                Err(e) => done(Err(e)),
            },
            Request::FsScoped { scope_root, op } => match self.current() {
                Ok(p) => self.fs_scoped_call(p, &scope_root, op, io).await,
                Err(e) => done(Err(e)),
            },
            Request::Doctor => {
                // Its probe command may have used a pre-started process: top the pool up, as
                // after any call that runs a command, off the reply's path.
                (Ok(self.doctor().await), refill(self.policy.get()))
            }
            Request::Ping => (Ok(Reply::Pong), None),
            Request::Coder(call) => (self.coder(*call).await, None),
            Request::Pty(op) => {
                let opens = matches!(op, PtyOp::Open(_));
                let policy = self.policy.get();
                let r = self.pty.handle_op(policy.clone(), op).await;
                let cont = if opens { refill(policy) } else { None };
                (r.map(Reply::Pty).map_err(|e| e.to_wire()), cont)
            }
            Request::PtySubscribe => {
                let cont = self.pty.subscribe(io, cancel);
                (Ok(Reply::Pty(PtyReply::Subscribed)), Some(cont))
            }
            Request::Watch(op) => done(self.watch(op)),
            Request::Turns(call) => done(self.turns_call(call).await),
            Request::UiState(op) => done(self.ui_state_call(op).await),
            Request::Usage => (Ok(Reply::Usage(self.usage())), None),
        }
    }

    /// `SetPolicy`: a stale generation (a respawn racing a reload) keeps the newer policy;
    /// otherwise the configuration is parsed, checked against the pinned envelope and the
    /// run-as rules, and swapped in. A policy that grants more than the previous one is
    /// logged here too, so a widening shows in the executor's own log whoever sent it.
    fn set_policy(&self, generation: u64, config_json: &str) -> Result<Reply, WireError> {
        if let Some(current) = self
            .policy
            .get()
            .map(|p| p.generation)
            .filter(|&g| g > generation)
        {
            tracing::debug!(generation, current, "ignoring a stale policy");
            return Ok(Reply::PolicyAccepted {
                generation: current,
                warnings: self.policy.get().map(|p| standing(&p)).unwrap_or_default(),
            });
        }
        let previous = self.policy.get();
        let built = Policy::build_after(generation, config_json, previous.as_deref())
            .map(|p| p.with_launcher(self.launcher.clone()))
            .and_then(|p| self.within_envelope(p))
            .and_then(|p| self.launcher.apply_run_as(&p.config).map(|()| p))
            .and_then(|mut p| p.settle_home().map(|()| p))
            // As the command user, and before the walk builds the command ruleset, so the
            // state's directories exist when Landlock denies them.
            .inspect(|p| crate::state_move::settle(&p.state, p.jail.is_jailed()))
            .map(|mut p| {
                p.settle_user(self.launcher.applied_run_as().as_ref());
                p
            })
            .and_then(|mut p| {
                // The first policy decides whether the executor's own filter holds the
                // special-bits rule (then no child loads it); place it again.
                let allow = p.config.fs.allow_special_bits;
                let seccomp = p.config.confinement.seccomp;
                confine::special_bits::settle(confine::special_bits::wanted(allow, seccomp));
                p.commands.replace_special_bits(allow, seccomp).map(|()| p)
            });
        match built {
            Ok(p) => {
                tracing::info!(
                    generation,
                    jailed = p.jail.is_jailed(),
                    home = p.home.path.as_deref().unwrap_or("(none)"),
                    "policy accepted"
                );
                self.log_relay.apply(&p.config.telemetry);
                let warnings = standing(&p);
                for gap in self.warnings.newly_standing(warnings.clone()) {
                    tracing::warn!(generation, "{gap}");
                }
                for note in self
                    .notes
                    .newly_standing(p.user.terminal.iter().cloned().collect())
                {
                    tracing::info!(generation, "{note}");
                }
                if let Some(prev) = self.policy.get() {
                    let widened = iii_shell_policy::widening::widening(&prev.config, &p.config);
                    if !widened.is_empty() {
                        tracing::warn!(
                            generation,
                            "the executor now acts under a wider policy than before: {}",
                            iii_shell_policy::widening::describe(&widened)
                        );
                    }
                }
                // Accepted, and the command user settled: the walk may start.
                p.start_walk();
                self.policy.set(p);
                if let Some(p) = self.policy.get() {
                    // Once the ruleset is built (off this path), the pool is filled.
                    tokio::spawn(async move {
                        if p.commands_ready().await.is_ok() {
                            p.refill_prestarted();
                        }
                    });
                }
                Ok(Reply::PolicyAccepted {
                    generation,
                    warnings,
                })
            }
            Err(e) => {
                tracing::warn!(generation, error = %e, "policy refused");
                Err(WireError::new(
                    Code::S210,
                    format!("policy refused by the executor: {e}"),
                ))
            }
        }
    }

    /// `Exec`: runs the command (re-checked by `run`), replies, then releases its resources.
    async fn exec(&self, spec: ExecSpec, cancel: Arc<Notify>) -> Handled {
        let p = match self.current() {
            Ok(p) => p,
            Err(e) => return done(Err(e)),
        };
        let (result, spent) = foreground::run_then_release(p.clone(), spec, cancel).await;
        // After the reply is on its way: the command's descriptors are closed, its job's
        // cgroup goes back to the pool, and the next command process is pre-started (not
        // under a policy replaced meanwhile).
        let cont: Option<fs::Continuation> = Some(Box::pin(async move {
            spent.release();
            p.refill_prestarted();
        }));
        (result.map(Reply::Exec).map_err(|e| e.to_wire()), cont)
    }

    /// `Fs`: checked and served by `fs::handle`; a mutating call records its pre-images into
    /// the open turn, if any (`turns::calls`).
    /// `FsScoped`: `fs_call` under the policy confined to `scope_root` (the executor resolves
    /// the scope itself: `Jail::scoped`).
    async fn fs_scoped_call(
        &self,
        p: Arc<Policy>,
        scope_root: &str,
        op: FsOp,
        io: &mut fs::RequestIo,
    ) -> Handled {
        let scoped = match p.fs.scoped(scope_root) {
            Ok(s) => Arc::new(s),
            Err(e) => return (Err(e.to_wire()), None),
        };
        self.fs_call(p, scoped, op, io).await
    }

    async fn fs_call(
        &self,
        p: Arc<Policy>,
        fs_policy: Arc<iii_shell_files::FsPolicy>,
        op: FsOp,
        io: &mut fs::RequestIo,
    ) -> Handled {
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
        let out = fs::handle(fs_policy, op, io).await;
        if let Some(rec) = rec {
            let t = self.turns.clone();
            let _ = tokio::task::spawn_blocking(move || t.finish(&p, rec, &[])).await;
        }
        match out {
            Ok((reply, cont)) => (Ok(Reply::Fs(reply)), cont),
            Err(e) => (Err(e.to_wire()), None),
        }
    }

    /// `Coder`: checked and served on the blocking pool (its errors are C-codes). A mutation
    /// records into the turn history, and change-diff reads it (`turns::coder_calls::run`).
    async fn coder(&self, call: CoderCall) -> Result<Reply, WireError> {
        let turns = self.turns.clone();
        let locks = self.edit_locks.clone();
        let result = match self.current() {
            Ok(p) => tokio::task::spawn_blocking(move || {
                crate::turns::coder_calls::run(&turns, &p, &locks, call)
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
        result.map(|r| Reply::Coder(Box::new(r)))
    }

    /// `Turns`: store I/O (fsyncs) runs on the blocking pool, off the request path's thread.
    async fn turns_call(&self, call: TurnsCall) -> Result<Reply, ExecError> {
        let p = self.current()?;
        let turns = self.turns.clone();
        tokio::task::spawn_blocking(move || turns.call(&p, &call.function, &call.payload_json))
            .await
            .unwrap_or_else(|e| Err(ExecError::Internal(format!("turns call failed: {e}"))))
            .map(|v| {
                Reply::Turns(iii_shell_protocol::turns::TurnsReply {
                    json: v.to_string(),
                })
            })
    }

    /// `UiState`: the console page's per-pane state, stored beside the turn history (blocking
    /// pool: it writes files).
    async fn ui_state_call(&self, op: UiStateOp) -> Result<Reply, ExecError> {
        let p = self.current()?;
        let store = self.ui_state.clone();
        tokio::task::spawn_blocking(move || {
            let dir = p.state.ui_state.clone();
            store.handle(&dir, op)
        })
        .await
        .unwrap_or_else(|e| Err(ExecError::Internal(format!("ui-state call failed: {e}"))))
        .map(Reply::UiState)
    }

    /// `Watch`: a binding's watcher, checked against the jail when it starts.
    fn watch(&self, op: WatchOp) -> Result<Reply, ExecError> {
        match op {
            WatchOp::Start {
                binding_id,
                path,
                include_ignored,
            } => {
                let p = self.current()?;
                self.watches
                    .start(p, &binding_id, &path, include_ignored)
                    .map(Reply::Watch)
            }
            WatchOp::Stop { binding_id } => Ok(Reply::Watch(self.watches.stop(&binding_id))),
        }
    }

    /// `Doctor`: the report of this executor and of a probe command under the policy.
    async fn doctor(&self) -> Reply {
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
        Reply::Doctor(Box::new(report))
    }
}

/// What holds under `p` that the executor warns about once (and `shell::config-status` and
/// `doctor` show): capabilities that reach other terminals, a `HOME` commands cannot use,
/// roots or a `working_dir` the command user cannot enter.
fn standing(p: &Policy) -> Vec<String> {
    doctor::terminal_gap(&p.config.confinement.capabilities)
        .into_iter()
        .chain(p.home.warning.clone())
        .chain(crate::state_move::gap(&p.state))
        .chain(p.user.reach.iter().cloned())
        .collect()
}
