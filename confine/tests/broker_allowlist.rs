//! The broker's allowlist installed for real: this test runs itself again as a child process
//! (a filter cannot be removed), which installs `broker_allowlist::install()` exactly as the
//! broker does and reports what the kernel answers.

use std::process::Command;

const CHILD: &str = "III_SHELL_BROKER_ALLOWLIST_CHILD";

/// The errno of a raw call, or "ok".
fn verdict(r: libc::c_long) -> String {
    if r < 0 {
        format!(
            "errno={}",
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        )
    } else {
        "ok".into()
    }
}

/// Runs in the child: confine, then try each call and print `name verdict` lines.
fn confined_child() {
    iii_shell_confine::set_no_new_privs().expect("no_new_privs");
    iii_shell_confine::broker_allowlist::install().expect("install the broker allowlist");
    let mut lines = Vec::new();
    // SAFETY: each call passes null pointers or harmless values; the filter is expected to
    // refuse them before the kernel acts. A clone that did succeed returns 0 in a child that
    // exits at once.
    unsafe {
        lines.push(format!(
            "clone3 {}",
            verdict(libc::syscall(
                libc::SYS_clone3,
                std::ptr::null::<u8>(),
                0usize
            ))
        ));
        let r = libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        );
        if r == 0 {
            libc::_exit(0);
        }
        lines.push(format!("clone_newuser {}", verdict(r)));
        lines.push(format!(
            "mkdirat {}",
            verdict(libc::syscall(
                libc::SYS_mkdirat,
                libc::AT_FDCWD,
                c"/nonexistent-iii/x".as_ptr(),
                0o700
            ))
        ));
        lines.push(format!(
            "execve {}",
            verdict(libc::syscall(
                libc::SYS_execve,
                c"/bin/true".as_ptr(),
                std::ptr::null::<u8>(),
                std::ptr::null::<u8>()
            ))
        ));
        lines.push(format!(
            "getpid {}",
            verdict(libc::syscall(libc::SYS_getpid))
        ));
    }
    // A thread: glibc tries clone3, gets ENOSYS and falls back to clone (no namespace flags).
    let thread = match std::thread::Builder::new().spawn(|| 7) {
        Ok(h) => match h.join() {
            Ok(7) => "ok".to_string(),
            _ => "failed".to_string(),
        },
        Err(e) => format!("not started: {e}"),
    };
    lines.push(format!("thread {thread}"));
    println!("VERDICTS\n{}\nEND", lines.join("\n"));
}

#[test]
fn the_installed_broker_allowlist_answers_enosys_eperm_and_allows_its_calls() {
    if std::env::var_os(CHILD).is_some() {
        confined_child();
        return;
    }
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "the_installed_broker_allowlist_answers_enosys_eperm_and_allows_its_calls",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("run the confined child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the confined child failed ({:?}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let verdicts = stdout
        .split("VERDICTS\n")
        .nth(1)
        .and_then(|s| s.split("\nEND").next())
        .unwrap_or_else(|| panic!("no verdicts in:\n{stdout}"));
    let (eperm, enosys) = (libc::EPERM, libc::ENOSYS);
    assert_eq!(
        verdicts,
        format!(
            "clone3 errno={enosys}\nclone_newuser errno={eperm}\nmkdirat errno={eperm}\n\
             execve errno={eperm}\ngetpid ok\nthread ok"
        )
    );
}
