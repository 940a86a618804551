//! Configs the suites start from: the built-in default jailed to a temp root, and the same
//! as JSON values for engine-side configuration.

use std::path::Path;

use iii_shell_protocol::config::{Config, SHIPPED_CONFIG_YAML};
use serde_json::Value;

/// The built-in default jailed to `root`. These tests were written for commands running as
/// the test's own user (root, in a root-owned temp dir), so they say so:
/// `confinement.run_as: root` (the escape suite's `run_as` cases use other users).
pub fn jailed(root: &Path) -> Config {
    let mut c = Config::builtin_default();
    c.fs.host_roots = vec![root.to_string_lossy().into_owned()];
    c.fs.allow_unjailed = false;
    c.confinement.run_as = Some("root".into());
    c
}

pub fn jailed_value(root: &Path) -> Value {
    serde_json::to_value(jailed(root)).unwrap()
}

pub fn unjailed_value() -> Value {
    serde_json::to_value(Config::builtin_default()).unwrap()
}

/// The shipped `config.yaml` as a JSON value.
pub fn shipped_value() -> Value {
    serde_json::to_value(Config::from_yaml(SHIPPED_CONFIG_YAML).expect("shipped config parses"))
        .unwrap()
}
