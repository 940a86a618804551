//! `Request::Usage`: this executor's memory and CPU, its parent's when a `serve` supervisor
//! started it, and the running jobs and terminal sessions, for the worker's gauges.

use iii_shell_confine::proc_stat::{read_pid, Sample};
use iii_shell_protocol::trace::{ProcessUsage, UsageReport};

use crate::Executor;

fn usage_of(s: Sample) -> ProcessUsage {
    ProcessUsage {
        rss_bytes: s.rss_bytes,
        file_bytes: s.file_bytes,
        cpu_micros: s.cpu_micros,
    }
}

impl Executor {
    pub fn usage(&self) -> UsageReport {
        UsageReport {
            executor: read_pid(None).map(usage_of).unwrap_or_default(),
            supervisor: self
                .supervisor
                .get()
                .and_then(|pid| read_pid(Some(*pid)))
                .map(usage_of),
            running_jobs: self.jobs.retained().running as u64,
            pty_sessions: self.pty.len() as u64,
        }
    }
}
