//! Turn history (`shell::turns::*`) on the broker↔executor socket.
//!
//! The store lives in the executor (the broker opens no files). The broker forwards each
//! turns function's JSON payload verbatim; the executor parses it against the seed schema
//! itself (nothing the broker sends is trusted) and answers with the JSON response.

use serde::{Deserialize, Serialize};

/// `Request::Turns`: `function` is the full function id (`shell::turns::list`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnsCall {
    pub function: String,
    pub payload_json: String,
}

/// `Reply::Turns`: the response document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnsReply {
    pub json: String,
}
