//! Landlock for commands, from the live jail: the glue between the executor's jail and the
//! shared plan and ruleset builder (`iii_shell_confine::landlock_plan` decides which path
//! gets which rights, `iii_shell_confine::landlock_ruleset` turns that into a ruleset fd).
//!
//! Here the executor supplies what only it knows: the protected entries its jail found
//! inside the roots ([`iii_shell_files::jail::Protected::in_roots`]: the `fs.denylist_paths` entries
//! inside a root and the entries that matched `code.non_accessible_globs` when the roots
//! were walked), the host's devices, and the gap of a protected-entry scan that stopped short.

use iii_shell_protocol::config::Config;

use iii_shell_files::jail::Protected;

pub use iii_shell_confine::landlock::kernel_abi;
pub use iii_shell_confine::landlock_plan::{Devices, Plan, DEVICE_FILES};
pub use iii_shell_confine::landlock_ruleset::{CommandRuleset, Enforcement};
use iii_shell_confine::{landlock_plan, landlock_ruleset};

/// The plan for `config` around `protected` and, when jailed, the executor's own state
/// (`iii_shell_files::state_place`: denied to commands wherever it is, so a system path above
/// it never reaches in; inside a root it is a protected entry already). Unjailed, commands
/// reach the host anyway and the state is not carved out: a carve-out would leave every
/// directory created later beside its path with directory rights only.
pub fn plan(config: &Config, protected: &Protected) -> Plan {
    let state = iii_shell_files::state_place::for_config(config);
    let jailed = !config.fs.host_roots.is_empty();
    let denied: Vec<std::path::PathBuf> = protected
        .in_roots
        .iter()
        .cloned()
        .chain(
            state
                .dirs()
                .iter()
                .filter(|_| jailed)
                .map(|d| d.to_path_buf()),
        )
        .collect();
    landlock_plan::plan(config, &denied, &Devices::host())
}

/// What the ruleset cannot cover because of `protected`: the entries a stopped scan missed.
pub fn protected_gaps(protected: &Protected) -> Vec<String> {
    if !protected.truncated {
        return Vec::new();
    }
    vec![format!(
        "the walk for protected entries in the roots stopped at {} entries: protected files past it are denied to the fs surface by name only, and not denied to commands",
        iii_shell_files::jail::SCAN_LIMIT
    )]
}

/// The gaps known before the walk for protected entries: Landlock switched off, or a kernel
/// that enforces less than the ruleset asks. (A walk that stops short adds its own,
/// [`protected_gaps`].) Strict mode refuses a policy on these when it is built.
pub fn known_gaps(config: &Config) -> Vec<String> {
    let c = &config.confinement;
    if !c.landlock {
        return vec!["confinement.landlock is false".into()];
    }
    landlock_ruleset::enforcement(kernel_abi(), c.network)
        .1
        .into_iter()
        .collect()
}

/// Builds the command ruleset for `config`. Paths that do not exist are skipped.
pub fn build(config: &Config, protected: &Protected) -> Result<CommandRuleset, String> {
    let c = &config.confinement;
    if !c.landlock {
        return Ok(landlock_ruleset::disabled(c.network));
    }
    let plan = plan(config, protected);
    landlock_ruleset::build(&plan.grants, c.network, protected_gaps(protected))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protected(in_roots: Vec<std::path::PathBuf>, truncated: bool) -> Protected {
        Protected {
            in_roots,
            truncated,
            ..Default::default()
        }
    }

    #[test]
    fn a_stopped_scan_is_a_gap_and_a_complete_one_is_not() {
        assert_eq!(
            protected_gaps(&protected(vec![], false)),
            Vec::<String>::new()
        );
        assert_eq!(
            protected_gaps(&protected(vec![], true)),
            vec!["the walk for protected entries in the roots stopped at 2000000 entries: protected files past it are denied to the fs surface by name only, and not denied to commands".to_string()]
        );
    }

    #[test]
    fn the_protected_entries_are_denied_to_commands() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join(".env"), "x").unwrap();
        std::fs::write(root.join("keep"), "x").unwrap();
        let mut c = Config::default();
        c.fs.host_roots = vec![root.to_string_lossy().into_owned()];
        c.fs.allow_unjailed = false;
        let p = plan(&c, &protected(vec![root.join(".env")], false));
        assert!(p.denied.contains(&root.join(".env")));
        let under: Vec<_> = p
            .grants
            .iter()
            .filter(|(g, _)| g.starts_with(&root))
            .collect();
        assert!(
            under.iter().all(|(g, _)| g != &root.join(".env")),
            "{under:?}"
        );
        assert!(under.contains(&&(root.join("keep"), landlock_plan::full())));
        assert!(under.contains(&&(root.clone(), landlock_plan::directory_only())));
    }

    #[test]
    fn the_gaps_known_before_the_walk_are_the_rulesets_own() {
        let mut c = Config::default();
        c.confinement.landlock = false;
        assert_eq!(
            known_gaps(&c),
            vec!["confinement.landlock is false".to_string()]
        );
        c.confinement.landlock = true;
        let built = build(&c, &protected(vec![], false)).unwrap();
        assert_eq!(known_gaps(&c), built.gaps);
    }

    #[test]
    fn landlock_off_builds_nothing_even_with_a_stopped_scan() {
        let mut c = Config::default();
        c.confinement.landlock = false;
        let r = build(&c, &protected(vec![], true)).unwrap();
        assert!(r.fd.is_none());
        assert_eq!(r.rules, 0);
        assert_eq!(r.gaps, vec!["confinement.landlock is false".to_string()]);
    }
}
