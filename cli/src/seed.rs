//! The `--config` seed: read from the host by the supervisor's CLI, then handed to the broker
//! as a value (the broker crate never reads a file).

use std::path::Path;

use iii_shell_protocol::config::Config;

/// The seed file names a configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("seed config {path}: {error}")]
    BadSeed { path: String, error: String },
}

/// Reads the `--config` seed: a missing file means the built-in default; a file that exists
/// but does not parse aborts boot.
pub fn load_seed(path: &Path) -> Result<Config, BootError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Config::from_yaml(&text).map_err(|e| BootError::BadSeed {
            path: path.display().to_string(),
            error: e.0,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(path = %path.display(), "no seed config file; the built-in default is the seed");
            Ok(Config::builtin_default())
        }
        Err(e) => Err(BootError::BadSeed {
            path: path.display().to_string(),
            error: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_seed_is_the_builtin_default() {
        let dir = tempfile::tempdir().unwrap();
        let seed = load_seed(&dir.path().join("absent.yaml")).unwrap();
        assert_eq!(seed, Config::builtin_default());
    }

    #[test]
    fn a_seed_that_does_not_parse_names_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.yaml");
        std::fs::write(&path, "default_timeout_ms: [not, a, number]\n").unwrap();
        let BootError::BadSeed { path: named, .. } = load_seed(&path).unwrap_err();
        assert_eq!(named, path.display().to_string());
    }

    #[test]
    fn a_directory_is_no_seed() {
        let dir = tempfile::tempdir().unwrap();
        let BootError::BadSeed { error, .. } = load_seed(dir.path()).unwrap_err();
        assert!(error.contains("directory"), "{error}");
    }
}
