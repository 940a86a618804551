//! Everything of iii-shell that touches the host filesystem beneath the jail.
//!
//! * [`jail`]: the roots as descriptors, every path resolved with `openat2` beneath one, the
//!   denylist and the protected entries.
//! * [`fs`]: the `shell::fs::*` operations, walks, atomic writes ([`fs::atomic`]) and what a
//!   replaced file keeps, the grep and sed engines, staged batches and streamed transfers.
//! * [`coder`]: the `coder::*` operations. Writers take [`coder::EditLocks`] and report their
//!   changes to a [`coder::ChangeRecorder`] (the executor's turn store is one).
//! * [`home`]: the `HOME` commands get, and the per-worker default directory.
//! * [`state_place`]: where the executor keeps its own state, out of every command's reach.
//!
//! Its callers (the executor) hand it an [`FsPolicy`]: the configuration and the jail built
//! from it. It never runs a program, and knows nothing of turns.

pub mod coder;
pub mod error;
pub mod fs;
pub mod globs;
pub mod home;
pub mod ignore_files;
pub mod jail;
pub mod ready;
pub mod state_place;

use iii_shell_protocol::config::Config;

/// The filesystem half of a policy: the configuration document and the jail compiled from
/// it. The executor's policy holds one (and derefs to it).
#[derive(Debug)]
pub struct FsPolicy {
    pub config: Config,
    pub jail: jail::Jail,
    /// The configuration's coder globs, compiled once here rather than on every coder call.
    pub coder_globs: globs::CoderGlobs,
    /// The key of this policy's walk, taken when it was built ([`FsPolicy::scan_key`]).
    scan_key: ScanKey,
    /// Where the executor keeps its own state ([`state_place`]): denied to the fs surface
    /// like `fs.denylist_paths`.
    pub state: state_place::Place,
}

/// What the walk for protected entries depends on: the canonical roots, the denylist (and
/// what each of its entries is now: a denylisted path that appeared, or now names another
/// inode, changes the key) and the globs. Two policies with the same key find the same
/// entries in the same tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanKey {
    pub roots: Vec<std::path::PathBuf>,
    pub denylist_paths: Vec<String>,
    pub denylisted: Vec<(std::path::PathBuf, Option<(u64, u64)>)>,
    pub non_accessible_globs: Vec<String>,
}

impl FsPolicy {
    /// Opens the configuration's roots (`jail::Jail::new`). It does not walk them: the record
    /// of protected entries (`jail::Jail::scan_protected`) is the caller's to make, off the
    /// call path, and to install with `jail::Jail::set_protected`.
    pub fn build(config: Config) -> Result<FsPolicy, String> {
        let state = state_place::for_config(&config);
        // The executor's own state reads like a missing path to every fs and coder call.
        let denylist: Vec<String> = config
            .fs
            .denylist_paths
            .iter()
            .cloned()
            .chain(
                state
                    .dirs()
                    .iter()
                    .map(|d| d.to_string_lossy().into_owned()),
            )
            .collect();
        let jail = jail::Jail::new(
            &config.fs.host_roots,
            &denylist,
            &config.code.non_accessible_globs,
        )?;
        let coder_globs = globs::CoderGlobs::new(&config.code);
        let scan_key = ScanKey {
            roots: jail.roots().iter().map(|r| r.path.clone()).collect(),
            denylist_paths: denylist,
            denylisted: jail.denylisted_now(),
            non_accessible_globs: config.code.non_accessible_globs.clone(),
        };
        Ok(FsPolicy {
            config,
            jail,
            coder_globs,
            scan_key,
            state,
        })
    }

    /// This policy for a call scoped to `fs_scope.scope_root` ([`jail::Jail::scoped`]):
    /// the same configuration and protection, every path confined to the scope.
    pub fn scoped(&self, scope_root: &str) -> Result<FsPolicy, error::ExecError> {
        Ok(FsPolicy {
            config: self.config.clone(),
            jail: self.jail.scoped(scope_root)?,
            coder_globs: self.coder_globs.clone(),
            scan_key: self.scan_key.clone(),
            state: self.state.clone(),
        })
    }

    /// The key of this policy's walk for protected entries, as it was when the policy was
    /// built (so a denylisted path that appeared since makes a newer policy's key differ).
    pub fn scan_key(&self) -> &ScanKey {
        &self.scan_key
    }
}
