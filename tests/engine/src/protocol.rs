//! Wire types of the worker protocol (protocol reference §1.3) and builders for
//! the frames the engine sends.
//!
//! Inbound frames are decoded into [`Inbound`]; unknown fields are ignored and
//! `null` optional fields read as absent, like the engine's serde types.
//! Outbound frames are built as JSON values so they can be logged verbatim.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use uuid::Uuid;

/// Namespace every unqualified lookup falls back to.
pub(crate) const DEFAULT_NAMESPACE: &str = "default";

/// `ErrorBody` = `{code, message, stacktrace?}`, carried by `invocationresult.error`
/// and `triggerregistrationresult.error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacktrace: Option<String>,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            stacktrace: None,
        }
    }

    pub(crate) fn deserialization(err: impl std::fmt::Display) -> Self {
        Self::new(
            "deserialization_error",
            format!("Failed to deserialize input: {err}"),
        )
    }

    pub(crate) fn invocation_stopped() -> Self {
        Self::new("invocation_stopped", "Invocation stopped")
    }
}

/// Which end of a data channel a [`ChannelRef`] is meant to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelDirection {
    Read,
    Write,
}

impl ChannelDirection {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelDirection::Read => "read",
            ChannelDirection::Write => "write",
        }
    }
}

/// `StreamChannelRef`: `{"channel_id","access_key","direction"}` (§7.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelRef {
    pub channel_id: String,
    pub access_key: String,
    pub direction: ChannelDirection,
}

impl ChannelRef {
    /// `ws://HOST:PORT/ws/channels/{id}?key={key}&dir={direction}` for an engine at `base_url`
    /// (`ws://HOST:PORT`).
    pub fn url(&self, base_url: &str) -> String {
        format!(
            "{}/ws/channels/{}?key={}&dir={}",
            base_url.trim_end_matches('/'),
            percent_encode(&self.channel_id),
            percent_encode(&self.access_key),
            self.direction.as_str()
        )
    }
}

/// `action` of an `invokefunction` (`TriggerAction`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub(crate) enum Action {
    Void,
    Enqueue {
        #[allow(dead_code)]
        queue: String,
    },
}

/// Every W→E message the engine understands. Anything else is logged and ignored.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub(crate) enum Inbound {
    Reattach {
        #[serde(default)]
        previous_worker_id: Option<String>,
        #[serde(default)]
        reattach_token: Option<String>,
    },
    RegisterFunction {
        id: String,
    },
    UnregisterFunction {
        id: String,
    },
    RegisterService {
        id: String,
    },
    RegisterTriggerType {
        id: String,
        #[serde(default)]
        namespace: Option<String>,
    },
    RegisterTrigger(RegisterTrigger),
    /// `trigger_type` may accompany it; bindings are looked up by id only.
    UnregisterTrigger {
        id: String,
    },
    TriggerRegistrationResult {
        id: String,
        trigger_type: String,
        function_id: String,
        #[serde(default)]
        error: Option<ErrorBody>,
    },
    InvokeFunction(InvokeFunction),
    InvocationResult {
        invocation_id: String,
        /// Required on the wire; routing uses the pending call's function id.
        #[allow(dead_code)]
        function_id: String,
        #[serde(default)]
        result: Option<Value>,
        #[serde(default)]
        error: Option<ErrorBody>,
    },
    Ping,
    Pong,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RegisterTrigger {
    pub id: String,
    pub trigger_type: String,
    pub function_id: String,
    #[serde(default)]
    pub config: Value,
    #[serde(default)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub trigger_namespace: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct InvokeFunction {
    /// Kept as a string: a present but non-UUID id makes the engine drop the frame.
    #[serde(default)]
    pub invocation_id: Option<String>,
    pub function_id: String,
    pub data: Value,
    #[serde(default)]
    pub traceparent: Option<String>,
    #[serde(default)]
    pub baggage: Option<String>,
    #[serde(default)]
    pub action: Option<Action>,
    #[serde(default)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// Decodes one text/binary payload. `Ok(None)` = blank text (skipped silently).
pub(crate) fn decode(text: &str) -> Result<Option<(Value, Inbound)>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let msg: Inbound = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    if let Inbound::InvokeFunction(f) = &msg {
        if let Some(id) = &f.invocation_id {
            Uuid::parse_str(id).map_err(|e| format!("invocation_id: {e}"))?;
        }
    }
    if let Inbound::InvocationResult { invocation_id, .. } = &msg {
        Uuid::parse_str(invocation_id).map_err(|e| format!("invocation_id: {e}"))?;
    }
    Ok(Some((value, msg)))
}

pub(crate) fn worker_registered(worker_id: Uuid, reattach_token: Uuid) -> Value {
    json!({
        "type": "workerregistered",
        "worker_id": worker_id.to_string(),
        "reattach_token": reattach_token.to_string(),
    })
}

pub(crate) fn pong() -> Value {
    json!({"type": "pong"})
}

pub(crate) struct OutboundInvoke<'a> {
    pub invocation_id: Uuid,
    pub function_id: &'a str,
    pub data: Value,
    pub metadata: Option<Value>,
    pub traceparent: Option<String>,
    pub baggage: Option<String>,
}

/// E→W `invokefunction`; `action` and `namespace` are never set (§3.1).
pub(crate) fn invoke_function(call: OutboundInvoke<'_>) -> Value {
    let mut frame = Map::new();
    frame.insert("type".into(), json!("invokefunction"));
    frame.insert(
        "invocation_id".into(),
        json!(call.invocation_id.to_string()),
    );
    frame.insert("function_id".into(), json!(call.function_id));
    frame.insert("data".into(), call.data);
    if let Some(metadata) = call.metadata.filter(|m| !m.is_null()) {
        frame.insert("metadata".into(), metadata);
    }
    if let Some(tp) = call.traceparent {
        frame.insert("traceparent".into(), json!(tp));
    }
    if let Some(baggage) = call.baggage {
        frame.insert("baggage".into(), json!(baggage));
    }
    Value::Object(frame)
}

/// E→W `invocationresult`: `error` on failure, else `result` (omitted when `null`).
pub(crate) fn invocation_result(
    invocation_id: &str,
    function_id: &str,
    outcome: &Result<Value, ErrorBody>,
) -> Value {
    let mut frame = Map::new();
    frame.insert("type".into(), json!("invocationresult"));
    frame.insert("invocation_id".into(), json!(invocation_id));
    frame.insert("function_id".into(), json!(function_id));
    match outcome {
        Ok(Value::Null) => {}
        Ok(result) => {
            frame.insert("result".into(), result.clone());
        }
        Err(error) => {
            frame.insert("error".into(), json!(error));
        }
    }
    Value::Object(frame)
}

pub(crate) fn trigger_registration_result(
    id: &str,
    trigger_type: &str,
    function_id: &str,
    error: Option<&ErrorBody>,
) -> Value {
    let mut frame = json!({
        "type": "triggerregistrationresult",
        "id": id,
        "trigger_type": trigger_type,
        "function_id": function_id,
    });
    if let (Some(error), Some(obj)) = (error, frame.as_object_mut()) {
        obj.insert("error".into(), json!(error));
    }
    frame
}

pub(crate) fn unregister_trigger(id: &str, trigger_type: &str) -> Value {
    json!({"type": "unregistertrigger", "id": id, "trigger_type": trigger_type})
}

/// `registrationrejected`; `function_id` / `worker_name` only when given.
pub(crate) fn registration_rejected(
    code: &str,
    namespace: &str,
    function_id: Option<&str>,
    worker_name: Option<&str>,
    owner_worker_id: &str,
) -> Value {
    let mut frame = Map::new();
    frame.insert("type".into(), json!("registrationrejected"));
    frame.insert("code".into(), json!(code));
    frame.insert("namespace".into(), json!(namespace));
    if let Some(name) = worker_name {
        frame.insert("worker_name".into(), json!(name));
    }
    if let Some(id) = function_id {
        frame.insert("function_id".into(), json!(id));
    }
    frame.insert("owner_worker_id".into(), json!(owner_worker_id));
    Value::Object(frame)
}

/// RFC 3986's unreserved characters: what a query value carries unencoded.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encoding for query values (unreserved characters pass through).
pub(crate) fn percent_encode(s: &str) -> String {
    utf8_percent_encode(s, UNRESERVED).to_string()
}

/// Percent-decoding of a query component (`+` is a space, as in form encoding); None when
/// the bytes are not UTF-8.
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    percent_decode_str(&s.replace('+', " "))
        .decode_utf8()
        .ok()
        .map(|v| v.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_known_frames_and_rejects_unknown() {
        let (_, msg) = decode(r#"{"type":"ping"}"#).unwrap().unwrap();
        assert!(matches!(msg, Inbound::Ping));
        assert!(decode(r#"{"type":"nosuchtype","x":1}"#).is_err());
        assert!(decode("this is not json").is_err());
        assert!(decode("   ").unwrap().is_none());
        let (_, msg) = decode(
            r#"{"type":"invokefunction","invocation_id":null,"function_id":"a::b","data":{},"namespace":null}"#,
        )
        .unwrap()
        .unwrap();
        match msg {
            Inbound::InvokeFunction(f) => {
                assert!(f.invocation_id.is_none());
                assert!(f.namespace.is_none());
            }
            other => panic!("unexpected {other:?}"),
        }
        // A non-UUID invocation id makes the whole frame undecodable.
        assert!(decode(
            r#"{"type":"invokefunction","invocation_id":"nope","function_id":"a","data":{}}"#
        )
        .is_err());
    }

    #[test]
    fn percent_round_trip() {
        assert_eq!(
            percent_decode(&percent_encode("a b/c?d")).unwrap(),
            "a b/c?d"
        );
        assert_eq!(percent_encode("a b/c?d+~é"), "a%20b%2Fc%3Fd%2B~%C3%A9");
        assert_eq!(percent_decode("a+b%2B%C3%A9").as_deref(), Some("a b+é"));
        assert_eq!(percent_decode("%FF"), None, "not UTF-8");
    }
}
