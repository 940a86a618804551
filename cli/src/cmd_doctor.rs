//! `iii-shell doctor [--json]`: what each half of the worker, and every command, is actually
//! confined by on this machine.

use std::path::Path;

use iii_shell_protocol::config::Config;
use iii_shell_protocol::doctor::{DoctorReport, ProcessReport};
use iii_shell_protocol::messages::{Reply, Request};
use serde_json::json;

use crate::cli::{DoctorArgs, ServeArgs};
use crate::spawn_executor::spawn_executor;
use iii_shell_broker::executor_client::ExecutorClient;

pub async fn run(args: DoctorArgs, serve: &ServeArgs) -> i32 {
    let written = match serve.seed() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    let config = match iii_shell_broker::worker_identity::resolve(&written) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("doctor: {e}");
            return 1;
        }
    };
    let config_id = match iii_shell_broker::worker_identity::config_id(
        serve.config_id.as_deref(),
        iii_shell_broker::engine::endpoint::namespace().as_deref(),
    ) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("doctor: {e}");
            return 1;
        }
    };
    let executor = match executor_report(&args, &config).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("doctor: {e}");
            return 1;
        }
    };
    let broker = broker_report(&config);
    let socket = args
        .socket
        .as_ref()
        .map(|p| socket_report(p, executor.executor.uid));
    let warnings = warnings(&config, &broker, &executor, socket.as_ref());
    if args.json {
        let v = json!({
            "configuration": {
                "config_id": config_id,
                "working_dir": config.working_dir,
                "turns_data_dir": config.turns.data_dir,
            },
            "broker": broker,
            "executor": executor.executor,
            "commands": executor.commands,
            "envelope": executor.envelope,
            "socket": socket,
            "warnings": warnings,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!("iii-shell doctor {}\n", iii_shell_protocol::VERSION);
        println!("configuration");
        println!("  config id       {config_id}");
        print!(
            "{}",
            crate::cmd_check_config::paths_report(&written, &config)
        );
        println!();
        print_human(&broker, &executor, socket.as_ref(), &warnings);
    }
    0
}

async fn executor_report(args: &DoctorArgs, config: &Config) -> Result<DoctorReport, String> {
    let (_child, stream) = match &args.socket {
        Some(p) => (
            None,
            tokio::net::UnixStream::connect(p)
                .await
                .map_err(|e| format!("cannot connect to {}: {e}", p.display()))?,
        ),
        None => {
            // Its environment may not be the service's: it must not move the service's store.
            let mut extra = vec!["--no-state".to_string()];
            if let Some(pin) = &args.pin_config {
                extra.push("--pin-config".to_string());
                extra.push(pin.display().to_string());
            }
            let (c, s) =
                spawn_executor(&extra).map_err(|e| format!("cannot start an executor: {e}"))?;
            (Some(c), s)
        }
    };
    let client = ExecutorClient::connect(stream)
        .await
        .map_err(|e| e.to_string())?;
    if args.socket.is_none() {
        let json = serde_json::to_string(config).map_err(|e| e.to_string())?;
        client
            .call(Request::SetPolicy {
                generation: 1,
                config_json: json,
            })
            .await
            .map_err(|e| format!("the executor refused the configuration: {}", e.message))?;
    }
    match client.call(Request::Doctor).await.map_err(|e| e.message)? {
        Reply::Doctor(r) => Ok(*r),
        _ => Err("unexpected reply".into()),
    }
}

/// Runs the broker's own confinement in a throwaway process and reads back what it got.
fn broker_report(config: &Config) -> ProcessReport {
    let exe = std::env::current_exe().unwrap_or_else(|_| "iii-shell".into());
    let seed = serde_json::to_string(config).unwrap_or_default();
    let out = std::process::Command::new(exe)
        .args(["probe", "broker", &seed])
        .env("RUST_LOG", "off")
        .output();
    match out {
        Ok(o) => serde_json::from_slice(&o.stdout).unwrap_or_else(|e| ProcessReport {
            role: "broker".into(),
            problems: vec![format!(
                "probe output unreadable: {e}: {}",
                String::from_utf8_lossy(&o.stderr)
            )],
            ..Default::default()
        }),
        Err(e) => ProcessReport {
            role: "broker".into(),
            problems: vec![format!("cannot run the broker probe: {e}")],
            ..Default::default()
        },
    }
}

fn socket_report(path: &Path, executor_uid: u32) -> serde_json::Value {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(md) => json!({
            "path": path.display().to_string(),
            "owner_uid": md.uid(),
            "mode": format!("{:04o}", md.mode() & 0o7777),
            "peer_is_command_uid": md.uid() == executor_uid,
        }),
        Err(e) => json!({"path": path.display().to_string(), "error": e.to_string()}),
    }
}

fn warnings(
    config: &Config,
    broker: &ProcessReport,
    ex: &DoctorReport,
    socket: Option<&serde_json::Value>,
) -> Vec<String> {
    let mut w = Vec::new();
    for p in broker.problems.iter().chain(ex.executor.problems.iter()) {
        w.push(p.clone());
    }
    w.extend(ex.commands.gaps.iter().cloned());
    w.extend(ex.commands.run_as_warning.iter().cloned());
    if ex.commands.foreign_chmod.starts_with("yes") && !config.fs.host_roots.is_empty() {
        w.push(format!(
            "a jailed command can change the mode of files it does not own: {}",
            ex.commands.foreign_chmod
        ));
    }
    if config.fs.host_roots.is_empty() && ex.commands.user.starts_with("0:") {
        w.push("unjailed as root: commands run as root (the operator's choice; set confinement.run_as to change it)".into());
    }
    if !ex.commands.cgroups {
        w.push(
            "no writable cgroup v2: a process that calls setsid() can outlive its job's kill"
                .into(),
        );
    }
    if !ex.commands.processes_bounded && !ex.commands.process_limits.is_empty() {
        w.push("nothing bounds how many processes a command may start (see the `limit` lines: pids.max is not enforced, and RLIMIT_NPROC is unset or does not bind root): enable the cgroup v2 pids controller for iii-shell's cgroup, or run commands as an unprivileged user (confinement.run_as) with confinement.rlimits.max_processes".into());
    }
    if broker.checks.iter().any(|(_, r)| r == "ALLOWED") {
        w.push("the broker can still open files or exec programs after its drop".into());
    }
    if let Some(s) = socket {
        if s["peer_is_command_uid"] == true {
            w.push("the executor socket's peer uid equals the uid commands run as: a command could connect to it (strict refuses this)".into());
        }
    }
    if config.fs.host_roots.is_empty() {
        w.push(
            "unjailed (fs.allow_unjailed): commands may read and write anywhere except confinement.secret_paths; jail the worker with fs.host_roots"
                .into(),
        );
    }
    w
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

fn caps(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(",")
    }
}

fn print_process(p: &ProcessReport) {
    println!("{} (pid {})", p.role, p.pid);
    println!("  uid/gid            {}/{}", p.uid, p.gid);
    println!("  capabilities       effective {} | permitted {} | bounding {} | ambient {} | inheritable {}", caps(&p.cap_effective), caps(&p.cap_permitted), caps(&p.cap_bounding), caps(&p.cap_ambient), caps(&p.cap_inheritable));
    println!("  no_new_privs       {}", yes(p.no_new_privs));
    println!("  seccomp            {}", p.seccomp);
    println!("  landlock           {}", p.landlock);
    println!(
        "  dumpable           {}",
        if p.dumpable {
            "yes (others may read its memory)"
        } else {
            "no"
        }
    );
    for (what, r) in &p.checks {
        println!("  check: {what:<28} {r}");
    }
}

fn print_human(
    broker: &ProcessReport,
    ex: &DoctorReport,
    socket: Option<&serde_json::Value>,
    warnings: &[String],
) {
    print_process(broker);
    println!();
    print_process(&ex.executor);
    println!("  child subreaper    {}", yes(ex.executor.subreaper));
    println!(
        "  envelope           {}",
        ex.envelope
            .clone()
            .unwrap_or_else(|| "not pinned (reloads may widen the policy)".into())
    );
    if let Some(s) = socket {
        println!("  socket             {s}");
    }
    let c = &ex.commands;
    println!(
        "\ncommands (mode {}, {})",
        c.mode,
        if c.jailed { "jailed" } else { "unjailed" }
    );
    println!(
        "  landlock           {} (kernel ABI {}, {} rules)",
        c.landlock, c.landlock_abi, c.landlock_rules
    );
    println!(
        "  scoping            {}",
        if c.scoping {
            "signals and abstract sockets limited to the command's own domain"
        } else {
            "NO"
        }
    );
    println!("  network            {}", c.network);
    println!(
        "  seccomp denies     {}",
        c.seccomp_denied
            .iter()
            .map(|s| s.trim_start_matches("SYS_"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "  rlimits            {}",
        c.rlimits
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "  job cgroups        {}{}",
        yes(c.cgroups),
        match c.cgroup_entry.as_str() {
            "clone3" => " (children start inside them: clone3 CLONE_INTO_CGROUP)",
            "cgroup.procs" => " (children join by writing cgroup.procs: slower, see BENCHMARKS.md)",
            _ => "",
        }
    );
    println!(
        "  pre-started        {}",
        match c.prestart.as_str() {
            "on" => "yes (shell::exec, exec_bg and pty::open run programs in processes that confined themselves ahead of time)",
            "off" => "no (switched off: --no-prestart or III_SHELL_PRESTART=0)",
            _ => "no (needs clone3 with CLONE_INTO_CGROUP and job cgroups)",
        }
    );
    for (k, v) in &c.process_limits {
        println!("  limit {k:<12} {v}");
    }
    println!("  user               {}", c.user);
    println!("  HOME               {}", c.home);
    println!("  cwd (none given)   {}", c.cwd);
    println!("  terminal shell     {}", c.terminal);
    println!("  chmod of / (root's) {}", c.foreign_chmod);
    println!("  a real command saw {}", c.observed.join(" | "));
    let j = &ex.jobs;
    println!(
        "  background jobs    {} running, {} finished kept ({} KiB of output); caps {} finished / {} MiB, oldest finished dropped first ({} dropped so far)",
        j.running,
        j.finished,
        j.finished_bytes / 1024,
        j.finished_max,
        j.finished_max_bytes >> 20,
        j.evicted
    );
    if warnings.is_empty() {
        println!("\nno warnings");
    } else {
        println!("\nwarnings:");
        for w in warnings {
            println!("  - {w}");
        }
    }
}
