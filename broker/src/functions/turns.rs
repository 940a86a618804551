//! `shell::turns::*`: the turn history functions and the harness hook targets.
//!
//! Their request and response schemas are the seed's, verbatim (`turns_seed.json`, taken
//! from the ide 0.12.9 api reference: the contract). The store lives in the executor; the
//! broker forwards each payload as `Request::Turns` and the executor parses it itself.
//!
//! The hook targets only observe: `on-pre-trigger`/`on-post-trigger` always answer
//! `{"decision": "continue"}` and the turn events `{"ok": …}`, within [`HOOK_BUDGET`], even
//! when the store fails (logged). `shell::turns::revert` also takes `force: true` (outside the
//! seed schema, which allows extra keys) to revert files changed since the turn.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::turns::TurnsCall;
use iii_shell_protocol::{Code, WireError};
use serde_json::{json, Value};

use super::FunctionDef;
use crate::services::{unexpected_reply, Services};

/// The seed's entries of the eight turns functions.
const SEED: &str = include_str!("turns_seed.json");
/// Hooks answer within this, well inside the 3 s binding timeout.
pub const HOOK_BUDGET: Duration = Duration::from_millis(2500);

/// Hook bindings made at start-up: (trigger type, function, config).
pub fn hook_bindings() -> Vec<(&'static str, &'static str, Value)> {
    let hook =
        json!({"functions": ["shell::*", "coder::*"], "timeout_ms": 3000, "on_error": "fail_open"});
    vec![
        (
            "harness::hook::pre-trigger",
            "shell::turns::on-pre-trigger",
            hook.clone(),
        ),
        (
            "harness::hook::post-trigger",
            "shell::turns::on-post-trigger",
            hook,
        ),
        (
            "harness::turn-started",
            "shell::turns::on-turn-started",
            json!({}),
        ),
        (
            "harness::turn-completed",
            "shell::turns::on-turn-completed",
            json!({}),
        ),
    ]
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

pub fn definitions() -> Vec<FunctionDef> {
    static DEFS: OnceLock<Vec<FunctionDef>> = OnceLock::new();
    DEFS.get_or_init(|| {
        let seed: Vec<Value> = serde_json::from_str(SEED).unwrap_or_default();
        seed.iter()
            .map(|f| FunctionDef {
                id: leak(f["name"].as_str().unwrap_or_default()),
                description: leak(f["description"].as_str().unwrap_or_default()),
                metadata: f["metadata"].clone(),
                request_format: f["request_schema"].clone(),
                response_format: f["response_schema"].clone(),
            })
            .collect()
    })
    .clone()
}

async fn forward(
    services: &Arc<Services>,
    function_id: &str,
    payload: &Value,
) -> Result<Value, WireError> {
    let reply = services
        .executor
        .call(Request::Turns(TurnsCall {
            function: function_id.to_string(),
            payload_json: payload.to_string(),
        }))
        .await?;
    match reply {
        Reply::Turns(r) => serde_json::from_str(&r.json)
            .map_err(|e| WireError::new(Code::S216, format!("bad turns reply: {e}"))),
        _ => Err(unexpected_reply()),
    }
}

pub async fn dispatch(
    services: &Arc<Services>,
    function_id: &str,
    payload: Value,
) -> Result<Value, WireError> {
    let hook = matches!(
        function_id,
        "shell::turns::on-pre-trigger" | "shell::turns::on-post-trigger"
    );
    let event = matches!(
        function_id,
        "shell::turns::on-turn-started" | "shell::turns::on-turn-completed"
    );
    if !hook && !event {
        if !payload.is_object() {
            return Err(WireError::new(Code::S210, "the request must be an object"));
        }
        return forward(services, function_id, &payload).await;
    }
    let outcome = tokio::time::timeout(HOOK_BUDGET, forward(services, function_id, &payload)).await;
    let failed = match &outcome {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e.message.clone()),
        Err(_) => Some(format!("no answer within {HOOK_BUDGET:?}")),
    };
    if let Some(why) = &failed {
        tracing::error!(function_id, "turn history missed a change ({why}); the call went on unblocked. Check that turns.data_dir is writable");
    }
    Ok(if hook {
        json!({"decision": "continue"})
    } else {
        json!({"ok": failed.is_none()})
    })
}
