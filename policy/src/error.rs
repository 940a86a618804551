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

impl Code {
    /// Every code, for parsing.
    pub const ALL: [Code; 21] = [
        Code::S200,
        Code::S210,
        Code::S211,
        Code::S212,
        Code::S213,
        Code::S214,
        Code::S215,
        Code::S216,
        Code::S217,
        Code::S218,
        Code::S220,
        Code::S300,
        Code::C210,
        Code::C211,
        Code::C213,
        Code::C215,
        Code::C216,
        Code::C218,
        Code::C220,
        Code::C221,
        Code::InvocationFailed,
    ];

    /// The code spelled `s`, if it is one of ours.
    pub fn parse(s: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// The code of a [`WireError`]: one of ours, or one forwarded as is from elsewhere (a
/// sandbox's S-code this release does not know, an engine error). On the wire it is the
/// plain string either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireCode {
    Known(Code),
    Foreign(String),
}

impl WireCode {
    pub fn as_str(&self) -> &str {
        match self {
            WireCode::Known(c) => c.as_str(),
            WireCode::Foreign(s) => s,
        }
    }

    /// The code, when it is one of ours.
    pub fn known(&self) -> Option<Code> {
        match self {
            WireCode::Known(c) => Some(*c),
            WireCode::Foreign(_) => None,
        }
    }
}

impl From<Code> for WireCode {
    fn from(c: Code) -> Self {
        WireCode::Known(c)
    }
}

impl From<&str> for WireCode {
    fn from(s: &str) -> Self {
        Code::parse(s).map_or_else(|| WireCode::Foreign(s.to_string()), WireCode::Known)
    }
}

impl From<String> for WireCode {
    fn from(s: String) -> Self {
        match Code::parse(&s) {
            Some(c) => WireCode::Known(c),
            None => WireCode::Foreign(s),
        }
    }
}

impl std::fmt::Display for WireCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<Code> for WireCode {
    fn eq(&self, other: &Code) -> bool {
        self.known() == Some(*other)
    }
}

impl PartialEq<str> for WireCode {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for WireCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for WireCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for WireCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(WireCode::from(String::deserialize(d)?))
    }
}

/// The error body as it appears on the wire and over the executor socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct WireError {
    pub code: WireCode,
    pub message: String,
}

impl WireError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        WireError {
            code: WireCode::Known(code),
            message: message.into(),
        }
    }

    /// An error with a code forwarded from elsewhere (kept as is).
    pub fn forwarded(code: impl Into<WireCode>, message: impl Into<String>) -> Self {
        WireError {
            code: code.into(),
            message: message.into(),
        }
    }

    /// A plain-message failure (no S-code).
    pub fn plain(message: impl Into<String>) -> Self {
        Self::new(Code::InvocationFailed, message)
    }

    pub fn is(&self, code: Code) -> bool {
        self.code == code
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }
}

#[cfg(test)]
mod wire_code_tests {
    use super::*;

    #[test]
    fn every_code_parses_back_and_foreign_codes_survive() {
        for c in Code::ALL {
            assert_eq!(Code::parse(c.as_str()), Some(c));
            assert_eq!(WireCode::from(c.as_str()), WireCode::Known(c));
        }
        assert_eq!(WireCode::from("S400"), WireCode::Foreign("S400".into()));
        let e = WireError::forwarded("S400", "too many");
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(json, r#"{"code":"S400","message":"too many"}"#);
        assert_eq!(serde_json::from_str::<WireError>(&json).unwrap(), e);
        let ours: WireError = serde_json::from_str(r#"{"code":"S211","message":"m"}"#).unwrap();
        assert_eq!(ours.code, WireCode::Known(Code::S211));
        assert!(ours.is(Code::S211) && !ours.is(Code::C211));
        assert_eq!(
            ours.to_json(),
            serde_json::json!({"code": "S211", "message": "m"})
        );
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
