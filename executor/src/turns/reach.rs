//! Whether a recorded path may be served or written back under the policy in force now.
//!
//! A turn record outlives the policy it was made under: a file can be made non-accessible
//! (`code.non_accessible_globs`, `fs.denylist_paths`), its root removed by a config reload,
//! or the caller confined to an `fs_scope` since. `shell::turns::get`, `shell::turns::revert`
//! and `coder::change-diff` ask [`Reach::allows`] at the time of the call for every recorded
//! name (the path, where it resolved when recorded, a move's source), and a body it refuses
//! reads exactly like one that is no longer kept (`stored: false`, C211 for a diff), and is
//! never written.
//!
//! The check is on names: a path must lie (component-wise, after lexical normalization) in
//! one of the current roots when jailed, not be denied (the jail's `is_denied`:
//! the denylist, the non-accessible globs, a protected identity), and lie in the caller's
//! canonical `fs_scope.scope_root` when one is stamped (only the scope root confines, as for
//! `coder::*`; the session root only anchors relative paths).

use std::path::{Path, PathBuf};

use iii_shell_files::error::ExecError;
use iii_shell_files::jail::normalize;
use iii_shell_protocol::coder::FsScope;

use super::model::FileRecord;
use crate::policy::Policy;

/// What a call may reach of the recorded paths: the policy in force and the caller's scope.
pub struct Reach<'a> {
    policy: &'a Policy,
    scope_root: Option<PathBuf>,
}

impl<'a> Reach<'a> {
    /// The reach of a call under `policy` with `scope` (its scope root canonicalized through
    /// the jail; a scope root that does not resolve is refused, as `coder::*` refuses it).
    pub fn new(policy: &'a Policy, scope: Option<&FsScope>) -> Result<Reach<'a>, ExecError> {
        let scope_root = match scope.and_then(|s| s.scope_root.as_deref()) {
            None => None,
            Some(s) => Some(
                policy
                    .jail
                    .resolve_with(s, libc::O_PATH | libc::O_DIRECTORY)
                    .map_err(|e| {
                        ExecError::Invalid(format!(
                            "fs_scope.scope_root {s:?} is not a usable directory ({e})"
                        ))
                    })?
                    .path,
            ),
        };
        Ok(Reach { policy, scope_root })
    }

    /// Whether the recorded path `path` may be served or written now.
    pub fn allows(&self, path: &str) -> bool {
        reachable(self.policy, self.scope_root.as_deref(), path)
    }

    /// Whether every name of a file record may be served or written now: its path, where it
    /// resolved when recorded, and a move's source.
    pub fn allows_file(&self, f: &FileRecord) -> bool {
        self.allows(&f.path)
            && f.real.as_deref().is_none_or(|r| self.allows(r))
            && f.from.as_deref().is_none_or(|r| self.allows(r))
    }
}

/// Whether `path` (a recorded absolute path) is reachable under `policy` for a caller confined
/// to `scope_root` (canonical): absolute, inside a current root when jailed, not denied, and
/// inside the scope root. A pure function of the policy and the name (plus the jail's
/// identity check of what is at the name now).
pub fn reachable(policy: &Policy, scope_root: Option<&Path>, path: &str) -> bool {
    if !path.starts_with('/') || path.contains('\0') {
        return false;
    }
    let p = normalize(Path::new(path));
    let jail = &policy.jail;
    if jail.is_jailed() && !jail.roots().iter().any(|r| p.starts_with(&r.path)) {
        return false;
    }
    if jail.is_denied(&p) {
        return false;
    }
    scope_root.is_none_or(|s| p.starts_with(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reachable_is_roots_then_protected_names_then_scope() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let (a, b) = (base.join("a"), base.join("b"));
        std::fs::create_dir_all(a.join("sub")).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let v = json!({"fs": {"host_roots": [a], "denylist_paths": [a.join("private")]},
            "code": {"non_accessible_globs": ["**/*.env"]}});
        let p = Policy::build(1, &v.to_string()).unwrap();
        let at = |rel: &str| format!("{}/{rel}", a.display());
        assert!(reachable(&p, None, &at("x.txt")));
        assert!(
            reachable(&p, None, &at("gone/deep/x.txt")),
            "missing is fine"
        );
        assert!(!reachable(&p, None, &at("private/x")), "denylisted");
        assert!(!reachable(&p, None, &at("sub/.env")), "non-accessible glob");
        assert!(
            !reachable(&p, None, &format!("{}/x", b.display())),
            "not a root now"
        );
        assert!(
            !reachable(&p, None, &at("../b/x")),
            "normalized before the root check"
        );
        assert!(!reachable(&p, None, "relative/x"));
        let sub = a.join("sub");
        assert!(reachable(&p, Some(&sub), &at("sub/x")));
        assert!(
            !reachable(&p, Some(&sub), &at("x")),
            "outside the scope root"
        );
        assert!(!reachable(&p, Some(&sub), &at("subx/y")), "component-wise");
        let scope = FsScope {
            scope_root: Some(sub.to_string_lossy().into_owned()),
            session_root: None,
        };
        let r = Reach::new(&p, Some(&scope)).unwrap();
        assert!(r.allows(&at("sub/y")) && !r.allows(&at("y")));
        let missing = FsScope {
            scope_root: Some(at("nope")),
            session_root: None,
        };
        assert!(matches!(
            Reach::new(&p, Some(&missing)),
            Err(ExecError::Invalid(_))
        ));
    }
}
