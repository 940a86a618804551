//! The functions this worker serves: their registration data and their handlers.

pub mod coder;
pub mod config_status;
pub mod exec;
pub mod fs;
pub mod pty;
pub mod sandbox;
pub mod turns;
pub mod ui;
pub mod workspace;

use std::sync::Arc;

use iii_shell_protocol::{Code, WireError};
use serde_json::{json, Value};

use crate::services::Services;

/// What the engine is told about a function.
#[derive(Debug, Clone)]
pub struct FunctionDef {
    pub id: &'static str,
    pub description: &'static str,
    pub metadata: Value,
    pub request_format: Value,
    pub response_format: Value,
}

/// Every function this build serves, in registration order.
pub fn catalogue() -> Vec<FunctionDef> {
    let mut v = exec::definitions();
    v.extend(config_status::definitions());
    v.extend(fs::definitions());
    v.extend(workspace::definitions());
    v.extend(coder::definitions());
    v.extend(pty::definitions());
    v.extend(turns::definitions());
    v.extend(ui::definitions());
    v
}

/// Per-invocation context.
#[derive(Clone, Default)]
pub struct CallMeta {
    /// The invocation's metadata sidecar, if the caller or trigger sent one.
    pub metadata: Option<Value>,
}

/// Runs the handler of `function_id`.
pub async fn dispatch(
    services: &Arc<Services>,
    function_id: &str,
    payload: Value,
    meta: CallMeta,
) -> Result<Value, WireError> {
    match function_id {
        "shell::exec" => exec::exec(services, payload).await,
        "shell::exec_bg" => exec::exec_bg(services, payload).await,
        "shell::status" => exec::status(services, payload).await,
        "shell::list" => exec::list(services).await,
        "shell::kill" => exec::kill(services, payload).await,
        "shell::config-status" => config_status::status(services),
        id if id.starts_with("shell::fs::") => fs::dispatch(services, id, payload).await,
        id if id.starts_with("shell::pty::") => pty::dispatch(services, id, payload).await,
        id if id.starts_with("shell::turns::") => turns::dispatch(services, id, payload).await,
        id if id == "shell::ui-content" || id.starts_with("shell::ui-state::") => {
            ui::dispatch(services, id, payload).await
        }
        id if id.starts_with("shell::workspace::") => {
            workspace::dispatch(services, id, payload).await
        }
        id if id.starts_with("coder::") => coder::dispatch(services, id, payload, meta).await,
        other => Err(WireError::new(
            Code::S210,
            format!("unknown function: {other}"),
        )),
    }
}

/// Metadata flags as the seed publishes them.
pub fn meta(internal: bool, trace_hidden: bool, display: bool) -> Value {
    let mut m = serde_json::Map::new();
    if display {
        m.insert("display".into(), json!(true));
    }
    if internal {
        m.insert("internal".into(), json!(true));
    }
    if trace_hidden {
        m.insert("trace_hidden".into(), json!(true));
    }
    Value::Object(m)
}

/// Serializes a response.
pub fn to_value<T: serde::Serialize>(v: &T) -> Result<Value, WireError> {
    serde_json::to_value(v)
        .map_err(|e| WireError::new(Code::S216, format!("serialize response: {e}")))
}
