//! `iii-shell call`: one call through validate → executor, result printed as JSON.

use std::path::Path;
use std::sync::Arc;

use iii_shell_protocol::config::Config;
use iii_shell_protocol::{Code, WireError};
use serde_json::Value;

use crate::cli::CallArgs;
use crate::spawn_executor::spawn_executor;
use iii_shell_broker::functions::{dispatch, CallMeta};
use iii_shell_broker::services::Services;

/// Loads `--config` if the file exists (a file that exists but fails to parse is an error),
/// else the built-in default.
pub fn load_config(path: Option<&Path>) -> Result<Config, WireError> {
    match path {
        None => Ok(Config::builtin_default()),
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                WireError::new(Code::S210, format!("cannot read {}: {e}", p.display()))
            })?;
            Config::from_yaml(&text)
                .map_err(|e| WireError::new(Code::S210, format!("{}: {e}", p.display())))
        }
    }
}

pub async fn run(args: CallArgs, config_path: Option<&Path>) -> i32 {
    match call(args, config_path).await {
        Ok(v) => {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            0
        }
        Err(e) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&e.to_json()).unwrap_or_default()
            );
            1
        }
    }
}

async fn call(args: CallArgs, config_path: Option<&Path>) -> Result<Value, WireError> {
    let config = iii_shell_broker::worker_identity::resolve(&load_config(config_path)?)
        .map_err(|e| WireError::new(Code::S210, e))?;
    let payload: Value = match &args.json {
        None => Value::Object(Default::default()),
        Some(s) => serde_json::from_str(s)
            .map_err(|e| WireError::new(Code::S210, format!("malformed payload: {e}")))?,
    };
    let services = Services::new();
    services.snapshots.install(config);
    let internal = |e: String| WireError::new(Code::S216, e);
    let (_child, stream) = match &args.socket {
        Some(path) => (
            None,
            tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| internal(format!("cannot connect to {}: {e}", path.display())))?,
        ),
        None => {
            let (child, stream) = spawn_executor(&[])
                .map_err(|e| internal(format!("cannot start the executor: {e}")))?;
            (Some(child), stream)
        }
    };
    services.attach_executor(stream).await?;
    let services: Arc<Services> = services;
    dispatch(&services, &args.function, payload, CallMeta::default()).await
}
