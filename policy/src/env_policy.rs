//! The per-call environment gate and the forwarded base environment.
//!
//! Per-call `env` is deny-only: any key may be set except one that would change *what runs*
//! rather than how the requested program behaves — the program search path, the dynamic
//! loader, and the startup files and option variables of shells and interpreters. Those are
//! refused for the whole call (S210), so the argv an approver saw is the program that runs.

use std::collections::BTreeMap;

use crate::error::PolicyError;

/// Keys refused by exact name (compared case-insensitively).
pub const DANGEROUS_KEYS: &[&str] = &[
    // Program lookup and identity.
    "PATH",
    "HOME",
    "SHELL",
    "IFS",
    "CDPATH",
    // Dynamic loader and libc (LD_* / DYLD_* are matched as families below).
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "RES_OPTIONS",
    "LOCALDOMAIN",
    "OPENSSL_CONF",
    "OPENSSL_ENGINES",
    "OPENSSL_MODULES",
    // Shells.
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "ZDOTDIR",
    "GLOBIGNORE",
    // Python.
    "PYTHONSTARTUP",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONWARNINGS",
    "PYTHONBREAKPOINT",
    "PYTHONEXECUTABLE",
    "PYTHONPLATLIBDIR",
    // Perl, Ruby, Node, Java.
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "PERL5DB",
    "RUBYOPT",
    "RUBYLIB",
    "RUBYSHELL",
    "NODE_OPTIONS",
    "NODE_PATH",
    "NODE_REPL_EXTERNAL_MODULE",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    // Programs that other programs run on the caller's behalf.
    "PAGER",
    "GIT_PAGER",
    "MANPAGER",
    "EDITOR",
    "VISUAL",
    "GIT_EDITOR",
    "BROWSER",
    "LESSOPEN",
    "LESSCLOSE",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_EXEC_PATH",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "SUDO_ASKPASS",
    "GIT_PROXY_COMMAND",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_TEMPLATE_DIR",
];

/// Key families refused by prefix (compared case-insensitively).
pub const DANGEROUS_PREFIXES: &[&str] = &[
    "LD_",
    "DYLD_",
    "GIT_CONFIG_KEY_",
    "GIT_CONFIG_VALUE_",
    "BASH_FUNC_",
];

/// True when `key` is `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_var_name(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

pub fn is_dangerous(key: &str) -> bool {
    let upper = key.to_ascii_uppercase();
    DANGEROUS_KEYS.contains(&upper.as_str())
        || DANGEROUS_PREFIXES.iter().any(|p| upper.starts_with(p))
}

/// Checks every per-call key; the first offender fails the whole call with S210.
pub fn check_overrides<'a, I>(keys: I) -> Result<(), PolicyError>
where
    I: IntoIterator<Item = &'a str>,
{
    for key in keys {
        if !is_var_name(key) {
            return Err(PolicyError::Invalid(format!(
                "env key {key:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )));
        }
        if is_dangerous(key) {
            return Err(PolicyError::Invalid(format!(
                "env key '{key}' is not allowed: it can change which program runs or how it starts (per-call env is deny-only; PATH, IFS, HOME, LD_*/DYLD_* and interpreter startup keys are always refused)"
            )));
        }
        if key.contains('\0') {
            return Err(PolicyError::Invalid(format!(
                "env key {key:?} contains a NUL byte"
            )));
        }
    }
    Ok(())
}

/// The worker's own variables, by exact name: its logging, its runtime, and what systemd
/// hands a service (its journal stream, notification and watchdog sockets, socket
/// activation, unit directories and credentials). They configure the worker, not the
/// programs it runs, so `env.inherit` never forwards them (an explicit `env.allow` entry
/// does: that is the operator's deliberate choice).
pub const WORKER_ONLY_KEYS: &[&str] = &[
    // The worker's logging and runtime.
    "RUST_LOG",
    "RUST_LOG_STYLE",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
    "TOKIO_WORKER_THREADS",
    // What systemd sets for a service (systemd.exec(5), "Environment Variables in Spawned
    // Processes").
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "NOTIFY_SOCKET",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "MAINPID",
    "MANAGERPID",
    "SYSTEMD_EXEC_PID",
    "STATE_DIRECTORY",
    "RUNTIME_DIRECTORY",
    "CACHE_DIRECTORY",
    "LOGS_DIRECTORY",
    "CONFIGURATION_DIRECTORY",
    "CREDENTIALS_DIRECTORY",
    "MEMORY_PRESSURE_WATCH",
    "MEMORY_PRESSURE_WRITE",
    "FDSTORE",
    "SERVICE_RESULT",
    "EXIT_CODE",
    "EXIT_STATUS",
    "TRIGGER_UNIT",
    "TRIGGER_PATH",
    "TRIGGER_TIMER_REALTIME_USEC",
    "TRIGGER_TIMER_MONOTONIC_USEC",
];

/// The worker's own variable families, by prefix: the engine's and the worker's
/// (`III_URL`, `III_NAMESPACE`, `III_WORKER_NAME`, `III_SHELL_*`, …) and systemd's
/// `ExecStopPost=` monitor variables.
pub const WORKER_ONLY_PREFIXES: &[&str] = &["III_", "MONITOR_"];

/// True when `key` is one of the worker's own variables ([`WORKER_ONLY_KEYS`],
/// [`WORKER_ONLY_PREFIXES`]; exact case: environment names are case-sensitive).
pub fn is_worker_only(key: &str) -> bool {
    WORKER_ONLY_KEYS.contains(&key) || WORKER_ONLY_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// What a command that is not a terminal session (`shell::exec`, `shell::exec_bg`) gets when
/// the forwarded environment does not set it: no pager (its output goes to a pipe, and a
/// pager that waits for a key would hold the call until its timeout) and no credential
/// prompt from git (nobody can answer it; git fails at once instead).
pub const NON_TERMINAL_DEFAULTS: &[(&str, &str)] = &[
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("GIT_TERMINAL_PROMPT", "0"),
];

/// `base` with [`NON_TERMINAL_DEFAULTS`] added where it has no value of its own.
pub fn non_terminal_env(base: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut env = base.clone();
    for (k, v) in NON_TERMINAL_DEFAULTS {
        env.entry((*k).to_string())
            .or_insert_with(|| (*v).to_string());
    }
    env
}

/// The environment a command starts with: the executor's own environment (all of it but the
/// worker's own variables ([`is_worker_only`]) when `inherit`, else only the `allow` keys),
/// then the per-call overrides on top.
pub fn build_env(
    inherit: bool,
    allow: &[String],
    base: impl Iterator<Item = (String, String)>,
    overrides: &[(String, String)],
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = base
        .filter(|(k, _)| allow.iter().any(|a| a == k) || (inherit && !is_worker_only(k)))
        .collect();
    for (k, v) in overrides {
        env.insert(k.clone(), v.clone());
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_families() {
        assert!(is_var_name("NODE_ENV"));
        assert!(is_var_name("_x1"));
        assert!(!is_var_name("1X"));
        assert!(!is_var_name("PATH=/tmp/evil"));
        assert!(!is_var_name(""));
        for k in [
            "PATH",
            "path",
            "LD_PRELOAD",
            "ld_audit",
            "LD_ANYTHING_NEW",
            "DYLD_INSERT_LIBRARIES",
            "BASH_ENV",
            "GLIBC_TUNABLES",
        ] {
            assert!(is_dangerous(k), "{k}");
        }
        for k in ["NODE_ENV", "RUST_LOG", "LANG", "OLD_PATH"] {
            assert!(!is_dangerous(k), "{k}");
        }
    }

    #[test]
    fn base_env_and_overrides() {
        let base = vec![
            ("PATH".to_string(), "/bin".to_string()),
            ("SECRET".to_string(), "x".to_string()),
        ];
        let env = build_env(
            false,
            &["PATH".to_string()],
            base.clone().into_iter(),
            &[("A".into(), "1".into())],
        );
        assert_eq!(env.get("PATH").map(String::as_str), Some("/bin"));
        assert!(!env.contains_key("SECRET"));
        assert_eq!(env.get("A").map(String::as_str), Some("1"));
        let env = build_env(
            true,
            &[],
            base.into_iter(),
            &[("SECRET".into(), "y".into())],
        );
        assert_eq!(env.get("SECRET").map(String::as_str), Some("y"));
    }

    #[test]
    fn the_workers_own_variables_are_never_inherited() {
        let base = [
            "PATH",
            "RUST_LOG",
            "III_URL",
            "III_SHELL_PRESTART",
            "INVOCATION_ID",
            "JOURNAL_STREAM",
            "NOTIFY_SOCKET",
            "STATE_DIRECTORY",
            "MONITOR_EXIT_CODE",
            "LANG",
            "rust_log",
            "XIII_X",
        ]
        .map(|k| (k.to_string(), "v".to_string()));
        let keys = |e: BTreeMap<String, String>| e.into_keys().collect::<Vec<_>>();
        assert_eq!(
            keys(build_env(true, &[], base.clone().into_iter(), &[])),
            ["LANG", "PATH", "XIII_X", "rust_log"]
        );
        // Named in env.allow: forwarded, as the operator asked.
        assert_eq!(
            keys(build_env(
                false,
                &["PATH".into(), "RUST_LOG".into()],
                base.clone().into_iter(),
                &[]
            )),
            ["PATH", "RUST_LOG"]
        );
        assert_eq!(
            keys(build_env(true, &["III_URL".into()], base.into_iter(), &[])),
            ["III_URL", "LANG", "PATH", "XIII_X", "rust_log"]
        );
        assert!(is_worker_only("III_"));
        assert!(!is_worker_only("II_X"));
        assert!(!is_worker_only("RUST_LOGGER"));
    }

    #[test]
    fn non_terminal_defaults_fill_only_what_is_unset() {
        let mut base = BTreeMap::new();
        base.insert("PATH".to_string(), "/bin".to_string());
        let got: Vec<(String, String)> = non_terminal_env(&base).into_iter().collect();
        let want: Vec<(String, String)> = [
            ("GIT_PAGER", "cat"),
            ("GIT_TERMINAL_PROMPT", "0"),
            ("PAGER", "cat"),
            ("PATH", "/bin"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        assert_eq!(got, want);
        base.insert("PAGER".to_string(), "less".to_string());
        base.insert("GIT_TERMINAL_PROMPT".to_string(), "1".to_string());
        let got = non_terminal_env(&base);
        assert_eq!(got["PAGER"], "less");
        assert_eq!(got["GIT_TERMINAL_PROMPT"], "1");
        assert_eq!(got["GIT_PAGER"], "cat");
    }
}
