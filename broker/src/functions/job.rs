//! `shell::job::start`, `write`, `read`, `signal` and `wait`: background jobs a caller
//! drives. Each request is checked here into its typed executor request (the executor checks
//! it again); a job of an executor that died is answered from the job book, as
//! `shell::status` is.

use std::sync::Arc;

use base64::Engine as _;
use iii_shell_policy::job_output::OutputRing;
use iii_shell_protocol::exec::{ExecBgResponse, JobRecord, StatusResponse};
use iii_shell_protocol::job::{
    JobChunk, JobReadRequest, JobReadResponse, JobSignal, JobSignalRequest, JobSignalResponse,
    JobStartRequest, JobStream, JobWaitRequest, JobWriteRequest, JobWriteResponse,
    DEFAULT_READ_BYTES, DEFAULT_WAIT_MS, MAX_READ_BYTES, MAX_WAIT_MS,
};
use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::{Code, WireError};
use serde_json::Value;

use super::definition::{meta, to_value, FunctionDef};
use super::sandbox;
use crate::schema::schema_for;
use crate::services::{unexpected_reply, Services};
use crate::validate::{exec_request_with, parse};

pub fn definitions() -> Vec<FunctionDef> {
    vec![
        FunctionDef {
            id: "shell::job::start",
            description: "Start a background job whose stdin stays open as a pipe; returns { job_id, argv } immediately. Same command, args, cwd, env and checks as shell::exec_bg (host only) and the same job limit; `stdin` text is written first. Feed it with shell::job::write, read it with shell::job::read, signal it with shell::job::signal, wait for it with shell::job::wait; shell::status/list/kill work on it too.",
            metadata: meta(false, false, false),
            request_format: schema_for::<JobStartRequest>(),
            response_format: schema_for::<ExecBgResponse>(),
        },
        FunctionDef {
            id: "shell::job::write",
            description: "Write to the stdin of a job started by shell::job::start: `data` (text) or `data_base64` (bytes), at most jobs.max_write_bytes per call (S218 past it, nothing written); `close: true` closes stdin after (allowed alone). Writing to a closed stdin, to an ended job or to a shell::exec_bg job is S210. Returns { job_id, written, closed }.",
            metadata: meta(false, false, false),
            request_format: schema_for::<JobWriteRequest>(),
            response_format: schema_for::<JobWriteResponse>(),
        },
        FunctionDef {
            id: "shell::job::read",
            description: "Read a job's output (shell::job::start or shell::exec_bg) from `offset` on `stream` stdout, stderr or merged (arrival order). Returns the bytes as `data` when valid UTF-8, else `data_base64`, with `next_offset`, `missed` (bytes that fell out of the job's bounded buffer before this read) and `ended`. `wait_ms` (up to 30000) waits for new bytes instead of polling; `max_bytes` (up to 1048576) caps the reply.",
            metadata: meta(false, false, false),
            request_format: schema_for::<JobReadRequest>(),
            response_format: schema_for::<JobReadResponse>(),
        },
        FunctionDef {
            id: "shell::job::signal",
            description: "Send TERM, INT, HUP, QUIT, KILL, STOP, CONT, USR1 or USR2 to a running job's process group (any other signal is S210). Returns { job_id, signal, sent, status, reason }; `sent` is false when the job had already ended.",
            metadata: meta(false, false, false),
            request_format: schema_for::<JobSignalRequest>(),
            response_format: schema_for::<JobSignalResponse>(),
        },
        FunctionDef {
            id: "shell::job::wait",
            description: "Wait up to `timeout_ms` (at most 30000, the default) for a job to end, then return its record, the shape shell::status returns (`status` is still `running` when it did not end in time).",
            metadata: meta(false, false, false),
            request_format: schema_for::<JobWaitRequest>(),
            response_format: schema_for::<StatusResponse>(),
        },
    ]
}

pub async fn dispatch(
    services: &Arc<Services>,
    id: &str,
    payload: Value,
) -> Result<Value, WireError> {
    match id {
        "shell::job::start" => start(services, payload).await,
        "shell::job::write" => write(services, payload).await,
        "shell::job::read" => read(services, payload).await,
        "shell::job::signal" => signal(services, payload).await,
        "shell::job::wait" => wait(services, payload).await,
        other => Err(WireError::new(
            Code::S210,
            format!("unknown function: {other}"),
        )),
    }
}

fn invalid(message: impl Into<String>) -> WireError {
    WireError::new(Code::S210, message)
}

async fn start(services: &Arc<Services>, payload: Value) -> Result<Value, WireError> {
    let rt = services
        .snapshots
        .get()
        .ok_or_else(|| WireError::new(Code::S216, "no configuration is in force yet"))?;
    // The typed request first: its schema has no `target`, and a job is host-only.
    let _: JobStartRequest = parse(&payload)?;
    if payload.get("target").is_some() {
        return Err(invalid(
            "shell::job::start runs on the host only: it takes no target",
        ));
    }
    let c = exec_request_with(&payload, &rt.config, rt.denylist()?)?;
    let Some(mut spec) = c.spec else {
        return Err(invalid("shell::job::start runs on the host only"));
    };
    spec.stdin.get_or_insert_with(Vec::new);
    sandbox::check_shared_job_cap(services, rt.config.max_concurrent_jobs as usize).await?;
    let executor = services.executor.get().map(|c| c.pid);
    match services.executor.call(Request::JobStart(spec)).await? {
        Reply::JobStart(r) => {
            if let Some(pid) = executor {
                services.job_book.started(pid, &r.job_id, &r.argv);
            }
            to_value(&r)
        }
        _ => Err(unexpected_reply()),
    }
}

/// The bytes of a write request, checked: one of `data` / `data_base64`, within
/// `max_write_bytes`, and something to do.
pub fn write_bytes(req: &JobWriteRequest, max_write_bytes: u64) -> Result<Vec<u8>, WireError> {
    let data = match (&req.data, &req.data_base64) {
        (Some(_), Some(_)) => return Err(invalid("give data or data_base64, not both")),
        (Some(text), None) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| invalid(format!("data_base64 is not valid base64: {e}")))?,
        (None, None) => Vec::new(),
    };
    if data.len() as u64 > max_write_bytes {
        return Err(WireError::new(
            Code::S218,
            format!(
                "{} bytes is more than one shell::job::write may send (jobs.max_write_bytes = {max_write_bytes}): split the data into several writes",
                data.len()
            ),
        ));
    }
    if data.is_empty() && !req.close {
        return Err(invalid(
            "nothing to do: give data or data_base64, or close: true",
        ));
    }
    Ok(data)
}

async fn write(services: &Arc<Services>, payload: Value) -> Result<Value, WireError> {
    let req: JobWriteRequest = parse(&payload)?;
    let max = services
        .snapshots
        .get()
        .map(|rt| rt.config.jobs.max_write_bytes)
        .unwrap_or(u64::MAX);
    let data = write_bytes(&req, max)?;
    if let Some(job) = orphan(services, &req.job_id) {
        return Err(invalid(format!(
            "job {} has ended ({}): its stdin is closed",
            job.id,
            job.status.as_str()
        )));
    }
    let request = Request::JobWrite {
        job_id: req.job_id,
        data,
        close: req.close,
    };
    match services.executor.call(request).await? {
        Reply::JobWrite(r) => to_value(&r),
        _ => Err(unexpected_reply()),
    }
}

/// `max_bytes` and `wait_ms` of a read, checked.
pub fn read_bounds(req: &JobReadRequest) -> Result<(u64, u64), WireError> {
    let max_bytes = req.max_bytes.unwrap_or(DEFAULT_READ_BYTES);
    if !(1..=MAX_READ_BYTES).contains(&max_bytes) {
        return Err(invalid(format!(
            "max_bytes is {max_bytes}: it must be between 1 and {MAX_READ_BYTES}"
        )));
    }
    Ok((max_bytes, wait_bound("wait_ms", req.wait_ms)?))
}

fn wait_bound(key: &str, ms: u64) -> Result<u64, WireError> {
    if ms > MAX_WAIT_MS {
        return Err(invalid(format!(
            "{key} is {ms}: it must be at most {MAX_WAIT_MS}"
        )));
    }
    Ok(ms)
}

async fn read(services: &Arc<Services>, payload: Value) -> Result<Value, WireError> {
    let req: JobReadRequest = parse(&payload)?;
    let (max_bytes, wait_ms) = read_bounds(&req)?;
    if let Some(job) = orphan(services, &req.job_id) {
        let c = orphan_chunk(&job, req.stream, req.offset, max_bytes)?;
        return to_value(&JobReadResponse::from_chunk(req.job_id, req.stream, c));
    }
    let request = Request::JobRead {
        job_id: req.job_id.clone(),
        stream: req.stream,
        offset: req.offset,
        max_bytes,
        wait_ms,
    };
    match services.executor.call(request).await? {
        Reply::JobRead(c) => to_value(&JobReadResponse::from_chunk(req.job_id, req.stream, c)),
        _ => Err(unexpected_reply()),
    }
}

/// A read of a job of an executor that died: its stream is what its record holds (its output
/// was lost with the executor; stderr carries the note saying so), and it has ended.
pub fn orphan_chunk(
    job: &JobRecord,
    stream: JobStream,
    offset: u64,
    max_bytes: u64,
) -> Result<JobChunk, WireError> {
    let text = match stream {
        JobStream::Stdout => job.stdout.clone(),
        JobStream::Stderr => job.stderr.clone(),
        JobStream::Merged => format!("{}{}", job.stdout, job.stderr),
    };
    let mut ring = OutputRing::new(text.len());
    ring.push(text.as_bytes());
    let s = ring
        .read(offset, usize::try_from(max_bytes).unwrap_or(usize::MAX))
        .map_err(|e| invalid(e.to_string()))?;
    Ok(JobChunk {
        offset: s.offset,
        ended: s.next_offset == ring.end(),
        bytes: s.bytes,
        next_offset: s.next_offset,
        missed: s.missed,
        status: job.status,
    })
}

async fn signal(services: &Arc<Services>, payload: Value) -> Result<Value, WireError> {
    let req: JobSignalRequest = parse(&payload)?;
    let Some(signal) = JobSignal::parse(&req.signal) else {
        return Err(invalid(JobSignal::refusal(&req.signal)));
    };
    if let Some(job) = orphan(services, &req.job_id) {
        return to_value(&JobSignalResponse {
            job_id: job.id,
            signal: signal.name().to_string(),
            sent: false,
            status: job.status,
            reason: Some(format!("job already {}", job.status.as_str())),
        });
    }
    let request = Request::JobSignal {
        job_id: req.job_id,
        signal,
    };
    match services.executor.call(request).await? {
        Reply::JobSignal(r) => to_value(&r),
        _ => Err(unexpected_reply()),
    }
}

async fn wait(services: &Arc<Services>, payload: Value) -> Result<Value, WireError> {
    let req: JobWaitRequest = parse(&payload)?;
    let timeout_ms = wait_bound("timeout_ms", req.timeout_ms.unwrap_or(DEFAULT_WAIT_MS))?;
    if let Some(job) = orphan(services, &req.job_id) {
        return to_value(&StatusResponse { job });
    }
    let request = Request::JobWait {
        job_id: req.job_id,
        timeout_ms,
    };
    match services.executor.call(request).await? {
        Reply::JobWait(r) => to_value(&r),
        _ => Err(unexpected_reply()),
    }
}

/// The record of a job of an executor that died (the job book answers for it).
fn orphan(services: &Services, id: &str) -> Option<JobRecord> {
    if let Some(rt) = services.snapshots.get() {
        services.job_book.prune(rt.config.job_retention_secs);
    }
    services.job_book.orphan_record(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iii_shell_protocol::exec::JobStatus;

    fn write_req(data: Option<&str>, b64: Option<&str>, close: bool) -> JobWriteRequest {
        JobWriteRequest {
            job_id: "j".into(),
            data: data.map(Into::into),
            data_base64: b64.map(Into::into),
            close,
        }
    }

    #[test]
    fn write_bytes_exact_values() {
        assert_eq!(
            write_bytes(&write_req(Some("hi\n"), None, false), 3).unwrap(),
            b"hi\n"
        );
        assert_eq!(
            write_bytes(&write_req(None, Some("/2E="), false), 3).unwrap(),
            [0xff, b'a']
        );
        assert_eq!(write_bytes(&write_req(None, None, true), 3).unwrap(), b"");
        let e = write_bytes(&write_req(Some("abcd"), None, false), 3).unwrap_err();
        assert!(e.is(Code::S218), "{e:?}");
        assert_eq!(e.message, "4 bytes is more than one shell::job::write may send (jobs.max_write_bytes = 3): split the data into several writes");
        for bad in [
            write_req(Some("a"), Some("YQ=="), false),
            write_req(None, Some("not base64!"), false),
            write_req(None, None, false),
            write_req(Some(""), None, false),
        ] {
            let e = write_bytes(&bad, 3).unwrap_err();
            assert!(e.is(Code::S210), "{bad:?}: {e:?}");
        }
    }

    #[test]
    fn read_bounds_exact_values() {
        let req = |max_bytes: Option<u64>, wait_ms: u64| JobReadRequest {
            job_id: "j".into(),
            stream: JobStream::Merged,
            offset: 0,
            max_bytes,
            wait_ms,
        };
        assert_eq!(read_bounds(&req(None, 0)).unwrap(), (65_536, 0));
        assert_eq!(read_bounds(&req(Some(1), 30_000)).unwrap(), (1, 30_000));
        assert_eq!(read_bounds(&req(Some(1 << 20), 5)).unwrap(), (1 << 20, 5));
        for (m, w) in [(Some(0), 0), (Some((1 << 20) + 1), 0), (None, 30_001)] {
            assert!(
                read_bounds(&req(m, w)).unwrap_err().is(Code::S210),
                "{m:?} {w}"
            );
        }
    }

    #[test]
    fn a_dead_executors_job_reads_as_its_record() {
        let job = JobRecord {
            id: "j".into(),
            argv: vec!["sh".into()],
            status: JobStatus::Killed,
            exit_code: None,
            started_at_ms: 1,
            finished_at_ms: Some(2),
            stdout: String::new(),
            stderr: "note\n".into(),
            stdout_truncated: false,
            stderr_truncated: false,
        };
        let c = orphan_chunk(&job, JobStream::Merged, 0, 3).unwrap();
        assert_eq!(
            (c.bytes.as_slice(), c.next_offset, c.ended),
            (&b"not"[..], 3, false)
        );
        let c = orphan_chunk(&job, JobStream::Stderr, 3, 9).unwrap();
        assert_eq!(
            (c.bytes.as_slice(), c.next_offset, c.ended),
            (&b"e\n"[..], 5, true)
        );
        let c = orphan_chunk(&job, JobStream::Stdout, 0, 9).unwrap();
        assert_eq!(
            (c.bytes.len(), c.next_offset, c.ended, c.status),
            (0, 0, true, JobStatus::Killed)
        );
        assert!(orphan_chunk(&job, JobStream::Stdout, 1, 9)
            .unwrap_err()
            .is(Code::S210));
    }
}
