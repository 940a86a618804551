//! The helpers this crate's test suites share (each suite says `mod common;`): a jail on a
//! temp tree next to an outside directory, with the policy that confines to it.
#![allow(dead_code)] // each suite compiles this module on its own and uses part of it

use std::path::PathBuf;

use iii_shell_executor::policy::Policy;
use iii_shell_files::error::ExecError;
use iii_shell_protocol::config::Config;

/// A temp dir holding `root/` (the jail) and `outside/` (beyond it), with canonical paths.
pub struct Tree {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub outside: PathBuf,
}

impl Tree {
    pub fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let (root, outside) = (base.join("root"), base.join("outside"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        Tree {
            _dir: dir,
            root,
            outside,
        }
    }

    pub fn write(&self, rel: &str, data: impl AsRef<[u8]>) -> PathBuf {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
        p
    }

    pub fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.root.join(rel)).unwrap()
    }

    pub fn abs(&self, rel: &str) -> String {
        self.root.join(rel).to_string_lossy().into_owned()
    }

    pub fn policy(&self) -> Policy {
        self.policy_with(|_| {})
    }

    pub fn policy_with(&self, f: impl FnOnce(&mut Config)) -> Policy {
        let mut config = Config::default();
        config.fs.host_roots = vec![self.root.to_string_lossy().into_owned()];
        config.fs.allow_unjailed = false;
        f(&mut config);
        Policy::build(1, &serde_json::to_string(&config).unwrap()).unwrap()
    }
}

/// The wire code of a failed call.
pub fn code_of<T: std::fmt::Debug>(r: Result<T, ExecError>) -> String {
    r.unwrap_err().to_wire().code.to_string()
}
