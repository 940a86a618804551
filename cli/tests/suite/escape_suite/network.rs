//! The network modes (cases 140 and up): `deny` refuses every IP, packet and netlink socket
//! with EACCES (the seccomp socket-family rule), Unix sockets keep working, a call may tighten
//! the mode for itself and never widen it, and what cannot be enforced runs as `deny` (or is
//! refused under `strict`). Each command reports through `iii-shell probe network`.

use super::*;
use serde_json::Value;

/// An address in TEST-NET-1 (RFC 5737): routed nowhere. Under `deny` no socket for it is
/// ever made, so nothing is sent.
const OUTSIDE: &str = "192.0.2.1:53";

/// The lines `iii-shell probe network ADDR` prints for a command under `deny`.
fn denied_lines(addr: &str) -> Vec<String> {
    let eacces = |l: &str| errno_line(l, libc::EACCES);
    vec![
        "network deny (IP sockets refused: Permission denied (os error 13); seccomp socket-family rule)".to_string(),
        eacces("socket inet stream"),
        eacces("socket inet dgram"),
        eacces("socket inet6 dgram"),
        eacces("socket inet raw"),
        eacces("socket packet raw"),
        eacces("socket netlink route"),
        "socket unix stream ok".into(),
        "socket unix dgram ok".into(),
        "socketpair unix ok".into(),
        eacces("socketpair inet"),
        eacces(&format!("udp sendto {addr}")),
        eacces(&format!("tcp connect {addr}")),
    ]
}

fn lines(out: &str) -> Vec<String> {
    out.lines().map(str::to_string).collect()
}

/// The probe through `shell::exec`, with `network` when given.
async fn probe_exec(h: &Harness, cwd: Option<&str>, addr: &str, network: Option<&str>) -> Value {
    let bin = s(bin());
    let mut p = json!({"command": bin, "args": ["probe", "network", addr], "timeout_ms": 20_000});
    if let Some(c) = cwd {
        p["cwd"] = json!(c);
    }
    if let Some(n) = network {
        p["network"] = json!(n);
    }
    h.call("shell::exec", p)
        .await
        .unwrap_or_else(|e| json!({"code": e.code.as_str(), "message": e.message}))
}

fn stdout_lines(v: &Value) -> Vec<String> {
    assert_eq!(v["exit_code"], json!(0), "{v}");
    lines(v["stdout"].as_str().unwrap())
}

#[tokio::test]
async fn escape_140_network_deny_refuses_every_ip_packet_and_netlink_socket_as_root() {
    let h = Harness::new(with_network(NetworkAccess::Deny)).await;
    // A TCP listener on the host's loopback: not reachable either.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let local = listener.local_addr().unwrap().to_string();
    for addr in [OUTSIDE, local.as_str()] {
        assert_eq!(
            stdout_lines(&probe_exec(&h, None, addr, None).await),
            denied_lines(addr)
        );
    }
}

#[tokio::test]
async fn escape_141_network_deny_as_the_command_user() {
    require_root!("run_as cases");
    let j = user_jail();
    let mut c = with_run_as(&j, Some("4242:4242"));
    c.confinement.network = NetworkAccess::Deny;
    let h = Harness::new(c).await;
    // Unprivileged, raw and packet sockets would be EPERM; the rule answers first.
    assert_eq!(
        stdout_lines(&probe_exec(&h, Some("."), OUTSIDE, None).await),
        denied_lines(OUTSIDE)
    );
}

#[tokio::test]
async fn escape_142_a_call_tightens_its_own_network_on_every_path() {
    require_root!("run_as cases");
    let j = Jail::new();
    let h = Harness::new(with_run_as(&j, Some("root"))).await;
    // The same harness, without the field: the host's network (allow).
    let open = stdout_lines(&probe_exec(&h, Some("."), OUTSIDE, None).await);
    assert_eq!(open[0], "network allow (the host's network)");
    assert_eq!(open[2], "socket inet dgram ok");
    assert_eq!(
        stdout_lines(&probe_exec(&h, Some("."), OUTSIDE, Some("deny")).await),
        denied_lines(OUTSIDE)
    );
    // exec_bg and a terminal session write the probe's lines to a file in the root.
    let script = |tag: &str| {
        format!(
            "{} probe network {OUTSIDE} > {tag}.tmp && mv {tag}.tmp {tag}.out",
            q(bin())
        )
    };
    h.ok(
        "shell::exec_bg",
        json!({"command": "sh", "args": ["-c", script("bg")], "cwd": ".", "network": "deny"}),
    )
    .await;
    h.ok(
        "shell::pty::open",
        json!({"cwd": s(&j.root), "cols": 80, "rows": 24,
               "output_function_id": "iii::shell-ui::pty-output::console-escape142",
               "program": "sh", "args": ["-c", script("pty")], "network": "deny"}),
    )
    .await;
    for tag in ["bg", "pty"] {
        let out = j.root.join(format!("{tag}.out"));
        assert!(
            eventually(Duration::from_secs(20), || out.exists()).await,
            "{tag}: the probe never wrote its result"
        );
        assert_eq!(
            lines(&std::fs::read_to_string(out).unwrap()),
            denied_lines(OUTSIDE),
            "{tag}"
        );
    }
}

#[tokio::test]
async fn escape_143_a_call_never_widens_the_network() {
    let h = Harness::new(with_network(NetworkAccess::Deny)).await;
    let bin = s(bin());
    for wider in ["allow", "deny_bind", "loopback"] {
        let want = format!(
            "network {wider} is wider than the configured confinement.network deny: a call may only tighten it"
        );
        for (f, p) in [
            (
                "shell::exec",
                json!({"command": bin, "args": ["probe", "network"], "network": wider}),
            ),
            (
                "shell::exec_bg",
                json!({"command": bin, "args": ["probe", "network"], "network": wider}),
            ),
            (
                "shell::pty::open",
                json!({"cwd": "/", "cols": 80, "rows": 24,
                "output_function_id": "iii::shell-ui::pty-output::console-escape143",
                "program": bin, "args": ["probe", "network"], "network": wider}),
            ),
        ] {
            let e = h.err(f, p).await;
            assert_eq!(
                (e.code.as_str(), e.message.as_str()),
                ("S210", want.as_str()),
                "{f}"
            );
        }
    }
    // Not a mode at all: the request is malformed (S210 too).
    let e = h
        .err(
            "shell::exec",
            json!({"command": bin, "network": "everything"}),
        )
        .await;
    assert_eq!(e.code, "S210", "{}", e.message);
}

#[tokio::test]
async fn escape_144_what_cannot_be_enforced_runs_as_deny_or_is_refused_when_strict() {
    // `loopback` (no namespace is made yet) and a per-call `deny_bind` under `allow` (no
    // Landlock TCP rule to add) run as `deny`.
    let h = Harness::new(with_network(NetworkAccess::Loopback)).await;
    assert_eq!(
        stdout_lines(&probe_exec(&h, None, OUTSIDE, None).await),
        denied_lines(OUTSIDE)
    );
    let h = Harness::new(with_network(NetworkAccess::Allow)).await;
    for n in ["loopback", "deny_bind"] {
        assert_eq!(
            stdout_lines(&probe_exec(&h, None, OUTSIDE, Some(n)).await),
            denied_lines(OUTSIDE),
            "{n}"
        );
    }
    // Strict: the call is refused (S216) naming what is missing; nothing ran.
    let j = Jail::new();
    let mut c = with_run_as(&j, Some("4242:4242"));
    c.confinement.mode = iii_shell_protocol::config::ConfinementMode::Strict;
    let h = Harness::new(c).await;
    let v = probe_exec(&h, Some("."), OUTSIDE, Some("loopback")).await;
    assert_eq!(v["code"], json!("S216"), "{v}");
    assert_eq!(
        v["message"],
        json!(format!(
            "network loopback cannot be enforced (confinement.mode: strict): missing {}",
            iii_shell_policy::network::NO_LOOPBACK
        ))
    );
}

#[tokio::test]
async fn escape_145_curl_to_an_outside_address_fails_at_once_under_deny() {
    let curl = require!(
        ["/usr/bin/curl", "/bin/curl"]
            .into_iter()
            .find(|p| Path::new(p).exists()),
        "curl"
    );
    let h = Harness::new(with_network(NetworkAccess::Deny)).await;
    // A hang would run into the call's timeout (20 s) and report timed_out; the refusal
    // is immediate, so curl's own 15 s connect timeout is never reached either.
    let o = run(
        &h,
        None,
        &[curl, "-sS", "--connect-timeout", "15", "http://192.0.2.1/"],
    )
    .await;
    // curl's "Couldn't connect to server"; `run` has checked it did not time out.
    assert_eq!(o.code, Some(7), "{o:?}");
}

/// The `network` line of `doctor` under `config`.
async fn doctor_network(config: Config) -> (String, Vec<String>) {
    use iii_shell_protocol::messages::Reply;
    let h = Harness::new(config).await;
    let Reply::Doctor(report) = h.services.executor.call(Request::Doctor).await.unwrap() else {
        panic!("not a doctor reply")
    };
    (report.commands.network, report.commands.gaps)
}

#[tokio::test]
async fn escape_146_doctor_shows_the_mode_its_mechanism_and_what_a_command_sees() {
    let (deny, _) = doctor_network(with_network(NetworkAccess::Deny)).await;
    assert_eq!(
        deny,
        "deny: seccomp: socket/socketpair of every family but AF_UNIX fail with EACCES; Landlock TCP rules as a second layer where the kernel has them; a command sees: network deny (IP sockets refused: Permission denied (os error 13); seccomp socket-family rule)"
    );
    let (allow, _) = doctor_network(with_network(NetworkAccess::Allow)).await;
    assert_eq!(
        allow,
        "allow: nothing restricts it; a command sees: network allow (the host's network)"
    );
    let (loopback, gaps) = doctor_network(with_network(NetworkAccess::Loopback)).await;
    assert!(
        loopback.starts_with("loopback (runs as deny): seccomp: ")
            && loopback.ends_with("a command sees: network deny (IP sockets refused: Permission denied (os error 13); seccomp socket-family rule)"),
        "{loopback}"
    );
    assert!(
        gaps.contains(&format!(
            "confinement.network loopback runs as deny: missing {}",
            iii_shell_policy::network::NO_LOOPBACK
        )),
        "{gaps:?}"
    );
}
