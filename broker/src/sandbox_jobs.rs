//! The broker's table of background jobs that run on a sandbox target.
//!
//! Host jobs live in the executor; a sandbox job has no local process, only a detached
//! `sandbox::exec` call, so its record lives here. Records have the same shape as host jobs
//! (`JobRecord`/`JobSummary`, a random UUID id), output is capped at `max_output_bytes` with
//! the truncation flags, finished records are pruned `job_retention_secs` after they finish,
//! and `shell::kill` can only mark a job killed: nothing can cancel the in-VM process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use iii_shell_policy::capture::Capture;
use iii_shell_policy::sync::lock;
use iii_shell_protocol::clock::now_ms;
use iii_shell_protocol::exec::{JobRecord, JobStatus, JobSummary, KillResponse};

/// The `reason` of a successful `shell::kill` of a sandbox job.
pub const KILL_REASON: &str = "sandbox jobs cannot be hard-killed: the in-VM process runs until its timeout_ms or sandbox::stop";

/// The spawn-time refusal when the job cap is reached (host wording).
pub fn cap_reached(limit: usize) -> String {
    iii_shell_protocol::config::job_cap_reached(limit)
}

/// How the `sandbox::exec` behind a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    /// The sandbox answered. `timed_out` marks the job killed.
    Exited {
        stdout: String,
        stderr: String,
        exit_code: Option<i32>,
        timed_out: bool,
    },
    /// The call failed (any sandbox error, S200 included); `reason` goes to stderr.
    Failed { reason: String },
}

struct JobState {
    status: JobStatus,
    exit_code: Option<i32>,
    finished_at_ms: Option<u64>,
    stdout: Capture,
    stderr: Capture,
}

pub struct SandboxJob {
    id: String,
    argv: Vec<String>,
    started_at_ms: u64,
    retention_secs: u64,
    state: Mutex<JobState>,
}

impl SandboxJob {
    pub fn id(&self) -> &str {
        &self.id
    }

    fn record(&self) -> JobRecord {
        let st = lock(&self.state);
        JobRecord {
            id: self.id.clone(),
            argv: self.argv.clone(),
            status: st.status,
            exit_code: st.exit_code,
            started_at_ms: self.started_at_ms,
            finished_at_ms: st.finished_at_ms,
            stdout: st.stdout.text(),
            stderr: st.stderr.text(),
            stdout_truncated: st.stdout.truncated,
            stderr_truncated: st.stderr.truncated,
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
            stdout_truncated: st.stdout.truncated,
            stderr_truncated: st.stderr.truncated,
        }
    }

    fn running(&self) -> bool {
        lock(&self.state).status == JobStatus::Running
    }

    fn expired(&self, now: u64) -> bool {
        let st = lock(&self.state);
        st.status != JobStatus::Running
            && st
                .finished_at_ms
                .is_some_and(|f| now >= f.saturating_add(self.retention_secs.saturating_mul(1000)))
    }

    /// Records how the call ended. A job already marked killed by `shell::kill` keeps its
    /// status and finish time; the output and exit code that arrive later are still recorded.
    pub fn finish(&self, end: JobEnd) {
        let mut st = lock(&self.state);
        let open = st.status == JobStatus::Running;
        let (status, note) = match end {
            JobEnd::Exited {
                stdout,
                stderr,
                exit_code,
                timed_out,
            } => {
                st.stdout.push(stdout.as_bytes());
                st.stderr.push(stderr.as_bytes());
                st.exit_code = exit_code;
                (
                    if timed_out {
                        JobStatus::Killed
                    } else {
                        JobStatus::Finished
                    },
                    None,
                )
            }
            JobEnd::Failed { reason } => (JobStatus::Failed, Some(reason)),
        };
        if let Some(note) = note {
            // Past the cap if need be, so the reason is never lost.
            let sep = if st.stderr.bytes.is_empty() || st.stderr.bytes.ends_with(b"\n") {
                ""
            } else {
                "\n"
            };
            st.stderr
                .bytes
                .extend_from_slice(format!("{sep}[iii-shell] {note}\n").as_bytes());
        }
        if open {
            st.status = status;
            st.finished_at_ms = Some(now_ms());
        }
    }
}

/// The process-wide table of sandbox jobs.
#[derive(Default)]
pub struct SandboxJobs {
    table: Mutex<HashMap<String, Arc<SandboxJob>>>,
}

impl SandboxJobs {
    /// Drops records whose retention has passed; returns the table, locked.
    fn pruned(&self) -> MutexGuard<'_, HashMap<String, Arc<SandboxJob>>> {
        let now = now_ms();
        let mut t = lock(&self.table);
        t.retain(|_, job| !job.expired(now));
        t
    }

    /// Running sandbox jobs.
    pub fn running(&self) -> usize {
        self.pruned().values().filter(|j| j.running()).count()
    }

    /// Creates a running job unless `others_running` (host jobs) plus the running sandbox jobs
    /// already reach `limit`. The count and the insert happen under one lock, so concurrent
    /// spawns cannot overshoot the cap. Err is the plain refusal message.
    pub fn try_start(
        &self,
        argv: Vec<String>,
        output_cap: u64,
        retention_secs: u64,
        limit: usize,
        others_running: usize,
    ) -> Result<Arc<SandboxJob>, String> {
        let mut t = self.pruned();
        let running = t.values().filter(|j| j.running()).count();
        if running.saturating_add(others_running) >= limit {
            return Err(cap_reached(limit));
        }
        let cap = usize::try_from(output_cap).unwrap_or(usize::MAX);
        let job = Arc::new(SandboxJob {
            id: uuid::Uuid::new_v4().to_string(),
            argv,
            started_at_ms: now_ms(),
            retention_secs,
            state: Mutex::new(JobState {
                status: JobStatus::Running,
                exit_code: None,
                finished_at_ms: None,
                stdout: Capture::new(cap),
                stderr: Capture::new(cap),
            }),
        });
        t.insert(job.id.clone(), job.clone());
        Ok(job)
    }

    pub fn status(&self, id: &str) -> Option<JobRecord> {
        self.pruned().get(id).map(|j| j.record())
    }

    pub fn summaries(&self) -> Vec<JobSummary> {
        self.pruned().values().map(|j| j.summary()).collect()
    }

    /// `shell::kill` of a sandbox job, or None when `id` is not one. A running job is marked
    /// killed at once (nothing is sent to the sandbox); any other job is left alone.
    pub fn kill(&self, id: &str) -> Option<KillResponse> {
        let job = self.pruned().get(id).cloned()?;
        let mut st = lock(&job.state);
        if st.status != JobStatus::Running {
            let reason = format!("job already {}", st.status.as_str());
            return Some(KillResponse {
                job_id: job.id.clone(),
                killed: false,
                status: st.status,
                reason: Some(reason),
            });
        }
        st.status = JobStatus::Killed;
        st.finished_at_ms = Some(now_ms());
        Some(KillResponse {
            job_id: job.id.clone(),
            killed: true,
            status: JobStatus::Killed,
            reason: Some(KILL_REASON.into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(jobs: &SandboxJobs, retention: u64) -> Arc<SandboxJob> {
        jobs.try_start(vec!["ls".into()], 4, retention, 2, 0)
            .unwrap()
    }

    #[test]
    fn lifecycle_cap_and_retention() {
        let jobs = SandboxJobs::default();
        let a = start(&jobs, 3600);
        let b = start(&jobs, 3600);
        assert_eq!(jobs.running(), 2);
        assert_eq!(
            jobs.try_start(vec!["ls".into()], 4, 0, 2, 0)
                .map(|_| ())
                .unwrap_err(),
            cap_reached(2)
        );
        assert!(
            jobs.try_start(vec!["ls".into()], 4, 0, 3, 1).is_err(),
            "host jobs count toward the cap"
        );

        a.finish(JobEnd::Exited {
            stdout: "abcdef".into(),
            stderr: String::new(),
            exit_code: Some(3),
            timed_out: false,
        });
        let r = jobs.status(a.id()).unwrap();
        assert_eq!(
            (r.status, r.exit_code, r.stdout.as_str(), r.stdout_truncated),
            (JobStatus::Finished, Some(3), "abcd", true)
        );
        assert!(r.finished_at_ms.is_some());

        // b: killed, then the late answer is recorded without changing the status.
        let k = jobs.kill(b.id()).unwrap();
        assert!(
            k.killed && k.status == JobStatus::Killed && k.reason.as_deref() == Some(KILL_REASON)
        );
        let finished_at = jobs.status(b.id()).unwrap().finished_at_ms;
        let again = jobs.kill(b.id()).unwrap();
        assert!(!again.killed && again.reason.as_deref() == Some("job already killed"));
        b.finish(JobEnd::Exited {
            stdout: "late".into(),
            stderr: String::new(),
            exit_code: Some(0),
            timed_out: false,
        });
        let r = jobs.status(b.id()).unwrap();
        assert_eq!(
            (r.status, r.finished_at_ms, r.stdout.as_str()),
            (JobStatus::Killed, finished_at, "late")
        );
        assert!(jobs.kill("nope").is_none());

        // Retention 0: pruned on the first access after it finishes.
        let c = start(&jobs, 0);
        assert_eq!(jobs.summaries().len(), 3);
        c.finish(JobEnd::Failed { reason: "x".into() });
        assert!(jobs.status(c.id()).is_none());
        assert_eq!(jobs.summaries().len(), 2);
    }

    #[test]
    fn failure_notes() {
        let jobs = SandboxJobs::default();
        let a = start(&jobs, 3600);
        a.finish(JobEnd::Failed {
            reason: "sandbox::exec failed: S002: gone".into(),
        });
        let r = jobs.status(a.id()).unwrap();
        assert_eq!(r.status, JobStatus::Failed);
        assert_eq!(r.exit_code, None);
        assert_eq!(r.stderr, "[iii-shell] sandbox::exec failed: S002: gone\n");
    }
}
