//! Recovering the S-code of a failed call to the sandbox worker (contract §2.2, §6.5).
//!
//! The sandbox worker does not put its S-code in the top-level error code: the SDK wraps its
//! handler error as `invocation_failed` with the message `handler error: {"code":"S211",…}`.
//! So the code is taken from the top-level code when that is an S-code, else from the JSON
//! object embedded in the message, else from the first standalone `S` + 3 digits of the
//! message. Codes outside the known table collapse to S216, and so does a failure with no
//! S-code at all (no sandbox worker registered, a transport timeout, a dropped connection).

use iii_shell_protocol::{Code, WireError};
use serde_json::Value;

use crate::engine::frames::ErrorBody;

/// Codes passed through unchanged; every other S-code becomes S216.
const PASSED_THROUGH: [&str; 20] = [
    "S001", "S002", "S003", "S004", "S100", "S101", "S102", "S200", "S210", "S211", "S212", "S213",
    "S214", "S215", "S216", "S217", "S218", "S219", "S300", "S400",
];

/// The error code our own engine link uses when a call gets no answer in time.
const LINK_TIMEOUT: &str = "timeout";

/// `S` followed by exactly three ASCII digits.
pub fn is_scode(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 4 && b[0] == b'S' && b[1..].iter().all(u8::is_ascii_digit)
}

/// A known code as is; anything else S216.
pub fn canonical(code: &str) -> String {
    if PASSED_THROUGH.contains(&code) {
        code.to_string()
    } else {
        Code::S216.as_str().to_string()
    }
}

fn glued(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The first `S` + 3 digits in `text` that is not glued to a letter, digit or `_` on either
/// side.
pub fn scan(text: &str) -> Option<&str> {
    let b = text.as_bytes();
    (0..b.len().saturating_sub(3)).find_map(|i| {
        let candidate = b.get(i..i + 4)?;
        let standalone = (i == 0 || !glued(b[i - 1])) && b.get(i + 4).is_none_or(|n| !glued(*n));
        if standalone && candidate[0] == b'S' && candidate[1..].iter().all(u8::is_ascii_digit) {
            text.get(i..i + 4)
        } else {
            None
        }
    })
}

/// The `code` of the JSON object starting at the first `{` of `message`, when it is an S-code.
fn embedded_json_code(message: &str) -> Option<String> {
    let start = message.find('{')?;
    let mut values = serde_json::Deserializer::from_str(&message[start..]).into_iter::<Value>();
    let object = values.next()?.ok()?;
    let code = object.get("code")?.as_str()?;
    is_scode(code).then(|| code.to_string())
}

/// Where the S-code of a failure was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovered {
    /// The top-level error code.
    TopLevel(String),
    /// Inside the message (the `handler error: {…}` wrapping).
    Wrapped(String),
    /// No S-code anywhere.
    None,
}

pub fn recover(err: &ErrorBody) -> Recovered {
    if is_scode(&err.code) {
        return Recovered::TopLevel(err.code.clone());
    }
    if err.code == LINK_TIMEOUT {
        return Recovered::None;
    }
    match embedded_json_code(&err.message).or_else(|| scan(&err.message).map(str::to_string)) {
        Some(code) => Recovered::Wrapped(code),
        None => Recovered::None,
    }
}

/// The error the caller gets for a failed sandbox call.
pub fn to_wire(err: &ErrorBody) -> WireError {
    match recover(err) {
        Recovered::TopLevel(code) => WireError::forwarded(
            canonical(&code),
            format!("forwarded from engine: {}", err.message),
        ),
        Recovered::Wrapped(code) => WireError::forwarded(
            canonical(&code),
            format!("forwarded from engine (wrapped): {}", err.message),
        ),
        Recovered::None => WireError::new(
            Code::S216,
            format!("engine error: {}: {}", err.code, err.message),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(code: &str, message: &str) -> ErrorBody {
        ErrorBody::new(code, message)
    }

    #[test]
    fn scanning() {
        assert_eq!(scan("S211"), Some("S211"));
        assert_eq!(scan("error S300: boot"), Some("S300"));
        assert_eq!(scan("\"code\":\"S002\""), Some("S002"));
        assert_eq!(scan("XS211 S2110 S21 S_211 S211_ aS211"), None);
        assert_eq!(scan("S21"), None);
        assert_eq!(scan(""), None);
        assert_eq!(scan("€S213€"), Some("S213"));
        assert_eq!(scan("S2111 then S214."), Some("S214"));
    }

    #[test]
    fn recovery_and_canonical_table() {
        let wrapped = r#"handler error: {"code":"S211","docs_url":"x#S211","fix":null,"message":"file not found: /a","retryable":false,"type":"filesystem"}"#;
        let e = to_wire(&body("invocation_failed", wrapped));
        assert_eq!(e.code, "S211");
        assert!(
            e.message
                .starts_with("forwarded from engine (wrapped): handler error: {"),
            "{}",
            e.message
        );
        // The JSON code wins over an S-code earlier in the object.
        let e = to_wire(&body(
            "invocation_failed",
            r#"handler error: {"message":"S300 text","code":"S002"}"#,
        ));
        assert_eq!(e.code, "S002");
        // No JSON: scan.
        assert_eq!(
            to_wire(&body("invocation_failed", "sandbox said S004 (stopped)")).code,
            "S004"
        );
        assert_eq!(
            to_wire(&body(
                "invocation_failed",
                r#"handler error: {"code":"S299"}"#
            ))
            .code,
            "S216"
        );
        assert_eq!(to_wire(&body("S400", "too many")).code, "S400");
        // S200 (an in-VM failure) is passed through, wrapped or not: never a timeout result.
        assert_eq!(to_wire(&body("S200", "exec timed out")).code, "S200");
        assert_eq!(
            to_wire(&body(
                "invocation_failed",
                r#"handler error: {"code":"S200","message":"exec timed out after 5 ms"}"#
            ))
            .code,
            "S200"
        );
        assert_eq!(to_wire(&body("S220", "future")).code, "S216");
        let e = to_wire(&body(
            "invocation_failed",
            "serialization error: missing field `path`",
        ));
        assert_eq!(e.code, "S216");
        assert!(
            e.message.starts_with("engine error: invocation_failed: "),
            "{}",
            e.message
        );
        assert_eq!(
            to_wire(&body(
                "function_not_found",
                "Function sandbox::exec not found"
            ))
            .code,
            "S216"
        );
        assert_eq!(
            to_wire(&body("timeout", "sandbox::exec S200: no answer")).code,
            "S216"
        );
        for c in PASSED_THROUGH {
            assert_eq!(canonical(c), c);
        }
    }
}
