//! Which shell a terminal session without a program starts, and what the worker says about
//! it: decisions made once per policy, when the command user is known.
//!
//! The shell, first that applies:
//! 1. The command user's login shell (its passwd entry) when it is one to log in with: not
//!    `nologin`, `false` and the like ([`is_real_shell`]), and an executable file.
//! 2. A command user with a passwd entry whose shell is not one (`nobody`, system users):
//!    `/bin/sh`. Its `nologin` would only print "This account is currently not available".
//! 3. A command user with no passwd entry (a bare `run_as: 4242`): the forwarded `SHELL`
//!    when it is a real, executable shell, else `/bin/sh`.

use std::path::Path;

/// What `/bin/sh` is called here.
pub const FALLBACK_SHELL: &str = "/bin/sh";

/// The shells of accounts nobody logs in to, by file name.
pub const NOT_SHELLS: &[&str] = &["nologin", "false", "true", "sync", "shutdown", "halt"];

/// True when `path` is absolute and not one of [`NOT_SHELLS`].
pub fn is_real_shell(path: &str) -> bool {
    let p = Path::new(path);
    p.is_absolute()
        && p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| !NOT_SHELLS.contains(&n))
}

/// The command user as the passwd database has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub shell: String,
}

/// The shell a terminal session gets, and why it is not the account's own when it is not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShellChoice {
    pub path: String,
    pub why: Option<String>,
}

/// The decision (see the module doc). `executable` says whether a path is an executable file.
pub fn choose_shell(
    account: Option<&Account>,
    forwarded: Option<&str>,
    executable: impl Fn(&str) -> bool,
) -> ShellChoice {
    let usable = |s: &str| is_real_shell(s) && executable(s);
    let plain = |path: &str| ShellChoice {
        path: path.to_string(),
        why: None,
    };
    match account {
        Some(a) if usable(&a.shell) => plain(&a.shell),
        Some(a) => ShellChoice {
            path: FALLBACK_SHELL.to_string(),
            why: Some(format!(
                "{}'s login shell {} is not one to log in with",
                a.name,
                if a.shell.is_empty() {
                    "(none)"
                } else {
                    &a.shell
                }
            )),
        },
        None => match forwarded.filter(|s| usable(s)) {
            Some(s) => plain(s),
            None => plain(FALLBACK_SHELL),
        },
    }
}

/// What the worker says once per policy about its terminals, when there is something to
/// say: that they are not root's although the worker is (`worker_is_root`, commands acting
/// as `uid`, named `name`, chosen because `why_user`), and which shell they get when it is
/// not the account's own.
pub fn note(
    worker_is_root: bool,
    uid: u32,
    name: Option<&str>,
    why_user: &str,
    shell: &ShellChoice,
) -> Option<String> {
    let shell_part = match &shell.why {
        Some(why) => format!("their shell is {} ({why})", shell.path),
        None => format!("their shell is {}", shell.path),
    };
    let who = match name {
        Some(n) => format!("{n} (uid {uid})"),
        None => format!("uid {uid}"),
    };
    if worker_is_root && uid != 0 {
        return Some(format!(
            "terminal sessions run as {who}, not root, like every command ({why_user}); {shell_part}; to have them act as another user, set confinement.run_as to it, or make it the owner of the primary root"
        ));
    }
    shell
        .why
        .as_ref()
        .map(|_| format!("terminal sessions run as {who}: {shell_part}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acct(name: &str, shell: &str) -> Account {
        Account {
            name: name.into(),
            shell: shell.into(),
        }
    }

    #[test]
    fn real_shells_exact_values() {
        for s in [
            "/bin/bash",
            "/usr/bin/zsh",
            "/bin/sh",
            "/usr/local/bin/fish",
        ] {
            assert!(is_real_shell(s), "{s}");
        }
        for s in [
            "/usr/sbin/nologin",
            "/sbin/nologin",
            "/bin/false",
            "/usr/bin/true",
            "/bin/sync",
            "/sbin/shutdown",
            "/sbin/halt",
            "bash",
            "",
            "/",
        ] {
            assert!(!is_real_shell(s), "{s}");
        }
    }

    #[test]
    fn the_shell_exact_values() {
        let all = |_: &str| true;
        let none = |_: &str| false;
        assert_eq!(
            choose_shell(Some(&acct("build", "/bin/bash")), Some("/bin/zsh"), all),
            ShellChoice {
                path: "/bin/bash".into(),
                why: None
            }
        );
        // nobody: /bin/sh, and why; the forwarded SHELL (root's) is not used.
        assert_eq!(
            choose_shell(
                Some(&acct("nobody", "/usr/sbin/nologin")),
                Some("/bin/bash"),
                all
            ),
            ShellChoice {
                path: "/bin/sh".into(),
                why: Some(
                    "nobody's login shell /usr/sbin/nologin is not one to log in with".into()
                )
            }
        );
        assert_eq!(
            choose_shell(Some(&acct("svc", "")), None, all)
                .why
                .as_deref(),
            Some("svc's login shell (none) is not one to log in with")
        );
        // A real shell that is not installed here.
        assert_eq!(
            choose_shell(Some(&acct("u", "/bin/zsh")), None, none).path,
            "/bin/sh"
        );
        // No passwd entry: the forwarded SHELL when it is a real one.
        assert_eq!(
            choose_shell(None, Some("/bin/bash"), all),
            ShellChoice {
                path: "/bin/bash".into(),
                why: None
            }
        );
        assert_eq!(choose_shell(None, Some("/bin/false"), all).path, "/bin/sh");
        assert_eq!(choose_shell(None, None, all).path, "/bin/sh");
    }

    #[test]
    fn the_note_exact_values() {
        let sh = ShellChoice {
            path: "/bin/sh".into(),
            why: Some("nobody's login shell /usr/sbin/nologin is not one to log in with".into()),
        };
        assert_eq!(
            note(true, 65534, Some("nobody"), "confinement.run_as unset and a root-owned primary root: nobody", &sh).as_deref(),
            Some("terminal sessions run as nobody (uid 65534), not root, like every command (confinement.run_as unset and a root-owned primary root: nobody); their shell is /bin/sh (nobody's login shell /usr/sbin/nologin is not one to log in with); to have them act as another user, set confinement.run_as to it, or make it the owner of the primary root")
        );
        let bash = ShellChoice {
            path: "/bin/bash".into(),
            why: None,
        };
        assert_eq!(
            note(true, 4242, None, "confinement.run_as", &bash).as_deref(),
            Some("terminal sessions run as uid 4242, not root, like every command (confinement.run_as); their shell is /bin/bash; to have them act as another user, set confinement.run_as to it, or make it the owner of the primary root")
        );
        // Root terminals of a root worker, or a non-root worker's own: nothing to say…
        assert_eq!(note(true, 0, Some("root"), "x", &bash), None);
        assert_eq!(note(false, 1000, Some("me"), "x", &bash), None);
        // …unless the shell is not the account's.
        assert_eq!(
            note(false, 1000, Some("me"), "x", &sh).as_deref(),
            Some("terminal sessions run as me (uid 1000): their shell is /bin/sh (nobody's login shell /usr/sbin/nologin is not one to log in with)")
        );
    }
}
