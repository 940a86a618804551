//! Starting our own executor over an inherited socketpair (no path on disk).

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};

use tokio::net::UnixStream;

/// Spawns `iii-shell executor --fd N` with one end of a fresh socketpair and returns the
/// child and our end.
pub fn spawn_executor(extra_args: &[String]) -> std::io::Result<(Child, UnixStream)> {
    spawn_executor_with(&std::env::current_exe()?, extra_args)
}

/// Same, with an explicit `iii-shell` binary (tests and benches run from other binaries).
/// The executor inherits `RUST_LOG`, which `logging::init` set to this process's level.
pub fn spawn_executor_with(
    exe: &std::path::Path,
    extra_args: &[String],
) -> std::io::Result<(Child, UnixStream)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let theirs: OwnedFd = theirs.into();
    // The child must inherit its end: clear close-on-exec on it alone. Nothing else in the
    // broker spawns processes, so no other child can pick it up.
    clear_cloexec(&theirs)?;
    let fd = theirs.as_raw_fd();
    let mut cmd = Command::new(exe);
    let child = cmd
        .arg("executor")
        .arg("--fd")
        .arg(fd.to_string())
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    drop(theirs);
    ours.set_nonblocking(true)?;
    Ok((child, UnixStream::from_std(ours)?))
}

/// Spawns `iii-shell executor --fd N`; returns the child and our end as a plain fd (to hand
/// to another process).
pub fn spawn_executor_raw(
    exe: &std::path::Path,
    extra_args: &[String],
) -> std::io::Result<(Child, OwnedFd)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let theirs: OwnedFd = theirs.into();
    clear_cloexec(&theirs)?;
    let mut cmd = Command::new(exe);
    let child = cmd
        .arg("executor")
        .arg("--fd")
        .arg(theirs.as_raw_fd().to_string())
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    drop(theirs);
    Ok((child, ours.into()))
}

/// Clears close-on-exec on one descriptor so the next child inherits it.
pub fn clear_cloexec(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: F_GETFD/F_SETFD on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFD);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
