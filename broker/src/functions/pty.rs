//! `shell::pty::*`: terminal sessions. The sessions themselves live in the executor (see
//! `executor/src/pty`); this validates calls, converts frames to base64, and starts the
//! delivery of live output (`crate::pty_delivery`).

use std::sync::Arc;

use base64::Engine as _;
use iii_shell_policy::command::{check_command, CommandCheck};
use iii_shell_policy::denylist::Denylist;
use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::pty::{
    bad_output_target, caller_of, parse_output_target, AdoptRequest, AttachRequest, AttachResponse,
    Attached, CloseRequest, CloseResponse, DetachRequest, DetachResponse, OpenRequest,
    OpenResponse, OpenSpec, OutputFrame, PtyOp, PtyReply, ResizeRequest, ResizeResponse,
    SessionsRequest, SessionsResponse, WriteRequest, WriteResponse, MAX_WRITE_BYTES,
};
use iii_shell_protocol::{Code, WireError};
use serde_json::Value;

use super::definition::{meta, to_value, FunctionDef};
use crate::pty_delivery::send;
use crate::schema::schema_for;
use crate::services::{unexpected_reply, Services};
use crate::validate::parse;

pub fn definitions() -> Vec<FunctionDef> {
    let hidden = || meta(true, true, false);
    vec![
        FunctionDef {
            id: "shell::pty::adopt",
            description: "Take back an unattached PTY session whose reconnect token is gone, from the console page that owns it. Refuses a session someone is attached to, and a page that is not the session's own.",
            metadata: hidden(),
            request_format: schema_for::<AdoptRequest>(),
            response_format: schema_for::<AttachResponse>(),
        },
        FunctionDef {
            id: "shell::pty::attach",
            description: "Attach to a retained PTY session and replay buffered output.",
            metadata: hidden(),
            request_format: schema_for::<AttachRequest>(),
            response_format: schema_for::<AttachResponse>(),
        },
        FunctionDef {
            id: "shell::pty::close",
            description: "Terminate and close a PTY session.",
            metadata: hidden(),
            request_format: schema_for::<CloseRequest>(),
            response_format: schema_for::<CloseResponse>(),
        },
        FunctionDef {
            id: "shell::pty::detach",
            description: "Detach a browser output target while retaining its PTY session.",
            metadata: hidden(),
            request_format: schema_for::<DetachRequest>(),
            response_format: schema_for::<DetachResponse>(),
        },
        FunctionDef {
            id: "shell::pty::open",
            description: "Open a persistent host PTY running the user's login shell, or the program named in `program`.",
            metadata: hidden(),
            request_format: schema_for::<OpenRequest>(),
            response_format: schema_for::<OpenResponse>(),
        },
        FunctionDef {
            id: "shell::pty::resize",
            description: "Resize a PTY session in terminal columns and rows.",
            metadata: hidden(),
            request_format: schema_for::<ResizeRequest>(),
            response_format: schema_for::<ResizeResponse>(),
        },
        FunctionDef {
            id: "shell::pty::sessions",
            description: "List live PTY sessions with program, cwd, sequence, replay buffer size, and output target. Diagnostics only — no credentials.",
            metadata: meta(false, false, false),
            request_format: schema_for::<SessionsRequest>(),
            response_format: schema_for::<SessionsResponse>(),
        },
        FunctionDef {
            id: "shell::pty::write",
            description: "Write base64-encoded keyboard input to a PTY session.",
            metadata: hidden(),
            request_format: schema_for::<WriteRequest>(),
            response_format: schema_for::<WriteResponse>(),
        },
    ]
}

fn invalid(message: impl Into<String>) -> WireError {
    WireError::new(Code::S210, message)
}

/// The output target must have the enforced shape (S210 otherwise).
pub fn check_target(id: &str) -> Result<(), WireError> {
    parse_output_target(id)
        .map(|_| ())
        .ok_or_else(|| invalid(bad_output_target(id)))
}

fn check_size(cols: u16, rows: u16) -> Result<(), WireError> {
    if cols == 0 || rows == 0 {
        return Err(invalid(format!(
            "cols and rows must be at least 1 (got {cols}x{rows})"
        )));
    }
    Ok(())
}

/// Checks an `open` payload and turns it into what the executor gets: the output target and
/// the size, then the one command validator (`policy::command`), which the executor re-runs.
pub fn open_spec(
    req: OpenRequest,
    unjailed: bool,
    denylist: &Denylist,
) -> Result<OpenSpec, WireError> {
    check_target(&req.output_function_id)?;
    check_size(req.cols, req.rows)?;
    let env: Vec<(String, String)> = req.env.unwrap_or_default().into_iter().collect();
    // `args` means nothing without `program`: a login shell takes no arguments here.
    let argv = req.program.map(|p| {
        let mut argv = vec![p];
        argv.extend(req.args.unwrap_or_default());
        argv
    });
    let cmd = CommandCheck {
        argv: argv.as_deref(),
        env: &env,
        cwd: Some(&req.cwd),
    };
    check_command(&cmd, denylist, !unjailed)?;
    Ok(OpenSpec {
        cwd: req.cwd,
        cols: req.cols,
        rows: req.rows,
        output_function_id: req.output_function_id,
        argv,
        env,
        caller: String::new(),
        network: req.network,
        limits: req.limits.unwrap_or_default(),
    })
}

async fn call(services: &Services, op: PtyOp) -> Result<PtyReply, WireError> {
    match services.executor.call(Request::Pty(op)).await? {
        Reply::Pty(r) => Ok(r),
        _ => Err(unexpected_reply()),
    }
}

fn attach_response(a: Attached) -> AttachResponse {
    let b64 = base64::engine::general_purpose::STANDARD;
    AttachResponse {
        access_key: a.access_key,
        reconnect_token: a.reconnect_token,
        cwd: a.cwd,
        frames: a
            .frames
            .into_iter()
            .map(|f| OutputFrame {
                sequence: f.sequence,
                data: b64.encode(f.data),
            })
            .collect(),
        next_sequence: a.next_sequence,
        truncated: a.truncated,
        status: a.status,
    }
}

/// Live output of attachment `epoch` may flow once this answer is on its way: the release
/// is sent from a task of its own, which runs only after this handler has returned and its
/// result was queued for the engine, so the replay reaches the consumer first.
fn release_after_answer(services: &Arc<Services>, session_id: &str, epoch: u64) {
    services.pty.started(session_id, epoch);
    send(
        &services.executor,
        PtyOp::Release {
            session_id: session_id.to_string(),
            epoch,
        },
    );
}

pub async fn dispatch(
    services: &Arc<Services>,
    id: &str,
    payload: Value,
) -> Result<Value, WireError> {
    match id {
        "shell::pty::open" => {
            let rt = services
                .snapshots
                .get()
                .ok_or_else(|| WireError::new(Code::S216, "no configuration is in force yet"))?;
            let req: OpenRequest = parse(&payload)?;
            iii_shell_policy::network::for_call(rt.config.confinement.network, req.network)
                .map_err(invalid)?;
            let mut spec = open_spec(req, rt.config.fs.host_roots.is_empty(), rt.denylist()?)?;
            spec.caller = caller_of(&payload);
            crate::validate::call_limits(Some(&spec.limits), &rt.config)?;
            match call(services, PtyOp::Open(spec)).await? {
                PtyReply::Opened(r, epoch) => {
                    release_after_answer(services, &r.session_id, epoch);
                    to_value(&r)
                }
                _ => Err(unexpected_reply()),
            }
        }
        "shell::pty::write" => {
            let req: WriteRequest = parse(&payload)?;
            let data = base64::engine::general_purpose::STANDARD
                .decode(req.data.as_bytes())
                .map_err(|e| invalid(format!("data is not valid base64: {e}")))?;
            if data.len() > MAX_WRITE_BYTES {
                return Err(WireError::new(
                    Code::S218,
                    format!(
                        "write of {} bytes exceeds the {MAX_WRITE_BYTES} byte limit per call",
                        data.len()
                    ),
                ));
            }
            match call(
                services,
                PtyOp::Write {
                    session_id: req.session_id,
                    access_key: req.access_key,
                    data,
                },
            )
            .await?
            {
                PtyReply::Written(r) => to_value(&r),
                _ => Err(unexpected_reply()),
            }
        }
        "shell::pty::resize" => {
            let req: ResizeRequest = parse(&payload)?;
            check_size(req.cols, req.rows)?;
            match call(
                services,
                PtyOp::Resize {
                    session_id: req.session_id,
                    access_key: req.access_key,
                    cols: req.cols,
                    rows: req.rows,
                },
            )
            .await?
            {
                PtyReply::Resized(r) => to_value(&r),
                _ => Err(unexpected_reply()),
            }
        }
        "shell::pty::attach" => {
            let req: AttachRequest = parse(&payload)?;
            check_target(&req.output_function_id)?;
            check_size(req.cols, req.rows)?;
            let session_id = req.session_id.clone();
            match call(
                services,
                PtyOp::Attach {
                    session_id: req.session_id,
                    reconnect_token: req.reconnect_token,
                    after_sequence: req.after_sequence,
                    cols: req.cols,
                    rows: req.rows,
                    output_function_id: req.output_function_id,
                    caller: caller_of(&payload),
                },
            )
            .await?
            {
                PtyReply::Attached(a) => {
                    release_after_answer(services, &session_id, a.epoch);
                    to_value(&attach_response(a))
                }
                _ => Err(unexpected_reply()),
            }
        }
        "shell::pty::adopt" => {
            let req: AdoptRequest = parse(&payload)?;
            check_target(&req.output_function_id)?;
            check_size(req.cols, req.rows)?;
            let session_id = req.session_id.clone();
            match call(
                services,
                PtyOp::Adopt {
                    session_id: req.session_id,
                    output_function_id: req.output_function_id,
                    cols: req.cols,
                    rows: req.rows,
                    after_sequence: req.after_sequence,
                    caller: caller_of(&payload),
                },
            )
            .await?
            {
                PtyReply::Attached(a) => {
                    release_after_answer(services, &session_id, a.epoch);
                    to_value(&attach_response(a))
                }
                _ => Err(unexpected_reply()),
            }
        }
        "shell::pty::detach" => {
            let req: DetachRequest = parse(&payload)?;
            let session_id = req.session_id.clone();
            match call(
                services,
                PtyOp::Detach {
                    session_id: req.session_id,
                    access_key: req.access_key,
                },
            )
            .await?
            {
                PtyReply::Detached(r, epoch) => {
                    services.pty.started(&session_id, epoch);
                    to_value(&r)
                }
                _ => Err(unexpected_reply()),
            }
        }
        "shell::pty::close" => {
            let req: CloseRequest = parse(&payload)?;
            let session_id = req.session_id.clone();
            match call(
                services,
                PtyOp::Close {
                    session_id: req.session_id,
                    access_key: req.access_key,
                },
            )
            .await?
            {
                PtyReply::Closed(r) => {
                    services.pty.remove(&session_id);
                    to_value(&r)
                }
                _ => Err(unexpected_reply()),
            }
        }
        "shell::pty::sessions" => match call(services, PtyOp::Sessions).await? {
            PtyReply::Sessions(r) => to_value(&r),
            _ => Err(unexpected_reply()),
        },
        other => Err(invalid(format!("unknown function: {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: serde_json::Value) -> OpenRequest {
        serde_json::from_value(v).unwrap()
    }

    fn open_spec(req: OpenRequest, unjailed: bool) -> Result<OpenSpec, WireError> {
        let patterns = iii_shell_protocol::config::default_denylist_patterns();
        super::open_spec(req, unjailed, &Denylist::compile(&patterns).unwrap())
    }

    /// The broker refuses what the executor would (the one command validator): a denylisted
    /// program and a NUL in an env value, with the executor's code and words.
    #[test]
    fn open_refuses_what_the_executor_would() {
        let base =
            serde_json::json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": OUT});
        let mut denied = base.clone();
        denied["program"] = "sudo".into();
        denied["args"] = serde_json::json!(["shutdown", "-h", "now"]);
        let e = open_spec(req(denied), true).unwrap_err();
        assert_eq!(e.code, "invocation_failed");
        assert_eq!(
            e.message,
            format!(
                "command matches denylist: {}",
                iii_shell_protocol::config::default_denylist_patterns()[4]
            )
        );
        let mut nul = base.clone();
        nul["env"] = serde_json::json!({"A": "a\u{0}b"});
        let e = open_spec(req(nul), true).unwrap_err();
        assert_eq!(e.code, "S210");
        assert_eq!(e.message, "env value of 'A' contains a NUL byte");
    }

    const OUT: &str = "iii::shell-ui::pty-output::console-b1";

    #[test]
    fn open_rules() {
        let ok = open_spec(
            req(
                serde_json::json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": OUT,
                 "args": ["ignored"]}),
            ),
            true,
        )
        .unwrap();
        assert_eq!(ok.argv, None, "args without program are ignored");
        let p = open_spec(
            req(
                serde_json::json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": OUT,
                 "program": "python3", "args": ["-q"], "env": {"A": "1"}}),
            ),
            true,
        )
        .unwrap();
        assert_eq!(p.argv, Some(vec!["python3".to_string(), "-q".to_string()]));
        assert_eq!(p.env, vec![("A".to_string(), "1".to_string())]);
        let err = |v: serde_json::Value, unjailed: bool| open_spec(req(v), unjailed).unwrap_err();
        let base = |extra: serde_json::Value| {
            let mut v = serde_json::json!({"cwd": "/tmp", "cols": 80, "rows": 24, "output_function_id": OUT});
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            v
        };
        for bad in [
            serde_json::json!({"output_function_id": "shell::exec"}),
            serde_json::json!({"cols": 0}),
            serde_json::json!({"cwd": "relative"}),
            serde_json::json!({"env": {"PATH": "/tmp/evil"}}),
            serde_json::json!({"env": {"PATH=/tmp/evil": "x"}}),
            serde_json::json!({"env": {"LD_PRELOAD": "x"}}),
        ] {
            assert!(err(base(bad.clone()), true).is(Code::S210), "{bad}");
        }
        // Jailed, a relative cwd resolves against the primary root (the executor checks it).
        assert!(open_spec(req(base(serde_json::json!({"cwd": "sub"}))), false).is_ok());
    }
}
