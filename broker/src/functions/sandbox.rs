//! Forwarding `target: {kind: "sandbox", sandbox_id}` calls through the engine to the
//! iii-sandbox worker: `shell::exec` and `shell::exec_bg` go to `sandbox::exec`, every
//! `shell::fs::<op>` to `sandbox::fs::<op>` (contract §6). Validation has already run
//! (`validate::exec_request`, `fs::dispatch`); this module builds the sandbox payload, calls
//! the engine with a deadline, validates the reply ([`replies`]) and maps failures to the
//! caller's S-codes ([`scode`]). A sandbox failure never falls back to the host.

mod replies;
mod scode;

use std::sync::Arc;
use std::time::Duration;

use iii_shell_policy::capture::Capture;
use iii_shell_protocol::exec::{ExecBgResponse, ExecResponse, JobStatus, Target};
use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::{Code, WireError};
use serde_json::{json, Value};

use crate::engine::EngineLink;
use crate::sandbox_jobs::{cap_reached, JobEnd, SandboxJob};
use crate::services::Services;
use crate::snapshot::ConfigSnapshot;
use crate::validate::{resolve_timeout, CheckedExec};

use replies::ExecReply;

/// RPC deadline of `sandbox::fs::*` calls. The daemon has no fs timeout of its own, and a
/// streamed write lasts as long as the caller keeps writing.
const FS_RPC_TIMEOUT: Duration = Duration::from_secs(300);

/// Added to an exec's `timeout_ms` for its RPC deadline, so the sandbox's own timeout (its
/// reply's `timed_out`) is what normally ends a long command, not ours.
const EXEC_RPC_SLACK: Duration = Duration::from_secs(30);

/// Forwards `shell::fs::<op>` to `sandbox::fs::<op>` with `sandbox_id` injected. `body` is the
/// request minus the host-only fields; field names are sent unchanged.
pub async fn fs(
    services: &Arc<Services>,
    op: &str,
    sandbox_id: &str,
    body: Value,
) -> Result<Value, WireError> {
    if !replies::FS_OPS.contains(&op) {
        return Err(WireError::new(
            Code::S210,
            format!("unknown function: shell::fs::{op}"),
        ));
    }
    let mut body = body;
    let Some(fields) = body.as_object_mut() else {
        return Err(WireError::new(
            Code::S210,
            "malformed payload: expected an object",
        ));
    };
    fields.insert("sandbox_id".into(), json!(sandbox_id));
    let engine = services.engine()?;
    let reply = engine
        .call_with_timeout(&format!("sandbox::fs::{op}"), body, FS_RPC_TIMEOUT)
        .await
        .map_err(|e| scode::to_wire(&e))?;
    replies::fs_reply(op, reply)
}

/// What a forwarded `sandbox::exec` came to. A sandbox error, S200 (an in-VM execution
/// failure) included, is the call's error: only a reply's own `timed_out` is a timeout.
enum Forwarded {
    Reply(ExecReply),
    Failed(WireError),
}

async fn forward_exec(engine: &EngineLink, payload: Value, timeout_ms: u64) -> Forwarded {
    let deadline = Duration::from_millis(timeout_ms).saturating_add(EXEC_RPC_SLACK);
    match engine
        .call_with_timeout("sandbox::exec", payload, deadline)
        .await
    {
        Ok(v) => match replies::exec_reply(v) {
            Ok(r) => Forwarded::Reply(r),
            Err(e) => Forwarded::Failed(e),
        },
        Err(e) => Forwarded::Failed(scode::to_wire(&e)),
    }
}

/// The sandbox id of a checked request; S210 unless it is a UUID.
fn sandbox_id(c: &CheckedExec) -> Result<&str, WireError> {
    match &c.request.target {
        Target::Sandbox { sandbox_id } if uuid::Uuid::parse_str(sandbox_id).is_ok() => {
            Ok(sandbox_id)
        }
        Target::Sandbox { sandbox_id } => Err(WireError::new(
            Code::S210,
            format!("sandbox_id {sandbox_id:?} is not a UUID"),
        )),
        Target::Host => Err(WireError::new(
            Code::S216,
            "internal error: a host request reached the sandbox forwarder",
        )),
    }
}

/// `{sandbox_id, cmd: argv[0], args: argv[1..], timeout_ms}`; never env/workdir/stdin/argv.
fn exec_payload(sandbox_id: &str, argv: &[String], timeout_ms: u64) -> Result<Value, WireError> {
    let Some((cmd, args)) = argv.split_first() else {
        return Err(WireError::new(
            Code::S210,
            iii_shell_policy::argv::EMPTY_COMMAND,
        ));
    };
    Ok(json!({"sandbox_id": sandbox_id, "cmd": cmd, "args": args, "timeout_ms": timeout_ms}))
}

/// `text` cut to `cap` bytes (at a character boundary), and whether it was cut.
fn capped(text: String, cap: u64) -> (String, bool) {
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    if text.len() <= cap {
        return (text, false);
    }
    let mut c = Capture::new(cap);
    c.push(text.as_bytes());
    (c.text(), c.truncated)
}

/// `shell::exec` on a sandbox target. A reply with `timed_out: true` is a normal result; a
/// sandbox error (S200 included) is the call's error with its code.
pub async fn exec(
    services: &Arc<Services>,
    rt: &ConfigSnapshot,
    c: &CheckedExec,
) -> Result<ExecResponse, WireError> {
    let id = sandbox_id(c)?;
    let timeout_ms = resolve_timeout(c.request.timeout_ms, &rt.config);
    let payload = exec_payload(id, &c.argv, timeout_ms)?;
    let engine = services.engine()?;
    match forward_exec(&engine, payload, timeout_ms).await {
        Forwarded::Reply(r) => {
            let (stdout, stdout_truncated) = capped(r.stdout, rt.config.max_output_bytes);
            let (stderr, stderr_truncated) = capped(r.stderr, rt.config.max_output_bytes);
            Ok(ExecResponse {
                stdout,
                stderr,
                exit_code: r.exit_code,
                timed_out: r.timed_out,
                stdout_truncated,
                stderr_truncated,
                duration_ms: r.duration_ms,
            })
        }
        Forwarded::Failed(e) => Err(e),
    }
}

/// exec_bg reports spawn-time failures (after request validation, which keeps its S-codes
/// as on the host) as plain messages, with any S-code embedded (`S216: …`).
pub fn plain_spawn_failure(e: WireError) -> WireError {
    if e.is(Code::InvocationFailed) {
        e
    } else {
        WireError::plain(format!("{}: {}", e.code, e.message))
    }
}

/// `shell::exec_bg` on a sandbox target: records a running job and runs `sandbox::exec` in a
/// detached task with the resolved timeout.
pub async fn exec_bg(
    services: &Arc<Services>,
    rt: &ConfigSnapshot,
    c: CheckedExec,
) -> Result<ExecBgResponse, WireError> {
    // A bad sandbox id is a request-validation failure: S210, as on shell::exec.
    let id = sandbox_id(&c)?.to_string();
    let timeout_ms = resolve_timeout(c.request.timeout_ms, &rt.config);
    let payload = exec_payload(&id, &c.argv, timeout_ms)?;
    // Not a spawn-time failure: without an engine (`iii-shell call`) no sandbox call can
    // work, and that is S216 as for every other sandbox target.
    let engine = services.engine()?;
    start_job(services, rt, c, engine, payload, timeout_ms)
        .await
        .map_err(plain_spawn_failure)
}

async fn start_job(
    services: &Arc<Services>,
    rt: &ConfigSnapshot,
    c: CheckedExec,
    engine: EngineLink,
    payload: Value,
    timeout_ms: u64,
) -> Result<ExecBgResponse, WireError> {
    let limit = rt.config.max_concurrent_jobs as usize;
    let host_running = running_host_jobs(services).await;
    let job = services
        .sandbox_jobs
        .try_start(
            c.argv.clone(),
            rt.config.max_output_bytes,
            rt.config.job_retention_secs,
            limit,
            host_running,
        )
        .map_err(WireError::plain)?;
    tokio::spawn(run_job(engine, job.clone(), payload, timeout_ms));
    Ok(ExecBgResponse {
        job_id: job.id().to_string(),
        argv: c.argv,
    })
}

async fn run_job(engine: EngineLink, job: Arc<SandboxJob>, payload: Value, timeout_ms: u64) {
    let end = match forward_exec(&engine, payload, timeout_ms).await {
        Forwarded::Reply(r) => JobEnd::Exited {
            stdout: r.stdout,
            stderr: r.stderr,
            exit_code: r.exit_code,
            timed_out: r.timed_out,
        },
        Forwarded::Failed(e) => JobEnd::Failed {
            reason: format!("sandbox::exec failed: {}: {}", e.code, e.message),
        },
    };
    job.finish(end);
}

/// Running host jobs, for the job cap shared with sandbox jobs; 0 when the executor cannot
/// be asked (a sandbox job does not depend on it).
async fn running_host_jobs(services: &Services) -> usize {
    match services.executor.call(Request::JobList).await {
        Ok(Reply::JobList(r)) => r
            .jobs
            .iter()
            .filter(|j| j.status == JobStatus::Running)
            .count(),
        _ => 0,
    }
}

/// Host `shell::exec_bg`: running sandbox jobs count toward `max_concurrent_jobs` too. Asks
/// the executor only while sandbox jobs are running; the executor itself caps host jobs.
pub async fn check_shared_job_cap(services: &Services, limit: usize) -> Result<(), WireError> {
    let sandbox_running = services.sandbox_jobs.running();
    if sandbox_running == 0 {
        return Ok(());
    }
    if running_host_jobs(services)
        .await
        .saturating_add(sandbox_running)
        >= limit
    {
        return Err(WireError::plain(cap_reached(limit)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_and_caps() {
        let v = exec_payload("id", &["ls".into(), "-l".into(), "a b".into()], 5).unwrap();
        assert_eq!(
            v,
            json!({"sandbox_id": "id", "cmd": "ls", "args": ["-l", "a b"], "timeout_ms": 5})
        );
        assert!(exec_payload("id", &[], 5).is_err());
        assert_eq!(capped("abc".into(), 3), ("abc".into(), false));
        assert_eq!(capped("ab€".into(), 4), ("ab".into(), true));
        let e = plain_spawn_failure(WireError::new(Code::S210, "'env' is host-only"));
        assert_eq!(
            (e.code.as_str(), e.message.as_str()),
            ("invocation_failed", "S210: 'env' is host-only")
        );
        assert_eq!(plain_spawn_failure(WireError::plain("x")).message, "x");
    }
}
