//! The command ruleset of a policy, made off the call path: the walk of the roots for
//! protected entries (`iii_shell_files::jail::Jail::scan_protected`, which grows with the tree)
//! and the Landlock ruleset that carves them out (`confine::landlock_rules`), on a thread of
//! their own. Only commands wait for it (`Policy::commands_ready`); fs calls check protection
//! where each path is resolved and use the record once it is there.

use std::sync::Arc;

use iii_shell_files::ready::Ready;
use iii_shell_files::FsPolicy;
use iii_shell_protocol::config::{Config, ConfinementConfig, ConfinementMode};

use crate::confine::landlock_rules;

/// The command ruleset, or why commands cannot run under this policy (strict mode and a walk
/// that stopped short, or a ruleset the kernel refused).
pub type Ruleset = Result<landlock_rules::CommandRuleset, String>;

/// What a new policy takes over from the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Nothing: it walks its roots and builds its ruleset.
    Nothing,
    /// The record of protected entries (the same roots, denylist and globs): it builds only
    /// its ruleset, once that record is there.
    Record,
    /// The ruleset too (and the confinement settings it is made from are the same).
    Ruleset,
}

/// What a policy with walk key `new` and confinement settings `new_confinement` takes over
/// from its predecessor: its key, its confinement settings, and whether its walk stopped
/// short (a record that stopped short is never taken over: a reload walks again).
pub fn reuse(
    previous: Option<(&iii_shell_files::ScanKey, &ConfinementConfig, bool)>,
    new: &iii_shell_files::ScanKey,
    new_confinement: &ConfinementConfig,
) -> Reuse {
    match previous {
        None => Reuse::Nothing,
        Some((key, _, stopped)) if key != new || stopped => Reuse::Nothing,
        Some((_, confinement, _)) if confinement == new_confinement => Reuse::Ruleset,
        Some(_) => Reuse::Record,
    }
}

/// The strict-mode refusal of `gaps`, if there are any and the mode is strict.
pub fn strict_refusal(config: &Config, gaps: &[String]) -> Option<String> {
    (config.confinement.mode == ConfinementMode::Strict && !gaps.is_empty()).then(|| {
        format!(
            "strict confinement cannot be met for commands: {}",
            gaps.join("; ")
        )
    })
}

/// Off the call path: walks `fs`'s roots for protected entries (unless the record is shared
/// with an earlier policy, whose walk is done or under way), waits for the record, and builds
/// the command ruleset from it. On a thread of its own, or here when that work is small (no
/// roots, or the record already made) or no thread can be had.
pub fn walk_then_finish(
    fs: Arc<FsPolicy>,
    ruleset: Arc<Ready<Ruleset>>,
    gaps: Vec<String>,
    walk: bool,
) {
    // Unjailed, the walk is the denylisted paths alone, and a shared record that is there
    // leaves only the ruleset: both are done here. A thread of its own would also turn the
    // executor multi-threaded for good, which costs every later call (glibc's malloc takes
    // its locks from then on).
    if (walk && !fs.jail.is_jailed()) || fs.jail.protected().is_some() {
        walk_and_finish(&fs, &ruleset, &gaps, walk);
        return;
    }
    let (f, r, g) = (fs.clone(), ruleset.clone(), gaps.clone());
    let spawned = std::thread::Builder::new()
        .name("iii-shell-walk".into())
        .spawn(move || walk_and_finish(&f, &r, &g, walk));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no thread for the protected-entry walk: walking on the call path");
        walk_and_finish(&fs, &ruleset, &gaps, walk);
    }
}

fn walk_and_finish(fs: &Arc<FsPolicy>, ruleset: &Ready<Ruleset>, gaps: &[String], walk: bool) {
    if walk {
        let t = std::time::Instant::now();
        // Given up once nobody else holds the policy or its record (replaced, and its last
        // call done): no one would read it.
        let unwanted =
            || Arc::strong_count(fs) == 1 && Arc::strong_count(fs.jail.protected_cell()) == 1;
        // A walk that panicked must still fill the record, or every command would wait on
        // it forever: it counts as one that stopped short.
        let protected = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fs.jail.scan_protected_until(&unwanted)
        }))
        .unwrap_or_else(|_| {
            tracing::error!("the walk for protected entries failed; commands get no carve-out (strict mode refuses them): report this with the executor's log");
            iii_shell_files::jail::Protected {
                truncated: true,
                ..Default::default()
            }
        });
        tracing::info!(
            walked = protected.walked,
            protected = protected.in_roots.len(),
            ids = protected.ids.len(),
            truncated = protected.truncated,
            ms = t.elapsed().as_millis() as u64,
            "walked the roots for protected entries"
        );
        fs.jail.set_protected(Arc::new(protected));
    }
    let protected = fs.jail.protected_cell().wait_blocking().clone();
    // A ruleset build that panicked must still answer the commands waiting for it.
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        finish(&fs.config, &protected, gaps)
    }))
    .unwrap_or_else(|_| {
        Err("building the command ruleset failed (a panic): report this with the executor's log, and restart the worker".into())
    });
    ruleset.set(built);
}

/// The command ruleset around `protected`, with the policy's other `gaps` after its own. A
/// walk that stopped short is a gap, which strict mode refuses: commands then fail with it.
pub fn finish(
    config: &Config,
    protected: &iii_shell_files::jail::Protected,
    gaps: &[String],
) -> Ruleset {
    let built = landlock_rules::build(config, protected).and_then(|mut r| {
        r.gaps.extend(gaps.iter().cloned());
        match strict_refusal(config, &landlock_rules::protected_gaps(protected)) {
            Some(refusal) => Err(refusal),
            None => Ok(r),
        }
    });
    if let Err(e) = &built {
        tracing::error!(
            error = %e,
            "commands cannot run under this policy; fix the configuration (or the kernel feature it names) and reload"
        );
    }
    built
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use iii_shell_files::jail::Protected;

    fn jailed(root: &std::path::Path) -> Config {
        let mut c = Config::builtin_default();
        c.fs.host_roots = vec![root.to_string_lossy().into_owned()];
        c.fs.allow_unjailed = false;
        c
    }

    #[test]
    fn a_walk_that_stopped_short_refuses_commands_in_strict_mode_only() {
        let mut c = Config::builtin_default();
        let stopped = Protected {
            truncated: true,
            ..Default::default()
        };
        let r = finish(&c, &stopped, &["seccomp gap".into()]).expect("best effort");
        assert_eq!(r.gaps[0], landlock_rules::protected_gaps(&stopped)[0]);
        assert_eq!(r.gaps.last().map(String::as_str), Some("seccomp gap"));
        c.confinement.mode = ConfinementMode::Strict;
        assert_eq!(
            finish(&c, &stopped, &[]).unwrap_err(),
            "strict confinement cannot be met for commands: the walk for protected entries in the roots stopped at 2000000 entries: protected files past it are denied to the fs surface by name only, and not denied to commands"
        );
        assert!(finish(&c, &Protected::default(), &[]).is_ok());
    }

    #[test]
    fn a_policy_takes_over_the_record_with_the_same_key_and_the_ruleset_with_the_same_confinement()
    {
        let key = |root: &str| iii_shell_files::ScanKey {
            roots: vec![root.into()],
            denylist_paths: vec![],
            denylisted: vec![],
            non_accessible_globs: vec!["**/.env".into()],
        };
        let c = ConfinementConfig::default();
        let network = ConfinementConfig {
            network: iii_shell_protocol::config::NetworkAccess::Deny,
            ..Default::default()
        };
        let (a, b) = (key("/a"), key("/b"));
        assert_eq!(reuse(None, &a, &c), Reuse::Nothing);
        assert_eq!(reuse(Some((&a, &c, false)), &b, &c), Reuse::Nothing);
        assert_eq!(reuse(Some((&a, &network, false)), &b, &c), Reuse::Nothing);
        assert_eq!(reuse(Some((&a, &network, false)), &a, &c), Reuse::Record);
        assert_eq!(reuse(Some((&a, &c, false)), &a, &c), Reuse::Ruleset);
        // A walk that stopped short is walked again.
        assert_eq!(reuse(Some((&a, &c, true)), &a, &c), Reuse::Nothing);
        // A denylisted path that appeared since changes the key.
        let mut appeared = a.clone();
        appeared.denylisted = vec![("/a/k".into(), Some((1, 2)))];
        let mut missing = a.clone();
        missing.denylisted = vec![("/a/k".into(), None)];
        assert_eq!(
            reuse(Some((&missing, &c, false)), &appeared, &c),
            Reuse::Nothing
        );
    }

    #[test]
    fn strict_refuses_any_gap_and_best_effort_none() {
        let mut c = Config::builtin_default();
        assert_eq!(strict_refusal(&c, &["a".into(), "b".into()]), None);
        c.confinement.mode = ConfinementMode::Strict;
        assert_eq!(strict_refusal(&c, &[]), None);
        assert_eq!(
            strict_refusal(&c, &["a".into(), "b".into()]).as_deref(),
            Some("strict confinement cannot be met for commands: a; b")
        );
    }

    /// The build walks nothing: the fs side resolves at once, the record and the ruleset come
    /// once the walk is started, and the ruleset carves the protected entry out.
    #[tokio::test]
    async fn the_walk_runs_after_the_build_and_only_commands_wait_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/.env"), "E").unwrap();
        std::fs::write(root.join("sub/ok"), "O").unwrap();
        let json = serde_json::to_string(&jailed(&root)).unwrap();
        let p = Policy::build(1, &json).unwrap();
        assert!(p.jail.protected().is_none());
        assert!(p.commands.landlock.get().is_none());
        assert!(p.commands.child().is_err());
        assert_eq!(p.jail.resolve("sub/ok").unwrap().path, root.join("sub/ok"));
        assert!(p.jail.resolve("sub/.env").is_err());
        p.commands_ready().await.unwrap();
        let rec = p.jail.protected().expect("record");
        assert_eq!(rec.in_roots, vec![root.join("sub/.env")]);
        assert!(p.commands.child().is_ok());
        let plan = landlock_rules::plan(&p.config, rec);
        assert!(plan.denied.contains(&root.join("sub/.env")));
    }

    /// A reload that walks the same roots the same way shares the record (done or under
    /// way); one that changes the roots, the denylist or the globs walks again.
    #[tokio::test]
    async fn a_reload_shares_the_walk_only_when_its_key_is_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join(".env"), "E").unwrap();
        let mut c = jailed(&root);
        let first = Policy::build(1, &serde_json::to_string(&c).unwrap()).unwrap();
        c.max_timeout_ms += 1;
        let same =
            Policy::build_after(2, &serde_json::to_string(&c).unwrap(), Some(&first)).unwrap();
        assert!(Arc::ptr_eq(
            first.jail.protected_cell(),
            same.jail.protected_cell()
        ));
        // The confinement settings are the same too: so is the ruleset.
        assert!(Arc::ptr_eq(
            &first.commands.landlock,
            &same.commands.landlock
        ));
        // Another network rule: the record is shared, the ruleset is its own.
        let mut net = c.clone();
        net.confinement.network = iii_shell_protocol::config::NetworkAccess::DenyBind;
        let own =
            Policy::build_after(2, &serde_json::to_string(&net).unwrap(), Some(&first)).unwrap();
        assert!(Arc::ptr_eq(
            first.jail.protected_cell(),
            own.jail.protected_cell()
        ));
        assert!(!Arc::ptr_eq(
            &first.commands.landlock,
            &own.commands.landlock
        ));
        own.commands_ready().await.unwrap();
        assert_eq!(
            own.commands.ruleset().unwrap().network,
            iii_shell_protocol::config::NetworkAccess::DenyBind
        );
        // The shared walk is the first policy's: started by either, it serves both.
        same.commands_ready().await.unwrap();
        first.commands_ready().await.unwrap();
        assert!(Arc::ptr_eq(
            first.jail.protected().unwrap(),
            same.jail.protected().unwrap()
        ));
        // A denylisted path that appears after a walk: the next reload walks again.
        let mut d = c.clone();
        d.fs.denylist_paths
            .push(root.join("later").display().to_string());
        let before =
            Policy::build_after(2, &serde_json::to_string(&d).unwrap(), Some(&first)).unwrap();
        before.commands_ready().await.unwrap();
        std::fs::write(root.join("later"), "L").unwrap();
        let after =
            Policy::build_after(2, &serde_json::to_string(&d).unwrap(), Some(&before)).unwrap();
        assert!(!Arc::ptr_eq(
            before.jail.protected_cell(),
            after.jail.protected_cell()
        ));
        after.commands_ready().await.unwrap();
        assert!(after
            .jail
            .protected()
            .unwrap()
            .in_roots
            .contains(&root.join("later")));
        c.code.non_accessible_globs.push("**/*.key".into());
        let other =
            Policy::build_after(3, &serde_json::to_string(&c).unwrap(), Some(&same)).unwrap();
        assert!(!Arc::ptr_eq(
            same.jail.protected_cell(),
            other.jail.protected_cell()
        ));
        assert!(other.jail.protected().is_none());
        other.commands_ready().await.unwrap();
        assert_eq!(
            other.jail.protected().unwrap().in_roots,
            vec![root.join(".env")]
        );
    }

    /// A directory the walk cannot list is protected whole: a caller could have made it
    /// unreadable for the walk only, and readable again after.
    #[tokio::test]
    async fn a_directory_the_walk_cannot_list_is_denied_to_commands() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        for d in ["shut", "open"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
            std::fs::write(root.join(d).join(".env"), "E").unwrap();
        }
        std::fs::set_permissions(root.join("shut"), std::fs::Permissions::from_mode(0o0)).unwrap();
        // Root reads a mode-0 directory through these; the walk's thread inherits this
        // thread's sets, so they go from this thread for the walk and come back after.
        let dac = [
            caps::Capability::CAP_DAC_OVERRIDE,
            caps::Capability::CAP_DAC_READ_SEARCH,
        ];
        let held: Vec<_> = dac
            .into_iter()
            .filter(|c| caps::has_cap(None, caps::CapSet::Effective, *c).unwrap_or(false))
            .collect();
        for c in &held {
            caps::drop(None, caps::CapSet::Effective, *c).unwrap();
        }
        let p = Policy::build(1, &serde_json::to_string(&jailed(&root)).unwrap()).unwrap();
        p.start_walk();
        let ready = p.commands_ready().await;
        for c in &held {
            caps::raise(None, caps::CapSet::Effective, *c).unwrap();
        }
        std::fs::set_permissions(root.join("shut"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        ready.unwrap();
        let mut in_roots = p.jail.protected().unwrap().in_roots.clone();
        in_roots.sort();
        assert_eq!(in_roots, vec![root.join("open/.env"), root.join("shut")]);
        let plan = landlock_rules::plan(&p.config, p.jail.protected().unwrap());
        assert!(plan.denied.contains(&root.join("shut")), "{plan:?}");
    }
}
