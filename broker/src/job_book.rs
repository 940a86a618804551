//! The broker's own record of the host jobs it started, so that they outlive the executor.
//!
//! Host jobs live in the executor, which answers `shell::status`, `list` and `kill` for them.
//! When that executor dies (SIGKILL, a crash), its job table dies with it, and the supervisor
//! kills every process it started. The broker, which started those jobs for its callers,
//! keeps a small record of each (id, argv, start time, and its end when the executor reported
//! one), and once a new executor is installed it answers for the jobs of the old one itself:
//! a job that was running is `killed`, with a note on stderr naming the restart; one that had
//! already ended keeps its status and exit code, its output being lost with the executor.
//!
//! The book is bounded: at most [`BOOK_MAX`] entries (the oldest ended ones go first), and
//! entries of a dead executor are dropped after `job_retention_secs`, as the executor would.

use std::collections::HashMap;
use std::sync::Mutex;

use iii_shell_policy::sync::lock;
use iii_shell_protocol::clock::now_ms;
use iii_shell_protocol::exec::{JobRecord, JobStatus, JobSummary, KillResponse};

/// The note a job of a dead executor carries on stderr when it was running.
pub const RESTART_NOTE: &str = "\n[iii-shell] job killed: the executor restarted (it died or was killed) while the job was running; its whole process tree was killed with it\n";
/// The note of a job that had ended before its executor died.
pub const LOST_OUTPUT_NOTE: &str =
    "[iii-shell] the output of this job was lost when the executor restarted\n";

/// How many jobs the book remembers at most.
pub const BOOK_MAX: usize = 4096;

#[derive(Debug, Clone)]
struct Entry {
    argv: Vec<String>,
    /// The pid of the executor that runs (ran) it.
    executor: u32,
    started_at_ms: u64,
    status: JobStatus,
    exit_code: Option<i32>,
    finished_at_ms: Option<u64>,
    /// Its executor is gone: the book answers for it.
    orphaned: bool,
    /// The order in which jobs ended (eviction takes the smallest).
    ended_seq: u64,
}

#[derive(Default)]
pub struct JobBook {
    entries: Mutex<HashMap<String, Entry>>,
    seq: std::sync::atomic::AtomicU64,
}

impl JobBook {
    /// A job the executor `executor` just started.
    pub fn started(&self, executor: u32, id: &str, argv: &[String]) {
        let mut t = lock(&self.entries);
        if t.len() >= BOOK_MAX {
            evict_oldest_ended(&mut t);
        }
        if t.len() >= BOOK_MAX {
            // Every remembered job is running: the cap of running jobs keeps this from
            // happening in practice; the new one is simply not remembered.
            return;
        }
        t.insert(
            id.to_string(),
            Entry {
                argv: argv.to_vec(),
                executor,
                started_at_ms: now_ms(),
                status: JobStatus::Running,
                exit_code: None,
                finished_at_ms: None,
                orphaned: false,
                ended_seq: 0,
            },
        );
    }

    /// The executor reported a job's end.
    pub fn ended(&self, id: &str, status: JobStatus, exit_code: Option<i32>) {
        if let Some(e) = lock(&self.entries).get_mut(id) {
            if !e.orphaned && e.status == JobStatus::Running {
                e.status = status;
                e.exit_code = exit_code;
                e.finished_at_ms = Some(now_ms());
                e.ended_seq = self.next_seq();
            }
        }
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    }

    /// A new executor (`current`) is installed: the jobs of every other one are orphaned. A
    /// running one is now `killed` (its executor's tree was killed with it).
    pub fn executor_installed(&self, current: u32) {
        let now = now_ms();
        let mut t = lock(&self.entries);
        for e in t.values_mut() {
            if e.executor == current || e.orphaned {
                continue;
            }
            e.orphaned = true;
            if e.status == JobStatus::Running {
                e.status = JobStatus::Killed;
                e.exit_code = None;
                e.finished_at_ms = Some(now);
                e.ended_seq = self.next_seq();
            }
        }
    }

    /// Drops orphaned entries past their retention.
    pub fn prune(&self, retention_secs: u64) {
        let now = now_ms();
        lock(&self.entries).retain(|_, e| {
            !e.orphaned
                || e.finished_at_ms
                    .is_none_or(|f| now < f.saturating_add(retention_secs.saturating_mul(1000)))
        });
    }

    /// The record of a job of a dead executor.
    pub fn orphan_record(&self, id: &str) -> Option<JobRecord> {
        let t = lock(&self.entries);
        let e = t.get(id).filter(|e| e.orphaned)?;
        let stderr = if e.status == JobStatus::Killed {
            RESTART_NOTE.trim_start().to_string()
        } else {
            LOST_OUTPUT_NOTE.to_string()
        };
        Some(JobRecord {
            id: id.to_string(),
            argv: e.argv.clone(),
            status: e.status,
            exit_code: e.exit_code,
            started_at_ms: e.started_at_ms,
            finished_at_ms: e.finished_at_ms,
            stdout: String::new(),
            stderr,
            stdout_truncated: false,
            stderr_truncated: false,
        })
    }

    /// Summaries of every job of a dead executor (for `shell::list`).
    pub fn orphan_summaries(&self) -> Vec<JobSummary> {
        lock(&self.entries)
            .iter()
            .filter(|(_, e)| e.orphaned)
            .map(|(id, e)| JobSummary {
                id: id.clone(),
                status: e.status,
                exit_code: e.exit_code,
                started_at_ms: e.started_at_ms,
                finished_at_ms: e.finished_at_ms,
                stdout_truncated: false,
                stderr_truncated: false,
            })
            .collect()
    }

    /// `shell::kill` of a job of a dead executor: it has ended, like any ended job.
    pub fn orphan_kill(&self, id: &str) -> Option<KillResponse> {
        let t = lock(&self.entries);
        let e = t.get(id).filter(|e| e.orphaned)?;
        Some(KillResponse {
            job_id: id.to_string(),
            killed: false,
            status: e.status,
            reason: Some(format!("job already {}", e.status.as_str())),
        })
    }

    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Removes the ended entry that ended first.
fn evict_oldest_ended(t: &mut HashMap<String, Entry>) {
    let oldest = t
        .iter()
        .filter(|(_, e)| e.status != JobStatus::Running)
        .min_by_key(|(_, e)| e.ended_seq)
        .map(|(id, _)| id.clone());
    if let Some(id) = oldest {
        t.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_of_a_replaced_executor_are_answered_by_the_book() {
        let b = JobBook::default();
        b.started(10, "a", &["sleep".into(), "9".into()]);
        b.started(10, "b", &["true".into()]);
        b.ended("b", JobStatus::Finished, Some(0));
        assert!(b.orphan_record("a").is_none(), "its executor still answers");
        b.executor_installed(10);
        assert!(
            b.orphan_record("a").is_none(),
            "a reconnect to the same executor"
        );
        b.executor_installed(11);
        let a = b.orphan_record("a").unwrap();
        assert_eq!((a.status, a.exit_code), (JobStatus::Killed, None));
        assert!(a.finished_at_ms.is_some());
        assert!(a.stderr.contains("executor restarted"), "{}", a.stderr);
        let bb = b.orphan_record("b").unwrap();
        assert_eq!((bb.status, bb.exit_code), (JobStatus::Finished, Some(0)));
        // A late end report of the dead executor changes nothing.
        b.ended("a", JobStatus::Finished, Some(0));
        assert_eq!(b.orphan_record("a").unwrap().status, JobStatus::Killed);
        let k = b.orphan_kill("a").unwrap();
        assert!(!k.killed);
        assert_eq!(k.reason.as_deref(), Some("job already killed"));
        assert_eq!(b.orphan_summaries().len(), 2);
        b.prune(0);
        assert!(b.is_empty());
    }

    #[test]
    fn the_book_is_bounded_and_evicts_the_oldest_ended_first() {
        let b = JobBook::default();
        for i in 0..BOOK_MAX {
            b.started(1, &format!("j{i}"), &[]);
            if i > 0 {
                b.ended(&format!("j{i}"), JobStatus::Finished, Some(0));
            }
        }
        b.started(1, "new", &[]);
        assert_eq!(b.len(), BOOK_MAX);
        let t = lock(&b.entries);
        assert!(t.contains_key("j0"), "a running job is never evicted");
        assert!(t.contains_key("new"));
        assert!(!t.contains_key("j1"), "the oldest ended job goes first");
    }
}
