//! Where a coder path points, and what a caller may reach.
//!
//! * **Jailed** (`fs.host_roots` set): the roots are the canonical host roots. A relative path
//!   anchors on the session root when the harness stamped a scope, else on the primary root,
//!   and is then resolved by the jail (`openat2(RESOLVE_BENEATH)` beneath the root it lies
//!   in, so `..` and symlinks cannot leave it: C215).
//! * **Unjailed** (`fs.allow_unjailed`, no roots): absolute paths are accepted anywhere; the
//!   fallback roots (the executor's working directory, then `/tmp`) only anchor relative
//!   paths, after the session root.
//! * A **scope** (`fs_scope.scope_root`) confines the call further: a path outside it is C220,
//!   checked on the lexical form before anything is opened (so the check reveals nothing
//!   about existence) and again on the canonical form.
//! * Denied paths (denylist, `non_accessible_globs`, EACCES) read like missing ones: C211 with
//!   one wording.

use std::path::{Path, PathBuf};

use iii_shell_protocol::coder::*;
use iii_shell_protocol::error::{escape_message, not_found_message};
use iii_shell_protocol::{Code, WireError, VERSION};

use crate::error::ExecError;
use crate::globs::SplitGlobs;
use crate::jail::{normalize, Parent, Resolved};
use crate::FsPolicy;

/// A coder failure: a C-code and a message that states the problem and the way out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CErr {
    pub code: Code,
    pub message: String,
}

impl CErr {
    pub fn new(code: Code, message: impl Into<String>) -> CErr {
        CErr {
            code,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> CErr {
        CErr::new(Code::C210, message)
    }
    pub fn not_found(input: &str) -> CErr {
        CErr::new(Code::C211, not_found_message(input))
    }
    pub fn io(message: impl Into<String>) -> CErr {
        CErr::new(Code::C216, message)
    }
    pub fn too_large(message: impl Into<String>) -> CErr {
        CErr::new(Code::C218, message)
    }
    pub fn into_wire(self) -> WireError {
        WireError::new(self.code, self.message)
    }
    pub fn entry(self) -> EntryError {
        EntryError {
            code: self.code.as_str().to_string(),
            message: self.message,
        }
    }

    /// The coder form of an executor error about `input` (the caller's own spelling, so a
    /// denied path and a missing one produce the same message).
    pub fn from_exec(e: ExecError, input: &str) -> CErr {
        match e {
            ExecError::NotFound(_) | ExecError::Missing(_) => CErr::not_found(input),
            ExecError::Escape(_) => CErr::new(Code::C215, escape_message(input)),
            ExecError::Invalid(m) | ExecError::WrongType(m) | ExecError::BadRegex(m) => {
                CErr::invalid(m)
            }
            ExecError::NotEmpty(m) => CErr::invalid(format!(
                "directory not empty: {m}; pass recursive: true to delete it with its contents"
            )),
            ExecError::Exists(m) => CErr::new(Code::C213, format!("already exists: {m}")),
            ExecError::TooLarge(m) => CErr::too_large(m),
            ExecError::Plain(m) | ExecError::Internal(m) => CErr::io(m),
            ExecError::OutOfScope(m) => CErr::new(Code::C220, m),
        }
    }
}

/// The policy a call runs under, with its roots and scope resolved.
pub struct Ctx<'a> {
    pub policy: &'a FsPolicy,
    /// Canonical roots: the host roots (jailed) or the fallback roots (unjailed).
    pub bases: Vec<PathBuf>,
    /// Canonical scope root, when the call is scoped.
    pub scope_root: Option<PathBuf>,
    /// Canonical session root (relative paths anchor here), when the call is scoped.
    pub session_root: Option<PathBuf>,
    non_accessible: RootedGlobs,
    excludes: RootedGlobs,
}

/// Globs matched on an absolute path, or relative to any of the roots (CODER-06).
#[derive(Clone)]
pub struct RootedGlobs {
    globs: SplitGlobs,
    bases: Vec<PathBuf>,
}

impl RootedGlobs {
    /// Compiles `globs` now (a list of the call's own).
    pub fn new(globs: &[String], bases: &[PathBuf]) -> RootedGlobs {
        RootedGlobs::with(SplitGlobs::new(globs), bases)
    }

    /// `globs`, compiled already, matched against `bases`.
    pub fn with(globs: SplitGlobs, bases: &[PathBuf]) -> RootedGlobs {
        RootedGlobs {
            globs,
            bases: bases.to_vec(),
        }
    }

    pub fn is_match(&self, path: &Path) -> bool {
        let (anywhere, rooted) = (&self.globs.anywhere, &self.globs.rooted);
        if !anywhere.is_empty() && anywhere.is_match(path) {
            return true;
        }
        if rooted.is_empty() {
            return false;
        }
        if rooted.is_match(path) {
            return true;
        }
        self.bases.iter().any(|b| {
            path.strip_prefix(b)
                .is_ok_and(|rel| !rel.as_os_str().is_empty() && rooted.is_match(rel))
        })
    }

    /// A directory also matches when the globs hide what is inside it (`**/target/**` hides
    /// `target` itself).
    pub fn is_match_dir(&self, path: &Path) -> bool {
        self.is_match(path) || self.is_match(&path.join("x"))
    }
}

/// The fallback roots of unjailed mode: the executor's working directory, then `/tmp`,
/// canonical, deduplicated, each only when it is a directory.
pub fn fallback_roots() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for c in [std::env::current_dir().ok(), Some(PathBuf::from("/tmp"))]
        .into_iter()
        .flatten()
    {
        if let Ok(p) = std::fs::canonicalize(&c) {
            if p.is_dir() && !out.contains(&p) {
                out.push(p);
            }
        }
    }
    if out.is_empty() {
        out.push(PathBuf::from("/"));
    }
    out
}

/// Whether `path` lies in `root` (component-wise: `/a/bc` is not in `/a/b`).
pub fn within(path: &Path, root: &Path) -> bool {
    path.starts_with(root)
}

impl<'a> Ctx<'a> {
    pub fn new(policy: &'a FsPolicy, scope: &FsScope) -> Result<Ctx<'a>, CErr> {
        let bases = if policy.jail.is_jailed() {
            policy.jail.roots().iter().map(|r| r.path.clone()).collect()
        } else {
            fallback_roots()
        };
        let non_accessible = RootedGlobs::with(policy.coder_globs.non_accessible.clone(), &bases);
        let excludes = RootedGlobs::with(policy.coder_globs.excludes.clone(), &bases);
        let mut ctx = Ctx {
            policy,
            bases,
            scope_root: None,
            session_root: None,
            non_accessible,
            excludes,
        };
        let canon_dir = |ctx: &Ctx<'_>, p: &str, what: &str| -> Result<PathBuf, CErr> {
            let r = ctx.policy.jail.resolve(p).map_err(|e| {
                CErr::invalid(format!(
                    "fs_scope.{what} {p:?} is not a usable directory ({})",
                    CErr::from_exec(e, p).message
                ))
            })?;
            Ok(r.path)
        };
        if let Some(s) = &scope.scope_root {
            ctx.scope_root = Some(canon_dir(&ctx, s, "scope_root")?);
        }
        if let Some(s) = &scope.session_root {
            let p = canon_dir(&ctx, s, "session_root")?;
            if let Some(scope) = &ctx.scope_root {
                if !within(&p, scope) {
                    return Err(CErr::invalid(format!(
                        "fs_scope.session_root {} lies outside fs_scope.scope_root {}",
                        p.display(),
                        scope.display()
                    )));
                }
            }
            ctx.session_root = Some(p);
        }
        Ok(ctx)
    }

    pub fn info(&self) -> InfoOutput {
        let c = &self.policy.config;
        InfoOutput {
            mode: if self.policy.jail.is_jailed() {
                AccessMode::Jailed
            } else {
                AccessMode::Unjailed
            },
            base_paths: self.bases.iter().map(|p| display(p)).collect(),
            primary_root: display(&self.bases[0]),
            session_root: self.session_root.as_deref().map(display),
            version: VERSION.to_string(),
            max_read_bytes: c.fs.max_read_bytes,
            max_write_bytes: c.fs.max_write_bytes,
            max_output_bytes: c.max_output_bytes,
            batch_read_budget_bytes: BATCH_READ_BUDGET_BYTES,
            list_default_page_size: LIST_DEFAULT_PAGE_SIZE,
            list_max_page_size: LIST_MAX_PAGE_SIZE,
            search_default_max_matches: SEARCH_DEFAULT_MAX_MATCHES,
            search_default_max_line_bytes: SEARCH_DEFAULT_MAX_LINE_BYTES,
            search_response_budget_bytes: SEARCH_RESPONSE_BUDGET_BYTES,
            tree_default_depth: TREE_DEFAULT_DEPTH,
            tree_per_folder_limit: TREE_PER_FOLDER_LIMIT,
            non_accessible_globs: c.code.non_accessible_globs.clone(),
            default_exclude_globs: c.code.default_exclude_globs.clone(),
        }
    }

    /// `fs.max_read_bytes` with 0 (unlimited) as `u64::MAX`.
    pub fn max_read(&self) -> u64 {
        nonzero(self.policy.config.fs.max_read_bytes)
    }

    /// `fs.max_write_bytes` with 0 (unlimited) as `u64::MAX`.
    pub fn max_write(&self) -> u64 {
        nonzero(self.policy.config.fs.max_write_bytes)
    }

    /// The absolute form of a caller path: relative paths anchor on the session root, else
    /// the primary root. Lexically normalized, so `..` is applied to the anchor too; the jail
    /// resolves the result (and judges escapes) on its own.
    pub fn absolute(&self, input: &str) -> Result<String, CErr> {
        if input.is_empty() {
            return Err(CErr::invalid("path is empty: pass a file or folder path (relative to primary_root, see coder::info)"));
        }
        if input.contains('\0') {
            return Err(CErr::invalid("path contains a NUL byte"));
        }
        if input.starts_with('/') {
            return Ok(input.to_string());
        }
        let anchor = self.session_root.as_ref().unwrap_or(&self.bases[0]);
        Ok(format!("{}/{}", anchor.display(), input))
    }

    /// C220 when `path` (absolute) lies outside the call's scope root.
    fn check_scope(&self, path: &Path, input: &str) -> Result<(), CErr> {
        match &self.scope_root {
            Some(scope) if !within(path, scope) => Err(CErr::new(
                Code::C220,
                format!(
                    "path is outside this session's scope root {}: {input}; use a path inside it",
                    scope.display()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The lexical scope check of an absolute path (before anything is opened).
    fn check_scope_lexical(&self, abs: &str, input: &str) -> Result<(), CErr> {
        self.check_scope(&normalize(Path::new(abs)), input)
    }

    /// Resolves `input` through the jail and opens it with `flags`.
    pub fn resolve(&self, input: &str, flags: i32) -> Result<Resolved, CErr> {
        let abs = self.absolute(input)?;
        self.check_scope_lexical(&abs, input)?;
        let jail = &self.policy.jail;
        let r = match jail.resolve_with(&abs, flags) {
            Err(ExecError::Escape(e)) => match self.rerooted(&abs, input, true)? {
                Some(c) => jail.resolve_with(&c, flags),
                None => Err(ExecError::Escape(e)),
            },
            other => other,
        }
        .map_err(|e| CErr::from_exec(e, input))?;
        self.check_scope(&r.path, input)?;
        Ok(r)
    }

    /// The canonical form of `abs` when the jail refused it as an escape but it resolves
    /// inside some root all the same: a symlink in one root leading into another, or a root
    /// spelled through a symlink (the jail knows roots by their canonical paths). A missing
    /// last component is kept as named (so a missing path reads like a denied one: C211), and
    /// so is any last component unless `follow_last` (a parent never follows its entry).
    /// That form is only a hint: the jail then resolves it beneath its own root (`openat2`),
    /// so a link swapped meanwhile leads nowhere else, and denied paths stay C211. A path
    /// resolving outside every root stays C215.
    fn rerooted(&self, abs: &str, input: &str, follow_last: bool) -> Result<Option<String>, CErr> {
        if !self.policy.jail.is_jailed() {
            return Ok(None);
        }
        let lexical = normalize(Path::new(abs));
        let whole = follow_last
            .then(|| std::fs::canonicalize(&lexical).ok())
            .flatten();
        let canon = whole.or_else(|| match (lexical.parent(), lexical.file_name()) {
            (Some(dir), Some(name)) => std::fs::canonicalize(dir).ok().map(|d| d.join(name)),
            _ => None,
        });
        let Some(canon) = canon.filter(|c| *c != lexical) else {
            return Ok(None);
        };
        if !self.bases.iter().any(|b| within(&canon, b)) {
            return Ok(None);
        }
        self.check_scope(&canon, input)?;
        Ok(Some(display(&canon)))
    }

    /// The directory holding `input` and its last component (not followed), creating missing
    /// parents when `create`.
    pub fn parent(&self, input: &str, create: bool) -> Result<Parent, CErr> {
        let abs = self.absolute(input)?;
        self.check_scope_lexical(&abs, input)?;
        let jail = &self.policy.jail;
        let mut p = match jail.parent(&abs, create) {
            Err(ExecError::Escape(e)) => match self.rerooted(&abs, input, false)? {
                Some(c) => jail.parent(&c, create),
                None => Err(ExecError::Escape(e)),
            },
            other => other,
        }
        .map_err(|e| CErr::from_exec(e, input))?;
        if let Err(e) = self.check_scope(&p.path, input) {
            p.remove_made();
            return Err(e);
        }
        Ok(p)
    }

    /// True when `path` (absolute, canonical) matches `code.non_accessible_globs`, on the
    /// absolute path or relative to one of the roots.
    pub fn is_non_accessible(&self, path: &Path) -> bool {
        self.non_accessible.is_match(path)
    }

    /// The default-exclude globs, for walkers that need an owned copy.
    pub fn excludes(&self) -> RootedGlobs {
        self.excludes.clone()
    }

    /// True when `path` is hidden by `code.default_exclude_globs`. A directory also matches
    /// when the globs exclude what is inside it (`**/target/**` hides `target` itself).
    pub fn is_excluded(&self, path: &Path, is_dir: bool) -> bool {
        if is_dir {
            self.excludes.is_match_dir(path)
        } else {
            self.excludes.is_match(path)
        }
    }

    /// True when the policy hides `path` entirely (denylisted, not merely non-accessible):
    /// such entries are left out of listings.
    pub fn is_hidden_by_denylist(&self, path: &Path) -> bool {
        self.policy.jail.is_denied(path) && !self.is_non_accessible(path)
    }

    /// True when `path` is a root (jailed) or `/`; roots cannot be deleted or moved.
    pub fn is_root(&self, path: &Path) -> bool {
        self.policy.jail.is_root(path)
            || (self.policy.jail.is_jailed() && self.bases.iter().any(|b| b == path))
    }

    /// The index of the root `path` lies in (jailed), for same-root checks; unjailed, every
    /// path is on the one host root.
    pub fn root_index(&self, path: &Path) -> usize {
        if !self.policy.jail.is_jailed() {
            return 0;
        }
        // The longest root containing the path (roots may nest).
        self.bases
            .iter()
            .enumerate()
            .filter(|(_, b)| within(path, b))
            .max_by_key(|(_, b)| b.as_os_str().len())
            .map(|(i, _)| i)
            .unwrap_or(0)
    }
}

fn nonzero(v: u64) -> u64 {
    if v == 0 {
        u64::MAX
    } else {
        v
    }
}

pub fn display(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `sha256:<hex>` of `bytes`: the revision of a file's exact content.
pub fn revision(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Lower 9 permission bits of a stat.
pub fn perm_bits(st: &libc::stat) -> u32 {
    st.st_mode & 0o777
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revision_is_sha256_of_the_bytes() {
        assert_eq!(
            revision(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            revision(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn within_is_component_wise() {
        assert!(within(Path::new("/a/b/c"), Path::new("/a/b")));
        assert!(within(Path::new("/a/b"), Path::new("/a/b")));
        assert!(!within(Path::new("/a/bc"), Path::new("/a/b")));
    }
}
