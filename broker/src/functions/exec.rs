//! `shell::exec`, `shell::exec_bg`, `shell::status`, `shell::list`, `shell::kill`.

use std::sync::Arc;

use iii_shell_protocol::exec::{
    ExecBgRequest, ExecBgResponse, ExecRequest, ExecResponse, KillRequest, KillResponse,
    ListRequest, ListResponse, StatusRequest, StatusResponse,
};
use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::{Code, WireError};
use serde_json::Value;

use super::definition::{meta, to_value, FunctionDef};
use super::sandbox;
use crate::schema::schema_for;
use crate::services::{unexpected_reply, Services};
use crate::snapshot::ConfigSnapshot;
use crate::validate::{exec_request_with, parse, CheckedExec};

pub fn definitions() -> Vec<FunctionDef> {
    vec![
        FunctionDef {
            id: "shell::exec",
            description: "Run a command in the foreground and return its full output. Put the program in `command` (string) and arguments in `args` (string[]), never argv in `command`. Host-only cwd/env/stdin reject S210 on a sandbox target. Errors return { code, message }; common: S216 host exec error, S300 VM boot failed, S200 in-VM failure.",
            metadata: meta(false, false, false),
            request_format: schema_for::<ExecRequest>(),
            response_format: schema_for::<ExecResponse>(),
        },
        FunctionDef {
            id: "shell::exec_bg",
            description: "Spawn a background job; returns { job_id, argv } immediately. Same payload as shell::exec. Host jobs ignore timeout_ms and run until exit or shell::kill; poll with shell::status, list with shell::list. Spawn-time failures are plain-string messages; later failures surface in shell::status, not here.",
            metadata: meta(false, false, false),
            request_format: schema_for::<ExecBgRequest>(),
            response_format: schema_for::<ExecBgResponse>(),
        },
        FunctionDef {
            id: "shell::status",
            description: "Fetch the full record (status, exit_code, timing) of a background job by job_id. Errors return { code, message }; common: S211 no such job.",
            metadata: meta(false, false, false),
            request_format: schema_for::<StatusRequest>(),
            response_format: schema_for::<StatusResponse>(),
        },
        FunctionDef {
            id: "shell::list",
            description: "List background jobs (running + recently completed). Takes no arguments.",
            metadata: meta(false, false, false),
            request_format: schema_for::<ListRequest>(),
            response_format: schema_for::<ListResponse>(),
        },
        FunctionDef {
            id: "shell::kill",
            description: "Terminate a running background job by job_id (the UUID from shell::exec_bg). Errors return { code, message }; common: S211 no such job, S216 kill/signal delivery failure.",
            metadata: meta(false, false, false),
            request_format: schema_for::<KillRequest>(),
            response_format: schema_for::<KillResponse>(),
        },
    ]
}

fn snapshot(services: &Services) -> Result<Arc<ConfigSnapshot>, WireError> {
    services
        .snapshots
        .get()
        .ok_or_else(|| WireError::new(Code::S216, "no configuration is in force yet"))
}

fn checked(rt: &ConfigSnapshot, payload: &Value) -> Result<CheckedExec, WireError> {
    exec_request_with(payload, &rt.config, rt.denylist()?)
}

pub async fn exec(services: &Arc<Services>, payload: Value) -> Result<Value, WireError> {
    let rt = snapshot(services)?;
    let c = checked(&rt, &payload)?;
    let Some(spec) = c.spec else {
        return to_value(&sandbox::exec(services, &rt, &c).await?);
    };
    match services.executor.call(Request::Exec(spec)).await? {
        Reply::Exec(r) => to_value(&r),
        _ => Err(unexpected_reply()),
    }
}

pub async fn exec_bg(services: &Arc<Services>, payload: Value) -> Result<Value, WireError> {
    let rt = snapshot(services)?;
    let c = checked(&rt, &payload)?;
    let Some(spec) = c.spec else {
        return to_value(&sandbox::exec_bg(services, &rt, c).await?);
    };
    // The job cap is shared with sandbox jobs (the executor only counts host jobs).
    sandbox::check_shared_job_cap(services, rt.config.max_concurrent_jobs as usize).await?;
    let executor = services.executor.get().map(|c| c.pid);
    match services.executor.call(Request::ExecBg(spec)).await? {
        Reply::ExecBg(r) => {
            if let Some(pid) = executor {
                services.job_book.started(pid, &r.job_id, &r.argv);
            }
            to_value(&r)
        }
        _ => Err(unexpected_reply()),
    }
}

pub async fn status(services: &Arc<Services>, payload: Value) -> Result<Value, WireError> {
    let req: StatusRequest = parse(&payload)?;
    // Sandbox jobs live in the broker, host jobs in the executor.
    if let Some(job) = services.sandbox_jobs.status(&req.job_id) {
        return to_value(&StatusResponse { job });
    }
    // A job of an executor that died: the broker's own record answers.
    prune_book(services);
    if let Some(job) = services.job_book.orphan_record(&req.job_id) {
        return to_value(&StatusResponse { job });
    }
    match services
        .executor
        .call(Request::JobStatus { job_id: req.job_id })
        .await?
    {
        Reply::JobStatus(r) => to_value(&r),
        _ => Err(unexpected_reply()),
    }
}

pub async fn list(services: &Arc<Services>) -> Result<Value, WireError> {
    let mut jobs = match services.executor.call(Request::JobList).await? {
        Reply::JobList(r) => r.jobs,
        _ => return Err(unexpected_reply()),
    };
    jobs.extend(services.sandbox_jobs.summaries());
    prune_book(services);
    jobs.extend(services.job_book.orphan_summaries());
    jobs.sort_by(|a, b| {
        a.started_at_ms
            .cmp(&b.started_at_ms)
            .then_with(|| a.id.cmp(&b.id))
    });
    to_value(&ListResponse {
        count: jobs.len(),
        jobs,
    })
}

pub async fn kill(services: &Arc<Services>, payload: Value) -> Result<Value, WireError> {
    let req: KillRequest = parse(&payload)?;
    if let Some(r) = services.sandbox_jobs.kill(&req.job_id) {
        return to_value(&r);
    }
    if let Some(r) = services.job_book.orphan_kill(&req.job_id) {
        return to_value(&r);
    }
    match services
        .executor
        .call(Request::JobKill { job_id: req.job_id })
        .await?
    {
        Reply::JobKill(r) => to_value::<KillResponse>(&r),
        _ => Err(unexpected_reply()),
    }
}

/// Drops the records of dead executors' jobs past `job_retention_secs`.
fn prune_book(services: &Services) {
    if let Some(rt) = services.snapshots.get() {
        services.job_book.prune(rt.config.job_retention_secs);
    }
}
