//! `iii-shell probe`: tiny self-checks that run *as a command* under the executor, so
//! `doctor` and the escape suite can see what a command can actually do.
//!
//! `probe syscall NAME` makes one system call with harmless arguments and prints
//! `NAME errno=N (text)` or `NAME ok`. `probe status` prints the confinement fields of
//! `/proc/self/status`. `probe network [ADDR:PORT]` says what network it reaches
//! (`crate::probe_network`). `probe limits` prints the memory, CPU and process limits of its own
//! cgroups as the kernel has them; `probe alloc MIB` and `probe burn MS` meet them
//! ([`crate::probe_limits`]).

/// Makes the named system call; returns the raw result and errno.
fn call(name: &str) -> Option<(i64, i32)> {
    let null = std::ptr::null::<u8>();
    // Large enough for every struct a probe passes (io_uring_params is 120 bytes, struct
    // timex 208): a call that succeeds copies the whole struct back into it.
    let mut buf = [0u64; 64];
    let b = buf.as_mut_ptr() as *mut u8;
    // SAFETY: every call passes null pointers, zero lengths, or a small stack buffer that
    // outlives the call; none of them can affect memory we rely on. Their only effects are on
    // kernel state the probe is meant to test (and they fail when confinement works).
    let r = unsafe {
        match name {
            "kexec_load" => libc::syscall(libc::SYS_kexec_load, 0usize, 0usize, null, 0usize),
            "kexec_file_load" => libc::syscall(
                libc::SYS_kexec_file_load,
                -1i32,
                -1i32,
                0usize,
                null,
                0usize,
            ),
            "init_module" => libc::syscall(libc::SYS_init_module, null, 0usize, null),
            "finit_module" => libc::syscall(libc::SYS_finit_module, -1i32, null, 0i32),
            "delete_module" => libc::syscall(
                libc::SYS_delete_module,
                c"iii_no_such_module".as_ptr(),
                0i32,
            ),
            "mount" => libc::syscall(
                libc::SYS_mount,
                c"none".as_ptr(),
                c"/nonexistent-iii".as_ptr(),
                c"tmpfs".as_ptr(),
                0usize,
                null,
            ),
            "umount2" => libc::syscall(libc::SYS_umount2, c"/nonexistent-iii".as_ptr(), 0i32),
            "pivot_root" => libc::syscall(
                libc::SYS_pivot_root,
                c"/nonexistent-iii".as_ptr(),
                c"/nonexistent-iii".as_ptr(),
            ),
            "open_tree" => libc::syscall(libc::SYS_open_tree, -100i32, c"/".as_ptr(), 0u32),
            "move_mount" => libc::syscall(
                libc::SYS_move_mount,
                -1i32,
                c"".as_ptr(),
                -1i32,
                c"".as_ptr(),
                0u32,
            ),
            "fsopen" => libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), 0u32),
            "fsconfig" => libc::syscall(libc::SYS_fsconfig, -1i32, 0u32, null, null, 0i32),
            "fsmount" => libc::syscall(libc::SYS_fsmount, -1i32, 0u32, 0u32),
            "swapon" => libc::syscall(libc::SYS_swapon, c"/nonexistent-iii".as_ptr(), 0i32),
            "swapoff" => libc::syscall(libc::SYS_swapoff, c"/nonexistent-iii".as_ptr()),
            // A bad magic number: the kernel refuses it without acting.
            "reboot" => libc::syscall(libc::SYS_reboot, 0i32, 0i32, 0i32, null),
            "acct" => libc::syscall(libc::SYS_acct, null),
            "syslog" => libc::syscall(libc::SYS_syslog, 10i32, null, 0i32),
            "bpf" => libc::syscall(libc::SYS_bpf, 0i32, null, 0u32),
            "perf_event_open" => {
                libc::syscall(libc::SYS_perf_event_open, null, 0i32, -1i32, -1i32, 0usize)
            }
            "userfaultfd" => libc::syscall(libc::SYS_userfaultfd, 0i32),
            "ptrace" => libc::syscall(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0i32, null, null),
            "process_vm_readv" => libc::syscall(
                libc::SYS_process_vm_readv,
                libc::getpid(),
                null,
                0usize,
                null,
                0usize,
                0usize,
            ),
            "process_vm_writev" => libc::syscall(
                libc::SYS_process_vm_writev,
                libc::getpid(),
                null,
                0usize,
                null,
                0usize,
                0usize,
            ),
            "keyctl" => libc::syscall(
                libc::SYS_keyctl,
                0i32, /* KEYCTL_GET_KEYRING_ID */
                -3i32,
                0i32,
            ),
            "add_key" => libc::syscall(
                libc::SYS_add_key,
                c"user".as_ptr(),
                c"iii".as_ptr(),
                null,
                0usize,
                -3i32,
            ),
            "request_key" => libc::syscall(
                libc::SYS_request_key,
                c"user".as_ptr(),
                c"iii-none".as_ptr(),
                null,
                0i32,
            ),
            "io_uring_setup" => libc::syscall(libc::SYS_io_uring_setup, 1u32, b),
            "io_uring_enter" => libc::syscall(
                libc::SYS_io_uring_enter,
                -1i32,
                0u32,
                0u32,
                0u32,
                null,
                0usize,
            ),
            "io_uring_register" => {
                libc::syscall(libc::SYS_io_uring_register, -1i32, 0u32, null, 0u32)
            }
            "open_by_handle_at" => libc::syscall(libc::SYS_open_by_handle_at, -100i32, b, 0i32),
            "name_to_handle_at" => {
                // struct file_handle { u32 handle_bytes; i32 handle_type; u8 f_handle[]; }
                b.write(32);
                let mut mount_id: i32 = 0;
                libc::syscall(
                    libc::SYS_name_to_handle_at,
                    -100i32,
                    c"/".as_ptr(),
                    b,
                    &mut mount_id as *mut i32,
                    0i32,
                )
            }
            #[cfg(target_arch = "x86_64")]
            "iopl" => libc::syscall(libc::SYS_iopl, 0i32),
            #[cfg(target_arch = "x86_64")]
            "ioperm" => libc::syscall(libc::SYS_ioperm, 0x80usize, 1usize, 0i32),
            // Setting the clock to its current value would still change it; pass a bad clock.
            "settimeofday" => libc::syscall(libc::SYS_settimeofday, null, null),
            "clock_settime" => libc::syscall(libc::SYS_clock_settime, -1i32, b),
            "adjtimex" => {
                // modes = 0: a read-only query, allowed without privilege.
                libc::syscall(libc::SYS_adjtimex, b)
            }
            "clock_adjtime" => libc::syscall(libc::SYS_clock_adjtime, -1i32, b),
            "setns" => libc::syscall(libc::SYS_setns, -1i32, 0i32),
            "unshare" => libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER),
            "unshare_files" => libc::syscall(libc::SYS_unshare, libc::CLONE_FILES),
            "clone_newuser" => {
                // A namespaced clone; if it were allowed the child exits at once.
                let pid = libc::syscall(
                    libc::SYS_clone,
                    (libc::CLONE_NEWUSER | libc::SIGCHLD) as usize,
                    0usize,
                    null,
                    null,
                    0usize,
                );
                if pid == 0 {
                    libc::_exit(0);
                }
                if pid > 0 {
                    libc::waitpid(pid as i32, std::ptr::null_mut(), 0);
                }
                pid
            }
            "clone3" => libc::syscall(libc::SYS_clone3, null, 0usize),
            #[cfg(target_arch = "x86_64")]
            "x32_getpid" => libc::syscall(libc::SYS_getpid | 0x4000_0000),
            "getpid" => libc::syscall(libc::SYS_getpid),
            _ => return None,
        }
    };
    let errno = if r < 0 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    } else {
        0
    };
    Some((r as i64, errno))
}

/// Confines this process exactly as the broker does, then checks what it can still do and
/// prints a JSON `ProcessReport` (for `doctor`).
fn broker_probe(seed_json: Option<&str>) -> i32 {
    use iii_shell_protocol::config::Config;
    let config = match seed_json.map(serde_json::from_str::<serde_json::Value>) {
        Some(Ok(v)) => Config::from_value(&v).unwrap_or_else(|_| Config::builtin_default()),
        _ => Config::builtin_default(),
    };
    let mut problems = Vec::new();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        if let Err(e) = iii_shell_broker::confine::lookup_user(&config.confinement.broker_user)
            .and_then(|(u, g)| {
                // Same order as `serve`: bounding set first, then groups, gid, uid.
                for cap in 0..64 {
                    // SAFETY: PR_CAPBSET_DROP only changes this process's bounding set.
                    unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
                }
                iii_shell_broker::confine::drop_user(u, g)
            })
        {
            problems.push(e);
        }
    }
    let report = iii_shell_broker::confine::confine_self(&config.confinement);
    let mut r = iii_shell_executor::doctor::process_report("broker");
    match report {
        Ok(b) => {
            r.landlock = b.landlock;
            r.seccomp = b.seccomp;
            problems.extend(b.problems);
        }
        Err(e) => problems.push(e),
    }
    let check = |what: &str, res: std::io::Result<()>| match res {
        Ok(()) => (what.to_string(), "ALLOWED".to_string()),
        Err(e) => (what.to_string(), format!("refused: {e}")),
    };
    r.checks.push(check(
        "open /etc/passwd",
        std::fs::File::open("/etc/passwd").map(|_| ()),
    ));
    r.checks.push(check(
        "create /tmp/iii-shell-broker-probe",
        std::fs::File::create("/tmp/iii-shell-broker-probe").map(|_| ()),
    ));
    r.checks.push(check(
        "exec /bin/true",
        std::process::Command::new("/bin/true").status().map(|_| ()),
    ));
    r.checks.push(check(
        "ptrace(TRACEME)",
        match call("ptrace") {
            Some((_, 0)) => Ok(()),
            Some((_, e)) => Err(std::io::Error::from_raw_os_error(e)),
            None => Ok(()),
        },
    ));
    let _ = std::fs::remove_file("/tmp/iii-shell-broker-probe");
    r.problems = problems;
    println!("{}", serde_json::to_string(&r).unwrap_or_default());
    0
}

fn usage() -> i32 {
    eprintln!(
        "usage: iii-shell probe syscall NAME... | probe status | probe network [ADDR:PORT] | probe limits | probe alloc MIB | probe burn MS"
    );
    2
}

pub fn run(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        Some("syscall") => {
            let mut code = 0;
            for name in &args[1..] {
                match call(name) {
                    Some((_, 0)) => println!("{name} ok"),
                    Some((_, e)) => println!(
                        "{name} errno={e} ({})",
                        std::io::Error::from_raw_os_error(e)
                    ),
                    None => {
                        println!("{name} unknown");
                        code = 2;
                    }
                }
            }
            code
        }
        Some("network") => crate::probe_network::run(&args[1..]),
        Some("broker") => broker_probe(args.get(1).map(String::as_str)),
        Some("status") => {
            let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            for l in s.lines() {
                if [
                    "NoNewPrivs",
                    "Seccomp",
                    "CapInh",
                    "CapPrm",
                    "CapEff",
                    "CapBnd",
                    "CapAmb",
                    "Uid",
                    "Gid",
                ]
                .iter()
                .any(|k| l.starts_with(k))
                {
                    println!("{l}");
                }
            }
            0
        }
        Some("limits") => crate::probe_limits::limits(),
        Some("alloc") => match args.get(1).and_then(|n| n.parse().ok()) {
            Some(mib) => crate::probe_limits::alloc(mib),
            None => usage(),
        },
        Some("burn") => match args.get(1).and_then(|n| n.parse().ok()) {
            Some(ms) => crate::probe_limits::burn(ms),
            None => usage(),
        },
        _ => usage(),
    }
}
