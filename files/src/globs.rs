//! The one place globs are compiled.
//!
//! Two syntaxes are in use, and each list names the one it is written in:
//! * [`Syntax::Config`] (globset's defaults, `*` crosses `/`): the configuration's
//!   `code.non_accessible_globs` and `code.default_exclude_globs`, matched on whole paths.
//! * [`Syntax::Filter`] (`*` stops at `/`, ripgrep style): the include/exclude globs of
//!   `shell::fs::grep`, `shell::fs::sed` and `coder::search`, where a glob without `/` is
//!   matched against the name and one with `/` against the root-relative path
//!   ([`NameOrPath`]).
//!
//! Errors name the glob; each caller words them for its surface (S210 or C210).

use std::path::Path;
use std::sync::Arc;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

/// How the globs of one list are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// globset's defaults: `*` and `?` also match `/`.
    Config,
    /// `*` and `?` never match `/`.
    Filter,
}

/// The most globs one caller's list may hold.
pub const MAX_CALLER_GLOBS: usize = 1000;

/// The most bytes the globs of one caller's list may take together.
pub const MAX_CALLER_GLOB_BYTES: usize = 64 * 1024;

/// Why a caller's glob list is refused before anything is compiled (`None`: within bounds).
/// Compiling a set costs time and memory in proportion to it (10,000 globs took 170 ms and
/// 80 MB, 100,000 took 2.2 s and 790 MB, and a 40 MiB request holds millions), so a longer
/// list is refused, never cut: cutting it would search what the caller excluded.
pub fn caller_list_problem(globs: &[String]) -> Option<String> {
    if globs.len() > MAX_CALLER_GLOBS {
        return Some(format!(
            "{} globs, at most {MAX_CALLER_GLOBS} are accepted; combine them (`*.{{rs,toml}}`) or search a narrower path",
            globs.len()
        ));
    }
    let bytes: usize = globs.iter().map(String::len).sum();
    if bytes > MAX_CALLER_GLOB_BYTES {
        return Some(format!(
            "the globs take {bytes} bytes, at most {MAX_CALLER_GLOB_BYTES} are accepted; combine them or search a narrower path"
        ));
    }
    None
}

/// A glob list that does not compile.
#[derive(Debug, thiserror::Error)]
pub enum GlobError {
    /// A caller's list is longer than [`caller_list_problem`] accepts.
    #[error("{0}")]
    Limit(String),
    /// One glob is malformed.
    #[error("{glob:?}: {source}")]
    Bad {
        glob: String,
        source: globset::Error,
    },
    /// The set as a whole cannot be built (e.g. too large).
    #[error("{0}")]
    Set(globset::Error),
}

/// Compiles `globs` into one set.
pub fn set<'a>(
    globs: impl IntoIterator<Item = &'a str>,
    syntax: Syntax,
) -> Result<GlobSet, GlobError> {
    let mut b = GlobSetBuilder::new();
    for g in globs {
        let glob = glob(g, syntax).map_err(|source| GlobError::Bad {
            glob: g.to_string(),
            source,
        })?;
        b.add(glob);
    }
    b.build().map_err(GlobError::Set)
}

/// Compiles the globs of `globs` that compile, skipping the others (a configuration list,
/// validated when the policy was built, that must not fail every call); empty when the set
/// cannot be built.
pub fn set_lenient(globs: &[String], syntax: Syntax) -> GlobSet {
    let mut b = GlobSetBuilder::new();
    for g in globs {
        // Parsed only: a glob is compiled once, with the set.
        if let Ok(glob) = glob(g, syntax) {
            b.add(glob);
        }
    }
    b.build().unwrap_or_else(|_| GlobSet::empty())
}

fn glob(g: &str, syntax: Syntax) -> Result<globset::Glob, globset::Error> {
    GlobBuilder::new(g)
        .literal_separator(syntax == Syntax::Filter)
        .build()
}

/// Include or exclude filter globs ([`Syntax::Filter`]): a glob without `/` matches a name,
/// one with `/` the root-relative path.
#[derive(Clone, Debug)]
pub struct NameOrPath {
    name: GlobSet,
    path: GlobSet,
    empty: bool,
}

impl NameOrPath {
    /// Compiles `globs`, each as the caller normalized it already (leading `./` cut).
    pub fn new<'a>(globs: impl IntoIterator<Item = &'a str>) -> Result<NameOrPath, GlobError> {
        let (mut names, mut paths) = (Vec::new(), Vec::new());
        for g in globs {
            if g.contains('/') {
                paths.push(g);
            } else {
                names.push(g);
            }
        }
        let empty = names.is_empty() && paths.is_empty();
        Ok(NameOrPath {
            name: set(names, Syntax::Filter)?,
            path: set(paths, Syntax::Filter)?,
            empty,
        })
    }

    /// Compiles a caller's `globs`, each as `trim` normalizes it; a bad one is named as the
    /// caller wrote it, so the error echoes their input. A list beyond
    /// [`caller_list_problem`]'s bounds is refused before anything is compiled.
    pub fn from_user<'a>(
        globs: &'a [String],
        trim: impl Fn(&'a str) -> &'a str,
    ) -> Result<NameOrPath, GlobError> {
        if let Some(why) = caller_list_problem(globs) {
            return Err(GlobError::Limit(why));
        }
        let trimmed: Vec<&str> = globs.iter().map(|g| trim(g)).collect();
        NameOrPath::new(trimmed.iter().copied()).map_err(|e| match e {
            GlobError::Bad { glob, source } => GlobError::Bad {
                glob: globs
                    .iter()
                    .zip(&trimmed)
                    .find(|(_, t)| **t == glob)
                    .map_or(glob, |(g, _)| g.clone()),
                source,
            },
            other => other,
        })
    }

    /// No glob was given.
    pub fn is_empty(&self) -> bool {
        self.empty
    }

    /// Whether `rel` (relative to the searched root) matches: its name a name glob, or the
    /// whole of it a path glob.
    pub fn is_match(&self, rel: &Path) -> bool {
        rel.file_name().is_some_and(|n| self.name.is_match(n)) || self.path.is_match(rel)
    }
}

/// A glob list compiled the way `coder::paths::RootedGlobs` matches it: the globs that start with `**/`
/// (matched the same on an absolute path as on any relative one, so once, on the absolute
/// path) apart from the others (matched on the absolute path and relative to each root).
/// The configuration's two lists are compiled once per policy (`FsPolicy::build`), not per
/// call; the sets are shared.
#[derive(Clone, Debug)]
pub struct SplitGlobs {
    /// The globs that start with `**/`.
    pub anywhere: Arc<GlobSet>,
    /// The others.
    pub rooted: Arc<GlobSet>,
}

impl SplitGlobs {
    pub fn new(globs: &[String]) -> SplitGlobs {
        let (any, rest): (Vec<String>, Vec<String>) =
            globs.iter().cloned().partition(|g| g.starts_with("**/"));
        SplitGlobs {
            // The configuration was validated when the policy was built; a glob that no
            // longer compiles is skipped rather than failing every call.
            anywhere: Arc::new(set_lenient(&any, Syntax::Config)),
            rooted: Arc::new(set_lenient(&rest, Syntax::Config)),
        }
    }
}

/// The configuration's coder globs, compiled once per policy.
#[derive(Clone, Debug)]
pub struct CoderGlobs {
    /// `code.non_accessible_globs`.
    pub non_accessible: SplitGlobs,
    /// `code.default_exclude_globs`.
    pub excludes: SplitGlobs,
}

impl CoderGlobs {
    pub fn new(code: &iii_shell_protocol::config::CodeConfig) -> CoderGlobs {
        CoderGlobs {
            non_accessible: SplitGlobs::new(&code.non_accessible_globs),
            excludes: SplitGlobs::new(&code.default_exclude_globs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_globs_cross_slashes_and_filter_globs_do_not() {
        let c = set(["src/*.rs"], Syntax::Config).unwrap();
        let f = set(["src/*.rs"], Syntax::Filter).unwrap();
        assert!(c.is_match("src/a.rs") && f.is_match("src/a.rs"));
        assert!(c.is_match("src/deep/a.rs"));
        assert!(!f.is_match("src/deep/a.rs"));
    }

    #[test]
    fn a_bad_glob_is_named_and_lenient_sets_skip_it() {
        let e = set(["ok", "a[", "b"], Syntax::Config).unwrap_err();
        assert!(
            matches!(&e, GlobError::Bad { glob, .. } if glob == "a["),
            "{e}"
        );
        assert!(e.to_string().starts_with("\"a[\": "), "{e}");
        let s = set_lenient(&["a[".into(), "*.pem".into()], Syntax::Config);
        assert_eq!(s.len(), 1);
        assert!(s.is_match("k.pem"));
    }

    #[test]
    fn a_caller_list_is_bounded_by_count_and_bytes() {
        let n = |count: usize, len: usize| vec!["x".repeat(len); count];
        assert_eq!(caller_list_problem(&n(MAX_CALLER_GLOBS, 1)), None);
        assert_eq!(
            caller_list_problem(&n(MAX_CALLER_GLOBS + 1, 1)).as_deref(),
            Some("1001 globs, at most 1000 are accepted; combine them (`*.{rs,toml}`) or search a narrower path")
        );
        assert_eq!(caller_list_problem(&n(64, 1024)), None);
        assert_eq!(
            caller_list_problem(&n(65, 1024)).as_deref(),
            Some("the globs take 66560 bytes, at most 65536 are accepted; combine them or search a narrower path")
        );
        let many = n(MAX_CALLER_GLOBS + 1, 1);
        assert!(matches!(
            NameOrPath::from_user(&many, |g| g),
            Err(GlobError::Limit(_))
        ));
    }

    #[test]
    fn name_globs_match_the_name_and_path_globs_the_whole_relative_path() {
        let g = NameOrPath::new(["*.rs", "docs/*.md"]).unwrap();
        assert!(!g.is_empty());
        assert!(g.is_match(Path::new("a/b/c.rs")));
        assert!(g.is_match(Path::new("docs/x.md")));
        assert!(!g.is_match(Path::new("a/docs/x.md")));
        assert!(!g.is_match(Path::new("docs/sub/x.md")));
        assert!(NameOrPath::new([]).unwrap().is_empty());
        // A caller's glob, trimmed before it is compiled, is named as they wrote it.
        let user = ["./ok".to_string(), "./a[".to_string()];
        let e = NameOrPath::from_user(&user, |g| g.trim_start_matches("./")).unwrap_err();
        assert!(
            matches!(&e, GlobError::Bad { glob, .. } if glob == "./a["),
            "{e}"
        );
        let g = NameOrPath::from_user(&user[..1], |g| g.trim_start_matches("./")).unwrap();
        assert!(g.is_match(Path::new("x/ok")));
        assert!(!NameOrPath::new([]).unwrap().is_match(Path::new("a")));
    }
}
