//! Background jobs: `shell::exec_bg`, `status`, `list`, `kill`, retention and the hard cap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iii_shell_policy::sync::lock;
use iii_shell_protocol::clock::now_ms;
use iii_shell_protocol::exec::{
    ExecBgResponse, JobRecord, JobStatus, JobSummary, KillResponse, ListResponse,
};
use iii_shell_protocol::messages::{Event, ExecSpec};
use tokio::sync::{broadcast, watch};

use crate::capture::{Capture, Collector};
use crate::job_io::{JobOutput, JobStdin, Waiters};
use crate::policy::Policy;
use crate::prepare;
use crate::prepare::spawn_error;
use crate::started::{release_later, start, start_in_prestarted, Confirmed, Running};
use iii_shell_files::error::ExecError;
use iii_shell_launch::tree::JobTree;
use iii_shell_protocol::call_trace::Span;

pub(crate) struct JobState {
    pub(crate) status: JobStatus,
    exit_code: Option<i32>,
    finished_at_ms: Option<u64>,
    /// Set by the first kill (or the hard cap); later kills are no-ops.
    kill_reason: Option<String>,
    /// The order in which jobs finished (eviction takes the smallest).
    finished_seq: Option<u64>,
}

pub(crate) struct Job {
    pub(crate) id: String,
    argv: Vec<String>,
    started_at_ms: u64,
    retention_secs: u64,
    pub(crate) state: Mutex<JobState>,
    stdout: Arc<Mutex<Capture>>,
    stderr: Arc<Mutex<Capture>>,
    pub(crate) tree: Arc<JobTree>,
    /// The call set its own `limits.memory_max_bytes` (named when the job is killed at it).
    memory_limit_from_call: bool,
    /// Flips to true when the job has left `running` (its output is all in `output` then).
    pub(crate) done: watch::Receiver<bool>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    /// Its output for `shell::job::read`.
    pub(crate) output: Arc<JobOutput>,
    /// Its stdin for `shell::job::write` (a `tokio` lock: a write waits on the pipe).
    pub(crate) stdin: Arc<tokio::sync::Mutex<JobStdin>>,
}

impl Job {
    pub(crate) fn record(&self) -> JobRecord {
        let st = lock(&self.state);
        let out = lock(&self.stdout);
        let err = lock(&self.stderr);
        JobRecord {
            id: self.id.clone(),
            argv: self.argv.clone(),
            status: st.status,
            exit_code: st.exit_code,
            started_at_ms: self.started_at_ms,
            finished_at_ms: st.finished_at_ms,
            stdout: out.text(),
            stderr: err.text(),
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
        }
    }

    fn summary(&self) -> JobSummary {
        let st = lock(&self.state);
        JobSummary {
            id: self.id.clone(),
            status: st.status,
            exit_code: st.exit_code,
            started_at_ms: self.started_at_ms,
            finished_at_ms: st.finished_at_ms,
            stdout_truncated: lock(&self.stdout).truncated,
            stderr_truncated: lock(&self.stderr).truncated,
        }
    }

    /// Bytes of output the job holds.
    fn output_bytes(&self) -> usize {
        lock(&self.stdout).bytes.len() + lock(&self.stderr).bytes.len() + self.output.bytes()
    }

    fn expired(&self, now: u64) -> bool {
        let st = lock(&self.state);
        st.status != JobStatus::Running
            && st
                .finished_at_ms
                .is_some_and(|f| now >= f.saturating_add(self.retention_secs.saturating_mul(1000)))
    }
}

/// At most this many finished jobs are kept; past it the oldest finished go first.
pub const FINISHED_MAX: usize = 256;
/// At most this many bytes of finished jobs' output are kept, all jobs together (each job
/// holds at most 2 x `max_output_bytes` and 3 x `jobs.output_buffer_bytes`); past it the oldest finished go first.
pub const FINISHED_MAX_BYTES: usize = 64 << 20;

/// Which finished jobs to evict so that at most `max_count` of them, holding at most
/// `max_bytes` of output together, are kept. `finished` is (finish order, output bytes); the
/// result lists indexes into it, the earliest finished first. A policy decision with no I/O.
pub fn evictions(finished: &[(u64, usize)], max_count: usize, max_bytes: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..finished.len()).collect();
    order.sort_by_key(|&i| finished[i].0);
    let mut count = finished.len();
    let mut bytes: usize = finished.iter().map(|f| f.1).sum();
    let mut out = Vec::new();
    for i in order {
        if count <= max_count && bytes <= max_bytes {
            break;
        }
        out.push(i);
        count -= 1;
        bytes -= finished[i].1;
    }
    out
}

/// What finished jobs cost now (`doctor`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retained {
    pub running: usize,
    pub finished: usize,
    pub finished_bytes: usize,
    /// Finished jobs evicted by the caps since start-up (retention expiry is not counted).
    pub evicted: u64,
}

/// The process-wide job table.
pub struct Jobs {
    table: Mutex<HashMap<String, Arc<Job>>>,
    /// Finished jobs evicted by [`FINISHED_MAX`] / [`FINISHED_MAX_BYTES`].
    evicted: std::sync::atomic::AtomicU64,
    /// Serialises the running-count check with the spawn, so the cap cannot be overshot.
    spawn_lock: tokio::sync::Mutex<()>,
    events: broadcast::Sender<Event>,
    /// Orders job ends for eviction: the last value handed to a finished job.
    finished_seq: Arc<std::sync::atomic::AtomicU64>,
    /// Callers waiting on jobs now (`shell::job::read` with `wait_ms`, `shell::job::wait`).
    pub(crate) waiters: Waiters,
}

impl Jobs {
    pub fn new(events: broadcast::Sender<Event>) -> Self {
        Jobs {
            table: Mutex::new(HashMap::new()),
            evicted: Default::default(),
            spawn_lock: tokio::sync::Mutex::new(()),
            events,
            finished_seq: Default::default(),
            waiters: Waiters::default(),
        }
    }

    fn prune(&self) {
        let now = now_ms();
        let mut t = lock(&self.table);
        t.retain(|_, job| {
            if job.expired(now) {
                for r in &job.readers {
                    r.abort();
                }
                false
            } else {
                true
            }
        });
        // Then the caps on what finished jobs may hold, oldest finished first.
        let finished: Vec<(String, (u64, usize))> = t
            .iter()
            .filter_map(|(id, j)| {
                let seq = lock(&j.state).finished_seq?;
                Some((id.clone(), (seq, j.output_bytes())))
            })
            .collect();
        let costs: Vec<(u64, usize)> = finished.iter().map(|f| f.1).collect();
        for i in evictions(&costs, FINISHED_MAX, FINISHED_MAX_BYTES) {
            if let Some(job) = t.remove(&finished[i].0) {
                for r in &job.readers {
                    r.abort();
                }
                self.evicted
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// What the job table holds now.
    pub fn retained(&self) -> Retained {
        self.prune();
        let t = lock(&self.table);
        let mut r = Retained {
            evicted: self.evicted.load(std::sync::atomic::Ordering::Relaxed),
            ..Default::default()
        };
        for j in t.values() {
            if lock(&j.state).status == JobStatus::Running {
                r.running += 1;
            } else {
                r.finished += 1;
                r.finished_bytes += j.output_bytes();
            }
        }
        r
    }

    pub(crate) fn get(&self, id: &str) -> Result<Arc<Job>, ExecError> {
        self.prune();
        lock(&self.table)
            .get(id)
            .cloned()
            .ok_or_else(|| ExecError::Missing(format!("no such job: {id}")))
    }

    pub async fn spawn(
        &self,
        policy: Arc<Policy>,
        spec: ExecSpec,
    ) -> Result<ExecBgResponse, ExecError> {
        self.start_job(policy, spec, false).await
    }

    /// Starts a background job: `shell::exec_bg` (`keep_stdin` false: stdin is `/dev/null`,
    /// or the call's bytes then end-of-file) or `shell::job::start` (`keep_stdin`: stdin is
    /// a pipe the job keeps, the call's bytes written first).
    pub async fn start_job(
        &self,
        policy: Arc<Policy>,
        mut spec: ExecSpec,
        keep_stdin: bool,
    ) -> Result<ExecBgResponse, ExecError> {
        if keep_stdin {
            spec.stdin.get_or_insert_with(Vec::new);
        }
        policy.commands_ready().await?;
        self.prune();
        let cap = usize::try_from(policy.config.max_output_bytes).unwrap_or(usize::MAX);
        let limit = policy.config.max_concurrent_jobs as usize;
        let _guard = self.spawn_lock.lock().await;
        let running_now = lock(&self.table)
            .values()
            .filter(|j| lock(&j.state).status == JobStatus::Running)
            .count();
        if running_now >= limit {
            return Err(ExecError::Plain(
                iii_shell_protocol::config::job_cap_reached(limit),
            ));
        }
        let mut prep_span = iii_shell_protocol::call_trace::start("exec.prepare");
        let mut kept = None;
        let (mut spawn_span, running, out, err) = match prestarted(
            &policy,
            &spec,
            cap,
            &mut prep_span,
            keep_stdin.then_some(&mut kept),
        )
        .await?
        {
            Some((span, r)) => (span, r.0, r.1, r.2),
            None => {
                let mut prepared = prepare::prepare(&policy, &spec)?;
                if keep_stdin {
                    kept = prepared.stdin.take();
                }
                drop(prep_span);
                let span = iii_shell_protocol::call_trace::start("exec.spawn");
                let (running, out, err) = start(prepared, &spec.argv[0], cap)?;
                (span, running, out, err)
            }
        };
        if let Some(s) = spawn_span.as_mut() {
            s.attr("process.pid", running.pid());
        }
        drop(spawn_span);
        let id = uuid::Uuid::new_v4().to_string();
        let stdout = Arc::new(Mutex::new(Capture::new(cap)));
        let stderr = Arc::new(Mutex::new(Capture::new(cap)));
        let ring_cap =
            usize::try_from(policy.config.jobs.output_buffer_bytes).unwrap_or(usize::MAX);
        let output = Arc::new(JobOutput::new(ring_cap));
        let readers = vec![
            pump_shared(out, stdout.clone(), output.clone(), false),
            pump_shared(err, stderr.clone(), output.clone(), true),
        ];
        let stdin = match kept {
            Some((fd, first)) => keep_stdin_pipe(fd, first),
            None => Arc::new(tokio::sync::Mutex::new(JobStdin::NotOpen)),
        };
        let (done_tx, done_rx) = watch::channel(false);
        let job = Arc::new(Job {
            id: id.clone(),
            argv: spec.argv.clone(),
            started_at_ms: now_ms(),
            retention_secs: policy.config.job_retention_secs,
            state: Mutex::new(JobState {
                status: JobStatus::Running,
                exit_code: None,
                finished_at_ms: None,
                kill_reason: None,
                finished_seq: None,
            }),
            stdout,
            stderr,
            tree: running.tree.clone(),
            memory_limit_from_call: spec.limits.memory_max_bytes.is_some(),
            done: done_rx,
            readers,
            output,
            stdin,
        });
        lock(&self.table).insert(id.clone(), job.clone());
        let hard_cap_ms = policy.config.max_bg_timeout_ms;
        tokio::spawn(supervise(
            job,
            running,
            hard_cap_ms,
            done_tx,
            self.events.clone(),
            self.finished_seq.clone(),
        ));
        Ok(ExecBgResponse {
            job_id: id,
            argv: spec.argv,
        })
    }

    pub fn status(&self, id: &str) -> Result<JobRecord, ExecError> {
        Ok(self.get(id)?.record())
    }

    pub fn list(&self) -> ListResponse {
        self.prune();
        let mut jobs: Vec<JobSummary> = lock(&self.table).values().map(|j| j.summary()).collect();
        jobs.sort_by(|a, b| {
            a.started_at_ms
                .cmp(&b.started_at_ms)
                .then_with(|| a.id.cmp(&b.id))
        });
        ListResponse {
            count: jobs.len(),
            jobs,
        }
    }

    pub async fn kill(&self, id: &str) -> Result<KillResponse, ExecError> {
        let job = self.get(id)?;
        let exited_on_its_own = {
            let mut st = lock(&job.state);
            if st.status != JobStatus::Running {
                let reason = format!("job already {}", st.status.as_str());
                return Ok(KillResponse {
                    job_id: job.id.clone(),
                    killed: false,
                    status: st.status,
                    reason: Some(reason),
                });
            }
            if st.kill_reason.is_some() {
                return Ok(KillResponse {
                    job_id: job.id.clone(),
                    killed: false,
                    status: st.status,
                    reason: Some("a kill of this job is already in progress".into()),
                });
            }
            // The root already exited by itself and `supervise` is finalising the record (it
            // waits briefly for the output readers): that job finished, so do not turn it into
            // "killed" and drop its exit code.
            let exited = root_exited(&job.tree);
            if !exited {
                st.kill_reason = Some("killed by shell::kill".into());
            }
            exited
        };
        if exited_on_its_own {
            let mut done = job.done.clone();
            let _ = tokio::time::timeout(Duration::from_secs(10), done.wait_for(|d| *d)).await;
            let st = lock(&job.state);
            let reason = format!("job already {}", st.status.as_str());
            return Ok(KillResponse {
                job_id: job.id.clone(),
                killed: false,
                status: st.status,
                reason: Some(reason),
            });
        }
        job.tree.kill();
        let mut done = job.done.clone();
        let waited = tokio::time::timeout(Duration::from_secs(10), done.wait_for(|d| *d)).await;
        if waited.is_err() {
            return Err(ExecError::Internal(format!(
                "job {id}: SIGKILL was sent but the process did not exit"
            )));
        }
        let st = lock(&job.state);
        Ok(KillResponse {
            job_id: job.id.clone(),
            killed: true,
            status: st.status,
            reason: None,
        })
    }

    /// Kills every running job (executor shutdown).
    pub fn kill_all(&self) {
        for job in lock(&self.table).values() {
            let running = lock(&job.state).status == JobStatus::Running;
            if running {
                lock(&job.state)
                    .kill_reason
                    .get_or_insert_with(|| "executor shutting down".into());
                job.tree.kill();
            }
        }
    }
}

/// True once a job's root process has exited: it is a zombie awaiting its supervisor, or
/// already reaped. (Until it is reaped, its pid cannot be reused.)
fn root_exited(tree: &JobTree) -> bool {
    iii_shell_launch::procfs::stat(tree.root).is_some_and(|s| s.state == b'Z')
        || tree.reaped.load(std::sync::atomic::Ordering::SeqCst)
}

/// A started root and its two output collectors.
type Started = (Running, Collector, Collector);

/// Starts the job's command in a pre-started process, as `shell::exec` does: the same checks
/// (`prepare::prepare_for_prestarted`), and the exec confirmed before the call returns, so a
/// program that cannot be executed is still the call's error. `None` when no pre-started
/// process is ready or it could not take the command: the caller spawns the ordinary way
/// (nothing has run).
async fn prestarted(
    policy: &Policy,
    spec: &ExecSpec,
    cap: usize,
    prep_span: &mut Option<Span>,
    keep_stdin: Option<&mut Option<(std::os::fd::OwnedFd, Vec<u8>)>>,
) -> Result<Option<(Option<Span>, Started)>, ExecError> {
    if !prepare::takes_prestarted(policy, spec) {
        return Ok(None);
    }
    let Some(w) = policy.take_prestarted() else {
        return Ok(None);
    };
    if let Some(s) = prep_span.as_mut() {
        s.attr("iii.shell.prestarted", true);
    }
    let (prepared, stdin) = match prepare::prepare_for_prestarted(policy, spec) {
        // A kept stdin is taken out before the start, which would write its bytes and close it.
        Ok(mut p) if keep_stdin.is_some() => {
            let stdin = p.stdin.take();
            (p, stdin)
        }
        Ok(p) => (p, None),
        Err(e) => {
            policy.put_back_prestarted(w);
            return Err(e);
        }
    };
    drop(prep_span.take());
    let span = iii_shell_protocol::call_trace::start("exec.spawn");
    let Some(r) = start_in_prestarted(w, prepared, cap, true) else {
        return Ok(None);
    };
    if let Some(kept) = keep_stdin {
        *kept = stdin;
    }
    let (mut running, out, err) = r?;
    match running.confirm_exec().await {
        Confirmed::Running => Ok(Some((span, (running, out, err)))),
        Confirmed::ExecFailed(e) => {
            release_later(running.tree.clone());
            Err(spawn_error(&spec.argv[0], &e))
        }
        Confirmed::NeverStarted => {
            tracing::debug!("a pre-started process died before it took a background command");
            release_later(running.tree.clone());
            Ok(None)
        }
    }
}

fn pump_shared(
    mut c: Collector,
    into: Arc<Mutex<Capture>>,
    output: Arc<JobOutput>,
    stderr: bool,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        c.pump_with(|chunk| {
            lock(&into).push(chunk);
            output.push(stderr, chunk);
        })
        .await
    })
}

/// The write end of a `shell::job::start` job's stdin pipe, kept for `shell::job::write`;
/// the call's own `stdin` bytes are written first, by a task holding the pipe's lock.
fn keep_stdin_pipe(fd: std::os::fd::OwnedFd, first: Vec<u8>) -> Arc<tokio::sync::Mutex<JobStdin>> {
    let stdin = Arc::new(tokio::sync::Mutex::new(JobStdin::Closed));
    let tx = match tokio::net::unix::pipe::Sender::from_owned_fd(fd) {
        Ok(tx) => tx,
        Err(e) => {
            tracing::warn!(error = %e, "a job's stdin pipe could not be kept; it is closed");
            return stdin;
        }
    };
    // Nobody else holds the new lock yet.
    let Ok(mut held) = stdin.clone().try_lock_owned() else {
        return stdin;
    };
    *held = JobStdin::Open(tx);
    if !first.is_empty() {
        tokio::spawn(async move {
            if let JobStdin::Open(tx) = &mut *held {
                use tokio::io::AsyncWriteExt;
                if tx.write_all(&first).await.is_err() {
                    *held = JobStdin::Closed;
                }
            }
        });
    }
    stdin
}

async fn supervise(
    job: Arc<Job>,
    mut running: Running,
    hard_cap_ms: u64,
    done: watch::Sender<bool>,
    events: broadcast::Sender<Event>,
    finished_seq: Arc<std::sync::atomic::AtomicU64>,
) {
    let status = if hard_cap_ms > 0 {
        tokio::select! {
            st = running.wait() => st,
            _ = tokio::time::sleep(Duration::from_millis(hard_cap_ms)) => {
                let first = {
                    let mut st = lock(&job.state);
                    st.kill_reason.is_none().then(|| st.kill_reason = Some("hard cap".into())).is_some()
                };
                if first {
                    let note = format!(
                        "\n[iii-shell] job killed: it hit the hard cap max_bg_timeout_ms = {hard_cap_ms} ms\n"
                    );
                    append_note(&job, &note);
                }
                job.tree.kill();
                running.wait().await
            }
        }
    } else {
        running.wait().await
    };
    // The root has exited. Its output is read for at most ROOT_EXIT_DRAIN more (a child may
    // still hold the pipes); then whatever is left of its tree is killed, exactly as for
    // `shell::exec`: a finished job leaves nothing running (`cgroup.kill` reaches daemons
    // that called setsid), so nothing escapes max_bg_timeout_ms or max_concurrent_jobs.
    let readers_done = readers_finished(&job, crate::foreground::ROOT_EXIT_DRAIN).await;
    if job.tree.kill_leftovers(!readers_done) || !readers_done {
        let _ = readers_finished(&job, Duration::from_millis(200)).await;
        for r in &job.readers {
            r.abort();
        }
    }
    // The kernel killed a process of it at its memory limit: the job was killed, and says why.
    if let Some(limit) = job.tree.memory_limit_hit() {
        let first = {
            let mut st = lock(&job.state);
            st.kill_reason
                .is_none()
                .then(|| st.kill_reason = Some("memory limit".into()))
                .is_some()
        };
        if first {
            let line = crate::limit_reason::memory_killed(limit, job.memory_limit_from_call);
            let mut capture = lock(&job.stderr);
            if capture.bytes.last().is_some_and(|b| *b != b'\n') {
                capture.bytes.push(b'\n');
            }
            capture.bytes.extend_from_slice(line.as_bytes());
        }
    }
    let (final_status, exit_code) = {
        let mut st = lock(&job.state);
        st.finished_at_ms = Some(now_ms());
        st.finished_seq = Some(finished_seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
        if st.kill_reason.is_some() {
            st.status = JobStatus::Killed;
            st.exit_code = None;
        } else {
            st.status = JobStatus::Finished;
            st.exit_code = status.code();
        }
        (st.status, st.exit_code)
    };
    release_later(job.tree.clone());
    let _ = done.send(true);
    let _ = events.send(Event::JobExited {
        job_id: job.id.clone(),
        status: final_status,
        exit_code,
    });
}

/// Waits up to `limit` for both output readers to reach EOF; true when they did.
async fn readers_finished(job: &Job, limit: Duration) -> bool {
    tokio::time::timeout(limit, async {
        for r in &job.readers {
            while !r.is_finished() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    })
    .await
    .is_ok()
}

/// Appends a worker note to a job's stderr, past the cap if need be so it is never lost.
fn append_note(job: &Job, note: &str) {
    lock(&job.stderr).bytes.extend_from_slice(note.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::evictions;

    #[test]
    fn evictions_take_the_oldest_finished_until_both_caps_hold() {
        // (finish order, bytes), listed out of order.
        let jobs = [(3, 10), (1, 10), (2, 50), (4, 0)];
        assert_eq!(evictions(&jobs, 4, 100), Vec::<usize>::new());
        // Count: 2 of 4 kept, the two that finished first go.
        assert_eq!(evictions(&jobs, 2, 100), vec![1, 2]);
        // Bytes: 70 in all, at most 25 kept: order 1 (10) then 2 (50) go, leaving 10.
        assert_eq!(evictions(&jobs, 10, 25), vec![1, 2]);
        // Bytes: at most 60 kept: only the first finished goes.
        assert_eq!(evictions(&jobs, 10, 60), vec![1]);
        assert_eq!(evictions(&jobs, 0, 0), vec![1, 2, 0, 3]);
        assert_eq!(evictions(&[], 0, 0), Vec::<usize>::new());
    }
}
