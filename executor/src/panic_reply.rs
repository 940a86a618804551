//! A request whose handler panicked still gets an answer.
//!
//! The server runs every request's handler (and the work that follows its reply) inside
//! [`caught`]: a panic is logged as an ERROR and becomes an internal-error reply for that
//! request's id ([`internal_error`]), the id leaves the in-flight table as after any reply,
//! and the executor goes on serving. A panic in work run on the blocking pool already
//! surfaces as a failed join, which each handler maps to its own internal error.
//!
//! With the `test-faults` feature (tests only; never in a release build) a request can ask
//! for a panic ([`injected_fault`]), so the tests prove all of this on the real binary.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use iii_shell_protocol::messages::Request;
use iii_shell_protocol::{Code, WireError};

/// Runs `work`, turning a panic into its message.
pub async fn caught<F: Future>(work: F) -> Result<F::Output, String> {
    // Unwind safety: after a panic the request's own state is dropped, not reused; shared
    // state behind the executor's mutexes is recovered from poisoning where it is locked.
    AssertUnwindSafe(work)
        .catch_unwind()
        .await
        .map_err(|payload| message(payload.as_ref()))
}

/// The text of a panic's payload.
pub fn message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// The reply to request `id` of `kind` whose handler panicked: C216 for a `coder::*` call
/// (its errors are C-codes), S216 for every other.
pub fn internal_error(id: u64, kind: &str, coder: bool) -> WireError {
    WireError::new(
        if coder { Code::C216 } else { Code::S216 },
        format!(
            "internal error in the executor while serving this {kind} request (id {id}); \
             the details are in the executor's log (ERROR \"request handler panicked\"); \
             the executor goes on serving"
        ),
    )
}

/// Whether `request` asks for an injected panic: a `shell::fs::stat` of
/// [`FAULT_PATH`]. Only with the `test-faults` feature.
#[cfg(feature = "test-faults")]
pub fn injected_fault(request: &Request) -> bool {
    matches!(request, Request::Fs(iii_shell_protocol::fs::FsOp::Stat { path }) if path == FAULT_PATH)
}

/// Never, in a build without the `test-faults` feature.
#[cfg(not(feature = "test-faults"))]
pub fn injected_fault(_request: &Request) -> bool {
    false
}

/// The path whose `stat` panics in a `test-faults` build.
pub const FAULT_PATH: &str = "/.iii-shell-test-fault/panic";

/// Whether a request is a `coder::*` call.
pub fn is_coder(request: &Request) -> bool {
    matches!(request, Request::Coder(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_becomes_its_message() {
        assert_eq!(caught(async { 7 }).await, Ok(7));
        let r: Result<(), String> = caught(async { panic!("boom {}", 1) }).await;
        assert_eq!(r, Err("boom 1".to_string()));
        let r: Result<(), String> = caught(async { std::panic::panic_any(3u8) }).await;
        assert_eq!(r, Err("a panic without a message".to_string()));
    }

    #[test]
    fn the_reply_says_where_it_is_logged() {
        let e = internal_error(9, "fs", false);
        assert_eq!(e.code, Code::S216);
        assert_eq!(
            e.message,
            "internal error in the executor while serving this fs request (id 9); the details \
             are in the executor's log (ERROR \"request handler panicked\"); the executor goes \
             on serving"
        );
        assert_eq!(internal_error(1, "coder", true).code, Code::C216);
    }
}
