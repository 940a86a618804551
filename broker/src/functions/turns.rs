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
//!
//! A turn event that does not fit its type (`TurnEvent`: a field of the wrong type) is S210
//! naming the field. A hook input that does not fit (`HookInput`: a field of the wrong type, a
//! `call` without `function_id`, an id over the bound) is answered `{"decision": "continue"}`
//! all the same (TURNS-06: the hooks never block or alter an agent's call), with the S210
//! reason logged at WARN; nothing is recorded for it.
//!
//! Every id a request names (`session_id`, `turn_id`, the parent links, a hooked call's
//! `function_id`) is at most `MAX_ID_BYTES` (256) bytes, and every path at most
//! `MAX_PATH_BYTES` (4096): longer is S210 naming the field (`TurnsRequest::check_lengths`).
//!
//! `get` and `revert` carry the caller's `fs_scope` (from the invocation metadata, else a
//! hidden payload field, as for `coder::*`) to the executor, which serves no body and
//! writes no file outside its `scope_root`.
//!
//! `shell::turns::sessions` is not in the seed (ide 0.12.9 has no function that lists
//! sessions): the sessions with recorded turns, newest first, a page at a time, so the console
//! page can offer them instead of asking for an id. Its schemas are generated from the
//! protocol's types; the broker checks the request (`sessions_page`) before forwarding it and
//! the executor checks it again.

use std::sync::Arc;
use std::time::Duration;

use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::turns::{SessionsRequest, SessionsResponse, TurnsCall, TurnsRequest};
use iii_shell_protocol::{Code, WireError};
use serde_json::{json, Value};

use super::definition::{meta, CallMeta, FunctionDef};
use crate::schema::schema_for;
use crate::services::{unexpected_reply, Services};

/// The one turns function that is not the seed's.
pub const SESSIONS: &str = "shell::turns::sessions";

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

/// The hook targets that answer `{"decision": "continue"}` whatever they are sent.
fn is_hook(function_id: &str) -> bool {
    matches!(
        function_id,
        "shell::turns::on-pre-trigger" | "shell::turns::on-post-trigger"
    )
}

/// `payload` with the caller's `fs_scope` (the invocation metadata's, else the payload's own,
/// checked as `coder::*` checks it: S210 when it is not `{scope_root?, session_root?}` of
/// absolute paths) as its `fs_scope` field, for the executor to confine `get` and `revert`.
fn with_scope(mut payload: Value, call: &CallMeta) -> Result<Value, WireError> {
    let scope = super::coder::scope_of(&payload, call)
        .map_err(|e| WireError::new(Code::S210, e.message))?;
    for (field, v) in [
        ("fs_scope.scope_root", &scope.scope_root),
        ("fs_scope.session_root", &scope.session_root),
    ] {
        iii_shell_protocol::turns::check_length(
            field,
            v.as_deref(),
            iii_shell_protocol::turns::MAX_PATH_BYTES,
        )
        .map_err(|why| WireError::new(Code::S210, why))?;
    }
    if let Some(o) = payload.as_object_mut() {
        o.insert("fs_scope".into(), super::definition::to_value(&scope)?);
    }
    Ok(payload)
}

/// One seed entry, borrowed from [`SEED`] (its strings hold no escapes, so they borrow; the
/// test `the_seed_gives_all_eight_functions` proves it).
#[derive(serde::Deserialize)]
struct SeedEntry {
    name: &'static str,
    description: &'static str,
    metadata: Value,
    request_schema: Value,
    response_schema: Value,
}

/// What `shell::turns::sessions` is described as (`sessions_description_names_the_limits`
/// checks the numbers against the protocol's).
const SESSIONS_DESCRIPTION: &str = "List the harness sessions that have recorded turns, newest first (by the last change to their history), with their turn counts, the first and last turn's start and the newest turn's title: what to pass to shell::turns::list. At most 200 per call (50 by default); pass next_cursor back as cursor for older ones.";

pub fn definitions() -> Vec<FunctionDef> {
    let seed: Vec<SeedEntry> = match serde_json::from_str(SEED) {
        Ok(seed) => seed,
        Err(e) => {
            tracing::error!("the turns functions' seed does not parse ({e}); they are not registered. This is a build defect: report it");
            Vec::new()
        }
    };
    let mut v: Vec<FunctionDef> = seed
        .into_iter()
        .map(|f| FunctionDef {
            id: f.name,
            description: f.description,
            metadata: f.metadata,
            request_format: f.request_schema,
            response_format: f.response_schema,
        })
        .collect();
    v.push(FunctionDef {
        id: SESSIONS,
        description: SESSIONS_DESCRIPTION,
        metadata: meta(false, false, false),
        request_format: schema_for::<SessionsRequest>(),
        response_format: schema_for::<SessionsResponse>(),
    });
    v
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
    call: CallMeta,
) -> Result<Value, WireError> {
    // The typed request, checked here (the executor parses it again with the same parser): a
    // malformed payload is S210 naming the field, never a default filled in for it.
    // A null `sessions` payload asks for the first page (every field has a default).
    let payload = if function_id == SESSIONS && payload.is_null() {
        json!({})
    } else {
        payload
    };
    let request = match TurnsRequest::parse(function_id, &payload) {
        Ok(r) => r,
        Err(why) if is_hook(function_id) => {
            // TURNS-06: a hook never blocks the call it observes, whatever it was sent.
            tracing::warn!(function_id, code = %Code::S210, "a harness hook input does not fit HookInput ({why}); nothing recorded for this call, which goes on");
            return Ok(json!({"decision": "continue"}));
        }
        Err(why) => return Err(WireError::new(Code::S210, why)),
    };
    let hook = match request {
        // The typed request goes on, not the payload (which may be null or carry extra keys).
        TurnsRequest::Sessions(r) => {
            return forward(services, function_id, &super::definition::to_value(&r)?).await;
        }
        TurnsRequest::Get(_) | TurnsRequest::Revert(_) => {
            let payload = with_scope(payload, &call)?;
            return forward(services, function_id, &payload).await;
        }
        TurnsRequest::List(_) | TurnsRequest::AdoptRoot(_) => {
            return forward(services, function_id, &payload).await
        }
        TurnsRequest::PreTrigger(_) | TurnsRequest::PostTrigger(_) => true,
        TurnsRequest::TurnStarted(_) | TurnsRequest::TurnCompleted(_) => false,
    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use iii_shell_protocol::turns::{DEFAULT_SESSIONS_PAGE, MAX_SESSIONS_PAGE};

    #[test]
    fn the_seed_gives_all_eight_functions() {
        let ids: Vec<&str> = definitions().iter().map(|d| d.id).collect();
        assert_eq!(
            ids,
            [
                "shell::turns::on-turn-started",
                "shell::turns::on-turn-completed",
                "shell::turns::on-pre-trigger",
                "shell::turns::on-post-trigger",
                "shell::turns::list",
                "shell::turns::get",
                "shell::turns::revert",
                "shell::turns::adopt-root",
                SESSIONS,
            ]
        );
    }

    #[test]
    fn sessions_description_names_the_limits() {
        assert_eq!(
            SESSIONS_DESCRIPTION,
            format!("List the harness sessions that have recorded turns, newest first (by the last change to their history), with their turn counts, the first and last turn's start and the newest turn's title: what to pass to shell::turns::list. At most {MAX_SESSIONS_PAGE} per call ({DEFAULT_SESSIONS_PAGE} by default); pass next_cursor back as cursor for older ones.")
        );
    }

    /// `shell::turns::sessions` is checked here before anything is forwarded: with no executor
    /// connected, a bad request still answers S210 at once, with the reason.
    #[tokio::test]
    async fn a_bad_sessions_request_is_refused_before_the_executor() {
        let services = Services::new();
        for (bad, why) in [
            (json!({"limit": 0}), "'limit' is 0; pass 1 to 200"),
            (json!({"limit": 1000}), "'limit' is 1000; pass 1 to 200"),
            (json!({"limit": "9"}), "malformed payload"),
            (json!({"cursor": "7"}), "'cursor' is not a cursor"),
            (json!([1]), "the request must be an object"),
            (json!("x"), "the request must be an object"),
        ] {
            let r = tokio::time::timeout(
                Duration::from_secs(5),
                dispatch(&services, SESSIONS, bad.clone(), CallMeta::default()),
            )
            .await
            .expect("answered without the executor");
            let e = r.expect_err("refused");
            assert!(e.is(Code::S210), "{bad}: {e:?}");
            assert!(e.message.starts_with(why), "{bad}: {}", e.message);
        }
    }

    /// TURNS-06: a hook input that does not fit `HookInput` (a wrong type, a `call` without
    /// its `function_id`, an id over the bound) is answered `continue` at once, with no
    /// executor; the history functions and turn events are S210 naming the field, an id of
    /// 257 bytes included, and one of 256 bytes passes the check.
    #[tokio::test]
    async fn malformed_hooks_continue_and_long_ids_are_s210_naming_the_field() {
        use iii_shell_protocol::turns::MAX_ID_BYTES;
        let services = Services::new();
        let long = "x".repeat(MAX_ID_BYTES + 1);
        let run = |f: &'static str, v: Value| {
            let services = Arc::clone(&services);
            async move {
                tokio::time::timeout(
                    Duration::from_secs(5),
                    dispatch(&services, f, v, CallMeta::default()),
                )
                .await
                .expect("answered without the executor")
            }
        };
        for (f, bad) in [
            ("shell::turns::on-pre-trigger", json!({"session_id": 5})),
            (
                "shell::turns::on-post-trigger",
                json!({"call": {"arguments": {}}}),
            ),
            ("shell::turns::on-pre-trigger", json!([1])),
            ("shell::turns::on-pre-trigger", json!(null)),
            ("shell::turns::on-post-trigger", json!({"session_id": long})),
        ] {
            assert_eq!(
                run(f, bad.clone()).await.map_err(|e| e.code),
                Ok(json!({"decision": "continue"})),
                "{f} {bad}"
            );
        }
        for (f, bad, field) in [
            (
                "shell::turns::list",
                json!({"session_id": long}),
                "session_id",
            ),
            (
                "shell::turns::get",
                json!({"session_id": "s", "turn_id": long}),
                "turn_id",
            ),
            (
                "shell::turns::revert",
                json!({"session_id": long, "turn_id": "t"}),
                "session_id",
            ),
            (
                "shell::turns::adopt-root",
                json!({"session_id": "s", "turn_id": long, "root": "/r"}),
                "turn_id",
            ),
            (
                "shell::turns::on-turn-started",
                json!({"session_id": long, "turn_id": "t"}),
                "session_id",
            ),
        ] {
            let e = run(f, bad).await.expect_err("refused");
            assert!(e.is(Code::S210), "{f}: {e:?}");
            assert_eq!(
                e.message,
                format!(
                    "'{field}' is {} bytes; it may be at most {MAX_ID_BYTES} bytes",
                    MAX_ID_BYTES + 1
                ),
                "{f}"
            );
        }
        // At the bound, the check passes (the call then fails only for want of an executor).
        let ok = run(
            "shell::turns::list",
            json!({"session_id": "s".repeat(MAX_ID_BYTES)}),
        )
        .await;
        assert!(
            ok.as_ref().err().is_none_or(|e| !e.is(Code::S210)),
            "{ok:?}"
        );
    }
}
