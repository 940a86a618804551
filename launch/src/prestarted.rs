//! Pre-started commands: a child that has done everything a command's process does before
//! `execve` — and is waiting for the command.
//!
//! Most of a foreground spawn's cost in the executor is not `execve` but what comes before
//! it: the clone into the job cgroup, resetting signal dispositions, `setsid`, rlimits,
//! no_new_privs and above all `landlock_restrict_self`, which copies every rule of the
//! policy's ruleset into a new domain (about 90 µs with the 248 rules of the unjailed
//! default). A pre-started process does all of that *between* calls, under the current policy, sets up
//! its stdio (`/dev/null` and the command's two output pipes, whose read ends the executor
//! keeps), and then blocks reading a socket. A call hands it the program, argv and
//! environment (in memory it shares with the executor) with one byte on the socket, carrying
//! over `SCM_RIGHTS` only what the call adds: its stdin pipe and its cwd, when it has them.
//! The child `dup3`s the stdin, `fchdir`s, applies the rlimits (only now, so a low open-files
//! limit cannot drop a descriptor in transit), drops signals that reached it while it waited,
//! and execs.
//!
//! * The child is created with `clone3(CLONE_VM | CLONE_PIDFD | CLONE_INTO_CGROUP)` from the
//!   executor's trampoline, **without** `CLONE_VFORK`: it runs alongside the executor in the
//!   same memory until it execs. So it touches only what is reserved for it (its stack and
//!   its [`Block`]) and makes raw system calls that never write `errno`, which belongs to the
//!   executor's thread.
//! * Right after its setup it closes every descriptor but its stdio and its socket, so it
//!   holds nothing of the executor's open (the broker connection, other commands' pipes).
//! * It is tied to one policy: a policy change drops it (SIGKILL, reaped). If the executor
//!   dies, the socket reaches EOF and the child exits.
//! * An exec failure is written to the block before the child exits; the caller reads it
//!   once the child has been reaped and reports it as a spawn error.
//! * `shell::exec`, `shell::exec_bg` and `shell::pty::open` use it. A background job and a
//!   terminal must report a failed exec at once: their call waits for the hand-over socket to
//!   reach end-of-file (the child's end is close-on-exec, so that is the exec, or the exit
//!   after a failed one) and reads the block. A terminal's program is handed the terminal
//!   ([`Prestarted::launch_on_terminal`]) as its stdio and controlling terminal. It is used
//!   only where clone3 with `CLONE_INTO_CGROUP` works (x86_64, Linux 5.7+); anything
//!   unexpected — the child not ready yet, dead, or the hand-over failing — falls back to the
//!   ordinary spawn. `executor --no-prestart` or `III_SHELL_PRESTART=0` turns it off.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::cgroups::{JobCgroup, JobCgroups, JobLimits};
use crate::child::{self, sys};
use crate::clone3::Clone3;
use crate::plan::{ChildConfinement, ExecImage};
use crate::privileges::{Kernel, Privileges};
use crate::reaper::ROOTS;
use crate::spawn::{pipe, DevNull};
use crate::stack::Stack;

const SETUP: u32 = 0;
const READY: u32 = 1;
const FAILED: u32 = 2;
/// The child has received a command (set right after `recvmsg`).
const TAKEN: u32 = 3;

/// The hand-over carries the command's stdin (replacing `/dev/null`).
const SENT_STDIN: u32 = 1;
/// The hand-over carries the directory the command starts in.
const SENT_CWD: u32 = 2;
/// The hand-over carries a terminal: the command's stdio and controlling terminal.
const SENT_TTY: u32 = 4;

const STACK: usize = 64 * 1024;

/// How long a call that must know whether its exec worked (a background job, a terminal)
/// waits for the hand-over socket's end-of-file before it takes the command as started: an
/// `execve` from a slow filesystem, or a waiting process stopped before it took the command.
/// The block is not read then, and the memory stays with the root until it is reaped.
pub const CONFIRM_EXEC: std::time::Duration = std::time::Duration::from_secs(5);

/// What a waiting process is called (`comm`, at most 15 bytes).
const NAME: &[u8; 15] = b"iii-prestarted\0";

/// Pre-started processes kept per policy: two, so that back-to-back calls find one ready
/// while the next is still setting itself up.
pub const POOL: usize = 2;

/// How long a launch waits for a process that is still setting itself up.
const SETUP_WAIT: std::time::Duration = std::time::Duration::from_millis(5);

/// What the child reads and writes; it lives in a Box the parent keeps until the child has
/// been reaped (leaked instead if it cannot be).
#[repr(C)]
struct Block {
    state: AtomicU32,
    /// Errno of a failed step (setup or execve), written before the child exits.
    err: AtomicI32,
    /// The child's end of the socketpair (same number in its descriptor table).
    sock: RawFd,
    /// The child's setup, for the one child routine; its hand-over ([`handover`]) reads the
    /// rest of this block.
    setup: child::Setup,
    /// The seccomp program `setup.seccomp` points at (its filter is kept alive by
    /// [`Prestarted::confinement`]).
    fprog: libc::sock_fprog,
    /// Set by the parent before the hand-over: which descriptors come with it ([`SENT_STDIN`],
    /// [`SENT_CWD`], in that order).
    sent: AtomicU32,
    program: AtomicUsize,
    argv: AtomicUsize,
    envp: AtomicUsize,
}

/// A pre-started command process, ready for [`Prestarted::launch`].
pub struct Prestarted {
    pid: i32,
    pidfd: Option<OwnedFd>,
    /// Taken by [`Prestarted::launch`] (it becomes the command's `handover`).
    sock: Option<OwnedFd>,
    block: Box<Block>,
    stack: Option<Stack>,
    cgroup: Option<JobCgroup>,
    /// Keeps the per-spawn seccomp program (pointed to by the block) alive.
    confinement: ChildConfinement,
    /// The read ends of the child's stdout and stderr (non-blocking).
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
}

// SAFETY: the raw pointers inside `Block` point into memory this value owns (the seccomp
// program through `confinement`) or are plain integers; nothing is tied to a thread.
unsafe impl Send for Prestarted {}
// SAFETY: shared references only read plain fields.
unsafe impl Sync for Prestarted {}

impl std::fmt::Debug for Prestarted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prestarted")
            .field("pid", &self.pid)
            .finish()
    }
}

/// Whether a launcher pre-starts command processes: where the trampoline exists (x86_64),
/// unless `III_SHELL_PRESTART=0` (read once, when the launcher is made) or `executor
/// --no-prestart` ([`Prestart::disable`]) turned it off, and while clone3 works.
#[derive(Debug)]
pub struct Prestart {
    /// This architecture has the clone3 trampoline.
    supported: bool,
    /// `III_SHELL_PRESTART=0`.
    env_off: bool,
    /// Switched off by the operator.
    off: AtomicBool,
}

impl Prestart {
    /// As the environment says (`III_SHELL_PRESTART`).
    pub fn from_env() -> Prestart {
        Prestart {
            supported: cfg!(target_arch = "x86_64"),
            env_off: std::env::var("III_SHELL_PRESTART").is_ok_and(|v| v.trim() == "0"),
            off: AtomicBool::new(false),
        }
    }

    /// Whether pre-started commands are used at all.
    pub fn enabled(&self, clone3: &Clone3) -> bool {
        self.supported && !self.env_off && !self.off.load(Ordering::Relaxed) && clone3.available()
    }

    /// `on`, `off` (switched off by the operator) or `unavailable` (no clone3 with
    /// `CLONE_INTO_CGROUP` here, or no job cgroups), for `doctor`.
    pub fn availability(&self, clone3: &Clone3, cgroups: &JobCgroups) -> &'static str {
        if self.enabled(clone3) && cgroups.base().is_some() {
            "on"
        } else if self.off.load(Ordering::Relaxed) || self.env_off {
            "off"
        } else {
            "unavailable"
        }
    }

    /// Turns pre-started commands off for the life of the launcher (`executor --no-prestart`).
    pub fn disable(&self) {
        self.off.store(true, Ordering::Relaxed);
    }
}

/// See [`Prestarted::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Starting,
    Ready,
    Dead,
}

/// A started command handed over by [`Prestarted::launch`].
pub struct PrestartedCommand {
    pub pid: i32,
    pub pidfd: OwnedFd,
    pub cgroup: Option<JobCgroup>,
    pub memory: ChildMemory,
    /// The read ends of the command's stdout and stderr (non-blocking).
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// The executor's end of the hand-over socket. The child's end is close-on-exec, and the
    /// child never writes to it, so it reaches end-of-file once the command has replaced the
    /// process or the process has exited: a caller that must know at once whether the exec
    /// worked (a background job, a terminal) waits for that, at most [`CONFIRM_EXEC`], then
    /// asks [`ChildMemory::peek`]. Dropping it changes nothing for the child.
    pub handover: OwnedFd,
}

/// What must outlive the child until it has exec'd: its block and stack, and the strings
/// execve reads.
pub struct ChildMemory {
    block: Box<Block>,
    stack: Option<Stack>,
    image: ExecImage,
    reaped: bool,
}

// SAFETY: as for Prestarted; the image's pointer arrays point into strings the image owns.
unsafe impl Send for ChildMemory {}
// SAFETY: shared references only read atomics.
unsafe impl Sync for ChildMemory {}

/// How a pre-started process that was handed a command ended up, read once it is reaped.
#[derive(Debug)]
pub enum Outcome {
    /// It took the command (and exec'd it, or died trying without an error of its own).
    Took,
    /// It took the command and could not exec it: the spawn error.
    ExecFailed(std::io::Error),
    /// It died before it received the command (killed while waiting): nothing ran, and the
    /// command can be started again the ordinary way.
    NeverStarted,
}

impl ChildMemory {
    /// What the child's block says became of it, without taking it as reaped: final once
    /// the child has been reaped, or once its `handover` socket has reached end-of-file (it
    /// writes the block before it exits, and execs only after it has left `READY`).
    pub fn peek(&self) -> Outcome {
        match self.block.state.load(Ordering::Acquire) {
            FAILED => Outcome::ExecFailed(std::io::Error::from_raw_os_error(
                self.block.err.load(Ordering::Acquire).max(1),
            )),
            READY => Outcome::NeverStarted,
            _ => Outcome::Took,
        }
    }

    /// Lets the memory go once the child no longer runs on it: its hand-over socket reached
    /// end-of-file, so it has exec'd (its own memory now; execve had copied the strings
    /// before it closed the socket) or exited.
    pub fn release_after_exec(mut self) {
        self.reaped = true;
    }

    /// Called once the child has been reaped.
    pub fn outcome(&mut self) -> Outcome {
        self.reaped = true;
        self.peek()
    }
}

impl Drop for ChildMemory {
    fn drop(&mut self) {
        if !self.reaped {
            // The child may still be reading this memory (it was never reaped): leave it be.
            // Only happens when a call's future is dropped before its command was reaped.
            let block = std::mem::replace(&mut self.block, Box::new(Block::empty()));
            std::mem::forget(block);
            std::mem::forget(self.stack.take());
            std::mem::forget(std::mem::take(&mut self.image));
        }
    }
}

impl Block {
    /// A block for a child that will hold `sock` (its end of the hand-over socket), apply
    /// `confinement`, join the v1 twins `v1_joins` (-1: none) and make `stdio` its
    /// 0, 1 and 2 (all above 2).
    fn new(
        sock: RawFd,
        confinement: &ChildConfinement,
        v1_joins: [RawFd; crate::plan::JOINS],
        stdio: [RawFd; 3],
    ) -> Box<Block> {
        let mut block = Box::new(Block::empty());
        block.sock = sock;
        if let Some(f) = &confinement.seccomp {
            block.fprog = f.fprog();
        }
        // Pointers into the block's own heap allocation, which does not move.
        let this: *const Block = &*block;
        block.setup = child::Setup {
            name: NAME.as_ptr(),
            // Started inside its v2 job cgroup by clone3; the v1 twins are joined here.
            join: v1_joins,
            // The sources are all above 2 (checked by the caller), so no dup3 overwrites one
            // still to be copied.
            stdio,
            no_new_privs: confinement.no_new_privs,
            landlock_fd: confinement.landlock_fd.unwrap_or(-1),
            seccomp: if confinement.seccomp.is_some() {
                // SAFETY: a field of the block `this` points to, which is alive here.
                unsafe { std::ptr::addr_of!((*this).fprog) }
            } else {
                std::ptr::null()
            },
            // Keep nothing else of the executor's open while waiting: only our socket.
            keep_fd: sock,
            // Only now, after the hand-over: a low open-files limit cannot drop a
            // descriptor in transit.
            rlimits: confinement.rlimits,
            drop_pending: true,
            wait: Some(handover),
            wait_arg: this as *const c_void,
            ..child::Setup::new()
        };
        block
    }

    fn empty() -> Block {
        Block {
            state: AtomicU32::new(SETUP),
            err: AtomicI32::new(0),
            sock: -1,
            setup: child::Setup::new(),
            fprog: libc::sock_fprog {
                len: 0,
                filter: std::ptr::null_mut(),
            },
            sent: AtomicU32::new(0),
            program: AtomicUsize::new(0),
            argv: AtomicUsize::new(0),
            envp: AtomicUsize::new(0),
        }
    }
}

impl Prestarted {
    /// Starts a child that confines itself with `confinement` inside a job cgroup of its own
    /// and waits for a command.
    ///
    /// The cgroup comes from `cgroups`, clone3's state is `clone3`'s, and its stdin
    /// `/dev/null` a duplicate of `null`: the launcher's (see `Launcher::prestart`).
    pub fn start(
        cgroups: &Arc<JobCgroups>,
        clone3: &Clone3,
        null: &DevNull,
        confinement: &ChildConfinement,
        limits: JobLimits,
    ) -> std::io::Result<Prestarted> {
        if !clone3.available() {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSYS));
        }
        let cgroup = cgroups
            .take_for(limits)
            .ok_or_else(|| std::io::Error::other("no job cgroup"))?;
        // The output pipes and /dev/null, made now so that a call does not have to.
        let stdio = (|| Ok::<_, std::io::Error>((pipe()?, pipe()?, null.open()?)))();
        let ((out_r, out_w), (err_r, err_w), null) = match stdio {
            Ok(fds) => fds,
            Err(e) => {
                let _ = cgroup.recycle();
                return Err(e);
            }
        };
        // The child's dup3s onto 0-2 rely on no source being one of 0-2 (`prepare_process`
        // keeps them open); where they are not, commands are spawned the ordinary way.
        if [&out_w, &err_w, &null].iter().any(|fd| fd.as_raw_fd() <= 2) {
            let _ = cgroup.recycle();
            return Err(std::io::Error::other(
                "descriptors 0-2 are not open in the executor",
            ));
        }
        let mut fds = [0; 2];
        // SAFETY: socketpair fills `fds` with two new descriptors on success.
        if unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        } < 0
        {
            let e = std::io::Error::last_os_error();
            let _ = cgroup.recycle();
            return Err(e);
        }
        // SAFETY: both descriptors are new and owned by nobody else.
        let (ours, theirs) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut block = Block::new(
            theirs.as_raw_fd(),
            confinement,
            crate::plan::CgroupTarget::v1_joins(Some(cgroup.target())),
            [null.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
        );
        let stack = match Stack::new(STACK) {
            Ok(s) => s,
            Err(e) => {
                let _ = cgroup.recycle();
                return Err(e);
            }
        };
        let base = stack.base();
        let top = stack.top(64);
        let mut pidfd: libc::c_int = -1;
        let block_ptr = &mut *block as *mut Block as *mut c_void;

        // Every signal blocked around the clone: the child starts with them blocked (it
        // resets dispositions, then unblocks only right before execve).
        let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigfillset initialises `all`; pthread_sigmask stores the old mask in `old`.
        unsafe {
            libc::sigfillset(all.as_mut_ptr());
            libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr());
        }
        let started = {
            // Registered as a job root under the lock, so the orphan reaper leaves it alone.
            let mut roots = ROOTS.lock().ok();
            // SAFETY: `prestarted_main` only makes raw system calls on the block and its own stack,
            // both owned by the returned Prestarted (or by the ChildMemory after launch), which outlive the
            // child's use of them: they are freed only after it has been reaped.
            let r = unsafe {
                crate::clone3::start_into(
                    cgroup.target().dir,
                    prestarted_main,
                    block_ptr,
                    base,
                    top - base as usize,
                    &mut pidfd,
                )
            };
            if let (Ok(pid), Some(roots)) = (&r, roots.as_mut()) {
                roots.push(*pid);
            }
            r
        };
        // SAFETY: restores the mask saved above.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut());
        }
        // The child has its own copies now (it shares no descriptor table with us).
        drop((theirs, null, out_w, err_w));
        let pid = match started {
            Ok(pid) => {
                clone3.note_success();
                pid
            }
            Err(e) => {
                clone3.note_failure(&e);
                let _ = cgroup.recycle();
                return Err(e);
            }
        };
        Ok(Prestarted {
            pid,
            // SAFETY: CLONE_PIDFD stored a fresh descriptor that only we own.
            pidfd: Some(unsafe { OwnedFd::from_raw_fd(pidfd) }),
            sock: Some(ours),
            block,
            stack: Some(stack),
            cgroup: Some(cgroup),
            confinement: confinement.clone(),
            stdout: Some(out_r),
            stderr: Some(err_r),
        })
    }

    /// Where the child says it is, without asking the kernel whether it is still alive (a
    /// dead one is found out when the hand-over fails: its socket is closed).
    pub fn claimed_state(&self) -> State {
        match self.block.state.load(Ordering::Acquire) {
            READY => State::Ready,
            SETUP => State::Starting,
            _ => State::Dead,
        }
    }

    /// Where the child is: still setting up, waiting for a command, or gone.
    pub fn state(&self) -> State {
        let alive = self
            .pidfd
            .as_ref()
            .is_some_and(|fd| matches!(crate::wait::try_reap_peek(fd), Ok(false)));
        match self.block.state.load(Ordering::Acquire) {
            _ if !alive => State::Dead,
            READY => State::Ready,
            SETUP => State::Starting,
            _ => State::Dead,
        }
    }

    /// Waits (bounded by [`SETUP_WAIT`]) for a child that is still setting itself up; true
    /// once it is ready.
    fn wait_ready(&self) -> bool {
        let deadline = std::time::Instant::now() + SETUP_WAIT;
        let mut checked = false;
        loop {
            // The cheap answer first; the kernel is asked only after a wait timed out (a child
            // killed during its setup never wakes us).
            let state = if checked {
                self.state()
            } else {
                self.claimed_state()
            };
            match state {
                State::Ready => return true,
                State::Dead => return false,
                State::Starting => {}
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            checked = true;
            let left = (deadline - now).min(std::time::Duration::from_millis(1));
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            };
            // SAFETY: FUTEX_WAIT on a word of the block we own, with a valid timeout; it
            // returns at once if the word is no longer SETUP. The child wakes it when ready.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.block.state.as_ptr(),
                    libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                    SETUP,
                    &ts as *const libc::timespec,
                );
            }
        }
    }

    /// Hands a command to the child: `image` to exec, the stdin to use instead of
    /// `/dev/null` and the directory to start in, when given. `None` when the child cannot
    /// take it (not ready, gone, or the hand-over failed); the child is discarded then, and
    /// the caller starts the command the ordinary way.
    pub fn launch(
        self,
        image: ExecImage,
        stdin: Option<OwnedFd>,
        cwd: Option<OwnedFd>,
    ) -> Option<PrestartedCommand> {
        self.hand_over(image, stdin, cwd, None)
    }

    /// [`Prestarted::launch`] for a terminal session's program: `tty` (the terminal's slave
    /// side) becomes its stdin, stdout, stderr and controlling terminal, in place of the
    /// `/dev/null` and the output pipes it waited with (the returned pipes then never carry
    /// anything).
    pub fn launch_on_terminal(
        self,
        image: ExecImage,
        tty: OwnedFd,
        cwd: Option<OwnedFd>,
    ) -> Option<PrestartedCommand> {
        self.hand_over(image, None, cwd, Some(tty))
    }

    fn hand_over(
        mut self,
        image: ExecImage,
        stdin: Option<OwnedFd>,
        cwd: Option<OwnedFd>,
        tty: Option<OwnedFd>,
    ) -> Option<PrestartedCommand> {
        if !self.wait_ready() {
            return None;
        }
        self.block
            .program
            .store(image.program_ptr() as usize, Ordering::Release);
        self.block
            .argv
            .store(image.argv_ptr() as usize, Ordering::Release);
        self.block
            .envp
            .store(image.envp_ptr() as usize, Ordering::Release);
        let sent = sent_flags(stdin.is_some(), cwd.is_some(), tty.is_some());
        self.block.sent.store(sent, Ordering::Release);
        // In the order the child takes them: stdin, cwd, terminal.
        let raw: Vec<RawFd> = stdin
            .iter()
            .chain(cwd.iter())
            .chain(tty.iter())
            .map(|f| f.as_raw_fd())
            .collect();
        let sock = self.sock.take()?;
        if let Err(e) = send_fds(&sock, &raw) {
            if e.raw_os_error() == Some(libc::EPIPE) {
                tracing::debug!("a pre-started process had died; spawning the ordinary way");
            } else {
                tracing::warn!(error = %e, "handing a command to a pre-started process failed");
            }
            return None;
        }
        // The child holds its own references now (in flight or installed).
        drop((stdin, cwd, tty));
        let (Some(pidfd), Some(stdout), Some(stderr)) =
            (self.pidfd.take(), self.stdout.take(), self.stderr.take())
        else {
            unreachable!("a Prestarted holds its pidfd and pipes until it is launched")
        };
        let memory = ChildMemory {
            block: std::mem::replace(&mut self.block, Box::new(Block::empty())),
            stack: self.stack.take(),
            image,
            reaped: false,
        };
        let launched = PrestartedCommand {
            pid: self.pid,
            pidfd,
            cgroup: self.cgroup.take(),
            memory,
            stdout,
            stderr,
            handover: sock,
        };
        // Nothing left for Drop to discard.
        self.pid = -1;
        Some(launched)
    }
}

impl Drop for Prestarted {
    /// Discards an unused child: SIGKILL, reaped, its cgroup given back.
    fn drop(&mut self) {
        let Some(pidfd) = self.pidfd.take() else {
            return;
        };
        // SAFETY: pidfd_send_signal on a pidfd we own; no memory is passed.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            );
        }
        let reaped = crate::wait::try_reap_blocking(&pidfd).is_ok();
        if let Ok(mut roots) = ROOTS.lock() {
            roots.retain(|&p| p != self.pid);
        }
        if let Some(cg) = self.cgroup.take() {
            if self.block.state.load(Ordering::Acquire) != READY {
                // Never got going: perhaps killed at birth by its cgroup; do not reuse that.
                cg.retire();
            }
            if let Err(cg) = cg.recycle() {
                // Not empty yet (it should be, the child is reaped): never reuse it, and leave
                // the empty directory to the executor's shutdown if it cannot go now.
                cg.retire();
                cg.remove();
            }
        }
        if !reaped {
            // Still running on this memory somehow: never free it under the child (nor the
            // seccomp program the block points to).
            let block = std::mem::replace(&mut self.block, Box::new(Block::empty()));
            std::mem::forget(block);
            std::mem::forget(self.stack.take());
            std::mem::forget(std::mem::take(&mut self.confinement));
        }
    }
}

/// Sends one byte with `fds` attached (a plain byte when there are none), through nix's
/// `sendmsg` with `SCM_RIGHTS`. (The child's `recvmsg` stays a raw system call: it must not
/// write errno.)
fn send_fds(sock: &OwnedFd, fds: &[RawFd]) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
    if fds.len() > 2 {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    let byte = [0u8; 1];
    let iov = [std::io::IoSlice::new(&byte)];
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    loop {
        match sendmsg::<UnixAddr>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The pre-started process. Runs on its own stack in the executor's memory, concurrently with it: the
/// one child routine on its block's setup, which waits in [`handover`] for the command.
extern "C" fn prestarted_main(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the Block the parent keeps alive until this child is reaped; the
    // routine makes raw system calls that neither allocate nor touch errno.
    unsafe { run_in(&Kernel, &*(arg as *const Block)) }
}

/// The child's life on `p`: the routine, then (it returns only when a step failed) the
/// failure reported in the block.
unsafe fn run_in<P: Privileges>(p: &P, b: &Block) -> libc::c_int {
    // SAFETY (caller): the block is alive, its setup's pointers valid.
    unsafe {
        let rc = child::steps(p, &b.setup);
        fail(p, b, rc)
    }
}

/// Wakes a launch waiting for the child's state to change.
unsafe fn wake<P: Privileges>(p: &P, b: &Block) {
    // SAFETY (caller): FUTEX_WAKE on a word of the block, which is alive.
    unsafe { p.wake(&b.state) }
}

/// Reports a failed step (`rc` is `-errno`) in the block and exits.
unsafe fn fail<P: Privileges>(p: &P, b: &Block, rc: isize) -> libc::c_int {
    b.err.store((-rc) as i32, Ordering::Release);
    b.state.store(FAILED, Ordering::Release);
    // SAFETY (caller): the block is alive; exit_group takes a plain integer.
    unsafe {
        wake(p, b);
        p.exit_group(127);
    }
    127
}

/// The hand-over ([`child::Wait`]): says it is ready, then waits for one byte on its socket
/// with the command's descriptors attached, and returns the command the parent wrote into
/// the block. Exits quietly when the executor discards it (EOF).
unsafe fn handover(arg: *const c_void) -> Result<child::Command, isize> {
    // SAFETY: `arg` is the block (see `Prestarted::start`); raw system calls on locals and on it.
    unsafe {
        let b = &*(arg as *const Block);
        let sock = b.sock as usize;
        b.state.store(READY, Ordering::Release);
        wake(&Kernel, b);
        let mut byte = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr() as *mut c_void,
            iov_len: 1,
        };
        let mut control = [0u64; 8];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut c_void;
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        loop {
            let n = sys(
                libc::SYS_recvmsg,
                [
                    sock,
                    &mut msg as *mut libc::msghdr as usize,
                    libc::MSG_CMSG_CLOEXEC as usize,
                    0,
                    0,
                    0,
                ],
            );
            if n == -(libc::EINTR as isize) {
                continue;
            }
            if n <= 0 {
                // Discarded (the executor closed its end, or is gone).
                sys(libc::SYS_exit_group, [0; 6]);
            }
            break;
        }
        b.state.store(TAKEN, Ordering::Release);
        let sent = b.sent.load(Ordering::Acquire);
        let want = (sent & SENT_STDIN != 0) as usize
            + (sent & SENT_CWD != 0) as usize
            + (sent & SENT_TTY != 0) as usize;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        let got = if cmsg.is_null() {
            0
        } else if (*cmsg).cmsg_level != libc::SOL_SOCKET || (*cmsg).cmsg_type != libc::SCM_RIGHTS {
            usize::MAX
        } else {
            ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4
        };
        if msg.msg_flags & libc::MSG_CTRUNC != 0 || got != want {
            return Err(-(libc::EPROTO as isize));
        }
        let mut next = 0;
        let mut take = || {
            let fd = std::ptr::read_unaligned((libc::CMSG_DATA(cmsg) as *const i32).add(next));
            next += 1;
            fd
        };
        // Received descriptors take the lowest free number, and 0-2 are open, so a stdin is
        // never 0 and replaces /dev/null. They and the socket are close-on-exec.
        let stdin = if sent & SENT_STDIN != 0 { take() } else { -1 };
        let cwd = if sent & SENT_CWD != 0 { take() } else { -1 };
        let tty = if sent & SENT_TTY != 0 { take() } else { -1 };
        Ok(child::Command {
            program: b.program.load(Ordering::Acquire) as *const libc::c_char,
            argv: b.argv.load(Ordering::Acquire) as *const *const libc::c_char,
            envp: b.envp.load(Ordering::Acquire) as *const *const libc::c_char,
            stdin,
            cwd,
            tty,
        })
    }
}

/// The block's `sent` word: which descriptors come along with a command.
fn sent_flags(stdin: bool, cwd: bool, tty: bool) -> u32 {
    (if stdin { SENT_STDIN } else { 0 })
        | (if cwd { SENT_CWD } else { 0 })
        | (if tty { SENT_TTY } else { 0 })
}

/// The order of a pre-started process's steps (before and after the hand-over), and what a
/// failed step leaves in its block for the executor, on the recording fake.
#[cfg(test)]
mod seam_tests {
    use super::*;
    use crate::privileges::fake::{confinement, expected_on_failure, Call, Recorder};

    /// A block as `Prestarted::start` makes it: socket 9, v1 twins (pids 42, memory 43,
    /// cpu 44), stdio 10-12.
    fn block() -> Box<Block> {
        Block::new(9, &confinement(), [-1, 42, 43, 44], [10, 11, 12])
    }

    fn image() -> ExecImage {
        let argv = ["cat".to_string(), "-n".to_string()];
        ExecImage::new("/bin/cat", &argv, Default::default(), &[]).unwrap()
    }

    /// The fake hands over `image` with these descriptors.
    fn recorder(image: &ExecImage, stdin: RawFd, cwd: RawFd, tty: RawFd) -> Recorder {
        Recorder {
            command: child::Command {
                program: image.program_ptr(),
                argv: image.argv_ptr(),
                envp: image.envp_ptr(),
                stdin,
                cwd,
                tty,
            },
            ..Recorder::default()
        }
    }

    fn full_run(stdin: RawFd, cwd: RawFd, tty: RawFd) -> Vec<Call> {
        let mut calls = vec![
            Call::DefaultSignals,
            Call::SetName("iii-prestarted".into()),
            Call::Setsid,
            Call::JoinCgroup(42),
            Call::JoinCgroup(43),
            Call::JoinCgroup(44),
            Call::DupOnto(10, 0),
            Call::DupOnto(11, 1),
            Call::DupOnto(12, 2),
            Call::NoNewPrivs,
            Call::LandlockRestrictSelf(50),
            Call::SeccompInstall(3),
            Call::CloseDescriptors { keep: 9 },
            Call::HandOver,
        ];
        if stdin >= 0 {
            calls.push(Call::DupOnto(stdin, 0));
        }
        if tty >= 0 {
            calls.extend([
                Call::DupOnto(tty, 0),
                Call::DupOnto(tty, 1),
                Call::DupOnto(tty, 2),
                Call::ControllingTty,
            ]);
        }
        if cwd >= 0 {
            calls.push(Call::Fchdir(cwd));
        }
        calls.extend([
            Call::Setrlimit(libc::RLIMIT_NOFILE as i32, 64),
            Call::Setrlimit(libc::RLIMIT_NPROC as i32, 99),
            Call::DropPendingSignals,
            Call::ClearSignalMask,
            Call::Execve("/bin/cat".into(), vec!["cat".into(), "-n".into()]),
        ]);
        calls
    }

    /// The three kinds of hand-over: a command with stdin and cwd (`shell::exec`), one with
    /// neither, and a terminal's program with a cwd (`shell::pty::open`).
    const KINDS: [(RawFd, RawFd, RawFd); 3] = [(13, 14, -1), (-1, -1, -1), (-1, 14, 15)];

    #[test]
    fn a_prestarted_process_confines_itself_before_the_hand_over_in_this_exact_order() {
        let image = image();
        for (stdin, cwd, tty) in KINDS {
            let p = recorder(&image, stdin, cwd, tty);
            let b = block();
            // SAFETY: the block and image are alive; the fake makes no system call.
            assert_eq!(unsafe { run_in(&p, &b) }, 127);
            let mut want = full_run(stdin, cwd, tty);
            want.extend([Call::Wake, Call::ExitGroup(127)]);
            assert_eq!(p.calls(), want, "stdin={stdin} cwd={cwd} tty={tty}");
        }
    }

    #[test]
    fn a_failed_step_is_the_last_one_run_and_the_executor_reads_its_errno() {
        let image = image();
        for (stdin, cwd, tty) in KINDS {
            let full = full_run(stdin, cwd, tty);
            for n in 0..full.len() {
                let mut p = recorder(&image, stdin, cwd, tty);
                p.fail = Some((n, libc::EACCES));
                let b = block();
                // SAFETY: as above.
                assert_eq!(unsafe { run_in(&p, &b) }, 127);
                let (want, failed) =
                    expected_on_failure(&full, n, &[Call::Wake, Call::ExitGroup(127)]);
                assert_eq!(p.calls(), want, "failing {:?}", full[n]);
                if !failed {
                    continue;
                }
                // What `launch`'s caller reads once the child is reaped: the spawn error.
                let mut memory = ChildMemory {
                    block: b,
                    stack: None,
                    image: ExecImage::default(),
                    reaped: true,
                };
                match memory.outcome() {
                    Outcome::ExecFailed(e) => {
                        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{:?}", full[n])
                    }
                    other => panic!("failing {:?}: {other:?}", full[n]),
                }
            }
        }
    }
}
