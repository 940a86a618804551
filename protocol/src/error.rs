//! The error envelope every failure travels in: `{ "code": "S211", "message": "…" }`.

use serde::{Deserialize, Serialize};

/// The stable error codes of the worker (see the README error table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// In-VM execution failure on a sandbox target.
    S200,
    /// Invalid request.
    S210,
    /// Not found, permission denied, protected glob or denylisted path (one wording).
    S211,
    /// Wrong file type for the operation.
    S212,
    /// Path already exists.
    S213,
    /// Directory not empty.
    S214,
    /// Path escapes the jail roots.
    S215,
    /// Generic internal failure (spawn error, channel error, bad engine response).
    S216,
    /// Invalid regex.
    S217,
    /// Size cap exceeded.
    S218,
    /// Outside the per-call scope root.
    S220,
    /// Sandbox VM boot failed.
    S300,
    /// A plain-message failure (argv parse, denylist, spawn-time job limits). This is the
    /// code the engine's SDKs use for untyped handler errors.
    InvocationFailed,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::S200 => "S200",
            Code::S210 => "S210",
            Code::S211 => "S211",
            Code::S212 => "S212",
            Code::S213 => "S213",
            Code::S214 => "S214",
            Code::S215 => "S215",
            Code::S216 => "S216",
            Code::S217 => "S217",
            Code::S218 => "S218",
            Code::S220 => "S220",
            Code::S300 => "S300",
            Code::InvocationFailed => "invocation_failed",
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error body as it appears on the wire and over the executor socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct WireError {
    pub code: String,
    pub message: String,
}

impl WireError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        WireError {
            code: code.as_str().to_string(),
            message: message.into(),
        }
    }

    /// A plain-message failure (no S-code).
    pub fn plain(message: impl Into<String>) -> Self {
        Self::new(Code::InvocationFailed, message)
    }

    pub fn is(&self, code: Code) -> bool {
        self.code == code.as_str()
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code, "message": self.message })
    }
}

/// The one wording used for a path that is missing **or** denied, so that the two cannot be
/// told apart (existence redaction).
pub fn not_found_message(path: &str) -> String {
    format!("path not found or not accessible: {path}")
}

/// The message of a jail escape.
pub fn escape_message(path: &str) -> String {
    format!("path escapes the fs jail roots: {path}")
}
