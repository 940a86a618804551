//! `iii-shell check-config FILE`: everything the worker would check before it serves the
//! file, so a file this accepts never fails closed at run time.
//!
//! It parses and validates the document, resolves relative paths against the current
//! directory (as the worker does against its start-up directory), and then builds the
//! executor's policy from it exactly as the executor does on every reload: jail roots opened
//! (they must exist and be directories), denylist compiled, Landlock ruleset and seccomp
//! filter built, strict-mode gaps found. What it cannot know is a pinned envelope of a
//! running executor.

use std::path::Path;

use iii_shell_executor::policy::Policy;
use iii_shell_protocol::config::Config;

/// What `check-config` prints on success, or the reason it refuses the file.
pub fn check(file: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    let written = Config::from_yaml(&text).map_err(|e| e.0)?;
    let config = iii_shell_broker::worker_identity::resolve(&written)?;
    let json = serde_json::to_string(&config).map_err(|e| e.to_string())?;
    let policy =
        Policy::build(0, &json).map_err(|e| format!("the executor would refuse it: {e}"))?;
    let mode = if config.fs.host_roots.is_empty() {
        "unjailed".to_string()
    } else {
        format!("jailed to {}", config.fs.host_roots.join(", "))
    };
    let mut out = format!(
        "{}: ok ({mode}, {} denylist patterns)\n",
        file.display(),
        config.denylist_patterns.len()
    );
    out.push_str(&paths_report(&written, &config));
    let user = iii_shell_launch::run_as::decide_here(&config)
        .map_err(|e| format!("the executor would refuse it: {e}"))?;
    out.push_str(&format!(
        "  commands as     {}:{} ({})\n",
        user.uid, user.gid, user.why
    ));
    if let Some(w) = &user.warning {
        out.push_str(&format!("  warning: {w}\n"));
    }
    // What the executor settles when it takes the policy; check-config creates nothing.
    let home = iii_shell_files::home::preview(
        &config,
        policy.base_env.get("HOME").map(String::as_str),
        user.uid,
    );
    out.push_str(&format!(
        "  HOME            {}\n",
        home.path
            .as_ref()
            .map_or(home.source.clone(), |h| format!("{h} ({})", home.source))
    ));
    if let Some(w) = &home.warning {
        out.push_str(&format!("  warning: {w}\n"));
    }
    // The command ruleset comes from the walk for protected entries, which the executor runs
    // off the call path; check-config waits for it, to report what it finds.
    let ruleset = policy
        .commands_ruleset_blocking()
        .as_ref()
        .map_err(|e| format!("the executor would refuse its commands: {e}"))?;
    for gap in &ruleset.gaps {
        out.push_str(&format!("  note: {gap}\n"));
    }
    Ok(out)
}

/// `working_dir` and `turns.data_dir` as the worker uses them, with what was written when
/// that differs. Shared with `doctor`.
pub fn paths_report(written: &Config, resolved: &Config) -> String {
    let mut out = String::new();
    let line = |key: &str, was: &str, now: &str| {
        if was == now {
            format!("  {key:<15} {now}\n")
        } else {
            format!(
                "  {key:<15} {now} (written {was:?}, resolved against the start-up directory)\n"
            )
        }
    };
    match (&written.working_dir, &resolved.working_dir) {
        (Some(was), Some(now)) => {
            out.push_str(&line("working_dir", was, now));
            if !Path::new(now).is_dir() {
                out.push_str(&format!(
                    "  warning: working_dir {now} is not an existing directory: commands without a cwd will fail until it is created\n"
                ));
            }
        }
        _ => match resolved.fs.host_roots.first() {
            Some(primary) => out.push_str(&format!(
                "  working_dir     null (commands start in the primary root {primary})\n"
            )),
            None => out.push_str("  working_dir     null (the executor's own working directory)\n"),
        },
    }
    out.push_str(&line(
        "turns.data_dir",
        &written.turns.data_dir,
        &resolved.turns.data_dir,
    ));
    out
}

/// Runs the check; exit 0 when the file is accepted, 1 with the reason otherwise.
pub fn run(file: &Path) -> i32 {
    match check(file) {
        Ok(report) => {
            print!("{report}");
            0
        }
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            1
        }
    }
}
