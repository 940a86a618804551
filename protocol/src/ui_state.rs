//! The console page's per-pane state (`shell::ui-state::get` / `set`): the public JSON types
//! exactly as the ide 0.12.9 registry page publishes them, the limits, and the messages that
//! carry them over the executor socket (added in protocol version 5).
//!
//! The broker never opens files, so the store lives in the executor; the state travels as
//! JSON text (postcard is not self-describing and cannot carry a `serde_json::Value`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 512;
/// The largest stored document (the serialized `state`), in bytes.
pub const MAX_STATE_BYTES: usize = 4 * 1024 * 1024;
/// The most panes stored: a new key past this is refused (S218), so callers inventing keys
/// cannot fill the disk (at most `MAX_PANES × MAX_STATE_BYTES`).
pub const MAX_PANES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "GetRequest")]
pub struct GetRequest {
    /// The pane's state key (the console pane id).
    pub key: String,
    /// The workspace tab id: saves made before panes had ids are read from here when `key` has nothing stored.
    #[serde(default)]
    pub legacy_key: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "GetResponse")]
pub struct GetResponse {
    pub key: String,
    /// The stored object, or null when nothing is stored.
    pub state: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "SetRequest")]
pub struct SetRequest {
    pub key: String,
    /// The pane's whole state; replaces what was stored.
    #[schemars(schema_with = "any_value")]
    pub state: Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "SetResponse")]
pub struct SetResponse {
    pub key: String,
    /// Size of the stored document.
    pub bytes: usize,
}

fn any_value(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({})
}

/// Why a key is refused (`None` = acceptable): non-empty, at most [`MAX_KEY_BYTES`].
pub fn key_problem(key: &str) -> Option<String> {
    if key.is_empty() {
        return Some("'key' is empty: pass the console pane id".into());
    }
    if key.len() > MAX_KEY_BYTES {
        return Some(format!(
            "'key' is {} bytes; at most {MAX_KEY_BYTES} are accepted",
            key.len()
        ));
    }
    None
}

/// Why a state document is refused (`None` = acceptable): it must be a JSON object of at
/// most [`MAX_STATE_BYTES`] serialized.
pub fn state_problem(state: &Value, serialized_len: usize) -> Option<(bool, String)> {
    if !state.is_object() {
        return Some((
            false,
            "'state' must be a JSON object (the pane's whole state)".into(),
        ));
    }
    if serialized_len > MAX_STATE_BYTES {
        return Some((
            true,
            format!("'state' is {serialized_len} bytes serialized; at most {MAX_STATE_BYTES} are stored per pane"),
        ));
    }
    None
}

/// `Request::UiState`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum UiStateOp {
    Get {
        key: String,
        legacy_key: Option<String>,
    },
    /// `state_json` is the serialized state object.
    Set { key: String, state_json: String },
}

/// `Reply::UiState`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum UiStateReply {
    /// `state_json` is `None` when nothing is stored under `key` (nor `legacy_key`).
    Got {
        key: String,
        state_json: Option<String>,
    },
    Set {
        key: String,
        bytes: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_checked_for_emptiness_and_length() {
        assert_eq!(
            key_problem(""),
            Some("'key' is empty: pass the console pane id".into())
        );
        assert_eq!(key_problem(&"k".repeat(512)), None);
        assert_eq!(
            key_problem(&"k".repeat(513)),
            Some("'key' is 513 bytes; at most 512 are accepted".into())
        );
        assert_eq!(
            key_problem("../../etc/passwd"),
            None,
            "encoded, not refused"
        );
    }

    #[test]
    fn state_must_be_an_object_within_the_cap() {
        assert_eq!(state_problem(&json!({}), 2), None);
        assert_eq!(state_problem(&json!([1]), 3).map(|p| p.0), Some(false));
        assert_eq!(state_problem(&json!(null), 4).map(|p| p.0), Some(false));
        assert_eq!(state_problem(&json!({}), MAX_STATE_BYTES), None);
        assert_eq!(
            state_problem(&json!({}), MAX_STATE_BYTES + 1).map(|p| p.0),
            Some(true)
        );
    }
}
