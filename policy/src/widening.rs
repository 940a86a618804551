//! The one decision "does this configuration grant more than that one".
//!
//! [`widening`] compares a new configuration with a base: the previous one on a reload (the
//! broker and the executor each log what it returns) or the pinned envelope (the executor
//! refuses a policy for which it returns anything). Every key that grants something is
//! covered: the jail and the fs surface, the denylists, the environment, the sandbox,
//! `confinement.*` (Landlock, seccomp, capabilities, `seccomp_allow`, paths, network, the
//! user commands run as, rlimits, job limits) and the resource caps (timeouts, output,
//! jobs, terminal sessions, watchers, the turn store).

use std::fmt;
use std::path::Path;

use crate::config::{Config, ConfinementMode, NetworkAccess, RunAs};

/// One thing the new configuration grants that the base did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Widening {
    /// The base is jailed and the new configuration has no root.
    Unjailed,
    /// A switch that grants something is on in the new configuration and off in the base.
    Enabled(&'static str),
    /// A confinement layer is off in the new configuration and on in the base.
    Disabled(&'static str),
    /// `confinement.mode` is `best_effort` where the base is `strict`.
    NotStrict,
    /// The base lists `value` under `key` (a denial) and the new configuration does not.
    Lost(&'static str, String),
    /// The new configuration lists `value` under `key` (a grant) and the base does not (for
    /// paths: the path is not inside any of the base's).
    Gained(&'static str, String),
    /// `confinement.run_as` differs.
    RunAs {
        base: Option<String>,
        new: Option<String>,
    },
    /// `confinement.network` allows more.
    Network {
        base: NetworkAccess,
        new: NetworkAccess,
    },
    /// A limit is higher, or gone (`None`: no limit).
    Raised {
        key: &'static str,
        base: Option<u64>,
        new: Option<u64>,
    },
}

impl fmt::Display for Widening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = |v: &Option<u64>| v.map_or("unlimited".to_string(), |n| n.to_string());
        match self {
            Widening::Unjailed => write!(f, "fs.host_roots is empty: the filesystem is unjailed"),
            Widening::Enabled(key) => write!(f, "{key} enabled"),
            Widening::Disabled(key) => write!(f, "{key} disabled"),
            Widening::NotStrict => write!(f, "confinement.mode is best_effort, not strict"),
            Widening::Lost(key, v) => write!(f, "{key} lost {v}"),
            Widening::Gained(key, v) => write!(f, "{key} gained {v}"),
            Widening::RunAs { base, new } => {
                write!(f, "confinement.run_as is {new:?}, not {base:?}")
            }
            Widening::Network { base, new } => {
                write!(f, "confinement.network is {new:?}, wider than {base:?}")
            }
            Widening::Raised { key, base, new } => {
                write!(f, "{key} raised from {} to {}", limit(base), limit(new))
            }
        }
    }
}

/// Everything `new` grants beyond `base`, in a fixed order (empty: `new` grants nothing
/// more). Pure: paths are compared lexically, as configured.
pub fn widening(base: &Config, new: &Config) -> Vec<Widening> {
    // Every key, classed (no `..`: a new key of Config does not compile until it is).
    let Config {
        // Compared below: each can grant more.
        max_timeout_ms: _,
        max_bg_timeout_ms: _,
        max_output_bytes: _,
        env: _,
        denylist_patterns: _,
        max_concurrent_jobs: _,
        fs: _,
        code: _,
        watch: _,
        sandbox: _,
        confinement: _,
        pty: _,
        jobs: _,
        job_retention_secs: _,
        turns: _,
        // Not widening: a default within the caps above, where a command starts (inside the
        // jail either way), what the worker reports about itself.
        default_timeout_ms: _,
        working_dir: _,
        telemetry: _,
    } = new;
    let mut w = Vec::new();
    let (b, n) = (base, new);
    let inside = |p: &str, roots: &[String]| roots.iter().any(|r| Path::new(p).starts_with(r));

    // The jail.
    if !b.fs.host_roots.is_empty() {
        if n.fs.host_roots.is_empty() {
            w.push(Widening::Unjailed);
        }
        for r in &n.fs.host_roots {
            if !inside(r, &b.fs.host_roots) {
                w.push(Widening::Gained("fs.host_roots", r.clone()));
            }
        }
    }

    // Switches that grant when on.
    for (key, new_on, base_on) in [
        (
            "fs.allow_unjailed",
            n.fs.allow_unjailed,
            b.fs.allow_unjailed,
        ),
        (
            "fs.allow_special_bits",
            n.fs.allow_special_bits,
            b.fs.allow_special_bits,
        ),
        ("env.inherit", n.env.inherit, b.env.inherit),
        ("sandbox.enabled", n.sandbox.enabled, b.sandbox.enabled),
        (
            "pty.adopt",
            adopt_reach(n.pty.adopt) > adopt_reach(b.pty.adopt),
            false,
        ),
    ] {
        if new_on && !base_on {
            w.push(Widening::Enabled(key));
        }
    }
    // Layers that confine when on.
    for (key, new_on, base_on) in [
        (
            "confinement.landlock",
            n.confinement.landlock,
            b.confinement.landlock,
        ),
        (
            "confinement.seccomp",
            n.confinement.seccomp,
            b.confinement.seccomp,
        ),
    ] {
        if base_on && !new_on {
            w.push(Widening::Disabled(key));
        }
    }
    if b.confinement.mode == ConfinementMode::Strict
        && n.confinement.mode != ConfinementMode::Strict
    {
        w.push(Widening::NotStrict);
    }

    // Denials that must stay.
    for (key, new_list, base_list) in [
        (
            "fs.denylist_paths",
            &n.fs.denylist_paths,
            &b.fs.denylist_paths,
        ),
        (
            "confinement.secret_paths",
            &n.confinement.secret_paths,
            &b.confinement.secret_paths,
        ),
        (
            "denylist_patterns",
            &n.denylist_patterns,
            &b.denylist_patterns,
        ),
        (
            "code.non_accessible_globs",
            &n.code.non_accessible_globs,
            &b.code.non_accessible_globs,
        ),
    ] {
        for x in base_list {
            if !new_list.contains(x) {
                w.push(Widening::Lost(key, x.clone()));
            }
        }
    }

    // Grants that must not grow.
    for (key, new_list, base_list) in [
        ("env.allow", &n.env.allow, &b.env.allow),
        (
            "confinement.capabilities",
            &n.confinement.capabilities,
            &b.confinement.capabilities,
        ),
        (
            "confinement.seccomp_allow",
            &n.confinement.seccomp_allow,
            &b.confinement.seccomp_allow,
        ),
    ] {
        for x in new_list {
            if !base_list.contains(x) {
                w.push(Widening::Gained(key, x.clone()));
            }
        }
    }
    for (key, new_paths, base_paths) in [
        (
            "confinement.scratch_paths",
            &n.confinement.scratch_paths,
            &b.confinement.scratch_paths,
        ),
        (
            "confinement.system_paths",
            &n.confinement.system_paths,
            &b.confinement.system_paths,
        ),
    ] {
        for p in new_paths {
            if !inside(p, base_paths) {
                w.push(Widening::Gained(key, p.clone()));
            }
        }
    }
    // Another command user, unless both are root (an unset `run_as` is root when unjailed).
    if n.confinement.run_as != b.confinement.run_as && !(acts_as_root(b) && acts_as_root(n)) {
        w.push(Widening::RunAs {
            base: b.confinement.run_as.clone(),
            new: n.confinement.run_as.clone(),
        });
    }
    if crate::network::wider(n.confinement.network, b.confinement.network) {
        w.push(Widening::Network {
            base: b.confinement.network,
            new: n.confinement.network,
        });
    }

    // Limits. `None` is no limit: for the caps where 0 means unlimited it is mapped first;
    // an rlimit left unset keeps the executor's own (no added limit).
    let zero_unlimited = |v: u64| (v != 0).then_some(v);
    let r = (&n.confinement.rlimits, &b.confinement.rlimits);
    let j = (&n.confinement.job_limits, &b.confinement.job_limits);
    let limits: [(&'static str, Option<u64>, Option<u64>); 24] = [
        (
            "fs.max_read_bytes",
            zero_unlimited(n.fs.max_read_bytes),
            zero_unlimited(b.fs.max_read_bytes),
        ),
        (
            "fs.max_write_bytes",
            zero_unlimited(n.fs.max_write_bytes),
            zero_unlimited(b.fs.max_write_bytes),
        ),
        (
            "max_bg_timeout_ms",
            zero_unlimited(n.max_bg_timeout_ms),
            zero_unlimited(b.max_bg_timeout_ms),
        ),
        (
            "max_timeout_ms",
            Some(n.max_timeout_ms),
            Some(b.max_timeout_ms),
        ),
        (
            "max_output_bytes",
            Some(n.max_output_bytes),
            Some(b.max_output_bytes),
        ),
        (
            "max_concurrent_jobs",
            Some(n.max_concurrent_jobs.into()),
            Some(b.max_concurrent_jobs.into()),
        ),
        (
            "pty.max_sessions",
            Some(n.pty.max_sessions.into()),
            Some(b.pty.max_sessions.into()),
        ),
        (
            "pty.max_sessions_per_caller",
            Some(n.pty.max_sessions_per_caller.into()),
            Some(b.pty.max_sessions_per_caller.into()),
        ),
        (
            "jobs.max_write_bytes",
            Some(n.jobs.max_write_bytes),
            Some(b.jobs.max_write_bytes),
        ),
        (
            "jobs.output_buffer_bytes",
            Some(n.jobs.output_buffer_bytes),
            Some(b.jobs.output_buffer_bytes),
        ),
        (
            "jobs.max_waiters",
            Some(n.jobs.max_waiters.into()),
            Some(b.jobs.max_waiters.into()),
        ),
        (
            "watch.max_watchers",
            Some(n.watch.max_watchers.into()),
            Some(b.watch.max_watchers.into()),
        ),
        (
            "watch.max_pending_paths",
            Some(n.watch.max_pending_paths.into()),
            Some(b.watch.max_pending_paths.into()),
        ),
        (
            "turns.max_blob_bytes",
            Some(n.turns.max_blob_bytes),
            Some(b.turns.max_blob_bytes),
        ),
        (
            "confinement.rlimits.max_processes",
            r.0.max_processes,
            r.1.max_processes,
        ),
        (
            "confinement.rlimits.address_space_bytes",
            r.0.address_space_bytes,
            r.1.address_space_bytes,
        ),
        (
            "confinement.rlimits.file_size_bytes",
            r.0.file_size_bytes,
            r.1.file_size_bytes,
        ),
        (
            "confinement.rlimits.open_files",
            r.0.open_files,
            r.1.open_files,
        ),
        (
            "confinement.rlimits.cpu_seconds",
            r.0.cpu_seconds,
            r.1.cpu_seconds,
        ),
        (
            "confinement.job_limits.pids_max",
            j.0.pids_max,
            j.1.pids_max,
        ),
        (
            "confinement.job_limits.memory_max_bytes",
            j.0.memory_max_bytes,
            j.1.memory_max_bytes,
        ),
        (
            "confinement.job_limits.cpu_max_percent",
            j.0.cpu_max_percent.map(u64::from),
            j.1.cpu_max_percent.map(u64::from),
        ),
        (
            "pty.detached_retention_secs",
            Some(n.pty.detached_retention_secs),
            Some(b.pty.detached_retention_secs),
        ),
        (
            "job_retention_secs",
            Some(n.job_retention_secs),
            Some(b.job_retention_secs),
        ),
    ];
    for (key, new_limit, base_limit) in limits {
        if raised(base_limit, new_limit) {
            w.push(Widening::Raised {
                key,
                base: base_limit,
                new: new_limit,
            });
        }
    }
    w
}

/// `new` allows more than `base` (`None` is no limit).
fn raised(base: Option<u64>, new: Option<u64>) -> bool {
    match (base, new) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(b), Some(n)) => n > b,
    }
}

/// Commands certainly run as root: `run_as` names root (or uid 0 with group 0), or is unset
/// while unjailed. (Unset and jailed is the owner of the primary root, decided with I/O.)
fn acts_as_root(c: &Config) -> bool {
    match c.confinement.run_as.as_deref().map(RunAs::parse) {
        None => c.fs.host_roots.is_empty(),
        Some(Ok(RunAs::Name(n))) => n == "root",
        Some(Ok(RunAs::Id { uid: 0, gid })) => gid.is_none_or(|g| g == 0),
        Some(_) => false,
    }
}

/// The reasons as one line, for a log or an error message.
pub fn describe(w: &[Widening]) -> String {
    w.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// How many callers `pty.adopt` lets take a session, as an order: `off` < `opener` < `any`.
fn adopt_reach(a: crate::config::PtyAdopt) -> u8 {
    match a {
        crate::config::PtyAdopt::Off => 0,
        crate::config::PtyAdopt::Opener => 1,
        crate::config::PtyAdopt::Any => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn jailed() -> Config {
        let mut c = Config::builtin_default();
        c.fs.allow_unjailed = false;
        c.fs.host_roots = vec!["/srv/work".into()];
        c
    }

    /// `pty.adopt` widens from `off` to `opener` to `any`; a higher per-caller terminal cap
    /// is a raised limit.
    #[test]
    fn adoption_and_the_per_caller_cap() {
        use crate::config::PtyAdopt::{Any, Off, Opener};
        let with = |a, per| {
            let mut c = jailed();
            c.pty.adopt = a;
            c.pty.max_sessions_per_caller = per;
            c
        };
        let said = |b: &Config, n: &Config| -> Vec<String> {
            widening(b, n).iter().map(|w| w.to_string()).collect()
        };
        assert_eq!(
            said(&with(Off, 16), &with(Opener, 16)),
            ["pty.adopt enabled"]
        );
        assert_eq!(
            said(&with(Opener, 16), &with(Any, 16)),
            ["pty.adopt enabled"]
        );
        assert!(said(&with(Any, 16), &with(Off, 16)).is_empty());
        assert!(said(&with(Any, 16), &with(Opener, 4)).is_empty());
        assert_eq!(
            said(&with(Any, 16), &with(Any, 17)),
            ["pty.max_sessions_per_caller raised from 16 to 17"]
        );
    }

    /// Each change alone, and exactly what it reports.
    #[test]
    fn each_widening_alone() {
        type Edit = fn(&mut Config);
        let cases: Vec<(&str, Edit, Vec<&str>)> = vec![
            ("nothing", |_| {}, vec![]),
            (
                "unjailed",
                |c| c.fs.host_roots.clear(),
                vec!["fs.host_roots is empty: the filesystem is unjailed"],
            ),
            (
                "another root",
                |c| c.fs.host_roots.push("/tmp".into()),
                vec!["fs.host_roots gained /tmp"],
            ),
            (
                "a sub-directory root is narrower",
                |c| c.fs.host_roots = vec!["/srv/work/sub".into()],
                vec![],
            ),
            (
                "allow_unjailed",
                |c| c.fs.allow_unjailed = true,
                vec!["fs.allow_unjailed enabled"],
            ),
            (
                "special bits",
                |c| c.fs.allow_special_bits = true,
                vec!["fs.allow_special_bits enabled"],
            ),
            ("env.inherit off", |c| c.env.inherit = false, vec![]),
            (
                "sandbox",
                |c| c.sandbox.enabled = !c.sandbox.enabled,
                vec![],
            ),
            (
                "landlock off",
                |c| c.confinement.landlock = false,
                vec!["confinement.landlock disabled"],
            ),
            (
                "seccomp off",
                |c| c.confinement.seccomp = false,
                vec!["confinement.seccomp disabled"],
            ),
            (
                "a capability",
                |c| c.confinement.capabilities.push("CAP_CHOWN".into()),
                vec!["confinement.capabilities gained CAP_CHOWN"],
            ),
            (
                "seccomp_allow",
                |c| c.confinement.seccomp_allow.push("ptrace".into()),
                vec!["confinement.seccomp_allow gained ptrace"],
            ),
            (
                "a scratch path outside",
                |c| c.confinement.scratch_paths.push("/srv".into()),
                vec!["confinement.scratch_paths gained /srv"],
            ),
            (
                "a scratch path inside",
                |c| c.confinement.scratch_paths.push("/tmp/x".into()),
                vec![],
            ),
            (
                "a system path",
                |c| c.confinement.system_paths.push("/home".into()),
                vec!["confinement.system_paths gained /home"],
            ),
            (
                "a secret path lost",
                |c| c.confinement.secret_paths.retain(|p| p != "/etc/shadow"),
                vec!["confinement.secret_paths lost /etc/shadow"],
            ),
            (
                "a denied path lost",
                |c| c.fs.denylist_paths.retain(|p| p != "/etc/passwd"),
                vec!["fs.denylist_paths lost /etc/passwd"],
            ),
            (
                "a denied path added",
                |c| c.fs.denylist_paths.push("/srv/secret".into()),
                vec![],
            ),
            (
                "a pattern lost",
                |c| {
                    c.denylist_patterns.remove(0);
                },
                vec!["denylist_patterns lost PATTERN0"],
            ),
            (
                "a protected glob lost",
                |c| c.code.non_accessible_globs.clear(),
                vec!["code.non_accessible_globs lost GLOB0"],
            ),
            (
                "env.allow",
                |c| c.env.allow.push("AWS_SECRET".into()),
                vec!["env.allow gained AWS_SECRET"],
            ),
            (
                "run_as",
                |c| c.confinement.run_as = Some("root".into()),
                vec!["confinement.run_as is Some(\"root\"), not None"],
            ),
            (
                "run_as another user",
                |c| c.confinement.run_as = Some("1000".into()),
                vec!["confinement.run_as is Some(\"1000\"), not None"],
            ),
            (
                "network",
                |c| c.confinement.network = NetworkAccess::Allow,
                vec!["confinement.network is Allow, wider than DenyBind"],
            ),
            (
                "network narrower",
                |c| c.confinement.network = NetworkAccess::Deny,
                vec![],
            ),
            (
                "best effort",
                |c| c.confinement.mode = ConfinementMode::BestEffort,
                vec!["confinement.mode is best_effort, not strict"],
            ),
            (
                "open_files raised",
                |c| c.confinement.rlimits.open_files = Some(8192),
                vec!["confinement.rlimits.open_files raised from 4096 to 8192"],
            ),
            (
                "open_files removed",
                |c| c.confinement.rlimits.open_files = None,
                vec!["confinement.rlimits.open_files raised from 4096 to unlimited"],
            ),
            (
                "open_files lowered",
                |c| c.confinement.rlimits.open_files = Some(10),
                vec![],
            ),
            (
                "cpu_seconds set",
                |c| c.confinement.rlimits.cpu_seconds = Some(5),
                vec![],
            ),
            (
                "pids_max removed",
                |c| c.confinement.job_limits.pids_max = None,
                vec!["confinement.job_limits.pids_max raised from 1024 to unlimited"],
            ),
            (
                "memory_max set",
                |c| c.confinement.job_limits.memory_max_bytes = Some(1 << 30),
                vec![],
            ),
            (
                "cpu_max set",
                |c| c.confinement.job_limits.cpu_max_percent = Some(50),
                vec![],
            ),
            (
                "watchers",
                |c| c.watch.max_watchers = 65,
                vec!["watch.max_watchers raised from 64 to 65"],
            ),
            (
                "pending paths",
                |c| c.watch.max_pending_paths = 1 << 20,
                vec!["watch.max_pending_paths raised from 4096 to 1048576"],
            ),
            (
                "read cap to unlimited",
                |c| c.fs.max_read_bytes = 0,
                vec!["fs.max_read_bytes raised from 1000 to unlimited"],
            ),
            (
                "output",
                |c| c.max_output_bytes += 1,
                vec!["max_output_bytes raised from 1048576 to 1048577"],
            ),
            (
                "jobs",
                |c| c.max_concurrent_jobs += 1,
                vec!["max_concurrent_jobs raised from 10 to 11"],
            ),
        ];
        for (name, edit, want) in cases {
            let mut base = jailed();
            base.confinement.mode = ConfinementMode::Strict;
            base.confinement.network = NetworkAccess::DenyBind;
            base.env.inherit = true;
            base.fs.max_read_bytes = 1000;
            base.max_output_bytes = 1_048_576;
            base.max_concurrent_jobs = 10;
            base.denylist_patterns = vec!["PATTERN0".into(), "PATTERN1".into()];
            base.code.non_accessible_globs = vec!["GLOB0".into()];
            let mut new = base.clone();
            edit(&mut new);
            let got: Vec<String> = widening(&base, &new)
                .iter()
                .map(|w| w.to_string())
                .collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_configuration_never_widens_itself_and_the_reverse_of_a_narrowing_widens() {
        let base = jailed();
        assert_eq!(widening(&base, &base), vec![]);
        let mut narrow = base.clone();
        narrow.confinement.capabilities.clear();
        narrow.fs.denylist_paths.push("/srv/work/secret".into());
        narrow.confinement.rlimits.cpu_seconds = Some(10);
        assert_eq!(widening(&base, &narrow), vec![]);
        assert_eq!(
            widening(&narrow, &base),
            vec![
                Widening::Lost("fs.denylist_paths", "/srv/work/secret".into()),
                Widening::Raised {
                    key: "confinement.rlimits.cpu_seconds",
                    base: Some(10),
                    new: None
                },
            ]
        );
        assert_eq!(
            describe(&widening(&narrow, &base)),
            "fs.denylist_paths lost /srv/work/secret; confinement.rlimits.cpu_seconds raised from 10 to unlimited"
        );
    }

    #[test]
    fn run_as_root_is_the_same_user_however_it_is_spelt() {
        let unjailed = Config::builtin_default();
        let mut named = unjailed.clone();
        named.confinement.run_as = Some("root".into());
        let mut id = unjailed.clone();
        id.confinement.run_as = Some("0:0".into());
        let mut jailed_root = jailed();
        jailed_root.confinement.run_as = Some("root".into());
        for (a, b) in [
            (&unjailed, &named),
            (&named, &id),
            (&unjailed, &jailed_root),
        ] {
            assert!(!widening(a, b)
                .iter()
                .any(|w| matches!(w, Widening::RunAs { .. })));
            assert!(!widening(b, a)
                .iter()
                .any(|w| matches!(w, Widening::RunAs { .. })));
        }
        // Jailed and unset is the root's owner, not root: naming root is a change.
        let w = widening(&jailed(), &jailed_root);
        assert_eq!(
            w,
            vec![Widening::RunAs {
                base: None,
                new: Some("root".into())
            }]
        );
    }

    #[test]
    fn an_unjailed_base_is_not_widened_by_roots() {
        let base = Config::builtin_default();
        let mut new = base.clone();
        new.fs.host_roots = vec!["/anywhere".into()];
        assert_eq!(widening(&base, &new), vec![]);
    }
}
