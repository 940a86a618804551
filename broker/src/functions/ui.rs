//! The console page's functions: `shell::ui-content` (the content function of the page's
//! `console:script` / `console:style` bindings, see [`crate::console_ui`]) and
//! `shell::ui-state::get` / `set` (per-pane state, stored by the executor).

use std::sync::Arc;

use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::ui_state::{
    key_problem, state_problem, GetRequest, GetResponse, SetRequest, SetResponse, UiStateOp,
    UiStateReply,
};
use iii_shell_protocol::{Code, WireError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::definition::{meta, to_value, FunctionDef};
use crate::console_ui::{content_for, CONTENT_FUNCTION};
use crate::schema::schema_for;
use crate::services::{unexpected_reply, Services};
use crate::validate::parse;

/// Input of the content function: the console asks for one asset by path.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "UiContentInput")]
pub struct UiContentInput {
    /// The asset path from the trigger config (e.g. `state/page.js`).
    pub path: String,
}

/// Output of the content function.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "UiContentResult")]
pub struct UiContentResult {
    /// The asset source, verbatim.
    pub content: String,
    /// MIME type the console should serve the asset with.
    pub content_type: String,
}

pub fn definitions() -> Vec<FunctionDef> {
    vec![
        FunctionDef {
            id: CONTENT_FUNCTION,
            description: "Serve the shell worker's injected console UI assets (content function for its console:script / console:style triggers).",
            metadata: meta(true, false, false),
            request_format: schema_for::<UiContentInput>(),
            response_format: schema_for::<UiContentResult>(),
        },
        FunctionDef {
            id: "shell::ui-state::get",
            description: "Console-only: the explorer page's stored state for one pane (`key` is the console pane id; `legacy_key`, the workspace tab id, is read when the pane has nothing stored). `state` is null when nothing is stored. Kept under the worker's data directory, per pane.",
            metadata: meta(true, true, false),
            request_format: schema_for::<GetRequest>(),
            response_format: schema_for::<GetResponse>(),
        },
        FunctionDef {
            id: "shell::ui-state::set",
            description: "Console-only: replace the explorer page's stored state for one pane. Writes only that pane's file, atomically, so panes never clobber each other.",
            metadata: meta(true, true, false),
            request_format: schema_for::<SetRequest>(),
            response_format: schema_for::<SetResponse>(),
        },
    ]
}

fn bad_key(key: &str) -> Result<(), WireError> {
    match key_problem(key) {
        Some(why) => Err(WireError::new(Code::S210, why)),
        None => Ok(()),
    }
}

pub async fn dispatch(
    services: &Arc<Services>,
    function_id: &str,
    payload: Value,
) -> Result<Value, WireError> {
    let op = match function_id {
        CONTENT_FUNCTION => {
            let r: UiContentInput = parse(&payload)?;
            let asset = content_for(&r.path).map_err(|m| WireError::new(Code::S211, m))?;
            return to_value(&UiContentResult {
                content: asset.content.to_string(),
                content_type: asset.content_type.to_string(),
            });
        }
        "shell::ui-state::get" => {
            let r: GetRequest = parse(&payload)?;
            bad_key(&r.key)?;
            UiStateOp::Get {
                key: r.key,
                legacy_key: r.legacy_key,
            }
        }
        "shell::ui-state::set" => {
            let r: SetRequest = parse(&payload)?;
            bad_key(&r.key)?;
            let state_json = r.state.to_string();
            if let Some((too_large, why)) = state_problem(&r.state, state_json.len()) {
                let code = if too_large { Code::S218 } else { Code::S210 };
                return Err(WireError::new(code, why));
            }
            UiStateOp::Set {
                key: r.key,
                state_json,
            }
        }
        other => {
            return Err(WireError::new(
                Code::S210,
                format!("unknown function: {other}"),
            ))
        }
    };
    match services.executor.call(Request::UiState(op)).await? {
        Reply::UiState(UiStateReply::Got { key, state_json }) => {
            let state = match state_json {
                Some(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
                    WireError::new(Code::S216, format!("stored pane state is not JSON: {e}"))
                })?,
                None => None,
            };
            to_value(&GetResponse { key, state })
        }
        Reply::UiState(UiStateReply::Set { key, bytes }) => to_value(&SetResponse {
            key,
            bytes: bytes as usize,
        }),
        _ => Err(unexpected_reply()),
    }
}
