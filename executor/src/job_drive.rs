//! Driving a background job (`shell::job::write`, `read`, `signal`, `wait`): every request
//! re-checked here against the same bounds the broker applied (`jobs.*` of the policy, the
//! read and wait limits of `iii_shell_protocol::job`).

use std::time::Duration;

use iii_shell_files::error::ExecError;
use iii_shell_policy::job_output::utf8_cut;
use iii_shell_policy::sync::lock;
use iii_shell_protocol::exec::{JobRecord, JobStatus};
use iii_shell_protocol::job::{
    JobChunk, JobSignal, JobSignalResponse, JobStream, JobWriteResponse, MAX_READ_BYTES,
    MAX_WAIT_MS,
};
use tokio::io::AsyncWriteExt;

use crate::job_io::{signal_number, JobStdin, WaiterSlot};
use crate::jobs::{Job, Jobs};
use crate::policy::Policy;

/// How long one write may take in all: waiting for an earlier write to the same job, then for
/// the program to take the bytes; past it the write returns what it wrote (`written`).
pub const WRITE_WAIT: Duration = Duration::from_secs(5);

/// One `shell::job::read`.
#[derive(Debug, Clone, Copy)]
pub struct ReadAsk {
    pub stream: JobStream,
    pub offset: u64,
    pub max_bytes: u64,
    pub wait_ms: u64,
}

impl Jobs {
    /// Writes `data` to a `shell::job::start` job's stdin, then closes it when `close`.
    pub async fn write(
        &self,
        policy: &Policy,
        id: &str,
        data: &[u8],
        close: bool,
    ) -> Result<JobWriteResponse, ExecError> {
        let cap = policy.config.jobs.max_write_bytes;
        if data.len() as u64 > cap {
            return Err(ExecError::TooLarge(format!(
                "{} bytes is more than one shell::job::write may send (jobs.max_write_bytes = {cap}): split the data into several writes",
                data.len()
            )));
        }
        if data.is_empty() && !close {
            return Err(ExecError::Invalid(
                "nothing to do: give data or data_base64, or close: true".into(),
            ));
        }
        let job = self.get(id)?;
        let status = lock(&job.state).status;
        if status != JobStatus::Running {
            return Err(ExecError::Invalid(format!(
                "job {id} has ended ({}): its stdin is closed",
                status.as_str()
            )));
        }
        let deadline = tokio::time::Instant::now() + WRITE_WAIT;
        let Ok(mut stdin) = tokio::time::timeout_at(deadline, job.stdin.lock()).await else {
            // An earlier write still waits on a program that does not read.
            return Ok(JobWriteResponse {
                job_id: job.id.clone(),
                written: 0,
                closed: false,
            });
        };
        let written = match &mut *stdin {
            JobStdin::NotOpen => return Err(ExecError::Invalid(format!(
                "job {id} was started by shell::exec_bg: its stdin was closed at start; start a job with shell::job::start to write to it"
            ))),
            JobStdin::Closed => {
                return Err(ExecError::Invalid(format!("the stdin of job {id} is closed")))
            }
            JobStdin::Open(tx) => match write_some(tx, data, deadline).await {
                Ok(n) => n,
                Err(n) => {
                    *stdin = JobStdin::Closed;
                    return Err(ExecError::Invalid(format!(
                        "job {id} no longer reads its stdin (the program closed it or exited): {n} of {} bytes were written",
                        data.len()
                    )));
                }
            },
        };
        if close {
            *stdin = JobStdin::Closed;
        }
        Ok(JobWriteResponse {
            job_id: job.id.clone(),
            written: written as u64,
            closed: matches!(*stdin, JobStdin::Closed),
        })
    }

    /// Reads a job's output from an offset, long-polling up to `wait_ms` for a first byte.
    pub async fn read(
        &self,
        policy: &Policy,
        id: &str,
        ask: ReadAsk,
    ) -> Result<JobChunk, ExecError> {
        if !(1..=MAX_READ_BYTES).contains(&ask.max_bytes) {
            return Err(ExecError::Invalid(format!(
                "max_bytes is {}: it must be between 1 and {MAX_READ_BYTES}",
                ask.max_bytes
            )));
        }
        check_wait("wait_ms", ask.wait_ms)?;
        let job = self.get(id)?;
        let mut arrived = job.output.subscribe();
        let first = chunk(&job, ask)?;
        if ask.wait_ms == 0 || !first.bytes.is_empty() || first.ended || first.missed > 0 {
            return Ok(first);
        }
        let _slot = self.waiter(policy)?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(ask.wait_ms);
        let mut done = job.done.clone();
        loop {
            tokio::select! {
                _ = arrived.changed() => {}
                _ = done.wait_for(|d| *d) => {}
                _ = tokio::time::sleep_until(deadline) => return chunk(&job, ask),
            }
            let c = chunk(&job, ask)?;
            if !c.bytes.is_empty() || c.ended || c.missed > 0 {
                return Ok(c);
            }
        }
    }

    /// Sends `signal` to a running job's process group.
    pub fn signal(&self, id: &str, signal: JobSignal) -> Result<JobSignalResponse, ExecError> {
        let job = self.get(id)?;
        let st = lock(&job.state);
        let reply = |sent: bool, reason: Option<String>| JobSignalResponse {
            job_id: job.id.clone(),
            signal: signal.name().to_string(),
            sent,
            status: st.status,
            reason,
        };
        if st.status != JobStatus::Running {
            return Ok(reply(
                false,
                Some(format!("job already {}", st.status.as_str())),
            ));
        }
        if job.tree.reaped.load(std::sync::atomic::Ordering::SeqCst) {
            // Its process group id may name another group by now: nothing is sent.
            return Ok(reply(
                false,
                Some("the job's program has exited; the job is ending".into()),
            ));
        }
        // SAFETY: kill(2) with a negative pid (the job's process group: its root called
        // setsid) and a signal number has no memory effects. The root is not reaped yet, so
        // the group id is still the job's.
        let r = unsafe { libc::kill(-job.tree.root, signal_number(signal)) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return Err(ExecError::Internal(format!(
                "job {id}: SIG{} could not be sent: {e}",
                signal.name()
            )));
        }
        Ok(reply(true, None))
    }

    /// Waits up to `timeout_ms` for a job to end; its record either way.
    pub async fn wait(
        &self,
        policy: &Policy,
        id: &str,
        timeout_ms: u64,
    ) -> Result<JobRecord, ExecError> {
        check_wait("timeout_ms", timeout_ms)?;
        let job = self.get(id)?;
        if timeout_ms > 0 && !*job.done.borrow() {
            let _slot = self.waiter(policy)?;
            let mut done = job.done.clone();
            let _ = tokio::time::timeout(Duration::from_millis(timeout_ms), done.wait_for(|d| *d))
                .await;
        }
        Ok(job.record())
    }

    fn waiter(&self, policy: &Policy) -> Result<WaiterSlot<'_>, ExecError> {
        let limit = policy.config.jobs.max_waiters as usize;
        self.waiters.take(limit).ok_or_else(|| {
            ExecError::TooLarge(format!(
                "{limit} callers are waiting on jobs already (jobs.max_waiters): retry later, or read with wait_ms 0"
            ))
        })
    }
}

fn check_wait(key: &str, ms: u64) -> Result<(), ExecError> {
    if ms > MAX_WAIT_MS {
        return Err(ExecError::Invalid(format!(
            "{key} is {ms}: it must be at most {MAX_WAIT_MS}"
        )));
    }
    Ok(())
}

/// What a job's stream holds from `ask.offset` now.
fn chunk(job: &Job, ask: ReadAsk) -> Result<JobChunk, ExecError> {
    // `done` first: once it is set, every byte of the job is in its rings.
    let done = *job.done.borrow();
    let status = lock(&job.state).status;
    let rings = lock(&job.output.rings);
    let ring = rings.get(ask.stream);
    let max = usize::try_from(ask.max_bytes).unwrap_or(usize::MAX);
    let mut s = ring
        .read(ask.offset, max)
        .map_err(|e| ExecError::Invalid(e.to_string()))?;
    let ended = done && s.next_offset == ring.end();
    let keep = utf8_cut(&s.bytes, ended);
    s.next_offset -= (s.bytes.len() - keep) as u64;
    s.bytes.truncate(keep);
    Ok(JobChunk {
        offset: s.offset,
        bytes: s.bytes,
        next_offset: s.next_offset,
        missed: s.missed,
        ended,
        status,
    })
}

/// Writes `data` until done or until `deadline`: `Ok(written)`. `Err(written)` when the pipe
/// is closed at its other end.
async fn write_some(
    tx: &mut tokio::net::unix::pipe::Sender,
    data: &[u8],
    deadline: tokio::time::Instant,
) -> Result<usize, usize> {
    let mut written = 0;
    while written < data.len() {
        match tokio::time::timeout_at(deadline, tx.write(&data[written..])).await {
            Ok(Ok(0)) | Err(_) => break,
            Ok(Ok(n)) => written += n,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(_)) => return Err(written),
        }
    }
    Ok(written)
}
