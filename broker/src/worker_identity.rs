//! What makes one worker's configuration its own: the configuration id it reads and
//! registers, and the directory its relative paths resolve against.
//!
//! * **Configuration id.** A worker alone uses `shell`, the seed's contract. A worker with a
//!   namespace (`III_NAMESPACE`) uses `shell-<namespace>`, so several hosts on one engine do
//!   not share (and overwrite) one entry; `--config-id ID` (or `III_SHELL_CONFIG_ID`) names
//!   the id explicitly and wins over both.
//! * **Start-up directory.** A relative `working_dir` or `turns.data_dir` resolves against the
//!   worker's working directory at start-up. The broker resolves it (it knows its cwd and
//!   never touches the filesystem to do so); the executor refuses a relative path, so it
//!   never guesses one.

use std::path::PathBuf;

use iii_shell_protocol::config::Config;

/// The configuration id of a worker with no namespace and no `--config-id`.
pub const DEFAULT_CONFIG_ID: &str = "shell";

/// Longest id the configuration worker accepts (`[a-z0-9_-]{1,64}`).
const MAX_ID: usize = 64;

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// The configuration id: `explicit`, else `shell-<namespace>`, else `shell`. A blank
/// `explicit` or `namespace` counts as unset. An id the configuration worker would refuse is
/// an error that says what to do.
pub fn config_id(explicit: Option<&str>, namespace: Option<&str>) -> Result<String, String> {
    let blank = |s: &&str| !s.trim().is_empty();
    if let Some(id) = explicit.filter(blank) {
        if valid_id(id) {
            return Ok(id.to_string());
        }
        return Err(format!(
            "--config-id {id:?} is not a configuration id: use 1 to 64 of a-z, 0-9, '_' and '-'"
        ));
    }
    match namespace.filter(blank) {
        None => Ok(DEFAULT_CONFIG_ID.to_string()),
        Some(ns) => {
            let id = format!("{DEFAULT_CONFIG_ID}-{ns}");
            if valid_id(&id) {
                Ok(id)
            } else {
                Err(format!(
                    "III_NAMESPACE {ns:?} does not make a configuration id ({id:?} is not 1 to 64 \
                     of a-z, 0-9, '_' and '-'): pass --config-id ID to name this worker's \
                     configuration"
                ))
            }
        }
    }
}

/// The directory the worker was started in: the process's working directory, which the
/// kernel keeps for it and nothing in the broker or the CLI changes (none of them calls
/// `chdir`; `serve` starts its broker in its own directory). Every reload resolves relative
/// paths against it.
pub fn start_dir() -> Result<PathBuf, String> {
    std::env::current_dir().map_err(|e| e.to_string())
}

/// `config` with its relative paths resolved against the start-up directory. An error only
/// when a path is relative and the directory is unknown.
pub fn resolve(config: &Config) -> Result<Config, String> {
    if config.require_resolved().is_ok() {
        return Ok(config.clone());
    }
    let dir = start_dir().map_err(|e| {
        format!(
            "cannot resolve the relative working_dir / turns.data_dir: the worker's working \
             directory is unknown ({e}); start it from an existing directory or make the paths \
             absolute"
        )
    })?;
    Ok(config.resolved_against(&dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_ids() {
        assert_eq!(config_id(None, None).unwrap(), "shell");
        assert_eq!(config_id(Some(" "), Some("")).unwrap(), "shell");
        assert_eq!(config_id(None, Some("host-a")).unwrap(), "shell-host-a");
        assert_eq!(config_id(Some("edge_1"), Some("host-a")).unwrap(), "edge_1");
        assert_eq!(config_id(Some("shell"), Some("host-a")).unwrap(), "shell");
        let e = config_id(None, Some("Host.A")).unwrap_err();
        assert!(e.contains("pass --config-id"), "{e}");
        assert!(config_id(Some("Bad Id"), None).is_err());
        assert!(config_id(Some(&"x".repeat(65)), None).is_err());
        assert_eq!(config_id(Some(&"x".repeat(64)), None).unwrap().len(), 64);
        assert!(config_id(None, Some(&"n".repeat(59))).is_err());
        assert!(config_id(None, Some(&"n".repeat(58))).is_ok());
    }
}
