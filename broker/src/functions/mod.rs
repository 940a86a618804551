//! The functions this worker serves: their registration data and their handlers.

pub mod coder;
pub mod config_status;
pub mod definition;
pub mod exec;
pub mod fs;
pub mod job;
pub mod pty;
pub mod sandbox;
pub mod turns;
pub mod ui;
pub mod workspace;

use std::sync::Arc;

use iii_shell_protocol::{Code, WireError};
use serde_json::Value;

pub use definition::{meta, to_value, CallMeta, FunctionDef};

use iii_shell_protocol::functions::{self, Family};

use crate::services::Services;

/// Every function this build serves, in registration order: the definitions of each family
/// of [`functions::FUNCTIONS`] (the tests below check they are the table's ids, in its order).
pub fn catalogue() -> Vec<FunctionDef> {
    let mut v = exec::definitions();
    v.extend(config_status::definitions());
    v.extend(fs::definitions());
    v.extend(workspace::definitions());
    v.extend(coder::definitions());
    v.extend(pty::definitions());
    v.extend(turns::definitions());
    v.extend(ui::definitions());
    v.extend(job::definitions());
    v
}

/// Runs the handler of `function_id`: found in the function table ([`functions::FUNCTIONS`]; an id
/// not in it is S210 `unknown function`), then the handlers of its family.
pub async fn dispatch(
    services: &Arc<Services>,
    function_id: &str,
    payload: Value,
    meta: CallMeta,
) -> Result<Value, WireError> {
    let Some(entry) = functions::find(function_id) else {
        return Err(WireError::new(
            Code::S210,
            format!("unknown function: {function_id}"),
        ));
    };
    let id = entry.id;
    match entry.family {
        Family::Exec => match id {
            "shell::exec" => exec::exec(services, payload).await,
            "shell::exec_bg" => exec::exec_bg(services, payload).await,
            "shell::status" => exec::status(services, payload).await,
            "shell::kill" => exec::kill(services, payload).await,
            "shell::list" => exec::list(services).await,
            other => Err(WireError::new(
                Code::S210,
                format!("unknown function: {other}"),
            )),
        },
        Family::ConfigStatus => config_status::status(services),
        Family::Fs => {
            let scope = coder::scope_of(&payload, &meta)
                .map_err(|e| WireError::new(Code::S210, e.message))?
                .scope_root;
            fs::dispatch(services, id, payload, scope).await
        }
        Family::Workspace => workspace::dispatch(services, id, payload).await,
        Family::Coder => coder::dispatch(services, id, payload, meta).await,
        Family::Pty => pty::dispatch(services, id, payload).await,
        Family::Turns => turns::dispatch(services, id, payload, meta).await,
        Family::Ui => ui::dispatch(services, id, payload).await,
        Family::Job => job::dispatch(services, id, payload).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iii_shell_protocol::functions::FUNCTIONS;

    /// What is registered is the table, in its order: no function is registered that the
    /// table (and so the dispatch) does not know, and none of the table is left unregistered.
    #[test]
    fn the_catalogue_is_the_function_table() {
        let registered: Vec<&str> = catalogue().iter().map(|d| d.id).collect();
        let table: Vec<&str> = FUNCTIONS.iter().map(|e| e.id).collect();
        assert_eq!(registered, table);
    }

    /// Every function of the table reaches a handler of its own: under the default
    /// configuration with no executor, each answers (an error of its handler at most), never
    /// `unknown function`; an id outside the table is `unknown function` (S210).
    #[tokio::test]
    async fn every_table_function_has_a_handler() {
        let services = Services::new();
        services
            .snapshots
            .install(iii_shell_protocol::config::Config::builtin_default());
        for e in FUNCTIONS {
            let r = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                dispatch(&services, e.id, Value::Null, CallMeta::default()),
            )
            .await
            .unwrap_or_else(|_| panic!("{} did not answer", e.id));
            if let Err(err) = r {
                assert!(
                    !err.message.starts_with("unknown function"),
                    "{}: {err:?}",
                    e.id
                );
            }
        }
        let e = dispatch(&services, "shell::nope", Value::Null, CallMeta::default())
            .await
            .unwrap_err();
        assert!(e.is(Code::S210), "{e:?}");
        assert_eq!(e.message, "unknown function: shell::nope");
    }
}
