//! The policy the executor enforces, compiled from the `shell` configuration document.
//!
//! The broker sends the whole document; the executor parses and validates it itself, so a
//! compromised broker cannot hand it a policy the configuration rules would refuse.

use std::sync::{Arc, RwLock};

use iii_shell_protocol::config::Config;

use crate::denylist::Denylist;
use crate::jail::Jail;

#[derive(Debug)]
pub struct Policy {
    pub generation: u64,
    pub config: Config,
    pub denylist: Denylist,
    pub jail: Jail,
}

impl Policy {
    pub fn build(generation: u64, config_json: &str) -> Result<Policy, String> {
        let value: serde_json::Value =
            serde_json::from_str(config_json).map_err(|e| format!("policy is not JSON: {e}"))?;
        let config = Config::from_value(&value).map_err(|e| e.0)?;
        let denylist = Denylist::compile(&config.denylist_patterns)?;
        let jail = Jail::new(
            &config.fs.host_roots,
            &config.fs.denylist_paths,
            &config.code.non_accessible_globs,
        )?;
        Ok(Policy { generation, config, denylist, jail })
    }
}

/// The newest accepted policy; each request takes one snapshot and keeps it to the end.
#[derive(Debug, Default)]
pub struct PolicyStore {
    current: RwLock<Option<Arc<Policy>>>,
}

impl PolicyStore {
    pub fn get(&self) -> Option<Arc<Policy>> {
        self.current.read().ok().and_then(|g| g.clone())
    }

    pub fn set(&self, p: Policy) {
        if let Ok(mut g) = self.current.write() {
            *g = Some(Arc::new(p));
        }
    }
}
