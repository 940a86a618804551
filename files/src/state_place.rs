//! Where the executor keeps its own state (the turn store, the console's pane store), out
//! of every command's reach.
//!
//! The configured place is `turns.data_dir` (default `data/shell/turns`, resolved against the
//! start-up directory) and the pane store `ui-state/` beside it. The executor keeps its state
//! there unless commands could write it: when jailed and that place lies at or under a root or
//! a scratch path (the default does when the worker starts in its primary root), a command
//! could plant links there, delete the history or read what it keeps, and Landlock cannot
//! carve a directory out of a tree it grants (the directories above it keep their directory
//! rights, which reach everything beneath). So the state moves to a per-worker directory
//! `<base>/<16 hex>/{turns,ui-state}` under the first of these bases that lies outside every
//! root and scratch path ([`bases`]):
//! 1. `$STATE_DIRECTORY` (systemd's `StateDirectory=`),
//! 2. `$XDG_STATE_HOME/iii-shell`,
//! 3. `$HOME/.local/state/iii-shell`.
//!
//! The 16 hex digits hash the worker's identity (`crate::home::identity`: namespace, name and
//! the configured `turns.data_dir`), so two workers never share a store. A store already at the
//! configured place is moved there once, the first time ([`Place::legacy`]). When no base
//! qualifies, the state stays where it is configured ([`Place::exposed`]: denied to commands
//! and to fs calls by name, with the directory rights above it still reaching in), and the
//! executor says so.
//!
//! Unjailed, commands may reach the whole host anyway: the configured place is kept, denied to
//! the fs surface like `fs.denylist_paths` (not to commands: a Landlock carve-out there would
//! leave every directory made later beside its path with directory rights only).

use std::path::{Component, Path, PathBuf};

use iii_shell_protocol::config::Config;

/// Where the state lives for one policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The turn store's directory.
    pub turns: PathBuf,
    /// The pane store's directory.
    pub ui_state: PathBuf,
    /// The configured place, when the state moved away from it (what to adopt once).
    pub legacy: Option<Legacy>,
    /// True when the state stays inside a root or scratch path (no base qualified).
    pub exposed: bool,
}

/// The configured place a store is moved from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Legacy {
    pub turns: PathBuf,
    pub ui_state: PathBuf,
}

impl Place {
    /// Both directories (what commands and fs calls are denied).
    pub fn dirs(&self) -> [&Path; 2] {
        [&self.turns, &self.ui_state]
    }
}

/// The pane store beside a turn store directory.
pub fn ui_state_beside(turns: &Path) -> PathBuf {
    match turns.parent() {
        Some(parent) => parent.join("ui-state"),
        None => turns.join("ui-state"),
    }
}

/// True when `p` lies at or under one of `dirs` (whole components; both canonical).
fn within(p: &Path, dirs: &[PathBuf]) -> bool {
    dirs.iter().any(|d| p.starts_with(d))
}

/// The decision (a pure function; exact-value tests below). `configured` is the resolved
/// `turns.data_dir`; `writable` the canonical roots and scratch paths (jailed only; empty
/// unjailed); `bases` the candidate bases in order; `worker` the per-worker directory name.
pub fn decide(configured: &Path, writable: &[PathBuf], bases: &[PathBuf], worker: &str) -> Place {
    let ui = ui_state_beside(configured);
    let in_place = |exposed| Place {
        turns: configured.to_path_buf(),
        ui_state: ui.clone(),
        legacy: None,
        exposed,
    };
    if !within(configured, writable) && !within(&ui, writable) {
        return in_place(false);
    }
    let usable = |b: &&PathBuf| {
        b.is_absolute()
            && !b.components().any(|c| c == Component::ParentDir)
            && !within(b, writable)
            && !writable.iter().any(|w| w.starts_with(b))
    };
    match bases.iter().find(usable) {
        Some(base) => {
            let dir = base.join(worker);
            Place {
                turns: dir.join("turns"),
                ui_state: dir.join("ui-state"),
                legacy: Some(Legacy {
                    turns: configured.to_path_buf(),
                    ui_state: ui,
                }),
                exposed: false,
            }
        }
        None => in_place(true),
    }
}

/// The candidate bases, in order, from the executor's environment (blank or relative values
/// are skipped).
pub fn bases(env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let abs = |k: &str| {
        env(k)
            .filter(|v| v.starts_with('/'))
            .map(|v| PathBuf::from(v.split(':').next().unwrap_or(&v)))
    };
    let mut out = Vec::new();
    out.extend(abs("STATE_DIRECTORY"));
    out.extend(abs("XDG_STATE_HOME").map(|d| d.join("iii-shell")));
    out.extend(abs("HOME").map(|d| d.join(".local/state/iii-shell")));
    out
}

/// `p` with its longest existing prefix canonicalized (symlinks resolved) and the rest kept.
pub fn canonical_prefix(p: &Path) -> PathBuf {
    let p = crate::jail::normalize(p);
    let mut rest = Vec::new();
    let mut cur = p.as_path();
    loop {
        if let Ok(c) = std::fs::canonicalize(cur) {
            let mut out = c;
            for r in rest.iter().rev() {
                out.push(r);
            }
            return out;
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                cur = parent;
            }
            _ => return p,
        }
    }
}

/// The place for `config` in this process (its environment and the host's tree).
pub fn for_config(config: &Config) -> Place {
    let writable: Vec<PathBuf> = if config.fs.host_roots.is_empty() {
        Vec::new()
    } else {
        config
            .fs
            .host_roots
            .iter()
            .chain(&config.confinement.scratch_paths)
            .map(|r| canonical_prefix(Path::new(r)))
            .collect()
    };
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let bases: Vec<PathBuf> = bases(&env).iter().map(|b| canonical_prefix(b)).collect();
    let worker = format!(
        "{:016x}",
        iii_shell_policy::home::fnv1a64(crate::home::identity(config).as_bytes())
    );
    decide(
        &canonical_prefix(Path::new(&config.turns.data_dir)),
        &writable,
        &bases,
        &worker,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn the_place_exact_values() {
        let w = [p("/srv/w"), p("/tmp")];
        let bases = [
            p("/var/lib/iii-shell-state"),
            p("/root/.local/state/iii-shell"),
        ];
        // Outside every root: in place, the pane store beside it.
        assert_eq!(
            decide(&p("/var/lib/iii-shell/data/shell/turns"), &w, &bases, "ab"),
            Place {
                turns: p("/var/lib/iii-shell/data/shell/turns"),
                ui_state: p("/var/lib/iii-shell/data/shell/ui-state"),
                legacy: None,
                exposed: false,
            }
        );
        // Inside the primary root: moved to the first base, the configured place adopted.
        assert_eq!(
            decide(&p("/srv/w/data/shell/turns"), &w, &bases, "ab"),
            Place {
                turns: p("/var/lib/iii-shell-state/ab/turns"),
                ui_state: p("/var/lib/iii-shell-state/ab/ui-state"),
                legacy: Some(Legacy {
                    turns: p("/srv/w/data/shell/turns"),
                    ui_state: p("/srv/w/data/shell/ui-state"),
                }),
                exposed: false,
            }
        );
        // The pane store alone inside a root (turns is the root's sibling dir) moves too.
        assert!(
            decide(&p("/srv/turns"), &[p("/srv/ui-state")], &bases, "ab")
                .legacy
                .is_some()
        );
        // A base inside a root or scratch path, or holding one, is skipped.
        let inside = [p("/tmp/state"), p("/srv"), p("/opt/s")];
        assert_eq!(
            decide(&p("/srv/w/t"), &w, &inside, "ab").turns,
            p("/opt/s/ab/turns")
        );
        // No base qualifies: in place, exposed.
        let none = decide(&p("/srv/w/t"), &w, &[p("/srv/w/x"), p("rel")], "ab");
        assert_eq!((none.turns, none.exposed), (p("/srv/w/t"), true));
        // Unjailed (nothing writable listed): in place.
        assert_eq!(decide(&p("/srv/w/t"), &[], &bases, "ab").legacy, None);
        // Whole components: /srv/wx is not in /srv/w.
        assert_eq!(decide(&p("/srv/wx/t"), &w, &bases, "ab").legacy, None);
    }

    #[test]
    fn the_bases_from_the_environment() {
        let env = |k: &str| match k {
            "STATE_DIRECTORY" => Some("/var/lib/iii-shell:/var/lib/other".to_string()),
            "XDG_STATE_HOME" => Some("relative".to_string()),
            "HOME" => Some("/home/u".to_string()),
            _ => None,
        };
        assert_eq!(
            bases(&env),
            [p("/var/lib/iii-shell"), p("/home/u/.local/state/iii-shell")]
        );
        assert_eq!(bases(&|_| None), Vec::<PathBuf>::new());
    }
}
