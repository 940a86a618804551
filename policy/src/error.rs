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
    /// coder: malformed input (the twin of S210; also wrong file type, non-empty directory
    /// and bad regex, which have no C-code of their own).
    C210,
    /// coder: not found or denied, one wording (S211).
    C211,
    /// coder: the target exists and `overwrite` is false (S213).
    C213,
    /// coder: the path escapes every root, jailed mode only (S215).
    C215,
    /// coder: an I/O error (S216).
    C216,
    /// coder: over `max_read_bytes` / `max_write_bytes` or a response budget (S218).
    C218,
    /// coder: outside the per-call `scope_root` (S220).
    C220,
    /// coder: `expected_revision` no longer matches; nothing was written.
    C221,
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
            Code::C210 => "C210",
            Code::C211 => "C211",
            Code::C213 => "C213",
            Code::C215 => "C215",
            Code::C216 => "C216",
            Code::C218 => "C218",
            Code::C220 => "C220",
            Code::C221 => "C221",
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

/// A refusal by one of the shared policy rules, carrying its wire code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// S210: the request is invalid.
    #[error("{0}")]
    Invalid(String),
    /// A plain-message failure (argv): code `invocation_failed`.
    #[error("{0}")]
    Plain(String),
}

impl PolicyError {
    pub fn code(&self) -> Code {
        match self {
            PolicyError::Invalid(_) => Code::S210,
            PolicyError::Plain(_) => Code::InvocationFailed,
        }
    }

    pub fn to_wire(&self) -> WireError {
        WireError::new(self.code(), self.to_string())
    }
}

impl From<PolicyError> for WireError {
    fn from(e: PolicyError) -> Self {
        e.to_wire()
    }
}
