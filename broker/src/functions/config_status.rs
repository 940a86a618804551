//! `shell::config-status`: the last hot-reload outcome.

use std::sync::Arc;

use iii_shell_protocol::WireError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::definition::{meta, to_value, FunctionDef};
use crate::schema::schema_for;
use crate::services::Services;
use crate::snapshot::ReloadStatus;

/// `shell::config-status` takes no arguments.
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ConfigStatusRequest")]
pub struct ConfigStatusRequest {}

pub fn definitions() -> Vec<FunctionDef> {
    vec![FunctionDef {
        id: "shell::config-status",
        description: "Report the last configuration hot-reload outcome: last_outcome (applied|rejected), last_error, and rejected_reloads since boot. A rejected outcome means shell is enforcing an older policy than the central store. Takes no arguments.",
        metadata: meta(true, false, false),
        request_format: schema_for::<ConfigStatusRequest>(),
        response_format: schema_for::<ReloadStatus>(),
    }]
}

pub fn status(services: &Arc<Services>) -> Result<Value, WireError> {
    to_value(&services.snapshots.status())
}
