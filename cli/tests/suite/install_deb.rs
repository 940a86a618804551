//! The Debian package, end to end: built from the binary under test
//! (`packaging/deb/build-deb`), installed into a fresh Debian root that this test builds
//! with debootstrap from the Debian mirror this machine's apt uses
//! (`packaging/deb/make-root`), both halves started the way their units start them (the
//! installed unit files and an administrator's drop-in are read for ExecStart, User,
//! Environment, WorkingDirectory and RuntimeDirectory), `iii-shell doctor` and calls run,
//! the one-unit alternative (`iii-shell.service`) started and called the same way, then the
//! package removed (only the configuration, the workspace and the units' enable
//! state may stay) and purged (nothing may stay but the two system users).
//!
//! It takes a minute or two and needs root, so it is `#[ignore]`d in the ordinary run;
//! `.ci/run` runs it with `--ignored`. A step that cannot run here fails the test naming the
//! step and the reason.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{is_root, BIN, WAIT};
use iii_test_engine::TestEngine;
use serde_json::{json, Value};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
const NAMESPACE: &str = "host-a";
const WORKER: &str = "shell-installtest";
const ONE_UNIT_WORKER: &str = "shell-installtest-one";

/// Fails the test naming the step.
fn fail(step: &str, why: impl std::fmt::Display) -> ! {
    panic!("install test: step '{step}' failed: {why}");
}

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn announce(step: &str) {
    let t = START.get_or_init(Instant::now).elapsed();
    eprintln!("install test: [{:>6.1}s] {step}", t.as_secs_f64());
}

fn output_text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a host command for `step`; fails the step unless it succeeds.
fn run(step: &str, cmd: &mut Command) -> Output {
    let o = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| fail(step, format!("cannot run {cmd:?}: {e}")));
    if !o.status.success() {
        fail(step, format!("{cmd:?}: {}", output_text(&o)));
    }
    o
}

/// `chroot ROOT ARGS` as root, with the environment a root shell there would have.
fn in_root(root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("chroot");
    c.arg(root)
        .args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("LANG", "C.UTF-8");
    c
}

/// A Debian root under a temp dir, with the file system mounts a booted Debian has and the
/// package's scripts and the executor need (/proc, /sys with the cgroup hierarchy, /dev).
/// Dropping it kills every process left in the root and undoes the mounts; if a mount is
/// still there afterwards the directory is kept rather than removed through it.
struct Root {
    base: Option<tempfile::TempDir>,
    path: PathBuf,
    mounts: Vec<PathBuf>,
}

impl Root {
    fn path(&self) -> &Path {
        &self.path
    }

    fn mount(&mut self, step: &str, args: &[&str], target: &str) {
        let t = self.path.join(target);
        std::fs::create_dir_all(&t).unwrap_or_else(|e| fail(step, e));
        run(step, Command::new("mount").args(args).arg(&t));
        self.mounts.push(t);
    }

    /// Pids whose root directory is this root.
    fn processes(&self) -> Vec<i32> {
        let me = std::fs::canonicalize(&self.path).unwrap_or_else(|_| self.path.clone());
        let mut v = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if std::fs::read_link(e.path().join("root")).is_ok_and(|r| r == me) {
                v.push(pid);
            }
        }
        v
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        for pid in self.processes() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(200));
        for m in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("-R").arg("-l").arg(m).status();
        }
        let base = self.base.take();
        let mounted = std::fs::read_to_string("/proc/self/mountinfo")
            .map(|t| {
                let me = self.path.to_string_lossy().into_owned();
                t.lines()
                    .any(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&me)))
            })
            .unwrap_or(true);
        if mounted {
            if let Some(b) = base {
                eprintln!(
                    "install test: a mount under {} is still there; keeping it",
                    b.keep().display()
                );
            }
        }
    }
}

/// Every path under `root` except the kernel's, the runtime's and dpkg's/apt's own
/// bookkeeping; the account databases are files that change in place (the users stay on
/// purge, as Debian's policy asks), so their backups and lock are left out too.
fn snapshot(root: &Path) -> BTreeSet<String> {
    const SKIP: &[&str] = &[
        "/proc",
        "/sys",
        "/dev",
        "/run",
        "/tmp",
        "/var/tmp",
        "/var/log",
        "/var/cache",
        "/var/lib/dpkg",
        "/var/lib/apt",
        "/etc/passwd-",
        "/etc/group-",
        "/etc/shadow-",
        "/etc/gshadow-",
        "/etc/.pwd.lock",
    ];
    let mut out = BTreeSet::new();
    let mut stack = vec![PathBuf::from("/")];
    while let Some(rel) = stack.pop() {
        let abs = root.join(rel.strip_prefix("/").unwrap());
        let Ok(entries) = std::fs::read_dir(&abs) else {
            continue;
        };
        for e in entries.flatten() {
            let r = rel.join(e.file_name());
            let s = r.to_string_lossy().into_owned();
            if SKIP.contains(&s.as_str()) {
                continue;
            }
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            out.insert(s);
            if is_dir {
                stack.push(r);
            }
        }
    }
    out
}

fn added(before: &BTreeSet<String>, now: &BTreeSet<String>) -> Vec<String> {
    now.difference(before).cloned().collect()
}

/// uid and gid of `user` in the root's /etc/passwd.
fn user_in(root: &Path, user: &str) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(root.join("etc/passwd")).ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() > 3 && f[0] == user {
            Some((f[2].parse().ok()?, f[3].parse().ok()?))
        } else {
            None
        }
    })
}

/// What a unit's [Service] section says about how to start it, with the administrator's
/// drop-ins (`/etc/systemd/system/UNIT.d/*.conf`) applied in order, as systemd does.
#[derive(Debug, Default)]
struct Unit {
    exec_start: Vec<String>,
    env: BTreeMap<String, String>,
    user: Option<String>,
    group: Option<String>,
    working_dir: Option<String>,
    runtime_dir: Option<String>,
    runtime_dir_mode: Option<u32>,
}

fn read_unit(root: &Path, name: &str) -> Unit {
    let step = "read the installed units";
    let mut files = vec![root.join("usr/lib/systemd/system").join(name)];
    let dropins = root.join("etc/systemd/system").join(format!("{name}.d"));
    let mut extra: Vec<PathBuf> = std::fs::read_dir(&dropins)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .collect();
    extra.sort();
    files.extend(extra);
    let mut u = Unit::default();
    for f in files {
        let text = std::fs::read_to_string(&f)
            .unwrap_or_else(|e| fail(step, format!("{}: {e}", f.display())));
        let mut section = String::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if line.starts_with('[') {
                section = line.to_string();
                continue;
            }
            if section != "[Service]" {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                fail(
                    step,
                    format!("{}: not a key=value line: {line}", f.display()),
                );
            };
            let words = || {
                shell_words::split(v)
                    .unwrap_or_else(|e| fail(step, format!("{}: {line}: {e}", f.display())))
            };
            match k.trim() {
                "ExecStart" => u.exec_start = words(),
                "Environment" => {
                    for w in words() {
                        let (k, v) = w
                            .split_once('=')
                            .unwrap_or_else(|| fail(step, format!("{}: {line}", f.display())));
                        u.env.insert(k.into(), v.into());
                    }
                }
                "User" => u.user = Some(v.into()),
                "Group" => u.group = Some(v.into()),
                "WorkingDirectory" => u.working_dir = Some(v.into()),
                "RuntimeDirectory" => u.runtime_dir = Some(v.into()),
                "RuntimeDirectoryMode" => {
                    u.runtime_dir_mode = Some(
                        u32::from_str_radix(v, 8)
                            .unwrap_or_else(|e| fail(step, format!("{line}: {e}"))),
                    )
                }
                _ => {}
            }
        }
    }
    if u.exec_start.is_empty() {
        fail(step, format!("{name} has no ExecStart"));
    }
    u
}

/// Starts `unit` inside `root` the way systemd would: its runtime directory created, its
/// user and group, its working directory, only its environment (plus systemd's PATH), and
/// stderr to `log`.
fn start_unit(root: &Path, unit: &Unit, log: &Path) -> Child {
    let step = "start the units";
    if let Some(d) = &unit.runtime_dir {
        let p = root.join("run").join(d);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| fail(step, e));
        let mode = unit.runtime_dir_mode.unwrap_or(0o755);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| fail(step, e));
    }
    let (uid, gid) = match &unit.user {
        None => (0, 0),
        Some(u) => {
            let (uid, mut gid) = user_in(root, u)
                .unwrap_or_else(|| fail(step, format!("User={u} does not exist in the root")));
            if let Some(g) = &unit.group {
                let text = std::fs::read_to_string(root.join("etc/group")).unwrap_or_default();
                gid = text
                    .lines()
                    .find_map(|l| {
                        let f: Vec<&str> = l.split(':').collect();
                        (f.len() > 2 && f[0] == g).then(|| f[2].parse().ok())?
                    })
                    .unwrap_or_else(|| fail(step, format!("Group={g} does not exist in the root")));
            }
            (uid, gid)
        }
    };
    let root_c = CString::new(root.as_os_str().as_encoded_bytes()).unwrap();
    let wd_c = CString::new(unit.working_dir.clone().unwrap_or_else(|| "/".into())).unwrap();
    let mut cmd = Command::new(&unit.exec_start[0]);
    cmd.args(&unit.exec_start[1..])
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin")
        .envs(&unit.env)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::fs::File::create(log).unwrap()))
        .stderr(Stdio::from(
            std::fs::File::create(log.with_extension("err")).unwrap(),
        ));
    // SAFETY: only raw system calls (chroot, chdir, setgroups, setresgid, setresuid) on
    // strings prepared before the fork; nothing is allocated.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if libc::chroot(root_c.as_ptr()) != 0
                || libc::chdir(wd_c.as_ptr()) != 0
                || libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
        .unwrap_or_else(|e| fail(step, format!("{:?}: {e}", unit.exec_start)))
}

fn log_of(log: &Path) -> String {
    std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn term(child: &mut Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
}

fn dpkg_status(root: &Path) -> String {
    let o = in_root(root, &["dpkg-query", "-W", "-f=${Status}", "iii-shell"])
        .output()
        .expect("dpkg-query");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "builds a Debian root with debootstrap (a minute or two, root, the Debian mirror): .ci/run runs it with --ignored"]
async fn the_package_installs_serves_and_uninstalls_cleanly() {
    let step = "preconditions";
    announce(step);
    if !is_root() {
        fail(
            step,
            "needs root (debootstrap, chroot, mount, dpkg into the root)",
        );
    }
    for tool in ["debootstrap", "dpkg-deb", "chroot", "mount"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            fail(
                step,
                format!("{tool} is not installed (.ci/run installs debootstrap with apt-get)"),
            );
        }
    }

    let step = "build the package";
    announce(step);
    let out = tempfile::tempdir().unwrap();
    let o = run(
        step,
        Command::new(format!("{REPO}/packaging/deb/build-deb"))
            .arg(BIN)
            .arg(out.path()),
    );
    let deb = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    let listing = run(step, Command::new("dpkg-deb").arg("-c").arg(&deb));
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    for f in [
        "./usr/bin/iii-shell",
        "./usr/lib/systemd/system/iii-shell-executor.service",
        "./usr/lib/systemd/system/iii-shell-broker.service",
        "./usr/lib/systemd/system/iii-shell.service",
        "./usr/lib/sysusers.d/iii-shell.conf",
        "./usr/lib/tmpfiles.d/iii-shell.conf",
        "./etc/iii-shell/config.yaml",
        "./etc/iii-shell/envelope.yaml",
        "./usr/share/doc/iii-shell/operators-guide.md",
        "./usr/share/doc/iii-shell/copyright",
    ] {
        if !listing
            .lines()
            .any(|l| l.ends_with(f) || l.contains(&format!("{f} -> ")))
        {
            fail(step, format!("the package lacks {f}:\n{listing}"));
        }
    }

    let step = "build a fresh Debian root (debootstrap)";
    announce(step);
    let base = tempfile::Builder::new()
        .prefix("iii-shell-root")
        .tempdir_in("/var/tmp")
        .unwrap();
    let mut root = Root {
        path: base.path().join("debian"),
        base: Some(base),
        mounts: Vec::new(),
    };
    run(
        step,
        Command::new(format!("{REPO}/packaging/deb/make-root")).arg(root.path()),
    );

    let step = "mount /proc, /sys and /dev in the root";
    announce(step);
    root.mount(step, &["-t", "proc", "proc"], "proc");
    root.mount(step, &["--rbind", "/sys"], "sys");
    run(
        step,
        Command::new("mount")
            .args(["--make-rslave"])
            .arg(root.path().join("sys")),
    );
    root.mount(step, &["--bind", "/dev"], "dev");
    root.mount(step, &["--bind", "/dev/pts"], "dev/pts");
    let r = root.path().to_path_buf();

    // The administrator's drop-in for this host, written before the package arrives (it is
    // the administrator's, so it stays after a purge): the packaged example with this test
    // engine's address.
    let engine = TestEngine::start().await;
    let example = std::fs::read_to_string(format!(
        "{REPO}/packaging/systemd/examples/iii-shell-broker.service.d/10-host.conf"
    ))
    .unwrap();
    let dropin: String = example
        .lines()
        .map(|l| {
            if l.starts_with("Environment=III_URL=") {
                format!("Environment=III_URL={}", engine.url())
            } else if l.starts_with("Environment=III_WORKER_NAME=") {
                format!("Environment=III_WORKER_NAME={WORKER}")
            } else if l.starts_with("Environment=III_NAMESPACE=") {
                format!("Environment=III_NAMESPACE={NAMESPACE}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let dropin_dir = r.join("etc/systemd/system/iii-shell-broker.service.d");
    std::fs::create_dir_all(&dropin_dir).unwrap();
    std::fs::write(dropin_dir.join("10-host.conf"), dropin.clone() + "\n").unwrap();
    // The same for the one-unit alternative, under another name.
    let one_dir = r.join("etc/systemd/system/iii-shell.service.d");
    std::fs::create_dir_all(&one_dir).unwrap();
    std::fs::write(
        one_dir.join("10-host.conf"),
        dropin.replace(WORKER, ONE_UNIT_WORKER) + "\n",
    )
    .unwrap();
    let before = snapshot(&r);

    let step = "install the package (dpkg -i)";
    announce(step);
    std::fs::copy(&deb, r.join("tmp/iii-shell.deb")).unwrap();
    let o = run(
        step,
        &mut in_root(&r, &["dpkg", "-i", "/tmp/iii-shell.deb"]),
    );
    eprintln!("{}", String::from_utf8_lossy(&o.stdout));
    if dpkg_status(&r) != "install ok installed" {
        fail(step, format!("dpkg status {:?}", dpkg_status(&r)));
    }
    let (broker_uid, broker_gid) =
        user_in(&r, "iii-shell").unwrap_or_else(|| fail(step, "no iii-shell user"));
    let (cmd_uid, cmd_gid) =
        user_in(&r, "iii-shell-cmd").unwrap_or_else(|| fail(step, "no iii-shell-cmd user"));
    assert_ne!(broker_uid, 0);
    assert_ne!(cmd_uid, 0);
    let ws = std::fs::metadata(r.join("var/lib/iii-shell/workspace"))
        .unwrap_or_else(|e| fail(step, format!("workspace: {e}")));
    assert_eq!(
        (ws.uid(), ws.gid(), ws.mode() & 0o7777),
        (cmd_uid, cmd_gid, 0o750),
        "workspace owner and mode"
    );
    for u in ["iii-shell-executor.service", "iii-shell-broker.service"] {
        let link = r.join("etc/systemd/system/multi-user.target.wants").join(u);
        if std::fs::symlink_metadata(&link).is_err() {
            fail(step, format!("{u} was not enabled"));
        }
    }
    let envelope = std::fs::metadata(r.join("etc/iii-shell/envelope.yaml")).unwrap();
    assert_eq!(
        (envelope.uid(), envelope.mode() & 0o022),
        (0, 0),
        "the envelope is root's alone"
    );

    let step = "start both halves the way the units do";
    announce(step);
    let logs = tempfile::tempdir().unwrap();
    let ex_unit = read_unit(&r, "iii-shell-executor.service");
    let br_unit = read_unit(&r, "iii-shell-broker.service");
    assert_eq!(
        br_unit.env.get("III_WORKER_NAME").map(String::as_str),
        Some(WORKER),
        "the drop-in applies"
    );
    let ex_log = logs.path().join("executor.log");
    let br_log = logs.path().join("broker.log");
    let mut executor = start_unit(&r, &ex_unit, &ex_log);
    let sock = r.join("run/iii-shell/executor.sock");
    let deadline = Instant::now() + WAIT;
    while !sock.exists() {
        if let Ok(Some(s)) = executor.try_wait() {
            fail(
                step,
                format!("the executor exited ({s}):\n{}", log_of(&ex_log)),
            );
        }
        if Instant::now() > deadline {
            fail(
                step,
                format!("no executor socket after {WAIT:?}:\n{}", log_of(&ex_log)),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let md = std::fs::metadata(&sock).unwrap();
    assert_eq!(
        (md.uid(), md.mode() & 0o777),
        (broker_uid, 0o600),
        "the socket is the broker's alone"
    );
    let mut broker = start_unit(&r, &br_unit, &br_log);
    let up = engine
        .wait_until(WAIT, |e| e.function_in(NAMESPACE, "shell::exec").is_some())
        .await;
    if !up {
        fail(
            step,
            format!(
                "the broker never registered:\n{}\n--- executor\n{}",
                log_of(&br_log),
                log_of(&ex_log)
            ),
        );
    }
    let info = engine
        .worker_info(WORKER)
        .unwrap_or_else(|| fail(step, "no worker of the drop-in's name"));
    assert_eq!(info.namespace.as_deref(), Some(NAMESPACE));
    let broker_log = log_of(&br_log);
    assert!(
        broker_log.contains(&format!("uid={broker_uid}"))
            && broker_log.contains(&format!("gid={broker_gid}")),
        "the broker runs as iii-shell:\n{broker_log}"
    );

    let step = "call shell::exec through the engine";
    announce(step);
    let caller = engine.client().await;
    let r1 = caller
        .call_in_namespace(
            NAMESPACE,
            "shell::exec",
            json!({"command": "sh", "args": ["-c", "echo installed > proof.txt; pwd; grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status"]}),
        )
        .await
        .unwrap_or_else(|e| fail(step, format!("{e:?}\n{}\n--- executor\n{}", log_of(&br_log), log_of(&ex_log))));
    assert_eq!(r1["exit_code"], 0, "{r1}");
    assert_eq!(
        r1["stdout"].as_str().unwrap_or_default(),
        "/var/lib/iii-shell/workspace\nNoNewPrivs:\t1\nSeccomp:\t2\n",
        "{r1}"
    );
    assert_eq!(
        std::fs::read_to_string(r.join("var/lib/iii-shell/workspace/proof.txt"))
            .ok()
            .as_deref(),
        Some("installed\n")
    );
    // Jailed by default: nothing outside the workspace and the scratch paths is writable.
    let r2 = caller
        .call_in_namespace(
            NAMESPACE,
            "shell::exec",
            json!({"command": "touch", "args": ["/var/lib/iii-shell/escaped"]}),
        )
        .await
        .unwrap_or_else(|e| fail(step, format!("{e:?}")));
    assert_ne!(r2["exit_code"], 0, "{r2}");
    assert!(!r.join("var/lib/iii-shell/escaped").exists());

    let step = "iii-shell doctor";
    announce(step);
    let o = run(
        step,
        &mut in_root(
            &r,
            &[
                "iii-shell",
                "doctor",
                "--json",
                "--config",
                "/etc/iii-shell/config.yaml",
                "--pin-config",
                "/etc/iii-shell/envelope.yaml",
            ],
        ),
    );
    let d: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| fail(step, format!("{e}: {}", output_text(&o))));
    assert_eq!(d["commands"]["jailed"], true, "{d:#}");
    assert_eq!(d["executor"]["no_new_privs"], true, "{d:#}");
    assert_eq!(d["executor"]["cap_effective"], json!([]), "{d:#}");
    assert_eq!(
        d["broker"]["uid"], broker_uid,
        "the broker probe runs as the package's user: {d:#}"
    );
    assert!(
        d["envelope"]
            .as_str()
            .unwrap_or_default()
            .contains("/var/lib/iii-shell/workspace"),
        "{d:#}"
    );
    // And against the running executor, as the broker's user (the only one it lets in).
    let o = run(
        step,
        &mut in_root(
            &r,
            &[
                "setpriv",
                &format!("--reuid={broker_uid}"),
                &format!("--regid={broker_gid}"),
                "--clear-groups",
                "iii-shell",
                "doctor",
                "--json",
                "--socket",
                "/run/iii-shell/executor.sock",
                "--config",
                "/etc/iii-shell/config.yaml",
            ],
        ),
    );
    let d: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| fail(step, format!("{e}: {}", output_text(&o))));
    assert_eq!(d["socket"]["owner_uid"], broker_uid, "{d:#}");
    assert_eq!(d["socket"]["mode"], "0600", "{d:#}");
    assert_eq!(d["socket"]["peer_is_command_uid"], false, "{d:#}");
    assert_eq!(
        d["commands"]["jailed"], true,
        "the running executor has the broker's policy: {d:#}"
    );

    let step = "iii-shell call";
    announce(step);
    let o = run(
        step,
        &mut in_root(&r, &["sh", "-c", "cd /var/lib/iii-shell && exec iii-shell call --config /etc/iii-shell/config.yaml shell::exec '{\"command\":\"cat\",\"args\":[\"proof.txt\"]}'"]),
    );
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| fail(step, format!("{e}: {}", output_text(&o))));
    assert_eq!(v["stdout"], "installed\n", "{v}");

    let step = "stop both halves";
    announce(step);
    term(&mut broker);
    match wait_exit(&mut broker, Duration::from_secs(45)) {
        Some(s) if s.success() => {}
        other => fail(step, format!("broker: {other:?}\n{}", log_of(&br_log))),
    }
    term(&mut executor);
    match wait_exit(&mut executor, Duration::from_secs(25)) {
        Some(s) if s.success() => {}
        other => fail(step, format!("executor: {other:?}\n{}", log_of(&ex_log))),
    }
    // Nothing listens any more. The socket file itself may stay: the executor runs as the
    // command user by then (confinement.run_as) and cannot unlink in root's runtime
    // directory; systemd removes that directory after the stop, and a stale socket is
    // replaced at the next start (bound as root).
    assert!(
        std::os::unix::net::UnixStream::connect(&sock).is_err(),
        "the stopped executor still accepts connections on its socket"
    );
    // systemd removes the runtime directory after the stop.
    let _ = std::fs::remove_dir_all(r.join("run/iii-shell"));
    if let Some(p) = root.processes().first() {
        fail(step, format!("process {p} is still running in the root"));
    }

    let step = "the one-unit alternative (iii-shell.service)";
    announce(step);
    let one_unit = read_unit(&r, "iii-shell.service");
    let one_log = logs.path().join("one-unit.log");
    let mut one = start_unit(&r, &one_unit, &one_log);
    let up = engine
        .wait_until(WAIT, |e| {
            e.worker_info(ONE_UNIT_WORKER)
                .is_some_and(|w| w.connected && w.namespace.as_deref() == Some(NAMESPACE))
                && e.function_in(NAMESPACE, "shell::exec").is_some()
        })
        .await;
    if !up {
        fail(step, format!("it never registered:\n{}", log_of(&one_log)));
    }
    let r3 = caller
        .call_in_namespace(
            NAMESPACE,
            "shell::exec",
            json!({"command": "cat", "args": ["proof.txt"]}),
        )
        .await
        .unwrap_or_else(|e| fail(step, format!("{e:?}\n{}", log_of(&one_log))));
    assert_eq!(r3["stdout"], "installed\n", "{r3}");
    term(&mut one);
    match wait_exit(&mut one, Duration::from_secs(45)) {
        Some(s) if s.success() => {}
        other => fail(step, format!("{other:?}\n{}", log_of(&one_log))),
    }
    if let Some(p) = root.processes().first() {
        fail(step, format!("process {p} is still running in the root"));
    }

    let step = "remove the package (dpkg -r): only configuration may stay";
    announce(step);
    let packaged_config = std::fs::read_to_string(r.join("etc/iii-shell/config.yaml")).unwrap();
    run(step, &mut in_root(&r, &["dpkg", "-r", "iii-shell"]));
    assert_eq!(dpkg_status(&r), "deinstall ok config-files");
    let left = added(&before, &snapshot(&r));
    let unexpected: Vec<_> = left
        .iter()
        .filter(|p| {
            !(p.starts_with("/etc/iii-shell")
                || p.starts_with("/var/lib/iii-shell")
                || (p.starts_with("/etc/systemd/system/multi-user.target.wants/iii-shell-"))
                || (p.starts_with("/var/lib/systemd/deb-systemd-helper-enabled/")
                    && p.contains("iii-shell")))
        })
        .collect();
    if !unexpected.is_empty() {
        fail(step, format!("left behind: {unexpected:#?}"));
    }
    assert!(
        left.contains(&"/etc/iii-shell/config.yaml".to_string()),
        "{left:#?}"
    );
    assert!(
        left.contains(&"/etc/iii-shell/envelope.yaml".to_string()),
        "{left:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(r.join("etc/iii-shell/config.yaml")).unwrap(),
        packaged_config
    );
    assert!(!r.join("usr/bin/iii-shell").exists());

    let step = "purge the package (dpkg -P): nothing may stay";
    announce(step);
    run(step, &mut in_root(&r, &["dpkg", "-P", "iii-shell"]));
    let left = added(&before, &snapshot(&r));
    if !left.is_empty() {
        fail(step, format!("left behind: {left:#?}"));
    }
    assert_eq!(dpkg_status(&r), "", "dpkg forgot the package");
    assert!(
        user_in(&r, "iii-shell").is_some(),
        "system users stay on purge (Debian policy)"
    );
    assert!(
        dropin_dir.join("10-host.conf").exists(),
        "the administrator's drop-in is not ours to remove"
    );
    drop(root);
}
