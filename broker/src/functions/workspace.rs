//! `shell::workspace::*`: the console's working-directory picker and chunked byte reads.

use std::sync::Arc;

use iii_shell_protocol::fs::*;
use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::{Code, WireError};
use serde_json::Value;

use super::definition::{meta, to_value, FunctionDef};
use crate::schema::schema_for;
use crate::services::{unexpected_reply, Services};
use crate::validate::parse;

pub fn definitions() -> Vec<FunctionDef> {
    vec![
        FunctionDef {
            id: "shell::workspace::roots",
            description: "Console-only workspace picker control plane: return canonical host directory anchors that an operator can browse before choosing a per-session working directory.",
            metadata: meta(false, false, false),
            request_format: schema_for::<WorkspaceRootsRequest>(),
            response_format: schema_for::<WorkspaceRootsResponse>(),
        },
        FunctionDef {
            id: "shell::workspace::list",
            description: "Console-only workspace picker control plane: list child directories under an existing host directory. Returns canonical paths and never returns files.",
            metadata: meta(false, false, false),
            request_format: schema_for::<WorkspaceListRequest>(),
            response_format: schema_for::<WorkspaceListResponse>(),
        },
        FunctionDef {
            id: "shell::workspace::validate",
            description: "Console-only workspace picker control plane: validate that `path` is an existing host directory and return its canonical path.",
            metadata: meta(false, false, false),
            request_format: schema_for::<WorkspaceValidateRequest>(),
            response_format: schema_for::<WorkspaceValidateResponse>(),
        },
        FunctionDef {
            id: "shell::workspace::read-bytes",
            description: "Console-only: one bounded byte range of a file, base64 (at most 4 MiB raw per call), so a page can stream a large image without one oversized frame.",
            metadata: meta(true, false, false),
            request_format: schema_for::<WorkspaceReadBytesRequest>(),
            response_format: schema_for::<WorkspaceReadBytesResponse>(),
        },
    ]
}

fn path_ok(p: &str) -> Result<(), WireError> {
    if p.is_empty() || p.contains('\0') {
        return Err(WireError::new(
            Code::S210,
            "'path' is empty or contains a NUL byte",
        ));
    }
    Ok(())
}

pub async fn dispatch(
    services: &Arc<Services>,
    function_id: &str,
    payload: Value,
) -> Result<Value, WireError> {
    let op = match function_id {
        "shell::workspace::roots" => FsOp::WorkspaceRoots,
        "shell::workspace::list" => {
            let r: WorkspaceListRequest = parse(&payload)?;
            path_ok(&r.path)?;
            if r.page_size == Some(0) {
                return Err(WireError::new(
                    Code::S210,
                    "page_size must be at least 1 (omit it for the default)",
                ));
            }
            FsOp::WorkspaceList {
                path: r.path,
                page_size: r.page_size,
            }
        }
        "shell::workspace::validate" => {
            let r: WorkspaceValidateRequest = parse(&payload)?;
            path_ok(&r.path)?;
            FsOp::WorkspaceValidate { path: r.path }
        }
        "shell::workspace::read-bytes" => {
            let r: WorkspaceReadBytesRequest = parse(&payload)?;
            path_ok(&r.path)?;
            let length = r
                .length
                .unwrap_or(READ_BYTES_MAX_CHUNK)
                .min(READ_BYTES_MAX_CHUNK);
            FsOp::WorkspaceReadBytes {
                path: r.path,
                offset: r.offset,
                length,
            }
        }
        other => {
            return Err(WireError::new(
                Code::S210,
                format!("unknown function: {other}"),
            ))
        }
    };
    match services.executor.call(Request::Fs(op)).await? {
        Reply::Fs(FsReply::WorkspaceRoots(x)) => to_value(&x),
        Reply::Fs(FsReply::WorkspaceList(x)) => to_value(&x),
        Reply::Fs(FsReply::WorkspaceValidate(x)) => to_value(&x),
        Reply::Fs(FsReply::WorkspaceReadBytes(x)) => to_value(&x),
        _ => Err(unexpected_reply()),
    }
}
