//! Frames of the engine's worker protocol (JSON, tagged by `type`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `{code, message, stacktrace?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacktrace: Option<String>,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorBody {
            code: code.into(),
            message: message.into(),
            stacktrace: None,
        }
    }
}

impl From<iii_shell_protocol::WireError> for ErrorBody {
    fn from(e: iii_shell_protocol::WireError) -> Self {
        ErrorBody::new(e.code.to_string(), e.message)
    }
}

/// Frames the engine sends us. Unknown types and fields are tolerated.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Inbound {
    WorkerRegistered {
        worker_id: String,
        #[serde(default)]
        reattach_token: Option<String>,
    },
    InvokeFunction {
        #[serde(default)]
        invocation_id: Option<String>,
        function_id: String,
        #[serde(default)]
        data: Value,
        #[serde(default)]
        metadata: Option<Value>,
        /// W3C trace context of the caller.
        #[serde(default)]
        traceparent: Option<String>,
        #[serde(default)]
        baggage: Option<String>,
    },
    InvocationResult {
        invocation_id: String,
        #[serde(default)]
        result: Option<Value>,
        #[serde(default)]
        error: Option<ErrorBody>,
    },
    RegistrationRejected {
        code: String,
        #[serde(default)]
        function_id: Option<String>,
        #[serde(default)]
        worker_name: Option<String>,
    },
    TriggerRegistrationResult {
        id: String,
        #[serde(default)]
        error: Option<ErrorBody>,
    },
    RegisterTrigger {
        id: String,
        trigger_type: String,
        function_id: String,
        #[serde(default)]
        config: Value,
        #[serde(default)]
        metadata: Option<Value>,
        #[serde(default)]
        namespace: Option<String>,
    },
    UnregisterTrigger {
        id: String,
    },
    Ping,
    Pong,
}

/// A `registerfunction` frame.
pub fn register_function(
    id: &str,
    description: &str,
    request: &Value,
    response: &Value,
    metadata: &Value,
) -> Value {
    serde_json::json!({
        "type": "registerfunction",
        "id": id,
        "description": description,
        "request_format": request,
        "response_format": response,
        "metadata": metadata,
    })
}

/// A `registertrigger` frame binding `trigger_type` to `function_id`.
pub fn register_trigger(id: &str, trigger_type: &str, function_id: &str, config: Value) -> Value {
    serde_json::json!({
        "type": "registertrigger",
        "id": id,
        "trigger_type": trigger_type,
        "function_id": function_id,
        "config": config,
    })
}

/// An `invocationresult` frame.
pub fn invocation_result(
    invocation_id: &str,
    function_id: &str,
    outcome: &Result<Value, ErrorBody>,
) -> Value {
    match outcome {
        Ok(v) => serde_json::json!({
            "type": "invocationresult", "invocation_id": invocation_id, "function_id": function_id, "result": v,
        }),
        Err(e) => serde_json::json!({
            "type": "invocationresult", "invocation_id": invocation_id, "function_id": function_id, "error": e,
        }),
    }
}
