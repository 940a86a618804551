//! Which `HOME` a command gets, and where a jailed command starts: decisions both halves
//! (and `check-config`) describe the same way.
//!
//! `HOME`, first that applies:
//! 1. `env.home`, when set (jailed or not): the operator's explicit choice.
//! 2. The worker's forwarded `HOME` (`env.inherit` / `env.allow`) that the command user
//!    cannot write: never handed on. The per-worker default (4.) is used instead, and a WARN
//!    says why ([`HomeChoice::Unwritable`]). (A root worker's `HOME=/tmp/w` in a container,
//!    with commands acting as another user, is the usual case.)
//! 3. Unjailed: the worker's own `HOME` as forwarded, or none, as it always was. Jailed: the
//!    worker's forwarded `HOME` when it lies inside a root or a scratch path, so an operator
//!    who set `HOME` in the executor's environment for the jail keeps it.
//! 4. Jailed: the per-worker default, a directory under the first scratch path that the
//!    executor creates for the command user ([`default_home_name`]).
//!
//! A per-call `env` never sets `HOME` (it is refused with S210, like `PATH`).

use std::path::{Component, Path};

/// Where `HOME` comes from (see the module doc for the order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HomeChoice {
    /// `env.home`.
    Configured(String),
    /// The worker's own `HOME`, forwarded unchanged.
    Forwarded(String),
    /// The per-worker default: the executor creates it under the first scratch path.
    PerWorker,
    /// The per-worker default, because the worker's forwarded `HOME` (this one), which would
    /// otherwise be used, is not writable by the command user.
    Unwritable(String),
    /// Unjailed, no `env.home`, and the worker forwards no `HOME`: commands get none.
    Unset,
}

/// The decision. `forwarded` is `HOME` in the forwarded environment, if any, and
/// `forwarded_writable` whether the command user can write it (a directory it may create
/// entries in).
pub fn choose(
    configured: Option<&str>,
    forwarded: Option<&str>,
    forwarded_writable: bool,
    roots: &[String],
    scratch: &[String],
) -> HomeChoice {
    if let Some(h) = configured {
        return HomeChoice::Configured(h.to_string());
    }
    let jailed = !roots.is_empty();
    match forwarded {
        None if jailed => HomeChoice::PerWorker,
        None => HomeChoice::Unset,
        Some(h) if jailed && !inside(h, roots, scratch) => HomeChoice::PerWorker,
        Some(h) if !forwarded_writable => HomeChoice::Unwritable(h.to_string()),
        Some(h) => HomeChoice::Forwarded(h.to_string()),
    }
}

/// Whether a directory of `owner`:`group` with `mode` lets `uid` (in groups `gids`) create
/// entries in it: root always; else the owner, group or other write and search bits, by the
/// first class that applies (as the kernel checks them, ACLs aside).
pub fn mode_lets_write(owner: u32, group: u32, mode: u32, uid: u32, gids: &[u32]) -> bool {
    let bits = if uid == 0 {
        return true;
    } else if uid == owner {
        mode >> 6
    } else if gids.contains(&group) {
        mode >> 3
    } else {
        mode
    };
    bits & 0o3 == 0o3
}

/// True when `path` is absolute, has no `..`, and lies (by whole components) at or under one
/// of `roots` or `scratch`: a place the commands' Landlock domain lets them write.
pub fn inside(path: &str, roots: &[String], scratch: &[String]) -> bool {
    let p = Path::new(path);
    if !p.is_absolute() || p.components().any(|c| c == Component::ParentDir) {
        return false;
    }
    roots
        .iter()
        .chain(scratch)
        .any(|r| p.starts_with(Path::new(r)))
}

/// 64-bit FNV-1a: a stable hash (the same on every build and host), for names on disk.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// What tells one worker on a host from another: its namespace and name (`III_NAMESPACE`,
/// `III_WORKER_NAME`, as the executor's environment has them) and its state directory
/// (`turns.data_dir`, resolved).
pub fn worker_identity(
    namespace: Option<&str>,
    worker_name: Option<&str>,
    turns_data_dir: &str,
) -> String {
    format!(
        "{}\0{}\0{}",
        namespace.unwrap_or(""),
        worker_name.unwrap_or(""),
        turns_data_dir
    )
}

/// The name of the per-worker default `HOME` of `uid` under the first scratch path:
/// `iii-shell-home-<uid>-<16 hex digits of the identity's hash>`. Only digits, letters and
/// `-`, so nothing a worker is called can make it a path.
pub fn default_home_name(uid: u32, identity: &str) -> String {
    format!("iii-shell-home-{uid}-{:016x}", fnv1a64(identity.as_bytes()))
}

/// The doctor gap (and start-up warning) of a jailed command's `HOME` that the commands'
/// Landlock domain does not let them use. Unjailed there is none. The per-worker default
/// is created inside a scratch path, so it has none either; when it could not be created
/// the executor says why instead.
pub fn gap(choice: &HomeChoice, roots: &[String], scratch: &[String]) -> Option<String> {
    const USES: &str = "jailed commands cannot use ~ (shell profiles and history, git and ssh \
                        configuration, npm, pip and cargo caches)";
    if roots.is_empty() {
        return None;
    }
    match choice {
        HomeChoice::Configured(h) if !inside(h, roots, scratch) => Some(format!(
            "env.home ({h}) is outside the jail: {USES}; set env.home to a directory under a \
             root or a scratch path, or remove it for the per-worker default"
        )),
        _ => None,
    }
}

/// The load-time gap of a directory the command user cannot enter: `working_dir` (`root` =
/// false) or a jail root, for commands acting as `uid`, with the fix.
pub fn unreachable_gap(path: &str, root: bool, uid: u32) -> String {
    let (what, effect) = if root {
        (
            format!("the root {path}"),
            "commands, terminal sessions and fs calls in it fail",
        )
    } else {
        (
            format!("working_dir {path}"),
            "every command without a cwd fails (S216)",
        )
    };
    format!(
        "{what} cannot be entered by uid {uid} that commands run as: {effect}; set confinement.run_as to a user that can enter it, or give uid {uid} access to it (chown the jail to that user)"
    )
}

/// Where a command starts when the call gives no `cwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefaultCwd {
    /// `working_dir`, when set.
    WorkingDir(String),
    /// Jailed, no `working_dir`: the primary root (the first of `fs.host_roots`).
    PrimaryRoot(String),
    /// Unjailed, no `working_dir`: the executor's own working directory.
    Executor,
}

/// The decision: `working_dir`, else (jailed) the primary root, else the executor's own.
pub fn default_cwd(working_dir: Option<&str>, roots: &[String]) -> DefaultCwd {
    match (working_dir, roots.first()) {
        (Some(wd), _) => DefaultCwd::WorkingDir(wd.to_string()),
        (None, Some(primary)) => DefaultCwd::PrimaryRoot(primary.clone()),
        (None, None) => DefaultCwd::Executor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn home_precedence_exact_values() {
        let roots = v(&["/srv/app"]);
        let scratch = v(&["/tmp", "/var/tmp"]);
        let none: Vec<String> = Vec::new();
        // 1. env.home wins, jailed or not, inside or not.
        assert_eq!(
            choose(
                Some("/srv/app/.home"),
                Some("/root"),
                false,
                &roots,
                &scratch
            ),
            HomeChoice::Configured("/srv/app/.home".into())
        );
        assert_eq!(
            choose(Some("/opt/h"), Some("/root"), true, &none, &scratch),
            HomeChoice::Configured("/opt/h".into())
        );
        // 2. Unjailed: the forwarded HOME as it was, or none.
        assert_eq!(
            choose(None, Some("/root"), true, &none, &scratch),
            HomeChoice::Forwarded("/root".into())
        );
        assert_eq!(choose(None, None, true, &none, &scratch), HomeChoice::Unset);
        // 3. Jailed: a forwarded HOME the jail lets commands use is kept.
        assert_eq!(
            choose(None, Some("/srv/app/home"), true, &roots, &scratch),
            HomeChoice::Forwarded("/srv/app/home".into())
        );
        assert_eq!(
            choose(None, Some("/var/tmp/h"), true, &roots, &scratch),
            HomeChoice::Forwarded("/var/tmp/h".into())
        );
        // 4. Jailed, a HOME outside (or none, or one with `..`): the per-worker default.
        assert_eq!(
            choose(None, Some("/root"), true, &roots, &scratch),
            HomeChoice::PerWorker
        );
        assert_eq!(
            choose(None, None, true, &roots, &scratch),
            HomeChoice::PerWorker
        );
        assert_eq!(
            choose(None, Some("/srv/app/../../root"), true, &roots, &scratch),
            HomeChoice::PerWorker
        );
        assert_eq!(
            choose(None, Some("/srv/apple"), true, &roots, &scratch),
            HomeChoice::PerWorker,
            "compared by whole components"
        );
        assert_eq!(
            choose(None, Some("relative"), true, &roots, &scratch),
            HomeChoice::PerWorker
        );
        // 2. A forwarded HOME the command user cannot write: never handed on, jailed (inside
        // a scratch path) or not; one outside the jail is not used anyway (no warning).
        assert_eq!(
            choose(None, Some("/tmp/w"), false, &roots, &scratch),
            HomeChoice::Unwritable("/tmp/w".into())
        );
        assert_eq!(
            choose(None, Some("/root"), false, &none, &scratch),
            HomeChoice::Unwritable("/root".into())
        );
        assert_eq!(
            choose(None, Some("/root"), false, &roots, &scratch),
            HomeChoice::PerWorker
        );
        assert_eq!(
            choose(None, None, false, &none, &scratch),
            HomeChoice::Unset
        );
    }

    #[test]
    fn who_may_write_a_directory_exact_values() {
        // root: always.
        assert!(mode_lets_write(1, 1, 0o000, 0, &[]));
        // The owner: its own bits, even when others have more.
        assert!(mode_lets_write(7, 7, 0o700, 7, &[7]));
        assert!(!mode_lets_write(7, 7, 0o577, 7, &[7]));
        assert!(!mode_lets_write(7, 7, 0o600, 7, &[7]), "no search bit");
        // The group.
        assert!(mode_lets_write(0, 9, 0o770, 7, &[7, 9]));
        assert!(!mode_lets_write(0, 9, 0o757, 7, &[7, 9]));
        // Others, e.g. a root-owned 0755 HOME for nobody; a sticky 1777 one.
        assert!(!mode_lets_write(0, 0, 0o755, 65534, &[65534]));
        assert!(mode_lets_write(0, 0, 0o1777, 65534, &[65534]));
    }

    #[test]
    fn the_default_home_name_is_stable_and_per_worker() {
        // FNV-1a's published test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        let id = worker_identity(None, None, "/srv/w/data/shell/turns");
        assert_eq!(id, "\0\0/srv/w/data/shell/turns");
        assert_eq!(
            default_home_name(4242, &id),
            format!("iii-shell-home-4242-{:016x}", fnv1a64(id.as_bytes()))
        );
        assert_eq!(default_home_name(4242, &id), default_home_name(4242, &id));
        // Another user, namespace, worker name or state directory: another directory.
        let names = [
            default_home_name(4243, &id),
            default_home_name(
                4242,
                &worker_identity(Some("a"), None, "/srv/w/data/shell/turns"),
            ),
            default_home_name(
                4242,
                &worker_identity(None, Some("b"), "/srv/w/data/shell/turns"),
            ),
            default_home_name(
                4242,
                &worker_identity(None, None, "/srv/x/data/shell/turns"),
            ),
        ];
        for n in &names {
            assert_ne!(n, &default_home_name(4242, &id));
        }
        // The separator keeps ("ab", "") apart from ("a", "b").
        assert_ne!(
            worker_identity(Some("ab"), Some(""), "/t"),
            worker_identity(Some("a"), Some("b"), "/t")
        );
        // Nothing in a worker's name reaches the directory name.
        let odd = default_home_name(0, &worker_identity(Some("../x"), Some("/etc"), "/t"));
        assert!(odd.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        assert_eq!(odd.len(), "iii-shell-home-0-".len() + 16);
    }

    #[test]
    fn only_a_configured_home_outside_the_jail_is_a_gap() {
        let roots = v(&["/srv/ws"]);
        let scratch = v(&["/tmp"]);
        assert_eq!(
            gap(&HomeChoice::Configured("/root".into()), &roots, &scratch),
            Some("env.home (/root) is outside the jail: jailed commands cannot use ~ (shell profiles and history, git and ssh configuration, npm, pip and cargo caches); set env.home to a directory under a root or a scratch path, or remove it for the per-worker default".to_string())
        );
        assert_eq!(
            gap(&HomeChoice::Configured("/tmp/h".into()), &roots, &scratch),
            None
        );
        assert_eq!(
            gap(&HomeChoice::Configured("/root".into()), &[], &scratch),
            None,
            "unjailed"
        );
        assert_eq!(gap(&HomeChoice::PerWorker, &roots, &scratch), None);
        assert_eq!(
            gap(&HomeChoice::Forwarded("/srv/ws/h".into()), &roots, &scratch),
            None
        );
    }

    #[test]
    fn unreachable_gaps_exact_values() {
        assert_eq!(
            unreachable_gap("/srv/app/sub", false, 65534),
            "working_dir /srv/app/sub cannot be entered by uid 65534 that commands run as: every command without a cwd fails (S216); set confinement.run_as to a user that can enter it, or give uid 65534 access to it (chown the jail to that user)"
        );
        assert_eq!(
            unreachable_gap("/srv/app", true, 7),
            "the root /srv/app cannot be entered by uid 7 that commands run as: commands, terminal sessions and fs calls in it fail; set confinement.run_as to a user that can enter it, or give uid 7 access to it (chown the jail to that user)"
        );
    }

    #[test]
    fn default_cwd_exact_values() {
        let roots = v(&["/srv/app", "/srv/lib"]);
        assert_eq!(
            default_cwd(Some("/srv/app/sub"), &roots),
            DefaultCwd::WorkingDir("/srv/app/sub".into())
        );
        assert_eq!(
            default_cwd(Some("/elsewhere"), &[]),
            DefaultCwd::WorkingDir("/elsewhere".into())
        );
        assert_eq!(
            default_cwd(None, &roots),
            DefaultCwd::PrimaryRoot("/srv/app".into())
        );
        assert_eq!(default_cwd(None, &[]), DefaultCwd::Executor);
    }
}
