//! Turning a JSON payload into a typed, checked request. Nothing reaches the executor before
//! it has passed through here.
//!
//! Order (the seed's): malformed payload → host-only fields → argv → denylist → env → cwd →
//! spawn; the command's part is `policy::command::check_command`, which the executor re-runs.

use iii_shell_policy::call_limits::{tighten, CallLimits};
use iii_shell_policy::command::{self, check_command, CommandCheck, CommandError};
use iii_shell_policy::denylist::Denylist;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::exec::{ExecRequest, Target};
use iii_shell_protocol::messages::ExecSpec;
use iii_shell_protocol::{Code, WireError};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A malformed payload: S210 naming what did not fit.
pub fn malformed(detail: impl std::fmt::Display) -> WireError {
    WireError::new(Code::S210, format!("malformed payload: {detail}"))
}

/// Deserializes a payload into `T` (S210 on failure). Unknown fields such as the engine's
/// `_caller_worker_id` are ignored.
pub fn parse<T: DeserializeOwned>(value: &Value) -> Result<T, WireError> {
    let v = if value.is_null() {
        Value::Object(Default::default())
    } else {
        value.clone()
    };
    serde_json::from_value(v).map_err(malformed)
}

/// A checked exec request: where it goes and, for the host, what the executor gets.
#[derive(Debug)]
pub struct CheckedExec {
    pub request: ExecRequest,
    pub argv: Vec<String>,
    /// `Some` for the host target.
    pub spec: Option<ExecSpec>,
}

/// Validates a `shell::exec` / `shell::exec_bg` payload against the configuration, compiling
/// its denylist for this one call (the handlers use the snapshot's, [`exec_request_with`]).
pub fn exec_request(value: &Value, config: &Config) -> Result<CheckedExec, WireError> {
    let denylist =
        Denylist::compile(&config.denylist_patterns).map_err(|e| WireError::new(Code::S216, e))?;
    exec_request_with(value, config, &denylist)
}

/// Validates a `shell::exec` / `shell::exec_bg` payload against the configuration and its
/// compiled `denylist`. Order: malformed payload → host-only fields → the command validator
/// (`policy::command`: argv → denylist → env keys → env values → cwd) → timeout.
pub fn exec_request_with(
    value: &Value,
    config: &Config,
    denylist: &Denylist,
) -> Result<CheckedExec, WireError> {
    let obj = value
        .as_object()
        .ok_or_else(|| malformed("expected an object"))?;
    // A `command`/`args` of the wrong JSON type is a malformed payload (S210), with a message
    // naming the violation, before serde sees it.
    match obj.get("command") {
        None => return Err(malformed("missing field `command`")),
        Some(Value::String(_)) => {}
        Some(_) => {
            return Err(malformed(
                "'command' must be a string: the program name or path; put its arguments in 'args'",
            ))
        }
    }
    match obj.get("args") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            if let Some(i) = items.iter().position(|v| !v.is_string()) {
                return Err(malformed(format!("'args[{i}]' must be a string")));
            }
        }
        Some(_) => return Err(malformed("'args' must be an array of strings")),
    }
    // Negative or fractional timeouts fall back to the default instead of failing. The value is
    // copied only then: otherwise it is read in place.
    let odd_timeout =
        matches!(obj.get("timeout_ms"), Some(Value::Number(n)) if n.as_u64().is_none());
    let request: ExecRequest = if odd_timeout {
        let mut normalized = value.clone();
        if let Some(t) = normalized.get_mut("timeout_ms") {
            *t = Value::Null;
        }
        serde_json::from_value(normalized)
    } else {
        <ExecRequest as serde::Deserialize>::deserialize(value)
    }
    .map_err(malformed)?;

    if let Target::Sandbox { .. } = &request.target {
        if !config.sandbox.enabled {
            return Err(WireError::new(
                Code::S210,
                "sandbox targets are disabled (sandbox.enabled: false)",
            ));
        }
        for (name, present) in [
            ("cwd", request.cwd.is_some()),
            ("env", request.env.is_some()),
            ("stdin", request.stdin.is_some()),
            ("network", request.network.is_some()),
            ("limits", request.limits.is_some()),
        ] {
            if present {
                return Err(WireError::new(
                    Code::S210,
                    format!("'{name}' is host-only: sandbox::exec does not forward it; omit it on a sandbox target"),
                ));
            }
        }
    }

    let argv = build_argv(&request.command, request.args.as_deref())?;
    let env: Vec<(String, String)> = request
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    // The one command validator; the executor runs it again (`prepare::check`).
    let cmd = CommandCheck {
        argv: Some(&argv),
        env: &env,
        cwd: request.cwd.as_deref(),
    };
    match check_command(&cmd, denylist, !config.fs.host_roots.is_empty()) {
        Ok(()) => {}
        Err(CommandError::Denied { pattern }) => {
            // For the operator: which pattern stopped which call (its trace shows the
            // caller); never the command line itself, which can hold secrets.
            tracing::warn!(
                pattern = %pattern,
                "a command was refused by the denylist; if it should run, remove or narrow that entry of denylist_patterns"
            );
            return Err(CommandError::Denied { pattern }.to_wire());
        }
        Err(e) => return Err(e.to_wire()),
    }
    if request.target != Target::Host {
        return Ok(CheckedExec {
            request,
            argv,
            spec: None,
        });
    }
    let timeout_ms = resolve_timeout(request.timeout_ms, config);
    iii_shell_policy::network::for_call(config.confinement.network, request.network)
        .map_err(|m| WireError::new(Code::S210, m))?;
    let limits = call_limits(request.limits.as_ref(), config)?;
    let spec = ExecSpec {
        argv: argv.clone(),
        cwd: request.cwd.clone(),
        env,
        stdin: request.stdin.clone().map(String::into_bytes),
        timeout_ms,
        network: request.network,
        limits,
    };
    Ok(CheckedExec {
        request,
        argv,
        spec: Some(spec),
    })
}

/// A call's `limits`, checked against the worker's `confinement.job_limits`: a value above
/// the worker's (a widening) or 0 is S210 naming the field. The executor checks again.
pub fn call_limits(limits: Option<&CallLimits>, config: &Config) -> Result<CallLimits, WireError> {
    let limits = limits.copied().unwrap_or_default();
    tighten(&config.confinement.job_limits, &limits)
        .map_err(|e| WireError::new(Code::S210, e.to_string()))?;
    Ok(limits)
}

/// `None` → `default_timeout_ms`; otherwise clamped to `max_timeout_ms`.
pub fn resolve_timeout(t: Option<u64>, config: &Config) -> u64 {
    command::resolve_timeout(t, config.default_timeout_ms, config.max_timeout_ms)
}

/// `args` absent or null: shell-words tokenization of `command`. Present (even empty):
/// `[command] + args` verbatim.
pub fn build_argv(command: &str, args: Option<&[String]>) -> Result<Vec<String>, WireError> {
    let argv = match args {
        None => {
            if command.contains('\0') {
                return Err(WireError::plain("'command' contains a NUL byte"));
            }
            shell_words::split(command)
                .map_err(|e| WireError::plain(format!("parse command: {e}")))?
        }
        Some(args) => {
            let mut v = Vec::with_capacity(args.len() + 1);
            v.push(command.to_string());
            v.extend(args.iter().cloned());
            v
        }
    };
    // Its rules (`check_argv`) are the command validator's first step.
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg() -> Config {
        Config::builtin_default()
    }

    fn err(v: Value) -> WireError {
        match exec_request(&v, &cfg()) {
            Ok(_) => panic!("accepted {v}"),
            Err(e) => e,
        }
    }

    #[test]
    fn argv_rules() {
        let ok = exec_request(&json!({"command": "echo 'a b' c"}), &cfg()).unwrap();
        assert_eq!(ok.argv, ["echo", "a b", "c"]);
        let ok = exec_request(&json!({"command": "echo 'a b'", "args": []}), &cfg()).unwrap();
        assert_eq!(ok.argv, ["echo 'a b'"]);
        let ok = exec_request(
            &json!({"command": "ls", "args": ["-l", "x y"], "_caller_worker_id": "w"}),
            &cfg(),
        )
        .unwrap();
        assert_eq!(ok.argv, ["ls", "-l", "x y"]);

        for blank in ["", "   ", "\t\n"] {
            let e = err(json!({"command": blank}));
            assert_eq!(e.code, "S210", "{blank:?}: {e:?}");
            assert!(e.message.contains("empty command"), "{blank:?}: {e:?}");
            let e = err(json!({"command": blank, "args": ["x"]}));
            assert_eq!(e.code, "S210", "{blank:?} with args: {e:?}");
        }
        let e = err(json!({"command": ["ls"]}));
        assert!(
            e.message.contains("'command'") && e.message.contains("must be a string"),
            "{e:?}"
        );
        assert_eq!(e.code, "S210");
        let e = err(json!({"command": "ls", "args": "x"}));
        assert_eq!(
            (e.code.as_str(), e.message.as_str()),
            (
                "S210",
                "malformed payload: 'args' must be an array of strings"
            )
        );
        let e = err(json!({"command": "ls", "args": ["a", 1]}));
        assert_eq!(
            (e.code.as_str(), e.message.as_str()),
            ("S210", "malformed payload: 'args[1]' must be a string")
        );
        assert!(err(json!({"command": "echo 'unterminated"}))
            .message
            .starts_with("parse command"));
        assert!(err(json!({"command": "echo", "args": ["a\u{0}b"]}))
            .message
            .contains("NUL"));
        assert!(err(json!({"command": "ec\u{0}ho"})).message.contains("NUL"));
        assert!(err(json!("not an object")).is(Code::S210));
        assert!(err(json!({"command": "ls", "cwd": 5})).is(Code::S210));
    }

    #[test]
    fn timeouts() {
        let c = cfg();
        let t = |v: Value| exec_request(&v, &c).unwrap().spec.unwrap().timeout_ms;
        assert_eq!(t(json!({"command": "true"})), 30_000);
        assert_eq!(t(json!({"command": "true", "timeout_ms": 5})), 5);
        assert_eq!(
            t(json!({"command": "true", "timeout_ms": 10_000_000})),
            120_000
        );
        assert_eq!(t(json!({"command": "true", "timeout_ms": -5})), 30_000);
        assert_eq!(t(json!({"command": "true", "timeout_ms": 1.5})), 30_000);
        assert_eq!(t(json!({"command": "true", "timeout_ms": 0})), 0);
        assert!(err(json!({"command": "true", "timeout_ms": "5"})).is(Code::S210));
    }

    #[test]
    fn sandbox_host_only_fields() {
        let sb = json!({"kind": "sandbox", "sandbox_id": "6f1c6a57-3f0e-4a59-9b8e-1a2b3c4d5e6f"});
        for field in ["cwd", "env", "stdin"] {
            let mut v = json!({"command": "ls", "target": sb});
            v[field] = if field == "env" {
                json!({"A": "1"})
            } else {
                json!("/tmp")
            };
            let e = err(v);
            assert!(e.is(Code::S210) && e.message.contains(field), "{e:?}");
        }
        assert!(err(json!({"command": "ls", "target": {"kind": "vm"}})).is(Code::S210));
        let mut c = cfg();
        c.sandbox.enabled = false;
        assert!(exec_request(&json!({"command": "ls", "target": sb}), &c)
            .unwrap_err()
            .is(Code::S210));
    }

    #[test]
    fn denylist_and_env() {
        assert_eq!(
            err(json!({"command": "sudo shutdown -h now"})).message,
            format!("command matches denylist: {}", cfg().denylist_patterns[4])
        );
        let e = err(json!({"command": "env", "env": {"LD_PRELOAD": "/x.so"}}));
        assert!(e.is(Code::S210) && e.message.contains("LD_PRELOAD"));
        assert!(exec_request(
            &json!({"command": "env", "env": {"NODE_ENV": "test"}}),
            &cfg()
        )
        .is_ok());
        assert!(err(json!({"command": "ls", "cwd": "relative"})).is(Code::S210));
    }
}
