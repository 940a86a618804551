//! A private pseudo-terminal namespace for the executor and its commands.
//!
//! Landlock rules are attached to inodes, and a right granted on `/dev/pts` is inherited by
//! every terminal in it: a pty a command allocates later needs read, write and ioctl on its
//! `/dev/pts/N`, and so would an attacker opening an operator's existing `/dev/pts/0`. Landlock
//! cannot tell the two apart (the peer of a master, `TIOCGPTPEER`, is checked on the same
//! inodes as an open by path). So two mechanisms close it:
//!
//! * **The host's terminals are not there.** The executor, at start-up and while it still
//!   holds `CAP_SYS_ADMIN` (before [`super::harden_executor`] drops it, single-threaded),
//!   moves itself into a mount namespace of its own (`MS_SLAVE` over `/`, so the host's later
//!   mounts still propagate in and nothing propagates out) with a new devpts instance on
//!   `/dev/pts` and its `ptmx` bound over `/dev/ptmx`. Every command inherits that namespace.
//! * **No terminal in it can be opened by path.** The instance gives every new pty the owner
//!   [`PTY_OWNER`] and mode `0000` (`uid=`, `gid=`, `mode=` devpts options). An open of
//!   `/dev/pts/N` goes through the permission check, which fails (EACCES) for every uid
//!   without `CAP_DAC_OVERRIDE`, and none but the owner may chmod or chown it back. The
//!   commands and the executor hold no capability after their set-up, so this holds for root
//!   commands and `run_as` users alike. The side a program allocates for itself comes from its
//!   master through `TIOCGPTPEER` (`openpty`/`forkpty` in glibc 2.29+, python's `pty`,
//!   `script`), which opens the peer without a permission check: a command reaches exactly the
//!   terminals it allocates. The executor's own sessions (`shell::pty::*`) get theirs the
//!   same way. What breaks: a program that opens its slave by name (`ptsname()` + `open()`,
//!   glibc before 2.29, some `expect` builds) or reopens its terminal by name (`screen`,
//!   gpg's pinentry through `GPG_TTY`, `mesg`/`write`). `/dev/tty` still works (it is the
//!   controlling terminal, not a path into devpts).
//!
//! Limit: a command configured with `CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH` (read only),
//! `CAP_FOWNER` or `CAP_CHOWN` in `confinement.capabilities` can override the mode (see [`reachable_by_caps`]).

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

/// The owner (uid and gid) of every pty of the private instance: a uid nothing runs as
/// (`(uid_t)-2`, the historic NFS "nobody"), so no command owns one and may chmod it.
pub const PTY_OWNER: u32 = u32::MAX - 1;

/// The devpts options of the private instance: see the module documentation.
pub const OPTIONS: &str = "newinstance,ptmxmode=0666,mode=0000,uid=4294967294,gid=4294967294";

/// The configured capabilities that would let a command open another's pty by path anyway
/// (override the mode, or chmod/chown the node back to itself), in the order given.
pub fn reachable_by_caps(capabilities: &[String]) -> Vec<String> {
    capabilities
        .iter()
        .map(|c| {
            let u = c.to_ascii_uppercase();
            if u.starts_with("CAP_") {
                u
            } else {
                format!("CAP_{u}")
            }
        })
        .filter(|c| {
            matches!(
                c.as_str(),
                "CAP_DAC_OVERRIDE" | "CAP_DAC_READ_SEARCH" | "CAP_FOWNER" | "CAP_CHOWN"
            )
        })
        .collect()
}

/// Moves this (single-threaded) process into its own mount namespace with a private devpts
/// instance. An error says which step failed; nothing is half-done that matters (a failure
/// after the unshare leaves the host's devpts visible, as before).
pub fn private_devpts() -> Result<(), String> {
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| format!("making / a slave mount: {e}"))?;
    mount(
        Some("devpts"),
        "/dev/pts",
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(OPTIONS),
    )
    .map_err(|e| format!("mounting a new devpts instance on /dev/pts: {e}"))?;
    mount(
        Some("/dev/pts/ptmx"),
        "/dev/ptmx",
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| format!("binding /dev/pts/ptmx over /dev/ptmx: {e}"))?;
    Ok(())
}

/// True when `/dev/ptmx` is the `ptmx` of the devpts instance on `/dev/pts` (the private
/// instance is in place), read from the device numbers.
pub fn is_private() -> bool {
    use std::os::unix::fs::MetadataExt;
    match (
        std::fs::metadata("/dev/ptmx"),
        std::fs::metadata("/dev/pts/ptmx"),
    ) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_name_the_owner() {
        assert_eq!(PTY_OWNER, 4_294_967_294);
        assert!(OPTIONS.contains(&format!("uid={PTY_OWNER},gid={PTY_OWNER}")));
        assert!(OPTIONS.contains("mode=0000"));
    }

    #[test]
    fn capabilities_that_reopen_ptys() {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            reachable_by_caps(&v(&[
                "chown",
                "CAP_NET_BIND_SERVICE",
                "cap_dac_override",
                "FOWNER"
            ])),
            v(&["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"])
        );
        assert_eq!(
            reachable_by_caps(&v(&["dac_read_search"])),
            v(&["CAP_DAC_READ_SEARCH"])
        );
        assert!(reachable_by_caps(&v(&["CAP_NET_RAW", "CAP_SYS_PTRACE"])).is_empty());
    }
}
