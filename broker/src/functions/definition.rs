//! What each function module hands the registration and its handlers: the definition the
//! engine is told, the per-call context, the metadata flags and the response serializer. A leaf:
//! the family modules and the crate's `functions` root import it, it imports neither.

use iii_shell_protocol::{Code, WireError};
use serde_json::{json, Value};

/// What the engine is told about a function.
#[derive(Debug, Clone)]
pub struct FunctionDef {
    pub id: &'static str,
    pub description: &'static str,
    pub metadata: Value,
    pub request_format: Value,
    pub response_format: Value,
}

/// Per-invocation context.
#[derive(Clone, Default)]
pub struct CallMeta {
    /// The invocation's metadata sidecar, if the caller or trigger sent one.
    pub metadata: Option<Value>,
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
