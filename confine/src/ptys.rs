//! A private pseudo-terminal namespace for the executor and its commands.
//!
//! Landlock rules are attached to inodes, and a right granted on `/dev/pts` is inherited by
//! every terminal in it: a pty a command allocates later needs read, write and ioctl on its
//! `/dev/pts/N`, and so would an attacker opening an operator's existing `/dev/pts/0`. Landlock
//! cannot tell the two apart. So the executor, at start-up and while it still holds
//! `CAP_SYS_ADMIN` (before [`super::harden_executor`] drops it, single-threaded), moves itself
//! into a mount namespace of its own (`MS_SLAVE` over `/`, so the host's later mounts still
//! propagate in and nothing propagates out) with a new devpts instance on `/dev/pts` and its
//! `ptmx` bound over `/dev/ptmx`. Every command inherits that namespace: the host's terminals
//! are not in it at all, and what a command allocates through `/dev/ptmx` lands in the
//! private instance, where the Landlock grant of `/dev/pts` applies.
//!
//! Limit: the commands of one executor share that instance, so one command can open a pty
//! another command of the same worker allocated.

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

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
        Some("newinstance,ptmxmode=0666,mode=0620"),
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
