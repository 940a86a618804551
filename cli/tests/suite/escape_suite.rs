//! The escape suite: every way out of the confinement we know of, each asserted to fail in a
//! precise way (an errno, an S-code, a file left untouched), or — for the few things the
//! kernel cannot express — asserted to behave exactly as documented (`LIMIT` rows).
//!
//! Every case is its own test function with its own executor process (restrictions cannot be
//! undone, and every command is a fresh process anyway). Jailed cases use [`escape::Jail`]:
//! `<tmp>/root` is the jail, `<tmp>/outside/secret.txt` the thing to protect; scratch paths
//! are emptied (the temp dirs live under `/tmp`, a default scratch path) and the directory of
//! the `iii-shell` binary is a system path, so commands can run `iii-shell probe`. Cases that
//! need root, python3, bash or a recent Landlock ABI print `SKIPPED: …` and return, or fail
//! when `III_SHELL_REQUIRE_ROOT=1` (`.ci/run` sets it).
//!
//! | #   | case                                                     | expected |
//! |-----|----------------------------------------------------------|----------|
//! | 001 | control: a jailed command writes inside its root         | exit 0, file written |
//! | 002 | `touch /outside/x`                                       | Permission denied, outside untouched |
//! | 003 | `sh -c 'echo x > /outside/y'`                            | Permission denied, outside untouched |
//! | 004 | `cp f /outside/f`                                        | Permission denied, outside untouched |
//! | 005 | `mkdir /outside/d`                                       | Permission denied, outside untouched |
//! | 006 | `ln -s /etc /outside/l`                                  | Permission denied, outside untouched |
//! | 007 | `mv f /outside/f`                                        | Permission denied, `f` stays, outside untouched |
//! | 008 | two roots: write into a sibling dir of the second root   | Permission denied (the root itself: ok) |
//! | 009 | `cat` a denylisted file (in the root; `/etc/shadow`)     | Permission denied (the literal `/etc/shadow` argv: the advisory denylist first) |
//! | 010 | `head` a denylisted file                                 | Permission denied |
//! | 011 | `cat` a symlink in the root pointing at a denylisted file| Permission denied |
//! | 012 | `cat /proc/self/root/<denylisted>`                       | Permission denied |
//! | 013 | secret path under a *symlinked* system path (FIXED)      | Permission denied via link and target; sibling readable |
//! | 014 | `echo x > /proc/self/root/<outside>/f`                   | Permission denied, outside untouched |
//! | 015 | `/proc/<executor>/fd/*`: readlink, `ls -l`, open         | Permission denied (as root the fd numbers are listable: LIMIT) |
//! | 016 | same with `confinement.landlock: false` (dumpable 0 only)| Permission denied |
//! | 017 | `/proc/<executor>/cwd`: list, readlink                   | Permission denied |
//! | 018 | `/proc/<executor>/environ`, `/mem`, `/proc/1/root`       | Permission denied |
//! | 019 | an fd the executor inherited without CLOEXEC (FIXED)     | command sees only 0 1 2 (+ ls's own 3) |
//! | 020 | `iii-shell probe status` as a command                    | NoNewPrivs 1, Seccomp 2, Cap* all 0 (root) |
//! | 021 | the executor's own /proc status                          | NoNewPrivs 1, Seccomp 2, Cap* all 0 (root) |
//! | 022–064 | `probe syscall NAME` for each denied system call     | `errno=1` (EPERM); clone3 `errno=38` (ENOSYS) |
//! | 065 | `getpid` under the filter                                | ok |
//! | 066 | `unshare(CLONE_FILES)` under the filter                  | ok |
//! | 067 | control, `seccomp: false` pinned+live: ptrace            | ok |
//! | 068 | control, `seccomp: false`: io_uring_setup                | ok |
//! | 069 | control, `seccomp: false`: keyctl                        | ok |
//! | 070 | control, `seccomp: false`: unshare(CLONE_NEWUSER)        | ok |
//! | 071 | `seccomp_allow: [ptrace]` in the live config only        | errno=1: the executor's start-up filter (no envelope) still denies it |
//! | 072 | `seccomp_allow: [ptrace]` pinned (`--pin-config`) + live | ptrace ok; keyctl still errno=1 |
//! | 073 | `kill -0 <executor>`                                     | Operation not permitted; executor alive |
//! | 074 | `kill -TERM <test process>`, `kill -0 1`                 | Operation not permitted |
//! | 105 | `kill -0`/`-KILL` each executor thread by its tid        | Operation not permitted; executor alive |
//! | 075 | connect to an abstract unix socket of the test process   | EPERM (Landlock scope) |
//! | 076 | uid 65534 connects to an executor socket (peer uid 0)    | EACCES (mode 0600, owner 0) — root |
//! | 077 | root connects to an executor socket for peer uid 65534   | closed without HelloAck — root |
//! | 078 | a command connects to an executor socket (peer 65534)    | EACCES (no CAP_DAC_OVERRIDE) — root |
//! | 079 | LIMIT: a jailed command connects to a pathname socket outside | connects (Landlock ABI ≤ 7 has no unix-connect right) |
//! | 080 | fs: write/mkdir through `root/link -> /outside`          | S215, outside untouched |
//! | 081 | fs: read through `root/leaf -> /outside/secret.txt`      | S215; stat shows the link, not the target |
//! | 082 | fs: write to `root/leaf`                                 | the link is replaced by a file; outside untouched |
//! | 083 | fs: `..` paths (write, read, mkdir, rm, chmod, mv)       | S215, outside untouched |
//! | 084 | fs: `/tmp/x/root-evil/f` prefix confusion                | S215, file untouched |
//! | 085 | fs: RENAME_EXCHANGE race (dir <-> symlink) during writes | every write ok or S215/S211; nothing outside |
//! | 086 | fs: write to a hardlink of an outside file               | link replaced atomically; outside untouched |
//! | 087 | LIMIT: a command writes through that hardlink; fs read of it | outside file changed; its bytes are served |
//! | 088 | a command hardlinks an outside file into the root        | EXDEV (Landlock refer rule), nothing created |
//! | 089 | fs: chmod mode "4755"                                    | S210, mode unchanged |
//! | 090 | fs: mkdir mode "2755"                                    | S210, not created |
//! | 091 | fs: write mode "1644"                                    | S210, not created |
//! | 092 | exec with `LD_PRELOAD` in env                            | S210, nothing ran |
//! | 093 | fs: `rm -r` of the jail root (every spelling)            | S210, root intact |
//! | 094 | rlimit: `ulimit -n` / `ulimit -Hn`                       | 4096 / 4096 |
//! | 095 | rlimit: `file_size_bytes: 1MiB`, write 2 MiB             | File too large, file is exactly 1 MiB |
//! | 096 | `network: deny`: TCP connect to a local listener         | Permission denied |
//! | 097 | `network: allow`: the same connect                       | connects |
//! | 098 | `network: deny_bind`: bind denied, connect allowed       | EACCES / connects |
//! | 099 | jailed: open a block device (FIXED)                      | Permission denied |
//! | 100 | jailed: open a character device not in DEVICE_FILES (FIXED) | Permission denied; /dev/null still works |
//! | 101 | unjailed: open a block device (FIXED)                    | Permission denied |
//! | 102 | a scratch path under a secret directory (FIXED)          | Permission denied |
//! | 103 | LIMIT: with `run_as: root`, a jailed command chmods an outside root-owned file | succeeds (Landlock has no chmod right; the default is a non-root user, 106) |
//! | 104 | LIMIT: with `run_as: root`, a jailed command stats/touches an outside file | succeeds (metadata and timestamps) |
//! | 106 | unjailed default: `id`, `getent passwd daemon`, `ls -l`; every shadow file | users resolve; shadow files Permission denied (FIXED) |
//! | 107 | jailed default: the same                                 | the same (FIXED) |
//! | 108 | fs::grep `^root:` over /etc with the shipped default     | no line from a shadow/gshadow file or a backup (FIXED) |
//! | 109 | a command hardlinks a denylisted file next to it; fs reads the link | S211 for read, read-bytes, stat; grep skips it (FIXED) |
//! | 110 | a command renames a denylisted file; fs reads the new name | S211 (FIXED) |
//! | 111 | `shell::fs::mv secrets public` (`**/secrets/**`)         | S211, nothing moved (FIXED) |
//! | 112 | a command renames `secrets/` to `public/`; fs reads a file in it | S211 (FIXED) |
//! | 113 | a jailed command `cat .env x.pem secrets/k` (existing at policy build) | Permission denied (FIXED); LIMIT: a new file next to them cannot be opened |
//! | 115 | jailed: write to / read from a pts the test opened on the host | not in the command's devpts (ENOENT; EACCES with O_CREAT); nothing reaches the pty (FIXED) |
//! | 116 | unjailed default: the same                               | the same (FIXED) |
//! | 117 | a command allocates its own pty (python `pty.openpty`, `script`) | works, jailed and unjailed |
//! | 114 | LIMIT: a `.env` created after the policy was built (in a dir with no protected entry) | a command reads it; the fs surface still hides it (by name) |
//! | 118 | `run_as: 4242:4242`: chmod/chown/chgrp/touch -d on outside files (root's, another user's) | Operation not permitted, all untouched — root |
//! | 119 | setuid/setgid on the command's own files in the root (`chmod`, python `os.chmod`/`os.fchmod`), as 4242 and as root | EPERM, modes unchanged; control: `fs.allow_special_bits` allows it — root |
//! | 120 | fs write/mkdir/sed, then a command appends/creates; fs grep/write of the command's file | both ways work; fs files owned by the command user — root |
//! | 121 | `/proc/self/status` with run_as unset (root owned by 4242) and `4242:4343` | Uid/Gid exactly those, Groups only the gid, caps 0, NoNewPrivs 1 — root |
//! | 122 | root-owned primary root, run_as unset                    | uid 65534, jail readable not writable, one WARN naming the fix; strict refuses (also `run_as: root`) — root |
//! | 123 | the worker itself runs as 4242 (`setpriv`)               | commands as 4242; outside chmod/chown/touch refused; no special bits — root (to set it up) |
//! | 124 | two units: a policy whose command user is the socket's peer uid | refused (S210 naming the socket); another user runs — root |
//! | 125 | setuid/setgid from `shell::exec` (pre-started and `--no-prestart`), `exec_bg`, a terminal session, as root | no mode changed; each command's `Seccomp_filters` is the executor's (the rule is inherited, none loaded per spawn) — root |
//! | 126 | reloads: `fs.allow_special_bits` true at start (fs::chmod 4755 and commands work), then false; false at start, then true | true→false: refused on every path, one filter loaded per spawn; false→true: S210 "restart the worker", still refused — root |
//! | 127 | `run_as: 4242:4242`: job cgroups where a root executor has them; a command's cgroup; a setsid daemon after its command | still on (base owned by 4242), the command in a job cgroup, the daemon killed — root |
//! | 128 | a command opens another command's pty by path (read, write) or chmods it | EACCES / EPERM, nothing read or written, jailed and unjailed (FIXED: owner `(uid_t)-2`, mode 0000) |
//! | 140 | `network: deny`: IP (TCP, UDP, raw), packet, netlink sockets and `socketpair(AF_INET)`; UDP sendto / TCP connect to an outside address and to a loopback listener, as root | EACCES for each; Unix sockets and socketpairs work (FIXED: UDP went out) |
//! | 141 | the same as `run_as: 4242:4242` | EACCES for each (not EPERM: the rule answers first) — root |
//! | 142 | `network: allow`, a call asking `network: deny` (exec, exec_bg, a terminal session) | that call: EACCES for each; a call without it: the host's network — root |
//! | 143 | `network: deny`, a call asking `allow` / `deny_bind` / `loopback` (exec, exec_bg, pty open) | S210 naming `network`, nothing ran |
//! | 144 | `loopback` configured, a per-call `loopback` or `deny_bind` under `allow`; the same under `strict` | runs as `deny` (EACCES); strict: S216 naming what is missing |
//! | 145 | `network: deny`: `curl http://192.0.2.1/` | exit 7 at once, no timeout |
//! | 146 | `doctor` under `deny`, `allow`, `loopback` | the mode, its mechanism, a probe command's verdict; loopback: "runs as deny" and its gap |
//! | c01 | coder: every function through `root/link -> /outside`   | C215, outside untouched |
//! | c02 | coder: read/write/search through `root/leaf -> secret`   | C215; listed as symlink; delete removes the link |
//! | c03 | coder: `..` paths and `/tmp/x/root-evil` prefix confusion | C215, files untouched |
//! | c04 | coder: RENAME_EXCHANGE race (dir <-> symlink) during create/update | every edit ok or C215/C211/C221; nothing outside |
//! | c05 | coder: non_accessible globs through symlinks (`alias -> .env`, `vault -> secrets`) | C211; search finds nothing |

use crate::common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::escape::*;
use common::*;
use iii_shell_protocol::config::{Config, NetworkAccess};
use iii_shell_protocol::messages::Request;
use serde_json::json;

/// The kernel's Landlock ABI (0 = none).
fn landlock_abi() -> i64 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only returns a number.
    unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    }
}

macro_rules! require_abi {
    ($abi:expr, $what:expr) => {
        if landlock_abi() < $abi {
            iii_shell_confine::requirement::unmet(&format!(
                "{} needs Landlock ABI {} (kernel has {})",
                $what,
                $abi,
                landlock_abi()
            ));
            return;
        }
    };
}

macro_rules! require {
    ($opt:expr, $what:expr) => {
        match $opt {
            Some(v) => v,
            None => {
                iii_shell_confine::requirement::unmet(&format!("{} is not installed", $what));
                return;
            }
        }
    };
}

// ------------------------------------------------------------------ writes outside the roots

#[tokio::test]
async fn escape_001_control_write_inside_root() {
    let j = Jail::new();
    let h = j.harness().await;
    let o = sh(&h, "echo ok > inside && cat inside").await;
    o.ok();
    assert_eq!(o.stdout, "ok\n");
    assert_eq!(std::fs::read(j.root.join("inside")).unwrap(), b"ok\n");
    j.outside_untouched();
}

#[tokio::test]
async fn escape_002_touch_outside() {
    let j = Jail::new();
    let h = j.harness().await;
    let target = j.outside.join("x");
    run(&h, Some("."), &["touch", &s(&target)]).await.denied();
    j.outside_untouched();
}

#[tokio::test]
async fn escape_003_sh_redirect_outside() {
    let j = Jail::new();
    let h = j.harness().await;
    sh(&h, &format!("echo x > {}", q(&j.outside.join("y"))))
        .await
        .denied();
    j.outside_untouched();
}

#[tokio::test]
async fn escape_004_cp_outside() {
    let j = Jail::new();
    std::fs::write(j.root.join("f"), "in").unwrap();
    let h = j.harness().await;
    run(&h, Some("."), &["cp", "f", &s(&j.outside.join("f"))])
        .await
        .denied();
    j.outside_untouched();
}

#[tokio::test]
async fn escape_005_mkdir_outside() {
    let j = Jail::new();
    let h = j.harness().await;
    run(&h, Some("."), &["mkdir", &s(&j.outside.join("d"))])
        .await
        .denied();
    j.outside_untouched();
}

#[tokio::test]
async fn escape_006_ln_s_outside() {
    let j = Jail::new();
    let h = j.harness().await;
    run(
        &h,
        Some("."),
        &["ln", "-s", "/etc", &s(&j.outside.join("l"))],
    )
    .await
    .denied();
    j.outside_untouched();
}

#[tokio::test]
async fn escape_007_mv_into_outside() {
    let j = Jail::new();
    std::fs::write(j.root.join("f"), "in").unwrap();
    let h = j.harness().await;
    run(&h, Some("."), &["mv", "f", &s(&j.outside.join("f"))])
        .await
        .denied();
    assert_eq!(std::fs::read(j.root.join("f")).unwrap(), b"in");
    j.outside_untouched();
}

#[tokio::test]
async fn escape_008_other_roots_sibling() {
    let j = Jail::new();
    let root2 = j.base.join("root2");
    let sibling = j.base.join("root2-sibling");
    std::fs::create_dir_all(&root2).unwrap();
    std::fs::create_dir_all(&sibling).unwrap();
    let mut c = j.config();
    c.fs.host_roots.push(s(&root2));
    let h = Harness::new(c).await;
    // The second root itself is writable...
    run(&h, Some("."), &["touch", &s(&root2.join("ok"))])
        .await
        .ok();
    assert!(root2.join("ok").exists());
    // ...its sibling (same parent, name sharing the prefix) is not.
    run(&h, Some("."), &["touch", &s(&sibling.join("x"))])
        .await
        .denied();
    sh(&h, &format!("echo x > {}", q(&j.base.join("x"))))
        .await
        .denied();
    assert_eq!(std::fs::read_dir(&sibling).unwrap().count(), 0);
    assert!(!j.base.join("x").exists());
    j.outside_untouched();
}

// ------------------------------------------------------------------ the denylist

/// A jail whose root holds a denylisted `private/key.txt`, plus in-root symlinks to it and to
/// `/etc/shadow` (denylisted by default). Everything exists before the policy is built.
fn denylist_jail() -> (Jail, Config) {
    let j = Jail::new();
    std::fs::create_dir_all(j.root.join("private")).unwrap();
    std::fs::write(j.root.join("private/key.txt"), "KEY").unwrap();
    std::fs::write(j.root.join("private/public.txt"), "PUBLIC").unwrap();
    std::os::unix::fs::symlink("private/key.txt", j.root.join("alias")).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", j.root.join("shadow-link")).unwrap();
    let mut c = j.config();
    c.fs.denylist_paths.push(s(&j.root.join("private/key.txt")));
    (j, c)
}

#[tokio::test]
async fn escape_009_cat_denylisted() {
    let (_j, c) = denylist_jail();
    let h = Harness::new(c).await;
    run(&h, Some("."), &["cat", "private/key.txt"])
        .await
        .denied();
    if Path::new("/etc/shadow").exists() {
        // The argv denylist (an advisory tripwire) refuses the literal path...
        let e = expect_code(
            &h,
            "shell::exec",
            json!({"command": "cat", "args": ["/etc/shadow"], "cwd": "."}),
            "invocation_failed",
        )
        .await;
        assert!(e.message.contains("denylist"), "{e:?}");
        // ...and Landlock refuses it however it is spelled.
        sh(&h, "cat /etc/sha''dow").await.denied();
    }
    // Control: the sibling of the denied file is readable.
    assert_eq!(
        run(&h, Some("."), &["cat", "private/public.txt"])
            .await
            .ok()
            .stdout,
        "PUBLIC"
    );
}

#[tokio::test]
async fn escape_010_head_denylisted() {
    let (_j, c) = denylist_jail();
    let h = Harness::new(c).await;
    run(&h, Some("."), &["head", "-c", "3", "private/key.txt"])
        .await
        .denied();
}

#[tokio::test]
async fn escape_011_symlink_to_denylisted() {
    let (_j, c) = denylist_jail();
    let h = Harness::new(c).await;
    run(&h, Some("."), &["cat", "alias"]).await.denied();
    if Path::new("/etc/shadow").exists() {
        run(&h, Some("."), &["cat", "shadow-link"]).await.denied();
    }
}

#[tokio::test]
async fn escape_012_proc_self_root_denylisted() {
    let (j, c) = denylist_jail();
    let h = Harness::new(c).await;
    let via = format!("/proc/self/root{}", s(&j.root.join("private/key.txt")));
    run(&h, Some("."), &["cat", &via]).await.denied();
}

#[tokio::test]
async fn escape_013_symlinked_system_path_denylisted() {
    // A system path that is a symlink (like `/lib -> usr/lib`) and a denylisted file beneath
    // its target. Before the fix the grant was compared lexically and the whole target tree
    // was granted: the denied file was readable through the link and the target alike.
    let j = Jail::new();
    let sys = j.base.join("sys");
    std::fs::create_dir_all(sys.join("real")).unwrap();
    std::fs::write(sys.join("real/secret"), "S").unwrap();
    std::fs::write(sys.join("real/public"), "P").unwrap();
    std::os::unix::fs::symlink("real", sys.join("link")).unwrap();
    let mut c = j.config();
    c.confinement.system_paths.push(s(&sys.join("link")));
    // Outside the roots, the commands' list is `confinement.secret_paths`.
    c.confinement.secret_paths.push(s(&sys.join("real/secret")));
    let h = Harness::new(c).await;
    run(&h, Some("."), &["cat", &s(&sys.join("link/secret"))])
        .await
        .denied();
    run(&h, Some("."), &["cat", &s(&sys.join("real/secret"))])
        .await
        .denied();
    assert_eq!(
        run(&h, Some("."), &["cat", &s(&sys.join("link/public"))])
            .await
            .ok()
            .stdout,
        "P"
    );
}

// ------------------------------------------------------------------ /proc magic links

#[tokio::test]
async fn escape_014_proc_self_root_write_outside() {
    let j = Jail::new();
    let h = j.harness().await;
    let via = format!("/proc/self/root{}", s(&j.outside.join("via-proc")));
    sh(&h, &format!("echo x > '{via}'")).await.denied();
    let via_secret = format!("/proc/self/root{}", s(&j.outside.join("secret.txt")));
    sh(&h, &format!("echo x >> '{via_secret}'")).await.denied();
    run(&h, Some("."), &["cat", &via_secret]).await.denied();
    j.outside_untouched();
}

#[tokio::test]
async fn escape_015_proc_executor_fd() {
    let j = Jail::new();
    let h = j.harness().await;
    let ep = h.executor_pid;
    let o = run(&h, Some("."), &["ls", "-l", &format!("/proc/{ep}/fd")]).await;
    if is_root() {
        // LIMIT: a non-dumpable process's /proc files belong to uid 0, and so does the
        // command: the fd numbers can be listed, but no link can be read or opened.
        o.failed_with(&format!(
            "cannot read symbolic link '/proc/{ep}/fd/0': Permission denied"
        ));
    } else {
        // Not root: the directory belongs to uid 0, so even the listing is refused.
        o.failed_with(&format!(
            "cannot open directory '/proc/{ep}/fd': Permission denied"
        ));
    }
    let fd0 = format!("/proc/{ep}/fd/0");
    for argv in [
        ["readlink", "-v", &fd0].as_slice(),
        &["head", "-c", "0", &fd0],
    ] {
        run(&h, Some("."), argv).await.denied();
    }
}

#[tokio::test]
async fn escape_016_proc_executor_fd_without_landlock() {
    // Landlock off: what still keeps a same-uid command out is the executor being
    // non-dumpable (and the command lacking CAP_SYS_PTRACE).
    let mut c = Config::builtin_default();
    c.confinement.landlock = false;
    let h = Harness::new(c).await;
    let ep = h.executor_pid;
    let (fd0, environ) = (format!("/proc/{ep}/fd/0"), format!("/proc/{ep}/environ"));
    for argv in [
        ["readlink", "-v", &fd0].as_slice(),
        &["head", "-c", "0", &fd0],
        &["head", "-c", "1", &environ],
    ] {
        run(&h, None, argv).await.denied();
    }
}

#[tokio::test]
async fn escape_017_proc_executor_cwd() {
    let j = Jail::new();
    let h = j.harness().await;
    let ep = h.executor_pid;
    let (cwd_dir, cwd) = (format!("/proc/{ep}/cwd/"), format!("/proc/{ep}/cwd"));
    for argv in [["ls", &cwd_dir].as_slice(), &["readlink", "-v", &cwd]] {
        run(&h, Some("."), argv).await.denied();
    }
}

#[tokio::test]
async fn escape_018_proc_executor_environ_mem_and_init_root() {
    let j = Jail::new();
    let h = j.harness().await;
    let ep = h.executor_pid;
    let (environ, mem) = (format!("/proc/{ep}/environ"), format!("/proc/{ep}/mem"));
    for argv in [
        ["head", "-c", "1", &environ].as_slice(),
        &["head", "-c", "1", &mem],
        &["ls", "/proc/1/root/"],
    ] {
        run(&h, Some("."), argv).await.denied();
    }
}

#[tokio::test]
async fn escape_019_no_inherited_fds() {
    // An fd without close-on-exec in the process that starts the executor (the broker, or
    // whatever started it). Before the fix it reached every command.
    let f = std::fs::File::open("/dev/null").unwrap();
    // SAFETY: dup of an fd we own; the copy (no CLOEXEC) is closed at the end of the test.
    let leaked = unsafe { libc::dup(f.as_raw_fd()) };
    assert!(leaked > 2);
    let h = Harness::default().await;
    let o = run(&h, None, &["ls", "/proc/self/fd"]).await;
    // SAFETY: closes the descriptor dup'ed above, which nothing else uses.
    unsafe { libc::close(leaked) };
    o.ok();
    // 0-2 are stdio; 3 is the directory ls itself has open.
    assert_eq!(o.stdout, "0\n1\n2\n3\n", "leaked descriptors: {o:?}");
}

// ------------------------------------------------------------------ process status

#[tokio::test]
async fn escape_020_command_status() {
    let j = Jail::new();
    let h = j.harness().await;
    let o = run(&h, Some("."), &[&s(bin()), "probe", "status"]).await;
    o.ok();
    assert_confined_status(&o.stdout, is_root());
    if is_root() {
        assert_eq!(
            field(&status_fields(&o.stdout), "Uid"),
            "0\t0\t0\t0",
            "the executor runs as root here"
        );
    } else {
        iii_shell_confine::requirement::unmet(
            "(partly) the empty capability sets are only asserted as root",
        );
    }
}

#[tokio::test]
async fn escape_021_executor_self_status() {
    let h = Harness::default().await;
    let text = std::fs::read_to_string(format!("/proc/{}/status", h.executor_pid)).unwrap();
    assert_confined_status(&text, is_root());
    if !is_root() {
        iii_shell_confine::requirement::unmet(
            "the empty capability sets are only asserted as root",
        );
    }
}

// ------------------------------------------------------------------ the seccomp filter

macro_rules! seccomp_denies {
    ($( $(#[$attr:meta])* $test:ident: $name:literal => $errno:expr; )*) => {$(
        $(#[$attr])*
        #[tokio::test]
        async fn $test() {
            let h = Harness::default().await;
            assert_probe_errno(&h, $name, $errno).await;
        }
    )*};
}

seccomp_denies! {
    escape_022_kexec_load: "kexec_load" => libc::EPERM;
    escape_023_kexec_file_load: "kexec_file_load" => libc::EPERM;
    escape_024_init_module: "init_module" => libc::EPERM;
    escape_025_finit_module: "finit_module" => libc::EPERM;
    escape_026_delete_module: "delete_module" => libc::EPERM;
    escape_027_mount: "mount" => libc::EPERM;
    escape_028_umount2: "umount2" => libc::EPERM;
    escape_029_pivot_root: "pivot_root" => libc::EPERM;
    escape_030_open_tree: "open_tree" => libc::EPERM;
    escape_031_move_mount: "move_mount" => libc::EPERM;
    escape_032_fsopen: "fsopen" => libc::EPERM;
    escape_033_fsconfig: "fsconfig" => libc::EPERM;
    escape_034_fsmount: "fsmount" => libc::EPERM;
    escape_035_swapon: "swapon" => libc::EPERM;
    escape_036_swapoff: "swapoff" => libc::EPERM;
    escape_037_reboot: "reboot" => libc::EPERM;
    escape_038_acct: "acct" => libc::EPERM;
    escape_039_syslog: "syslog" => libc::EPERM;
    escape_040_bpf: "bpf" => libc::EPERM;
    escape_041_perf_event_open: "perf_event_open" => libc::EPERM;
    escape_042_userfaultfd: "userfaultfd" => libc::EPERM;
    escape_043_ptrace: "ptrace" => libc::EPERM;
    escape_044_process_vm_readv: "process_vm_readv" => libc::EPERM;
    escape_045_process_vm_writev: "process_vm_writev" => libc::EPERM;
    escape_046_keyctl: "keyctl" => libc::EPERM;
    escape_047_add_key: "add_key" => libc::EPERM;
    escape_048_request_key: "request_key" => libc::EPERM;
    escape_049_io_uring_setup: "io_uring_setup" => libc::EPERM;
    escape_050_io_uring_enter: "io_uring_enter" => libc::EPERM;
    escape_051_io_uring_register: "io_uring_register" => libc::EPERM;
    escape_052_open_by_handle_at: "open_by_handle_at" => libc::EPERM;
    escape_053_name_to_handle_at: "name_to_handle_at" => libc::EPERM;
    #[cfg(target_arch = "x86_64")]
    escape_054_iopl: "iopl" => libc::EPERM;
    #[cfg(target_arch = "x86_64")]
    escape_055_ioperm: "ioperm" => libc::EPERM;
    escape_056_settimeofday: "settimeofday" => libc::EPERM;
    escape_057_clock_settime: "clock_settime" => libc::EPERM;
    escape_058_adjtimex: "adjtimex" => libc::EPERM;
    escape_059_clock_adjtime: "clock_adjtime" => libc::EPERM;
    escape_060_setns: "setns" => libc::EPERM;
    escape_061_unshare_newuser: "unshare" => libc::EPERM;
    escape_062_clone_newuser: "clone_newuser" => libc::EPERM;
    escape_063_clone3_enosys: "clone3" => libc::ENOSYS;
    #[cfg(target_arch = "x86_64")]
    escape_064_x32_abi: "x32_getpid" => libc::EPERM;
}

#[tokio::test]
async fn escape_065_getpid_allowed() {
    let h = Harness::default().await;
    assert_probe_ok(&h, "getpid").await;
}

#[tokio::test]
async fn escape_066_unshare_files_allowed() {
    let h = Harness::default().await;
    assert_probe_ok(&h, "unshare_files").await;
}

// Controls: the same probes with the filter off (pinned envelope and live config both say
// `seccomp: false`; the executor's own start-up filter comes from the envelope, and commands
// inherit it, so the live config alone could not turn it off).

#[tokio::test]
async fn escape_067_control_ptrace_without_filter() {
    let h = seccomp_off_harness().await;
    assert_probe_ok(&h, "ptrace").await;
}

#[tokio::test]
async fn escape_068_control_io_uring_without_filter() {
    let h = seccomp_off_harness().await;
    assert_probe_ok(&h, "io_uring_setup").await;
}

#[tokio::test]
async fn escape_069_control_keyctl_without_filter() {
    let h = seccomp_off_harness().await;
    assert_probe_ok(&h, "keyctl").await;
}

#[tokio::test]
async fn escape_070_control_unshare_without_filter() {
    let h = seccomp_off_harness().await;
    assert_probe_ok(&h, "unshare").await;
}

#[tokio::test]
async fn escape_071_seccomp_allow_live_only_is_not_enough() {
    // The live config re-allows ptrace, so the per-command filter lets it through; but the
    // executor installed its own filter at start-up from its envelope (none: the defaults),
    // commands inherit it, and stacked filters take the strictest answer. `doctor` should say
    // so: "ptrace is re-allowed by confinement.seccomp_allow but still denied by the
    // executor's start-up filter; pin an envelope whose seccomp_allow has it".
    let mut c = Config::builtin_default();
    c.confinement.seccomp_allow = vec!["ptrace".into()];
    let h = Harness::new(c).await;
    assert_probe_errno(&h, "ptrace", libc::EPERM).await;
}

#[tokio::test]
async fn escape_072_seccomp_allow_pinned() {
    let mut c = Config::builtin_default();
    c.confinement.seccomp_allow = vec!["ptrace".into()];
    let h = pinned_harness(&c, c.clone()).await;
    assert_probe_ok(&h, "ptrace").await;
    // Only that one: the rest of the list is still denied.
    for name in ["keyctl", "process_vm_readv"] {
        assert_probe_errno(&h, name, libc::EPERM).await;
    }
}

// ------------------------------------------------------------------ signals

#[tokio::test]
async fn escape_073_kill_executor() {
    require_abi!(6, "signal scoping");
    let j = Jail::new();
    let mut h = j.harness().await;
    let ep = h.executor_pid;
    sh(&h, &format!("kill -0 {ep}"))
        .await
        .failed_with("Operation not permitted");
    sh(&h, &format!("kill -TERM {ep}"))
        .await
        .failed_with("Operation not permitted");
    sh(&h, &format!("kill -KILL {ep}"))
        .await
        .failed_with("Operation not permitted");
    assert_eq!(h.child.try_wait().unwrap(), None, "the executor died");
    assert_eq!(sh(&h, "echo alive").await.ok().stdout, "alive\n");
}

/// Signal scoping is checked against the credentials of the thread a pid names, so every
/// thread of the executor must be outside the commands' Landlock domain (a spawner thread that
/// held it, for instance, would let `kill -9 <its tid>` take the whole executor down).
#[tokio::test]
async fn escape_105_kill_executor_threads_by_tid() {
    require_abi!(6, "signal scoping");
    let j = Jail::new();
    let mut h = j.harness().await;
    let ep = h.executor_pid;
    // One call first, so every thread the executor starts for commands exists.
    assert_eq!(sh(&h, "echo warm").await.ok().stdout, "warm\n");
    let tids: Vec<String> = std::fs::read_dir(format!("/proc/{ep}/task"))
        .expect("the executor's threads")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!tids.is_empty());
    for tid in &tids {
        for sig in ["-0", "-KILL"] {
            sh(&h, &format!("kill {sig} {tid}"))
                .await
                .failed_with("Operation not permitted");
        }
    }
    assert_eq!(h.child.try_wait().unwrap(), None, "the executor died");
    assert_eq!(sh(&h, "echo alive").await.ok().stdout, "alive\n");
}

#[tokio::test]
async fn escape_074_kill_test_process_and_init() {
    require_abi!(6, "signal scoping");
    let j = Jail::new();
    let h = j.harness().await;
    let me = std::process::id();
    sh(&h, &format!("kill -TERM {me}"))
        .await
        .failed_with("Operation not permitted");
    sh(&h, "kill -0 1")
        .await
        .failed_with("Operation not permitted");
    assert_eq!(sh(&h, "echo alive").await.ok().stdout, "alive\n");
}

// ------------------------------------------------------------------ sockets

#[tokio::test]
async fn escape_075_abstract_socket_scoped() {
    require_abi!(6, "abstract unix socket scoping");
    let py = require!(python3(), "python3");
    use std::os::linux::net::SocketAddrExt;
    let name = format!("iii-escape-{}", marker());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let h = Harness::default().await;
    let script = format!("import socket; s = socket.socket(socket.AF_UNIX); s.connect('\\0{name}'); print('connected')");
    run(&h, None, &[py, "-c", &script])
        .await
        .failed_with("PermissionError: [Errno 1] Operation not permitted");
}

#[tokio::test]
async fn escape_076_socket_other_uid() {
    require_root!("connecting as uid 65534");
    let py = require!(python3(), "python3");
    let mut e = SocketExecutor::start(0).await;
    let md = std::fs::metadata(&e.path).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o777), (0, 0o600));
    use std::os::unix::process::CommandExt;
    let script = format!(
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); print('connected')",
        s(&e.path)
    );
    let out = std::process::Command::new(py)
        .args(["-c", &script])
        .uid(65534)
        .gid(65534)
        .current_dir("/")
        .env_clear()
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "uid 65534 connected: {stderr}");
    assert!(
        stderr.contains("PermissionError: [Errno 13] Permission denied"),
        "{stderr}"
    );
    e.assert_alive();
}

#[tokio::test]
async fn escape_077_socket_mismatched_peer_uid() {
    require_root!("handing the socket to uid 65534");
    use iii_shell_protocol::frame::write_frame;
    use iii_shell_protocol::messages::{ClientFrame, Hello, MAGIC};
    use tokio::io::AsyncReadExt;
    let mut e = SocketExecutor::start(65534).await;
    let md = std::fs::metadata(&e.path).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o777), (65534, 0o600));
    // Root gets past the file mode, then SO_PEERCRED says uid 0, not 65534.
    let mut sock = tokio::net::UnixStream::connect(&e.path).await.unwrap();
    let _ = write_frame(
        &mut sock,
        &ClientFrame::Hello(Hello {
            magic: MAGIC,
            version: iii_shell_protocol::PROTOCOL_VERSION,
        }),
    )
    .await;
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        loop {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the executor kept a foreign peer's connection open"
    );
    assert!(
        got.is_empty(),
        "a foreign peer got an answer (HelloAck?): {got:?}"
    );
    let refusal = "peer uid 0 is not the expected broker uid 65534";
    assert!(
        eventually(Duration::from_secs(5), || e.log().contains(refusal)).await,
        "{}",
        e.log()
    );
    e.assert_alive();
}

#[tokio::test]
async fn escape_078_command_connects_to_executor_socket() {
    require_root!("handing the socket to uid 65534");
    let py = require!(python3(), "python3");
    let mut e = SocketExecutor::start(65534).await;
    let h = Harness::default().await;
    let script = format!(
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); print('connected')",
        s(&e.path)
    );
    // The command is uid 0 like the executor, but without CAP_DAC_OVERRIDE the 0600 socket
    // of uid 65534 is closed to it.
    run(&h, None, &[py, "-c", &script])
        .await
        .failed_with("PermissionError: [Errno 13] Permission denied");
    e.assert_alive();
}

#[tokio::test]
async fn escape_079_limit_pathname_socket_outside() {
    let py = require!(python3(), "python3");
    let j = Jail::new();
    let sock = j.outside.join("svc.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600)).unwrap();
    let h = j.harness().await;
    let script = format!(
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); print('connected')",
        s(&sock)
    );
    // LIMIT: Landlock (ABI <= 7) does not mediate connect(2) to pathname unix sockets; only
    // the socket file's mode and owner do. A root-run command reaches any root-owned
    // service socket it can name (keep such sockets off hosts that run jailed commands, or
    // run commands as another uid).
    assert_eq!(
        run(&h, Some("."), &[py, "-c", &script]).await.ok().stdout,
        "connected\n"
    );
}

// ------------------------------------------------------------------ shell::fs::* escapes

#[tokio::test]
async fn escape_080_fs_symlink_parent() {
    let j = Jail::new();
    std::os::unix::fs::symlink(&j.outside, j.root.join("link")).unwrap();
    let h = j.harness().await;
    for (function, payload) in [
        (
            "shell::fs::write",
            json!({"path": "link/x", "content": "x"}),
        ),
        (
            "shell::fs::write",
            json!({"path": "link/deep/x", "content": "x", "parents": true}),
        ),
        (
            "shell::fs::mkdir",
            json!({"path": "link/d", "parents": true}),
        ),
        (
            "shell::fs::mv",
            json!({"src": "link/secret.txt", "dst": "stolen"}),
        ),
        ("shell::fs::rm", json!({"path": "link/secret.txt"})),
    ] {
        expect_code(&h, function, payload, "S215").await;
    }
    j.outside_untouched();
    assert!(!j.root.join("stolen").exists());
}

#[tokio::test]
async fn escape_081_fs_symlink_leaf_read() {
    let j = Jail::new();
    let target = j.outside.join("secret.txt");
    std::os::unix::fs::symlink(&target, j.root.join("leaf")).unwrap();
    let h = j.harness().await;
    expect_code(
        &h,
        "shell::workspace::read-bytes",
        json!({"path": "leaf"}),
        "S215",
    )
    .await;
    expect_code(
        &h,
        "shell::fs::grep",
        json!({"path": "leaf", "pattern": "SECRET"}),
        "S215",
    )
    .await;
    // stat describes the link itself, never the target behind it.
    let st = h.ok("shell::fs::stat", json!({"path": "leaf"})).await;
    assert_eq!(
        (st["is_symlink"].as_bool(), st["is_dir"].as_bool()),
        (Some(true), Some(false)),
        "{st}"
    );
    assert_eq!(st["size"].as_u64(), Some(s(&target).len() as u64), "{st}");
    j.outside_untouched();
}

#[tokio::test]
async fn escape_082_fs_symlink_leaf_write_replaces_link() {
    let j = Jail::new();
    std::os::unix::fs::symlink(j.outside.join("secret.txt"), j.root.join("leaf")).unwrap();
    let h = j.harness().await;
    h.ok(
        "shell::fs::write",
        json!({"path": "leaf", "content": "inside"}),
    )
    .await;
    let md = std::fs::symlink_metadata(j.root.join("leaf")).unwrap();
    assert!(
        md.file_type().is_file(),
        "the link was written through instead of replaced"
    );
    assert_eq!(std::fs::read(j.root.join("leaf")).unwrap(), b"inside");
    j.outside_untouched();
}

#[tokio::test]
async fn escape_083_fs_dotdot() {
    let j = Jail::new();
    std::fs::write(j.root.join("f"), "in").unwrap();
    std::fs::create_dir(j.root.join("a")).unwrap();
    let h = j.harness().await;
    let abs = format!("{}/../outside/x", s(&j.root));
    for (f, p) in [
        (
            "shell::fs::write",
            json!({"path": "../outside/x", "content": "x"}),
        ),
        ("shell::fs::write", json!({"path": abs, "content": "x"})),
        (
            "shell::fs::write",
            json!({"path": "a/../../outside/x", "content": "x", "parents": true}),
        ),
        (
            "shell::workspace::read-bytes",
            json!({"path": "../outside/secret.txt"}),
        ),
        (
            "shell::fs::mkdir",
            json!({"path": "../evil", "parents": true}),
        ),
        ("shell::fs::rm", json!({"path": "../outside/secret.txt"})),
        (
            "shell::fs::chmod",
            json!({"path": "../outside/secret.txt", "mode": "0666"}),
        ),
        ("shell::fs::mv", json!({"src": "f", "dst": "../outside/f"})),
        ("shell::fs::ls", json!({"path": ".."})),
    ] {
        expect_code(&h, f, p, "S215").await;
    }
    assert!(!j.base.join("evil").exists());
    assert_eq!(std::fs::read(j.root.join("f")).unwrap(), b"in");
    j.outside_untouched();
}

#[tokio::test]
async fn escape_084_fs_root_evil_prefix() {
    let j = Jail::new();
    let evil = j.base.join("root-evil");
    std::fs::create_dir_all(&evil).unwrap();
    std::fs::write(evil.join("f"), "EVIL").unwrap();
    let h = j.harness().await;
    let p = s(&evil.join("f"));
    for (function, payload) in [
        ("shell::workspace::read-bytes", json!({"path": p})),
        ("shell::fs::write", json!({"path": p, "content": "x"})),
        (
            "shell::fs::write",
            json!({"path": s(&evil.join("new")), "content": "x"}),
        ),
        ("shell::fs::rm", json!({"path": p})),
        ("shell::fs::stat", json!({"path": s(&evil)})),
    ] {
        expect_code(&h, function, payload, "S215").await;
    }
    assert_eq!(std::fs::read(evil.join("f")).unwrap(), b"EVIL");
    assert_eq!(std::fs::read_dir(&evil).unwrap().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escape_085_fs_rename_exchange_race() {
    let j = Jail::new();
    let d = j.root.join("d");
    let swap = j.root.join("swap");
    std::fs::create_dir(&d).unwrap();
    std::os::unix::fs::symlink(&j.outside, &swap).unwrap();
    let h = j.harness().await;
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = {
        let stop = stop.clone();
        let (a, b) = (
            std::ffi::CString::new(s(&d)).unwrap(),
            std::ffi::CString::new(s(&swap)).unwrap(),
        );
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: two valid NUL-terminated paths; renameat2 only swaps directory entries.
                let rc = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(rc, 0, "renameat2: {}", std::io::Error::last_os_error());
                n += 1;
            }
            n
        })
    };
    let (mut ok, mut refused) = (0, 0);
    for i in 0..300 {
        match h
            .call(
                "shell::fs::write",
                json!({"path": "d/f", "content": format!("round {i}")}),
            )
            .await
        {
            Ok(_) => ok += 1,
            Err(e) if e.code == "S215" || e.code == "S211" => refused += 1,
            Err(e) => panic!("round {i}: unexpected {e:?}"),
        }
        assert!(
            !j.outside.join("f").exists(),
            "round {i}: a write landed outside the jail"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let n = swaps.join().unwrap();
    eprintln!("race: {n} exchanges, {ok} writes landed inside, {refused} refused");
    assert!(n > 0);
    assert_eq!(ok + refused, 300);
    j.outside_untouched();
    // Every write that succeeded landed in the real directory, whatever its name was then.
    let real = if std::fs::symlink_metadata(&d).unwrap().is_dir() {
        &d
    } else {
        &swap
    };
    assert_eq!(real.join("f").exists(), ok > 0);
}

#[tokio::test]
async fn escape_086_fs_write_to_hardlink_replaces_it() {
    let j = Jail::new();
    std::fs::hard_link(j.outside.join("secret.txt"), j.root.join("hl")).unwrap();
    let h = j.harness().await;
    h.ok(
        "shell::fs::write",
        json!({"path": "hl", "content": "replaced"}),
    )
    .await;
    let md = std::fs::metadata(j.root.join("hl")).unwrap();
    assert_eq!(md.nlink(), 1, "hl is still the outside inode");
    assert_eq!(std::fs::read(j.root.join("hl")).unwrap(), b"replaced");
    assert_eq!(
        std::fs::metadata(j.outside.join("secret.txt"))
            .unwrap()
            .nlink(),
        1
    );
    j.outside_untouched();
}

#[tokio::test]
async fn escape_087_limit_hardlink_write_through_by_command() {
    // LIMIT: a hard link made by someone else (here: the test, as the file's owner) is the
    // outside inode under an inside name. Neither the jail (fd path checks) nor Landlock
    // (path hierarchy rules) can tell: a command writes through it, and a read serves it.
    let j = Jail::new();
    std::fs::hard_link(j.outside.join("secret.txt"), j.root.join("hl")).unwrap();
    let h = j.harness().await;
    let r = h
        .ok("shell::workspace::read-bytes", json!({"path": "hl"}))
        .await;
    assert_eq!(r["size"], SECRET.len());
    sh(&h, "printf pwned > hl").await.ok();
    assert_eq!(
        std::fs::read(j.outside.join("secret.txt")).unwrap(),
        b"pwned"
    );
}

#[tokio::test]
async fn escape_088_command_cannot_hardlink_outside_file() {
    let j = Jail::new();
    let h = j.harness().await;
    run(
        &h,
        Some("."),
        &["ln", &s(&j.outside.join("secret.txt")), "hl2"],
    )
    .await
    .failed_with("Invalid cross-device link");
    assert!(std::fs::symlink_metadata(j.root.join("hl2")).is_err());
    assert_eq!(
        std::fs::metadata(j.outside.join("secret.txt"))
            .unwrap()
            .nlink(),
        1
    );
    j.outside_untouched();
}

#[tokio::test]
async fn escape_089_fs_chmod_setuid() {
    let j = Jail::new();
    std::fs::write(j.root.join("f"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(j.root.join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let h = j.harness().await;
    expect_code(
        &h,
        "shell::fs::chmod",
        json!({"path": "f", "mode": "4755"}),
        "S210",
    )
    .await;
    expect_code(
        &h,
        "shell::fs::chmod",
        json!({"path": ".", "mode": "2755", "recursive": true}),
        "S210",
    )
    .await;
    assert_eq!(mode_of(&j.root.join("f")), 0o644);
}

#[tokio::test]
async fn escape_090_fs_mkdir_setgid() {
    let j = Jail::new();
    let h = j.harness().await;
    expect_code(
        &h,
        "shell::fs::mkdir",
        json!({"path": "d", "mode": "2755"}),
        "S210",
    )
    .await;
    assert!(!j.root.join("d").exists());
}

#[tokio::test]
async fn escape_091_fs_write_sticky() {
    let j = Jail::new();
    let h = j.harness().await;
    expect_code(
        &h,
        "shell::fs::write",
        json!({"path": "w", "content": "x", "mode": "1644"}),
        "S210",
    )
    .await;
    assert!(!j.root.join("w").exists());
}

#[tokio::test]
async fn escape_092_exec_dangerous_env() {
    let j = Jail::new();
    let h = j.harness().await;
    let e = expect_code(&h, "shell::exec", json!({"command": "touch", "args": ["ran"], "cwd": ".", "env": {"LD_PRELOAD": "/tmp/evil.so"}}), "S210").await;
    assert!(e.message.contains("LD_PRELOAD"), "{e:?}");
    assert!(!j.root.join("ran").exists(), "the command ran");
}

#[tokio::test]
async fn escape_093_fs_rm_jail_root() {
    let j = Jail::new();
    std::fs::write(j.root.join("keep"), "k").unwrap();
    let h = j.harness().await;
    for p in [
        ".".to_string(),
        "./".to_string(),
        s(&j.root),
        format!("{}/", s(&j.root)),
        "a/..".to_string(),
    ] {
        expect_code(
            &h,
            "shell::fs::rm",
            json!({"path": p, "recursive": true}),
            "S210",
        )
        .await;
    }
    assert!(j.root.is_dir());
    assert_eq!(std::fs::read(j.root.join("keep")).unwrap(), b"k");
}

// ------------------------------------------------------------------ rlimits and network

#[tokio::test]
async fn escape_094_rlimit_open_files() {
    let h = Harness::default().await;
    assert_eq!(
        sh_unjailed(&h, "ulimit -n; ulimit -Hn").await.ok().stdout,
        "4096\n4096\n"
    );
}

#[tokio::test]
async fn escape_095_rlimit_file_size() {
    let j = Jail::new();
    let mut c = j.config();
    c.confinement.rlimits.file_size_bytes = Some(1 << 20);
    let h = Harness::new(c).await;
    // SIGXFSZ ignored, so the write fails with EFBIG instead of killing head.
    sh(&h, "trap '' XFSZ; head -c 2M /dev/zero > big")
        .await
        .failed_with("File too large");
    assert_eq!(
        std::fs::metadata(j.root.join("big")).unwrap().len(),
        1 << 20
    );
}

fn with_network(n: NetworkAccess) -> Config {
    let mut c = Config::builtin_default();
    c.confinement.network = n;
    c
}

fn tcp_connect_script(port: u16) -> String {
    format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected")
}

#[tokio::test]
async fn escape_096_network_deny_connect() {
    require_abi!(4, "the TCP restriction");
    let bash = require!(bash(), "bash");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let h = Harness::new(with_network(NetworkAccess::Deny)).await;
    let o = run(&h, None, &[bash, "-c", &tcp_connect_script(port)]).await;
    o.denied();
    assert_eq!(o.stdout, "");
}

#[tokio::test]
async fn escape_097_network_allow_connect() {
    let bash = require!(bash(), "bash");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let h = Harness::new(with_network(NetworkAccess::Allow)).await;
    assert_eq!(
        run(&h, None, &[bash, "-c", &tcp_connect_script(port)])
            .await
            .ok()
            .stdout,
        "connected\n"
    );
}

#[tokio::test]
async fn escape_098_network_deny_bind() {
    require_abi!(4, "the TCP restriction");
    let py = require!(python3(), "python3");
    let h = Harness::new(with_network(NetworkAccess::DenyBind)).await;
    let bind =
        "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); print('bound')";
    run(&h, None, &[py, "-c", bind])
        .await
        .failed_with("PermissionError: [Errno 13] Permission denied");
    if let Some(bash) = bash() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(
            run(&h, None, &[bash, "-c", &tcp_connect_script(port)])
                .await
                .ok()
                .stdout,
            "connected\n"
        );
    }
}

// ------------------------------------------------------------------ device nodes (fixed)

/// A device under /dev of the wanted kind that this (root) test process can open read-only
/// without blocking or side effects.
fn openable_device(block: bool) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let candidates: Vec<std::path::PathBuf> = if block {
        let mut v: Vec<_> = std::fs::read_dir("/dev")
            .ok()?
            .flatten()
            .filter(|e| e.file_type().map(|t| t.is_block_device()).unwrap_or(false))
            .map(|e| e.path())
            .collect();
        v.sort();
        v
    } else {
        // Harmless to open: screen memory, the hardware RNG, the kernel log reader.
        ["/dev/vcs", "/dev/hwrng", "/dev/kmsg"]
            .iter()
            .map(std::path::PathBuf::from)
            .filter(|p| {
                std::fs::metadata(p)
                    .map(|m| m.file_type().is_char_device())
                    .unwrap_or(false)
            })
            .collect()
    };
    candidates.into_iter().find(|p| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(p)
            .is_ok()
    })
}

#[tokio::test]
async fn escape_099_jailed_block_device() {
    require_root!("opening a block device");
    let dev = require!(openable_device(true), "an openable block device");
    let j = Jail::new();
    let h = j.harness().await;
    sh(&h, &format!(": < {}", q(&dev))).await.denied();
}

#[tokio::test]
async fn escape_100_jailed_char_device() {
    require_root!("opening a console/RNG device");
    let dev = require!(openable_device(false), "a console or RNG character device");
    let j = Jail::new();
    let h = j.harness().await;
    sh(&h, &format!(": < {}", q(&dev))).await.denied();
    // The granted devices still work.
    assert_eq!(
        sh(
            &h,
            "head -c 3 /dev/zero | wc -c; echo x > /dev/null && echo null-ok"
        )
        .await
        .ok()
        .stdout,
        "3\nnull-ok\n"
    );
}

#[tokio::test]
async fn escape_101_unjailed_block_device() {
    require_root!("opening a block device");
    let dev = require!(openable_device(true), "an openable block device");
    let h = Harness::default().await;
    sh_unjailed(&h, &format!(": < {}", q(&dev))).await.denied();
}

#[tokio::test]
async fn escape_102_scratch_path_under_denylisted_dir() {
    let j = Jail::new();
    let inner = j.base.join("scratch/inner");
    std::fs::create_dir_all(&inner).unwrap();
    let mut c = j.config();
    c.confinement.scratch_paths = vec![s(&inner)];
    c.confinement.secret_paths.push(s(&j.base.join("scratch")));
    let h = Harness::new(c).await;
    run(&h, Some("."), &["touch", &s(&inner.join("x"))])
        .await
        .denied();
    assert!(!inner.join("x").exists());
}

// ------------------------------------------------------------------ documented limits

#[tokio::test]
async fn escape_103_limit_chmod_outside() {
    // LIMIT: Landlock (ABI <= 7) has no right for chmod/utimes/xattrs. A command running as
    // the owner of a file outside the jail (uid 0 owns most of the host) can change its mode:
    // that is why commands in a jail run as root only by an explicit `run_as: root` (the
    // jail helper's), and otherwise as an unprivileged user (118-123).
    let j = Jail::new();
    let h = j.harness().await;
    run(
        &h,
        Some("."),
        &["chmod", "0666", &s(&j.outside.join("secret.txt"))],
    )
    .await
    .ok();
    assert_eq!(mode_of(&j.outside.join("secret.txt")), 0o666);
    assert_eq!(
        std::fs::read(j.outside.join("secret.txt")).unwrap(),
        SECRET,
        "the content stays out of reach"
    );
}

#[tokio::test]
async fn escape_104_limit_outside_metadata() {
    // LIMIT: stat works on any path, and `touch` of an existing outside file updates its
    // timestamps (open fails, utimensat by the owner does not). Its content stays unreadable.
    let j = Jail::new();
    let secret = j.outside.join("secret.txt");
    let h = j.harness().await;
    assert_eq!(
        run(&h, Some("."), &["stat", "-c", "%s", &s(&secret)])
            .await
            .ok()
            .stdout,
        format!("{}\n", SECRET.len())
    );
    run(&h, Some("."), &["touch", "-d", "@978307200", &s(&secret)])
        .await
        .ok();
    assert_eq!(std::fs::metadata(&secret).unwrap().mtime(), 978_307_200);
    run(&h, Some("."), &["cat", &s(&secret)]).await.denied();
    j.outside_untouched();
}

// ------------------------------------------------------------------ secrets and user databases

/// The shadow files that exist on this host (the tests need at least `/etc/shadow`).
fn shadow_files() -> Vec<&'static str> {
    [
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/shadow-",
        "/etc/gshadow-",
    ]
    .into_iter()
    .filter(|p| Path::new(p).exists())
    .collect()
}

/// Users resolve (`id`, `getent`, `ls -l` names), and no spelling of a shadow file opens.
async fn users_resolve_and_shadow_is_denied(h: &Harness, cwd: Option<&str>) {
    let run_sh = |script: String| async move { run(h, cwd, &["sh", "-c", &script]).await };
    let o =
        run_sh("id -un; getent passwd daemon | cut -d: -f1; ls -ld /etc | awk '{print $3}'".into())
            .await;
    o.ok();
    assert_eq!(o.stdout, "root\ndaemon\nroot\n", "{o:?}");
    for f in shadow_files() {
        // Spelled so the advisory argv denylist does not see `/etc/shadow`.
        let spelled = f.replace("shadow", "sha''dow");
        run_sh(format!("cat {spelled}")).await.denied();
        run_sh(format!("cat /proc/self/root{spelled}"))
            .await
            .denied();
    }
}

#[tokio::test]
async fn escape_106_unjailed_default_users_resolve_shadow_denied() {
    require_root!("reading the host's user database as uid 0");
    require_abi!(1, "Landlock");
    if shadow_files().is_empty() {
        iii_shell_confine::requirement::unmet("this host has no /etc/shadow");
        return;
    }
    let h = Harness::default().await;
    users_resolve_and_shadow_is_denied(&h, None).await;
}

#[tokio::test]
async fn escape_107_jailed_default_users_resolve_shadow_denied() {
    require_root!("reading the host's user database as uid 0");
    require_abi!(1, "Landlock");
    if shadow_files().is_empty() {
        iii_shell_confine::requirement::unmet("this host has no /etc/shadow");
        return;
    }
    let j = Jail::new();
    let h = j.harness().await;
    users_resolve_and_shadow_is_denied(&h, Some(".")).await;
}

#[tokio::test]
async fn escape_108_fs_grep_etc_serves_no_password_hash() {
    require_root!("reading /etc/shadow-like files as uid 0");
    let h = Harness::default().await;
    let r = h
        .ok(
            "shell::fs::grep",
            json!({"path": "/etc", "pattern": "^root:", "recursive": false}),
        )
        .await;
    let files: Vec<String> = r["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap().to_string())
        .collect();
    for f in &files {
        for hidden in [
            "/etc/passwd",
            "/etc/shadow",
            "/etc/gshadow",
            "/etc/passwd-",
            "/etc/shadow-",
            "/etc/group-",
            "/etc/gshadow-",
        ] {
            assert_ne!(f, hidden, "grep served {hidden}: {r}");
        }
    }
    // Control: /etc/group is public and has a root line.
    if std::fs::read_to_string("/etc/group").is_ok_and(|g| g.starts_with("root:")) {
        assert!(files.iter().any(|f| f == "/etc/group"), "{r}");
    }
}

/// A jail with a denylisted `private/key.txt` in the root, and a `secrets/k` under the
/// default `**/secrets/**` glob.
fn protected_jail() -> (Jail, Config) {
    let j = Jail::new();
    std::fs::create_dir_all(j.root.join("private")).unwrap();
    std::fs::write(j.root.join("private/key.txt"), "KEY").unwrap();
    std::fs::create_dir_all(j.root.join("secrets")).unwrap();
    std::fs::write(j.root.join("secrets/k"), "SECRETK").unwrap();
    let mut c = j.config();
    c.fs.denylist_paths.push(s(&j.root.join("private/key.txt")));
    (j, c)
}

/// Every fs read shape of `path` answers exactly like a missing path, and grep skips it.
async fn fs_hides(h: &Harness, path: &str, secret: &str) {
    for (f, p) in [
        ("shell::workspace::read-bytes", json!({"path": path})),
        ("shell::fs::stat", json!({"path": path})),
    ] {
        let e = expect_code(h, f, p, "S211").await;
        assert!(!e.message.contains(secret), "{e:?}");
    }
    let r = h
        .ok(
            "shell::fs::grep",
            json!({"path": ".", "pattern": secret, "recursive": true}),
        )
        .await;
    assert_eq!(r["matches"], json!([]), "grep served a protected file: {r}");
}

#[tokio::test]
async fn escape_109_hardlink_of_denylisted_file() {
    let (_j, c) = protected_jail();
    let h = Harness::new(c).await;
    run(&h, Some("."), &["ln", "private/key.txt", "private/pub.txt"])
        .await
        .ok();
    fs_hides(&h, "private/pub.txt", "KEY").await;
    // A command cannot read it either (the link inherits no read right).
    run(&h, Some("."), &["cat", "private/pub.txt"])
        .await
        .denied();
}

#[tokio::test]
async fn escape_110_rename_of_denylisted_file() {
    let (_j, c) = protected_jail();
    let h = Harness::new(c).await;
    run(
        &h,
        Some("."),
        &["mv", "private/key.txt", "private/moved.txt"],
    )
    .await
    .ok();
    fs_hides(&h, "private/moved.txt", "KEY").await;
}

#[tokio::test]
async fn escape_111_fs_mv_of_a_protected_folder() {
    let (j, c) = protected_jail();
    let h = Harness::new(c).await;
    expect_code(
        &h,
        "shell::fs::mv",
        json!({"src": "secrets", "dst": "public"}),
        "S211",
    )
    .await;
    // And the parent of a denylisted file.
    expect_code(
        &h,
        "shell::fs::mv",
        json!({"src": "private", "dst": "open"}),
        "S211",
    )
    .await;
    assert!(j.root.join("secrets/k").exists() && !j.root.join("public").exists());
    assert!(j.root.join("private/key.txt").exists() && !j.root.join("open").exists());
    fs_hides(&h, "public/k", "SECRETK").await;
}

#[tokio::test]
async fn escape_112_command_renames_a_protected_folder() {
    let (_j, c) = protected_jail();
    let h = Harness::new(c).await;
    run(&h, Some("."), &["mv", "secrets", "public"]).await.ok();
    fs_hides(&h, "public/k", "SECRETK").await;
}

#[tokio::test]
async fn escape_113_command_reads_non_accessible_files() {
    require_abi!(1, "Landlock");
    let j = Jail::new();
    std::fs::write(j.root.join(".env"), "ENVSECRET").unwrap();
    std::fs::write(j.root.join("x.pem"), "PEM").unwrap();
    std::fs::create_dir_all(j.root.join("sub/secrets")).unwrap();
    std::fs::write(j.root.join("sub/secrets/k"), "K").unwrap();
    std::fs::write(j.root.join("sub/ok.txt"), "OK").unwrap();
    std::fs::create_dir_all(j.root.join("other")).unwrap();
    let h = j.harness().await;
    for f in [".env", "x.pem", "sub/secrets/k"] {
        run(&h, Some("."), &["cat", f]).await.denied();
        sh(&h, &format!("echo x >> {f}")).await.denied();
    }
    assert_eq!(std::fs::read(j.root.join(".env")).unwrap(), b"ENVSECRET");
    // Control: the siblings are readable and the root stays writable.
    assert_eq!(
        run(&h, Some("."), &["cat", "sub/ok.txt"]).await.ok().stdout,
        "OK"
    );
    sh(&h, "echo n > other/new.txt && cat other/new.txt")
        .await
        .ok();
    // LIMIT (documented): Landlock cannot deny one entry of a granted directory, so a
    // directory that holds a protected entry is granted piecewise: a file created in it later
    // can be created but not opened by commands.
    sh(&h, "echo n > new.txt").await.denied();
}

#[tokio::test]
async fn escape_114_limit_non_accessible_file_created_later() {
    // LIMIT: Landlock rules attach to inodes that exist when the roots are walked; a `.env`
    // created afterwards is readable by commands. The fs surface still hides it by name.
    require_abi!(1, "Landlock");
    let j = Jail::new();
    let h = j.harness().await;
    sh(&h, "echo LATE > .env").await.ok();
    assert_eq!(
        run(&h, Some("."), &["cat", ".env"]).await.ok().stdout,
        "LATE\n"
    );
    expect_code(
        &h,
        "shell::workspace::read-bytes",
        json!({"path": ".env"}),
        "S211",
    )
    .await;
}

// ------------------------------------------------------------------ terminals

/// A pty opened by the test on the host: (master, slave path). The slave is kept open so
/// the pts node exists while the command runs.
fn host_pty() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd, String) {
    let p = nix::pty::openpty(None, None).expect("openpty");
    let path = std::fs::read_link(format!("/proc/self/fd/{}", p.slave.as_raw_fd()))
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(path.starts_with("/dev/pts/"), "{path}");
    // Non-blocking, to check below that nothing was written to it.
    nix::fcntl::fcntl(
        &p.master,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    (p.master, p.slave, path)
}

async fn host_pty_unreachable(h: &Harness, cwd: Option<&str>) {
    let (master, _slave, pts) = host_pty();
    // Not there at all (a write with O_CREAT into devpts reads EACCES, a plain open ENOENT).
    let o = run(h, cwd, &["sh", "-c", &format!("echo FAKE > {pts}")]).await;
    o.denied();
    let o = run(h, cwd, &["head", "-c1", &pts]).await;
    o.failed_with("No such file or directory");
    let o = run(h, cwd, &["sh", "-c", "ls /dev/pts"]).await;
    o.ok();
    assert_eq!(o.stdout, "ptmx\n", "{o:?}");
    let mut buf = [0u8; 64];
    assert_eq!(
        nix::unistd::read(&master, &mut buf),
        Err(nix::errno::Errno::EAGAIN),
        "something reached the host's pty"
    );
}

#[tokio::test]
async fn escape_115_jailed_command_cannot_reach_host_ptys() {
    require_root!("a private devpts instance (CAP_SYS_ADMIN at executor start-up)");
    let j = Jail::new();
    let h = j.harness().await;
    host_pty_unreachable(&h, Some(".")).await;
}

#[tokio::test]
async fn escape_116_unjailed_command_cannot_reach_host_ptys() {
    require_root!("a private devpts instance (CAP_SYS_ADMIN at executor start-up)");
    let h = Harness::default().await;
    host_pty_unreachable(&h, None).await;
}

#[tokio::test]
async fn escape_117_command_allocates_its_own_pty() {
    require_root!("a private devpts instance (CAP_SYS_ADMIN at executor start-up)");
    let py = require!(python3(), "python3");
    let script = "import os, pty\nm, s = pty.openpty()\nprint(os.ttyname(s))\nos.write(s, b'hi\\n')\nprint(os.read(m, 16))\n";
    let j = Jail::new();
    let jailed_h = j.harness().await;
    let unjailed_h = Harness::default().await;
    for (h, cwd) in [(&jailed_h, Some(".")), (&unjailed_h, None)] {
        let o = run(h, cwd, &[py, "-c", script]).await;
        o.ok();
        assert_eq!(o.stdout, "/dev/pts/0\nb'hi\\r\\n'\n", "{o:?}");
        if Path::new("/usr/bin/script").exists() {
            let o = run(h, cwd, &["script", "-qec", "tty", "/dev/null"]).await;
            o.ok();
            assert!(o.stdout.contains("/dev/pts/"), "{o:?}");
        }
    }
}

/// Holds a pty as an operator's terminal would: the other side has typed a line that waits
/// on the slave, and nothing has been written to the slave. Prints what reached the master
/// and what is still waiting on the slave once `done` appears.
const PTY_HOLDER: &str = r#"
import os, pty, sys, time, tty, fcntl
d = sys.argv[1]
m, s = pty.openpty()
tty.setraw(s)
os.write(m, b'TYPED-SECRET\n')
fcntl.fcntl(m, fcntl.F_SETFL, os.O_NONBLOCK)
open(d + '/pts.tmp', 'w').write(os.ttyname(s))
os.rename(d + '/pts.tmp', d + '/pts')
for _ in range(400):
    if os.path.exists(d + '/done'):
        break
    time.sleep(0.05)
time.sleep(0.2)
try:
    got = os.read(m, 4096)
except BlockingIOError:
    got = b''
print('master got', got)
fcntl.fcntl(s, fcntl.F_SETFL, os.O_NONBLOCK)
try:
    print('slave has', os.read(s, 64))
except BlockingIOError:
    print('slave has nothing: the typed line was read by someone else')
"#;

/// Another command: opens the holder's pts by path for writing, reading and both, and tries
/// to chmod it back open.
const PTY_INTRUDER: &str = r#"
import os, sys, time
d = sys.argv[1]
for _ in range(400):
    if os.path.exists(d + '/pts'):
        break
    time.sleep(0.05)
p = open(d + '/pts').read()
for label, flags in (('write', os.O_WRONLY), ('read', os.O_RDONLY | os.O_NONBLOCK), ('rw', os.O_RDWR | os.O_NONBLOCK)):
    try:
        fd = os.open(p, flags | os.O_NOCTTY)
    except OSError as e:
        print(label, e.strerror)
        continue
    if label != 'read':
        os.write(fd, b'FAKE\n')
    try:
        print(label, 'opened', os.read(fd, 64) if label != 'write' else b'')
    except BlockingIOError:
        print(label, 'opened')
try:
    os.chmod(p, 0o666)
    print('chmod done')
except OSError as e:
    print('chmod', e.strerror)
open(d + '/done', 'w').close()
"#;

#[tokio::test]
async fn escape_128_command_cannot_open_another_commands_pty() {
    // Every command of one executor shares its private devpts instance: a pty one command
    // (or an operator's shell::pty session) holds must not open by path from another, for
    // reading (what is typed there) or writing (fake output), nor be chmod-ed back open.
    require_root!("a private devpts instance (CAP_SYS_ADMIN at executor start-up)");
    let py = require!(python3(), "python3");
    let j = Jail::new();
    let jailed_h = j.harness().await;
    let unjailed_h = Harness::default().await;
    for (name, h, cwd) in [("j", &jailed_h, Some(".")), ("u", &unjailed_h, None)] {
        let d = j.root.join(name);
        std::fs::create_dir(&d).unwrap();
        let d = s(&d);
        let holder_argv = [py, "-c", PTY_HOLDER, &d];
        let intruder_argv = [py, "-c", PTY_INTRUDER, &d];
        let (holder, intruder) =
            tokio::join!(run(h, cwd, &holder_argv), run(h, cwd, &intruder_argv));
        holder.ok();
        intruder.ok();
        assert_eq!(
            intruder.stdout,
            "write Permission denied\nread Permission denied\nrw Permission denied\nchmod Operation not permitted\n",
            "{name}: {intruder:?}"
        );
        assert_eq!(
            holder.stdout, "master got b''\nslave has b'TYPED-SECRET\\n'\n",
            "{name}: {holder:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// coder::*: the same path policy as shell::fs::*, with C-codes.
// ---------------------------------------------------------------------------------------------

/// The code of a coder call: the call's own error, or its first entry's (batched calls).
async fn coder_code(h: &Harness, function: &str, payload: serde_json::Value) -> String {
    match h.call(function, payload.clone()).await {
        Err(e) => e.code.to_string(),
        Ok(v) => match v.get("results").and_then(|r| r.get(0)) {
            Some(r) if r["success"] == true => "ok".to_string(),
            Some(r) => r["error"]["code"].as_str().unwrap_or("?").to_string(),
            None => "ok".to_string(),
        },
    }
}

/// Every coder function aimed at `p` (reads and writes): each must give `code`.
async fn coder_all(h: &Harness, p: &str, code: &str) {
    let calls = [
        ("coder::read-file", json!({"path": p})),
        ("coder::read-file", json!({"path": p, "stat": true})),
        ("coder::read-file", json!({"paths": [p]})),
        ("coder::list-folder", json!({"path": p})),
        ("coder::tree", json!({"path": p})),
        ("coder::search", json!({"query": "S", "path": p})),
        (
            "coder::create-file",
            json!({"files": [{"path": p, "content": "x", "overwrite": true}]}),
        ),
        (
            "coder::create-file",
            json!({"files": [{"path": format!("{p}/new"), "content": "x"}]}),
        ),
        (
            "coder::update-file",
            json!({"files": [{"path": p, "ops": [{"op": "insert", "at_line": 1, "content": "x"}]}]}),
        ),
        (
            "coder::delete-file",
            json!({"paths": [p], "recursive": true}),
        ),
        (
            "coder::move",
            json!({"files": [{"from": p, "to": "stolen"}]}),
        ),
        (
            "coder::move",
            json!({"files": [{"from": "inside.txt", "to": p, "overwrite": true}]}),
        ),
    ];
    for (f, payload) in calls {
        let got = coder_code(h, f, payload.clone()).await;
        assert_eq!(got, code, "{f} {payload}");
    }
}

#[tokio::test]
async fn escape_c01_coder_symlinked_parent() {
    let j = Jail::new();
    std::os::unix::fs::symlink(&j.outside, j.root.join("link")).unwrap();
    std::fs::write(j.root.join("inside.txt"), "in").unwrap();
    let h = j.harness().await;
    coder_all(&h, "link/secret.txt", "C215").await;
    // The link itself lives in the root; what it leads to does not.
    for (f, payload) in [
        ("coder::list-folder", json!({"path": "link"})),
        ("coder::tree", json!({"path": "link"})),
        ("coder::search", json!({"query": "S", "path": "link"})),
        (
            "coder::create-file",
            json!({"files": [{"path": "link/deep/new", "content": "x"}]}),
        ),
    ] {
        assert_eq!(
            coder_code(&h, f, payload.clone()).await,
            "C215",
            "{f} {payload}"
        );
    }
    j.outside_untouched();
    assert!(!j.root.join("stolen").exists());
    assert_eq!(
        std::fs::read_to_string(j.root.join("inside.txt")).unwrap(),
        "in"
    );
}

#[tokio::test]
async fn escape_c02_coder_symlinked_leaf() {
    let j = Jail::new();
    std::os::unix::fs::symlink(j.outside.join("secret.txt"), j.root.join("leaf")).unwrap();
    std::fs::write(j.root.join("inside.txt"), "in").unwrap();
    let h = j.harness().await;
    for (f, payload) in [
        ("coder::read-file", json!({"path": "leaf"})),
        ("coder::read-file", json!({"paths": ["leaf"]})),
        (
            "coder::create-file",
            json!({"files": [{"path": "leaf", "content": "x", "overwrite": true}]}),
        ),
        (
            "coder::update-file",
            json!({"files": [{"path": "leaf", "ops": [{"op": "insert", "at_line": 1, "content": "x"}]}]}),
        ),
        ("coder::search", json!({"query": "S", "path": "leaf"})),
    ] {
        assert_eq!(
            coder_code(&h, f, payload.clone()).await,
            "C215",
            "{f} {payload}"
        );
    }
    // Listings show the link as a link, never its target; searches do not follow it.
    let v = h.ok("coder::list-folder", json!({})).await;
    let leaf = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "leaf")
        .unwrap();
    assert_eq!(leaf["kind"], "symlink");
    let v = h.ok("coder::search", json!({"query": "SECRET"})).await;
    assert_eq!(v["content_matches"], json!([]));
    // Deleting the leaf removes the link itself.
    assert_eq!(
        coder_code(&h, "coder::delete-file", json!({"paths": ["leaf"]})).await,
        "ok"
    );
    assert!(std::fs::symlink_metadata(j.root.join("leaf")).is_err());
    j.outside_untouched();
}

#[tokio::test]
async fn escape_c03_coder_dotdot_and_prefix_confusion() {
    let j = Jail::new();
    std::fs::create_dir_all(j.root.join("a")).unwrap();
    std::fs::write(j.root.join("inside.txt"), "in").unwrap();
    let evil = j.base.join(format!(
        "{}-evil",
        j.root.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&evil).unwrap();
    std::fs::write(evil.join("f"), "EVIL").unwrap();
    let h = j.harness().await;
    coder_all(&h, "../outside/secret.txt", "C215").await;
    coder_all(&h, "a/../../outside/secret.txt", "C215").await;
    coder_all(&h, &format!("{}/../outside/secret.txt", s(&j.root)), "C215").await;
    coder_all(&h, &s(&evil.join("f")), "C215").await;
    j.outside_untouched();
    assert_eq!(std::fs::read_to_string(evil.join("f")).unwrap(), "EVIL");
}

#[tokio::test]
async fn escape_c04_coder_rename_exchange_race_during_edits() {
    let j = Jail::new();
    let d = j.root.join("d");
    let swap = j.root.join("swap");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("f"), "line\n").unwrap();
    std::os::unix::fs::symlink(&j.outside, &swap).unwrap();
    let h = j.harness().await;
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = {
        let stop = stop.clone();
        let (a, b) = (
            std::ffi::CString::new(s(&d)).unwrap(),
            std::ffi::CString::new(s(&swap)).unwrap(),
        );
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: two valid NUL-terminated paths; renameat2 only swaps directory entries.
                let rc = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(rc, 0, "renameat2: {}", std::io::Error::last_os_error());
                n += 1;
            }
            n
        })
    };
    let (mut ok, mut refused) = (0, 0);
    for i in 0..300 {
        let (f, payload) = if i % 2 == 0 {
            (
                "coder::create-file",
                json!({"files": [{"path": "d/f", "content": format!("round {i}\n"), "overwrite": true}]}),
            )
        } else {
            (
                "coder::update-file",
                json!({"files": [{"path": "d/f", "ops": [{"op": "insert", "at_line": 1, "content": format!("r{i}\n")}]}]}),
            )
        };
        match coder_code(&h, f, payload).await.as_str() {
            "ok" => ok += 1,
            "C215" | "C211" | "C221" => refused += 1,
            other => panic!("round {i}: unexpected {other}"),
        }
        assert!(
            !j.outside.join("f").exists(),
            "round {i}: a write landed outside the jail"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let n = swaps.join().unwrap();
    eprintln!("coder race: {n} exchanges, {ok} edits landed inside, {refused} refused");
    assert!(n > 0);
    assert_eq!(ok + refused, 300);
    j.outside_untouched();
}

#[tokio::test]
async fn escape_c05_coder_non_accessible_through_symlinks() {
    let j = Jail::new();
    std::fs::write(j.root.join(".env"), "SECRET=1\n").unwrap();
    std::fs::create_dir_all(j.root.join("secrets")).unwrap();
    std::fs::write(j.root.join("secrets/token"), "SECRET token\n").unwrap();
    std::os::unix::fs::symlink(".env", j.root.join("alias")).unwrap();
    std::os::unix::fs::symlink("secrets", j.root.join("vault")).unwrap();
    std::fs::write(j.root.join("inside.txt"), "in").unwrap();
    let h = j.harness().await;
    for p in ["alias", "vault/token", ".env", "secrets/token"] {
        for (f, payload) in [
            ("coder::read-file", json!({"path": p})),
            ("coder::read-file", json!({"paths": [p]})),
            (
                "coder::update-file",
                json!({"files": [{"path": p, "ops": [{"op": "insert", "at_line": 1, "content": "x"}]}]}),
            ),
            (
                "coder::create-file",
                json!({"files": [{"path": p, "content": "x", "overwrite": true}]}),
            ),
        ] {
            assert_eq!(
                coder_code(&h, f, payload.clone()).await,
                "C211",
                "{f} {payload}"
            );
        }
    }
    // `**/secrets/**` guards what is inside the folder: it is listed, flagged.
    let v = h.ok("coder::list-folder", json!({"path": "vault"})).await;
    assert_eq!(v["path"], s(&j.root.join("secrets")));
    assert_eq!(v["entries"][0]["name"], "token");
    assert_eq!(v["entries"][0]["non_accessible"], true);
    let v = h.ok("coder::search", json!({"query": "SECRET"})).await;
    assert_eq!(v["content_matches"], json!([]), "{v}");
    assert_eq!(
        std::fs::read_to_string(j.root.join(".env")).unwrap(),
        "SECRET=1\n"
    );
    assert_eq!(
        std::fs::read_to_string(j.root.join("secrets/token")).unwrap(),
        "SECRET token\n"
    );
    j.outside_untouched();
}

// ------------------------------------------------------------------ the command user (run_as)

/// The command user of the `run_as` cases, and another user owning a file outside.
const CMD_UID: u32 = 4242;
const OTHER_UID: u32 = 4343;

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
}

/// `j` with the root handed to `CMD_UID`, and `outside/other.txt` owned by `OTHER_UID`.
fn user_jail() -> Jail {
    let j = other_file(Jail::new());
    chown(&j.root, CMD_UID);
    j
}

/// `outside/other.txt`, owned by `OTHER_UID`, mode 0644.
fn other_file(j: Jail) -> Jail {
    std::fs::write(j.outside.join("other.txt"), "other").unwrap();
    chown(&j.outside.join("other.txt"), OTHER_UID);
    std::fs::set_permissions(
        j.outside.join("other.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    j
}

fn with_run_as(j: &Jail, run_as: Option<&str>) -> Config {
    let mut c = j.config();
    c.confinement.run_as = run_as.map(str::to_string);
    c
}

/// Mode, owner and mtime of `p`.
fn meta(p: &Path) -> (u32, u32, u32, i64) {
    let m = std::fs::metadata(p).unwrap();
    (m.mode() & 0o7777, m.uid(), m.gid(), m.mtime())
}

/// A jailed command cannot change the mode, owner or times of files outside the roots, owned
/// by root or by another user.
async fn assert_no_outside_metadata_changes(h: &Harness, j: &Jail) {
    for name in ["secret.txt", "other.txt"] {
        let f = j.outside.join(name);
        let before = meta(&f);
        for argv in [
            vec!["chmod", "0666", &s(&f)],
            vec!["chown", "4242:4242", &s(&f)],
            vec!["chgrp", "4242", &s(&f)],
            vec!["touch", "-c", "-d", "@978307200", &s(&f)],
        ] {
            let o = run(h, Some("."), &argv).await;
            assert!(
                o.code.is_some_and(|c| c != 0)
                    && (o.stderr.contains("Operation not permitted")
                        || o.stderr.contains("Permission denied")),
                "{argv:?} on {name}: {o:?}"
            );
        }
        assert_eq!(meta(&f), before, "{name} changed");
    }
}

/// No setuid or setgid bit anywhere, not even on the command's own files inside the roots.
async fn assert_no_special_bits(h: &Harness, j: &Jail) {
    let o = sh(
        h,
        "rm -rf own ownd; echo x > own && mkdir ownd && chmod 0700 own && echo ok",
    )
    .await;
    assert_eq!(o.ok().stdout, "ok\n");
    for (mode, target) in [
        ("4755", "own"),
        ("2755", "own"),
        ("6755", "own"),
        ("u+s", "own"),
        ("g+s", "ownd"),
    ] {
        run(h, Some("."), &["chmod", mode, target])
            .await
            .failed_with("Operation not permitted");
    }
    assert_eq!(mode_of(&j.root.join("own")), 0o700);
    assert_eq!(mode_of(&j.root.join("ownd")) & 0o6000, 0);
    // Through python's os.chmod and os.fchmod too (fchmodat / fchmod).
    if let Some(py) = python3() {
        let o = run(
            h,
            Some("."),
            &[
                py,
                "-c",
                "import os\nfor f in (lambda: os.chmod('own', 0o4755), lambda: os.fchmod(os.open('own', os.O_RDONLY), 0o2755)):\n    try:\n        f(); print('changed')\n    except PermissionError as e: print(e.errno)",
            ],
        )
        .await;
        assert_eq!(o.ok().stdout, "1\n1\n");
        assert_eq!(mode_of(&j.root.join("own")), 0o700);
    }
}

fn status_ids(text: &str) -> (String, String, String) {
    let f = status_fields(text);
    (
        field(&f, "Uid")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        field(&f, "Gid")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        field(&f, "Groups").to_string(),
    )
}

#[tokio::test]
async fn escape_118_run_as_cannot_touch_outside_metadata() {
    require_root!("run_as cases");
    let j = user_jail();
    let h = Harness::new(with_run_as(&j, Some("4242:4242"))).await;
    assert_no_outside_metadata_changes(&h, &j).await;
    assert_eq!(std::fs::read(j.outside.join("secret.txt")).unwrap(), SECRET);
}

#[tokio::test]
async fn escape_119_no_special_bits_whatever_the_uid() {
    require_root!("run_as cases");
    let j = user_jail();
    let h = Harness::new(with_run_as(&j, Some("4242:4242"))).await;
    assert_no_special_bits(&h, &j).await;
    drop(h);
    // The seccomp rule holds for root commands too (explicit run_as: root).
    let j = Jail::new();
    let h = Harness::new(with_run_as(&j, Some("root"))).await;
    assert_no_special_bits(&h, &j).await;
    // Control: fs.allow_special_bits lets the command's own file get them.
    let mut c = with_run_as(&j, Some("root"));
    c.fs.allow_special_bits = true;
    drop(h);
    let h = Harness::new(c).await;
    run(&h, Some("."), &["chmod", "4755", "own"]).await.ok();
    assert_eq!(mode_of(&j.root.join("own")), 0o4755);
}

#[tokio::test]
async fn escape_120_fs_and_commands_share_files() {
    require_root!("run_as cases");
    let j = user_jail();
    let h = Harness::new(with_run_as(&j, None)).await;
    h.ok(
        "shell::fs::write",
        json!({"path": "made/by/fs.txt", "content": "one\n", "parents": true}),
    )
    .await;
    h.ok("shell::fs::mkdir", json!({"path": "fsdir"})).await;
    h.ok(
        "shell::fs::sed",
        json!({"files": ["made/by/fs.txt"], "pattern": "one", "replacement": "two"}),
    )
    .await;
    assert_eq!(meta(&j.root.join("made/by/fs.txt")).1, CMD_UID);
    assert_eq!(meta(&j.root.join("fsdir")).1, CMD_UID);
    let o = sh(
        &h,
        "echo three >> made/by/fs.txt && touch fsdir/x && rm fsdir/x && echo cmd > bycmd.txt && cat made/by/fs.txt",
    )
    .await;
    assert_eq!(o.ok().stdout, "two\nthree\n");
    let r = h
        .ok("shell::fs::grep", json!({"path": ".", "pattern": "cmd"}))
        .await;
    assert!(r.to_string().contains("bycmd.txt"), "{r}");
    h.ok(
        "shell::fs::write",
        json!({"path": "bycmd.txt", "content": "rewritten"}),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(j.root.join("bycmd.txt")).unwrap(),
        "rewritten"
    );
}

#[tokio::test]
async fn escape_121_status_shows_the_command_user() {
    require_root!("run_as cases");
    let j = user_jail();
    // run_as unset: the owner of the primary root.
    let h = Harness::new(with_run_as(&j, None)).await;
    let o = run(&h, Some("."), &["cat", "/proc/self/status"]).await;
    assert_confined_status(&o.ok().stdout, true);
    assert_eq!(
        status_ids(&o.stdout),
        (
            "4242 4242 4242 4242".into(),
            "4242 4242 4242 4242".into(),
            "4242".into()
        )
    );
    drop(h);
    // Explicit uid:gid (no user database entry: exactly that group, no root group).
    let h = Harness::new(with_run_as(&j, Some("4242:4343"))).await;
    let o = run(&h, Some("."), &["cat", "/proc/self/status"]).await;
    assert_confined_status(&o.ok().stdout, true);
    assert_eq!(
        status_ids(&o.stdout),
        (
            "4242 4242 4242 4242".into(),
            "4343 4343 4343 4343".into(),
            "4343".into()
        )
    );
}

/// `iii-shell call --config FILE shell::exec` of `argv`, as `setpriv` args say: (stdout, stderr).
fn call_cli(config: &Config, dir: &Path, setpriv: &[&str], argv: &[&str]) -> (String, String) {
    let file = dir.join("cfg.yaml");
    std::fs::write(&file, serde_norway::to_string(config).unwrap()).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let payload = json!({"command": argv[0], "args": &argv[1..], "cwd": "."}).to_string();
    let mut cmd = if setpriv.is_empty() {
        std::process::Command::new(bin())
    } else {
        let mut c = std::process::Command::new("setpriv");
        c.args(setpriv).arg(bin());
        c
    };
    let out = cmd
        .args(["call", "--config", &s(&file), "shell::exec", &payload])
        .env("RUST_LOG", "warn")
        .current_dir("/")
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn escape_122_root_owned_root_runs_nobody_and_strict_refuses() {
    require_root!("run_as cases");
    let j = other_file(Jail::new());
    let h = Harness::new(with_run_as(&j, None)).await;
    let o = run(&h, Some("."), &["cat", "/proc/self/status"]).await;
    assert_eq!(status_ids(&o.ok().stdout).0, "65534 65534 65534 65534");
    assert_eq!(status_ids(&o.stdout).1, "65534 65534 65534 65534");
    sh(&h, "echo x > inside").await.denied();
    assert!(!j.root.join("inside").exists());
    // It can read the jail.
    std::fs::write(j.root.join("readme"), "r").unwrap();
    assert_eq!(sh(&h, "cat readme").await.ok().stdout, "r");
    assert_no_outside_metadata_changes(&h, &j).await;
    drop(h);
    // The start-up WARN names the fix.
    let (out, err) = call_cli(&with_run_as(&j, None), &j.base, &[], &["id", "-u"]);
    assert!(out.contains("\"stdout\": \"65534\\n\""), "{out}");
    // Exactly one WARN about the command user (other start-up warnings, such as a pids
    // controller this host does not delegate, are not this case's business).
    assert_eq!(
        err.lines()
            .filter(|l| l.contains("WARN") && l.contains("run_as"))
            .count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("set confinement.run_as")
            && err.contains(&format!("change the owner of {}", s(&j.root))),
        "{err}"
    );
    // strict refuses.
    let mut strict = with_run_as(&j, None);
    strict.confinement.mode = iii_shell_protocol::config::ConfinementMode::Strict;
    let (out, _) = call_cli(&strict, &j.base, &[], &["id", "-u"]);
    assert!(
        out.contains("strict mode refuses to start") && !out.contains("65534\\n"),
        "{out}"
    );
    // And so does an explicit run_as: root in a jail under strict.
    strict.confinement.run_as = Some("root".into());
    let (out, _) = call_cli(&strict, &j.base, &[], &["id", "-u"]);
    assert!(out.contains("run_as is root in a jail"), "{out}");
}

#[tokio::test]
async fn escape_123_non_root_worker_runs_commands_as_itself() {
    require_root!("run_as cases");
    let j = user_jail();
    // The worker itself runs as 4242 (run_as is ignored: it cannot switch).
    let c = with_run_as(&j, Some("root"));
    let priv_args = ["--reuid", "4242", "--regid", "4242", "--clear-groups"];
    let (out, _) = call_cli(&c, &j.base, &priv_args, &["id", "-u"]);
    assert!(out.contains("\"stdout\": \"4242\\n\""), "{out}");
    for name in ["secret.txt", "other.txt"] {
        let f = j.outside.join(name);
        let before = meta(&f);
        let (out, _) = call_cli(
            &c,
            &j.base,
            &priv_args,
            &[
                "sh",
                "-c",
                &format!(
                    "chmod 0666 {0}; chown 4242 {0}; touch -c -d @978307200 {0}",
                    q(&f)
                ),
            ],
        );
        assert_eq!(
            out.matches("Operation not permitted").count()
                + out.matches("Permission denied").count(),
            3,
            "{out}"
        );
        assert_eq!(meta(&f), before);
    }
    let (out, _) = call_cli(
        &c,
        &j.base,
        &priv_args,
        &[
            "sh",
            "-c",
            "echo x > own; chmod 4755 own; chmod 2755 own; stat -c %a own",
        ],
    );
    assert!(out.contains("\"stdout\": \"644\\n\""), "{out}");
    assert_eq!(out.matches("Operation not permitted").count(), 2, "{out}");
}

#[tokio::test]
async fn escape_124_commands_never_run_as_the_socket_peer() {
    require_root!("run_as cases");
    // Two units: the broker's uid may connect to the executor socket, so no command may run
    // as it (Landlock ABI <= 7 does not govern connecting to a socket file).
    let j = user_jail();
    let mut e = SocketExecutor::start(CMD_UID).await;
    let run_with = |run_as: &str| {
        let file = j.base.join(format!("cfg-{run_as}.yaml"));
        let c = with_run_as(&j, Some(run_as));
        std::fs::write(&file, serde_norway::to_string(&c).unwrap()).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let payload = json!({"command": "id", "args": ["-u"], "cwd": "."}).to_string();
        let out = std::process::Command::new("setpriv")
            .args(["--reuid", "4242", "--regid", "4242", "--clear-groups"])
            .arg(bin())
            .args(["call", "--socket", &s(&e.path), "--config", &s(&file)])
            .args(["shell::exec", &payload])
            .current_dir("/")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = run_with("4242");
    assert!(
        out.contains("the uid allowed to connect to the executor socket"),
        "{out}"
    );
    // Another user is fine.
    let out = run_with("4343");
    assert!(out.contains("\"stdout\": \"4343\\n\""), "{out}");
    e.assert_alive();
}

// ------------------------------------------------------- the special-bits rule, every path

/// `Seccomp_filters` of a process: how many filters it runs under.
fn seccomp_filters(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    field(&status_fields(&status), "Seccomp_filters").to_string()
}

/// A script that tries every spelling of setuid/setgid on its own file `<tag>.f` and writes
/// `changed=<how many worked> filters=<its Seccomp_filters>` to `<tag>.out` (renamed into
/// place, so a reader never sees half of it).
fn special_bits_script(tag: &str) -> String {
    format!(
        "t={tag}; echo x > $t.f && chmod 0700 $t.f || exit 1
c=0; for m in 4755 2755 6755 u+s g+s; do chmod $m $t.f 2>/dev/null && c=$((c+1)); done
n=$(sed -n 's/^Seccomp_filters:[[:space:]]*//p' /proc/self/status)
echo \"changed=$c filters=$n\" > $t.tmp && mv $t.tmp $t.out"
    )
}

/// Waits for `<tag>.out` in the root and returns it.
async fn special_bits_result(j: &Jail, tag: &str) -> String {
    let out = j.root.join(format!("{tag}.out"));
    assert!(
        eventually(Duration::from_secs(20), || out.exists()).await,
        "{tag}: the command never wrote its result"
    );
    std::fs::read_to_string(out).unwrap().trim_end().to_string()
}

/// The script through `shell::exec`, `shell::exec_bg` and a terminal session.
async fn special_bits_on_every_path(h: &Harness, j: &Jail) -> [(String, String); 3] {
    run(h, Some("."), &["sh", "-c", &special_bits_script("exec")])
        .await
        .ok();
    h.ok(
        "shell::exec_bg",
        json!({"command": "sh", "args": ["-c", special_bits_script("bg")], "cwd": "."}),
    )
    .await;
    use iii_shell_protocol::pty::{OpenSpec, PtyOp};
    h.services
        .executor
        .call(Request::Pty(PtyOp::Open(OpenSpec {
            cwd: s(&j.root),
            cols: 80,
            rows: 24,
            output_function_id: "iii::shell-ui::pty-output::console-escape125".into(),
            argv: Some(vec!["sh".into(), "-c".into(), special_bits_script("pty")]),
            env: Vec::new(),
            caller: String::new(),
            network: None,
            limits: Default::default(),
        })))
        .await
        .expect("pty open");
    let mut r = Vec::new();
    for tag in ["exec", "bg", "pty"] {
        r.push((tag.to_string(), special_bits_result(j, tag).await));
        assert_eq!(mode_of(&j.root.join(format!("{tag}.f"))), 0o700, "{tag}");
    }
    r.try_into().unwrap()
}

/// Sends `config` to the executor as a reload would (a newer generation).
async fn reload(
    h: &Harness,
    generation: u64,
    config: &Config,
) -> Result<(), iii_shell_protocol::WireError> {
    h.services
        .executor
        .call(Request::SetPolicy {
            generation,
            config_json: serde_json::to_string(config).unwrap(),
        })
        .await
        .map(drop)
}

#[tokio::test]
async fn escape_125_no_special_bits_on_any_spawn_path_and_no_filter_per_spawn() {
    require_root!("run_as cases");
    // Root commands (run_as: root) would set the bits but for the rule. With and without
    // pre-started processes (the fallback spawn path).
    for extra in [&[][..], &["--no-prestart"][..]] {
        let j = Jail::new();
        let h = Harness::with_args(with_run_as(&j, Some("root")), extra).await;
        let executor = seccomp_filters(h.executor_pid);
        let expected = format!("changed=0 filters={executor}");
        for (tag, got) in special_bits_on_every_path(&h, &j).await {
            // The rule is the executor's own: no command loads a filter of its own for it.
            assert_eq!(got, expected, "{tag} {extra:?}");
        }
    }
}

#[tokio::test]
async fn escape_126_special_bits_across_reloads() {
    require_root!("run_as cases");
    // Started with fs.allow_special_bits: the executor's filter has no rule, so its own
    // fs::chmod and commands may set the bits.
    let j = Jail::new();
    let mut c = with_run_as(&j, Some("root"));
    c.fs.allow_special_bits = true;
    let h = Harness::new(c.clone()).await;
    let executor = seccomp_filters(h.executor_pid);
    std::fs::write(j.root.join("a"), "x").unwrap();
    h.ok("shell::fs::chmod", json!({"path": "a", "mode": "4755"}))
        .await;
    assert_eq!(mode_of(&j.root.join("a")), 0o4755);
    let o = sh(&h, &special_bits_script("on")).await;
    o.ok();
    assert_eq!(
        special_bits_result(&j, "on").await,
        format!("changed=5 filters={executor}")
    );
    // true → false: from then on every command loads the rule itself.
    c.fs.allow_special_bits = false;
    reload(&h, 1_000, &c).await.expect("narrowing reload");
    for (tag, got) in special_bits_on_every_path(&h, &j).await {
        assert_eq!(
            got,
            format!("changed=0 filters={}", executor.parse::<u32>().unwrap() + 1),
            "{tag}"
        );
    }
    let e = h
        .err("shell::fs::chmod", json!({"path": "a", "mode": "2755"}))
        .await;
    assert_eq!(e.code, "S210", "{e:?}");
    drop(h);

    // Started without it: the rule is in the executor's filter, which cannot be removed, so
    // false → true is refused (the reload result says to restart) and the rule still holds.
    let j = Jail::new();
    let mut c = with_run_as(&j, Some("root"));
    let h = Harness::new(c.clone()).await;
    c.fs.allow_special_bits = true;
    let e = reload(&h, 1_000, &c)
        .await
        .expect_err("a widening the filter cannot follow");
    assert_eq!(e.code, "S210", "{e:?}");
    assert!(
        e.message.contains("fs.allow_special_bits") && e.message.contains("restart the worker"),
        "{e:?}"
    );
    let executor = seccomp_filters(h.executor_pid);
    let o = sh(&h, &special_bits_script("still")).await;
    o.ok();
    assert_eq!(
        special_bits_result(&j, "still").await,
        format!("changed=0 filters={executor}")
    );
    // The executor's own chmod of a plain mode still works under its rule.
    std::fs::write(j.root.join("b"), "x").unwrap();
    h.ok("shell::fs::chmod", json!({"path": "b", "mode": "0750"}))
        .await;
    assert_eq!(mode_of(&j.root.join("b")), 0o750);
}

#[tokio::test]
async fn escape_127_job_cgroups_survive_the_uid_switch() {
    require_root!("run_as cases");
    // Where the test's own cgroup lets a root executor make job cgroups, the one that becomes
    // the command user keeps them: the base is handed to that user before the switch.
    let control = Harness::default().await;
    let usable = job_cgroups_enabled(control.executor_pid);
    drop(control);
    if !usable {
        eprintln!("no writable cgroup v2 here: only the fallback (sessions and parentage) runs");
    }
    let j = user_jail();
    let h = Harness::new(with_run_as(&j, Some("4242:4242"))).await;
    assert_eq!(job_cgroups_enabled(h.executor_pid), usable);
    if let Some(base) = job_cgroup_base_of(h.executor_pid) {
        assert_eq!(std::fs::metadata(&base).unwrap().uid(), CMD_UID, "{base:?}");
    }
    // A setsid daemon that closed its output outlives its command only without job cgroups.
    let m = marker();
    let o = sh(
        &h,
        &format!("setsid sleep {m} </dev/null >/dev/null 2>&1 & grep ^0:: /proc/self/cgroup"),
    )
    .await;
    o.ok();
    let needle = format!("sleep {m}");
    if usable {
        assert!(
            o.stdout
                .contains(&format!("/iii-shell-{}/", h.executor_pid)),
            "the command ran outside the job cgroups: {o:?}"
        );
        assert!(
            eventually(Duration::from_secs(10), || procs_with(&needle).is_empty()).await,
            "the setsid daemon outlived its command"
        );
    }
    for p in procs_with(&needle) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

// ------------------------------------------------------------------ network modes (140 and up)

mod network;
// ------------------------------------------------ memory, CPU and process limits per job

/// The command users of the limit cases: root, then `CMD_UID`.
const LIMIT_USERS: [Option<&str>; 2] = [None, Some("4242:4242")];

/// A jail for `run_as` (its root handed to `CMD_UID` when that is the user) whose jobs have
/// the limits `set` leaves.
fn limits_config(
    run_as: Option<&str>,
    set: impl FnOnce(&mut iii_shell_protocol::config::JobLimitsConfig),
) -> (Jail, Config) {
    let j = if run_as.is_some() {
        user_jail()
    } else {
        // Writable by whichever user the default makes commands run as.
        let j = Jail::new();
        std::fs::set_permissions(&j.root, std::fs::Permissions::from_mode(0o777)).unwrap();
        j
    };
    let mut c = with_run_as(&j, run_as);
    set(&mut c.confinement.job_limits);
    (j, c)
}

/// `iii-shell probe ARGS` through `shell::exec` in the jail, with the call's `limits`.
async fn probe_with(h: &Harness, args: &[&str], limits: Option<serde_json::Value>) -> Out {
    let mut argv = vec![s(bin())];
    argv.push("probe".into());
    argv.extend(args.iter().map(|a| a.to_string()));
    let mut p = json!({"command": argv[0], "args": &argv[1..], "cwd": ".", "timeout_ms": 30_000});
    if let Some(l) = limits {
        p["limits"] = l;
    }
    let v = h.ok("shell::exec", p).await;
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    Out::from_value(&argv, &v)
}

/// The line of `probe limits` for `controller` (`pids`, `memory`, `cpu`).
fn limits_line(out: &Out, controller: &str) -> String {
    out.stdout
        .lines()
        .find(|l| l.starts_with(&format!("{controller} ")))
        .unwrap_or_else(|| panic!("no {controller} line: {out:?}"))
        .to_string()
}

/// A `shell::exec_bg` job's record once it has left `running`.
async fn finished_record(h: &Harness, id: &str) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = h.ok("shell::status", json!({ "job_id": id })).await;
        let r = r["job"].clone();
        if r["status"] != "running" || std::time::Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn escape_129_a_memory_bomb_is_killed_at_the_memory_limit() {
    require_root!("run_as cases");
    for run_as in LIMIT_USERS {
        let (_j, c) = limits_config(run_as, |l| l.memory_max_bytes = Some(64 << 20));
        let h = Harness::new(c).await;
        // The limit is the kernel's, as the command itself sees it.
        let l = probe_with(&h, &["limits"], None).await;
        let line = limits_line(l.ok(), "memory");
        assert!(
            line.contains("memory.limit_in_bytes=67108864") || line.contains("memory.max=67108864"),
            "{run_as:?}: {line}"
        );
        // 512 MiB asked, 64 allowed: killed by the kernel, and the caller is told why.
        let o = probe_with(&h, &["alloc", "512"], None).await;
        assert_eq!(o.code, None, "{run_as:?}: not killed: {o:?}");
        assert!(!o.stdout.contains("in all"), "{run_as:?}: {o:?}");
        assert!(
            o.stderr.ends_with(
                "iii-shell: killed: memory limit 64 MiB reached (confinement.job_limits.memory_max_bytes)\n"
            ),
            "{run_as:?}: {o:?}"
        );
        // A background job ends `killed`, its record saying why.
        let bin = s(bin());
        let id = h
            .ok(
                "shell::exec_bg",
                json!({"command": bin, "args": ["probe", "alloc", "512"], "cwd": "."}),
            )
            .await["job_id"]
            .as_str()
            .unwrap()
            .to_string();
        let r = finished_record(&h, &id).await;
        assert_eq!(r["status"], "killed", "{run_as:?}: {r}");
        assert!(
            r["stderr"].as_str().unwrap_or_default().ends_with(
                "iii-shell: killed: memory limit 64 MiB reached (confinement.job_limits.memory_max_bytes)\n"
            ),
            "{run_as:?}: {r}"
        );
        // The next command in a reused cgroup is not blamed for the earlier kill.
        let ok = probe_with(&h, &["alloc", "8"], None).await;
        ok.ok();
        assert!(!ok.stderr.contains("killed"), "{run_as:?}: {ok:?}");
    }
}

#[tokio::test]
async fn escape_130_a_fork_bomb_is_bounded_by_pids_max() {
    require_root!("run_as cases");
    for run_as in LIMIT_USERS {
        let (_j, c) = limits_config(run_as, |l| l.pids_max = Some(20));
        let h = Harness::new(c).await;
        let l = probe_with(&h, &["limits"], None).await;
        assert!(
            limits_line(l.ok(), "pids").starts_with("pids pids.max=20 "),
            "{run_as:?}: {l:?}"
        );
        // At most 40 tries whatever happens; each process that started writes a line. The
        // shell gives up at the first fork the kernel refuses; the job's tree goes with it.
        let forks = _j.root.join("forks.txt");
        let _ = std::fs::remove_file(&forks);
        let o = sh(
            &h,
            "for i in $(seq 40); do (echo x >> forks.txt; exec sleep 5) & done; wait",
        )
        .await;
        let started = std::fs::read_to_string(&forks)
            .unwrap_or_default()
            .lines()
            .count();
        assert!(
            (1..20).contains(&started),
            "{run_as:?}: {started} processes besides the shell in a job limited to 20: {o:?}"
        );
    }
}

#[tokio::test]
async fn escape_131_a_cpu_burner_is_held_to_its_cpu_share() {
    require_root!("run_as cases");
    for run_as in LIMIT_USERS {
        let (_j, c) = limits_config(run_as, |l| l.cpu_max_percent = Some(10));
        let h = Harness::new(c).await;
        let l = probe_with(&h, &["limits"], None).await;
        let line = limits_line(l.ok(), "cpu");
        assert!(
            line.contains("cpu.cfs_quota_us=10000 cpu.cfs_period_us=100000")
                || line.contains("cpu.max=10000 100000"),
            "{run_as:?}: {line}"
        );
        // doctor shows the limit and its controller, and the value the kernel has.
        let Ok(iii_shell_protocol::messages::Reply::Doctor(report)) =
            h.services.executor.call(Request::Doctor).await
        else {
            panic!("no doctor reply")
        };
        let line = |key: &str| {
            report
                .commands
                .process_limits
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no {key}: {:?}", report.commands.process_limits))
        };
        assert!(
            line("cpu.max")
                == "enforced: 10 per job (the job's twin in the cgroup v1 cpu hierarchy)"
                || line("cpu.max") == "enforced: 10 per job (the job cgroup)",
            "{}",
            line("cpu.max")
        );
        let kernel = line("job cgroup as the kernel has it");
        assert!(
            kernel.contains("cpu.cfs_quota_us=10000 cpu.cfs_period_us=100000")
                || kernel.contains("cpu.max=10000 100000"),
            "{kernel}"
        );
        // Two seconds of spinning at 10 % of a CPU: about 200 ms of CPU time, and the kernel
        // throttled it. (Generous: anything under 600 ms; unlimited it is up to 2000.)
        let o = probe_with(&h, &["burn", "2000"], None).await;
        o.ok();
        let field = |k: &str| -> u64 {
            o.stdout
                .split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{run_as:?}: no {k}: {o:?}"))
        };
        assert!(field("cpu_ms=") < 600, "{run_as:?}: {o:?}");
        assert!(
            field("nr_throttled=") > 0,
            "{run_as:?}: never throttled: {o:?}"
        );
    }
}

#[tokio::test]
async fn escape_132_a_call_tightens_its_own_limits() {
    require_root!("run_as cases");
    for run_as in LIMIT_USERS {
        let (j, c) = limits_config(run_as, |l| {
            l.memory_max_bytes = Some(256 << 20);
            l.pids_max = Some(1024);
        });
        let h = Harness::new(c).await;
        let tight = json!({"memory_max_bytes": 32 << 20, "cpu_max_percent": 20, "pids_max": 16});
        let l = probe_with(&h, &["limits"], Some(tight.clone())).await;
        l.ok();
        let (mem, cpu, pids) = (
            limits_line(&l, "memory"),
            limits_line(&l, "cpu"),
            limits_line(&l, "pids"),
        );
        assert!(
            mem.contains("=33554432 ") || mem.contains("memory.max=33554432"),
            "{run_as:?}: {mem}"
        );
        assert!(
            cpu.contains("cpu.cfs_quota_us=20000") || cpu.contains("cpu.max=20000 100000"),
            "{run_as:?}: {cpu}"
        );
        assert!(pids.starts_with("pids pids.max=16 "), "{run_as:?}: {pids}");
        // 64 MiB is under the worker's 256 but over the call's 32.
        let o = probe_with(&h, &["alloc", "64"], Some(tight.clone())).await;
        assert!(
            o.stderr.ends_with(
                "iii-shell: killed: memory limit 32 MiB reached (limits.memory_max_bytes of the call)\n"
            ),
            "{run_as:?}: {o:?}"
        );
        // The next call without limits has the worker's again (a pooled cgroup is rewritten).
        let l = probe_with(&h, &["limits"], None).await;
        assert!(
            limits_line(l.ok(), "pids").starts_with("pids pids.max=1024 "),
            "{run_as:?}: {l:?}"
        );
        // A background job and a terminal session get theirs too.
        let bin = s(bin());
        let id = h
            .ok(
                "shell::exec_bg",
                json!({"command": bin, "args": ["probe", "limits"], "cwd": ".", "limits": {"pids_max": 9}}),
            )
            .await["job_id"]
            .as_str()
            .unwrap()
            .to_string();
        let r = finished_record(&h, &id).await;
        assert!(
            r["stdout"]
                .as_str()
                .unwrap_or_default()
                .contains("pids pids.max=9 "),
            "{run_as:?}: {r}"
        );
        let out = j.root.join("pty-limits.txt");
        let _ = std::fs::remove_file(&out);
        h.ok(
            "shell::pty::open",
            json!({
                "cwd": s(&j.root), "cols": 80, "rows": 24,
                "output_function_id": "iii::shell-ui::pty-output::console-escape132",
                "program": "sh",
                "args": ["-c", format!("{} probe limits > {}", bin, s(&out))],
                "limits": {"pids_max": 7},
            }),
        )
        .await;
        assert!(
            eventually(Duration::from_secs(10), || std::fs::read_to_string(&out)
                .is_ok_and(|t| t.contains("pids pids.max=7 ")))
            .await,
            "{run_as:?}: {:?}",
            std::fs::read_to_string(&out)
        );
    }
}

#[tokio::test]
async fn escape_133_a_call_cannot_widen_its_limits() {
    let (j, c) = limits_config(None, |l| {
        l.memory_max_bytes = Some(64 << 20);
        l.pids_max = Some(64);
        l.cpu_max_percent = Some(50);
    });
    let h = Harness::new(c).await;
    for (field, value) in [
        ("memory_max_bytes", json!((64 << 20) + 1)),
        ("pids_max", json!(65)),
        ("cpu_max_percent", json!(51)),
        ("pids_max", json!(0)),
    ] {
        let limits = json!({ field: value });
        for (function, payload) in [
            ("shell::exec", json!({"command": "true", "limits": limits})),
            (
                "shell::exec_bg",
                json!({"command": "true", "limits": limits}),
            ),
            (
                "shell::pty::open",
                json!({
                    "cwd": s(&j.root), "cols": 80, "rows": 24,
                    "output_function_id": "iii::shell-ui::pty-output::console-escape133",
                    "program": "true", "limits": limits,
                }),
            ),
        ] {
            let e = h.err(function, payload).await;
            assert_eq!(e.code, "S210", "{function} {limits}: {e:?}");
            assert!(
                e.message.contains(&format!("'limits.{field}'")),
                "{function} {limits}: {e:?}"
            );
        }
    }
    // The executor checks again: a call that reached it unchecked is refused the same way.
    let e = h
        .services
        .executor
        .call(Request::Exec(iii_shell_protocol::messages::ExecSpec {
            argv: vec!["true".into()],
            cwd: None,
            env: Vec::new(),
            stdin: None,
            timeout_ms: 5000,
            network: None,
            limits: iii_shell_policy::call_limits::CallLimits {
                pids_max: Some(65),
                ..Default::default()
            },
        }))
        .await
        .expect_err("a widening reached the executor");
    assert_eq!(e.code, "S210", "{e:?}");
    assert!(e.message.contains("'limits.pids_max'"), "{e:?}");
}
