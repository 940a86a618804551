//! Forwarding `target: {kind: "sandbox", sandbox_id}` calls to the iii-sandbox worker.
//! (Being implemented.)

use std::sync::Arc;

use iii_shell_protocol::{Code, WireError};
use serde_json::Value;

use crate::services::Services;

/// Forwards `shell::fs::<op>` to `sandbox::fs::<op>` with `sandbox_id` injected.
pub async fn fs(services: &Arc<Services>, op: &str, sandbox_id: &str, body: Value) -> Result<Value, WireError> {
    let _ = (services, op, sandbox_id, body);
    Err(WireError::new(Code::S216, "sandbox forwarding is not implemented yet"))
}
