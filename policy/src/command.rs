//! The one command validator: what the broker checks of a command (`shell::exec`,
//! `shell::exec_bg`, `shell::pty::open`) and the executor checks again before it starts it,
//! with the same function, so the two checks are one check, in one order:
//!
//! 1. argv ([`check_argv`]: an empty program, a NUL byte);
//! 2. the denylist (a plain `command matches denylist: …`);
//! 3. env keys ([`env_policy::check_overrides`]: names, the dangerous keys);
//! 4. env values (a NUL byte);
//! 5. cwd (empty; relative while unjailed). The jail resolves it afterwards.
//!
//! Timeouts are not refused but resolved ([`resolve_timeout`]).

use crate::argv::check_argv;
use crate::denylist::{denied_message, Denylist};
use crate::env_policy;
use crate::error::{Code, PolicyError, WireError};

/// What a command is checked on. `argv: None` is a terminal's login shell (nothing to check
/// but its environment and cwd).
#[derive(Debug, Clone, Copy)]
pub struct CommandCheck<'a> {
    pub argv: Option<&'a [String]>,
    pub env: &'a [(String, String)],
    pub cwd: Option<&'a str>,
}

/// Why a command is refused, with its wire code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// An argv, env or cwd rule (S210, or a plain message for a NUL in argv).
    #[error("{0}")]
    Rule(#[from] PolicyError),
    /// A denylist pattern matched (a plain message naming the pattern).
    #[error("{}", denied_message(.pattern))]
    Denied { pattern: String },
}

impl CommandError {
    pub fn code(&self) -> Code {
        match self {
            CommandError::Rule(e) => e.code(),
            CommandError::Denied { .. } => Code::InvocationFailed,
        }
    }

    pub fn to_wire(&self) -> WireError {
        WireError::new(self.code(), self.to_string())
    }
}

impl From<CommandError> for WireError {
    fn from(e: CommandError) -> Self {
        e.to_wire()
    }
}

/// Checks `cmd` against the denylist and the jail mode, in the order of the module doc.
pub fn check_command(
    cmd: &CommandCheck<'_>,
    denylist: &Denylist,
    jailed: bool,
) -> Result<(), CommandError> {
    if let Some(argv) = cmd.argv {
        check_argv(argv)?;
        if let Some(p) = denylist.matches(argv) {
            return Err(CommandError::Denied {
                pattern: p.to_string(),
            });
        }
    }
    env_policy::check_overrides(cmd.env.iter().map(|(k, _)| k.as_str()))?;
    if let Some((k, _)) = cmd.env.iter().find(|(_, v)| v.contains('\0')) {
        return Err(PolicyError::Invalid(format!("env value of '{k}' contains a NUL byte")).into());
    }
    if let Some(cwd) = cmd.cwd {
        if cwd.is_empty() {
            return Err(PolicyError::Invalid("cwd is empty".into()).into());
        }
        if !jailed && !cwd.starts_with('/') {
            return Err(PolicyError::Invalid(format!(
                "path must be absolute when unjailed (fs.host_roots is empty; `~` is not expanded): {cwd}"
            ))
            .into());
        }
    }
    Ok(())
}

/// A call's timeout: `None` → `default_ms`; otherwise clamped to `max_ms`.
pub fn resolve_timeout(t: Option<u64>, default_ms: u64, max_ms: u64) -> u64 {
    t.unwrap_or(default_ms).min(max_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argv::EMPTY_COMMAND;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn env(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Each input against the exact code and message, and the order: an input that breaks
    /// several rules gets the first one's answer.
    #[test]
    fn each_input_gets_its_exact_code_and_message() {
        let deny = Denylist::compile(&["^rm -rf /$".to_string()]).unwrap();
        let ok_argv = s(&["echo", "hi"]);
        let no_env = env(&[]);
        type Case<'a> = (
            Option<Vec<String>>,
            Vec<(String, String)>,
            Option<&'a str>,
            bool,
            Option<(Code, String)>,
        );
        let cases: Vec<Case> = vec![
            (Some(ok_argv.clone()), no_env.clone(), None, false, None),
            (None, no_env.clone(), Some("/tmp"), false, None),
            (Some(ok_argv.clone()), no_env.clone(), Some("sub"), true, None),
            (
                Some(s(&[""])),
                env(&[("PATH", "x")]),
                Some(""),
                false,
                Some((Code::S210, EMPTY_COMMAND.to_string())),
            ),
            (
                Some(s(&["echo", "a\0b"])),
                no_env.clone(),
                None,
                false,
                Some((Code::InvocationFailed, "'args[0]' contains a NUL byte".into())),
            ),
            (
                Some(s(&["rm", "-rf", "/"])),
                env(&[("LD_PRELOAD", "/x.so")]),
                None,
                false,
                Some((
                    Code::InvocationFailed,
                    "command matches denylist: ^rm -rf /$".into(),
                )),
            ),
            (
                Some(ok_argv.clone()),
                env(&[("1X", "v"), ("A", "a\0")]),
                None,
                false,
                Some((
                    Code::S210,
                    "env key \"1X\" is not a variable name ([A-Za-z_][A-Za-z0-9_]*)".into(),
                )),
            ),
            (
                None,
                env(&[("LD_PRELOAD", "/x.so")]),
                Some("rel"),
                false,
                Some((Code::S210, "env key 'LD_PRELOAD' is not allowed: it can change which program runs or how it starts (per-call env is deny-only; PATH, IFS, HOME, LD_*/DYLD_* and interpreter startup keys are always refused)".into())),
            ),
            (
                Some(ok_argv.clone()),
                env(&[("A", "a\0b")]),
                Some(""),
                false,
                Some((Code::S210, "env value of 'A' contains a NUL byte".into())),
            ),
            (
                Some(ok_argv.clone()),
                no_env.clone(),
                Some(""),
                true,
                Some((Code::S210, "cwd is empty".into())),
            ),
            (
                Some(ok_argv.clone()),
                no_env.clone(),
                Some("~/x"),
                false,
                Some((Code::S210, "path must be absolute when unjailed (fs.host_roots is empty; `~` is not expanded): ~/x".into())),
            ),
        ];
        for (argv, env, cwd, jailed, want) in cases {
            let cmd = CommandCheck {
                argv: argv.as_deref(),
                env: &env,
                cwd,
            };
            let got = check_command(&cmd, &deny, jailed).map_err(|e| (e.code(), e.to_string()));
            let want = match want {
                None => Ok(()),
                Some(w) => Err(w),
            };
            assert_eq!(got, want, "{cmd:?} jailed={jailed}");
        }
    }

    #[test]
    fn timeouts_resolve_to_exact_values() {
        assert_eq!(resolve_timeout(None, 30_000, 120_000), 30_000);
        assert_eq!(resolve_timeout(Some(5), 30_000, 120_000), 5);
        assert_eq!(resolve_timeout(Some(0), 30_000, 120_000), 0);
        assert_eq!(resolve_timeout(Some(10_000_000), 30_000, 120_000), 120_000);
        assert_eq!(resolve_timeout(None, 300_000, 120_000), 120_000);
    }

    #[test]
    fn a_denied_command_carries_its_pattern() {
        let deny = Denylist::compile(&["^sudo".to_string()]).unwrap();
        let argv = s(&["sudo", "x"]);
        let e = check_command(
            &CommandCheck {
                argv: Some(&argv),
                env: &[],
                cwd: None,
            },
            &deny,
            true,
        )
        .unwrap_err();
        assert_eq!(
            e,
            CommandError::Denied {
                pattern: "^sudo".into()
            }
        );
        assert_eq!(e.to_wire().code, "invocation_failed");
    }
}
