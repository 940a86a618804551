//! Job cgroups: where they live (a base per executor in cgroup v2, next to the executor's own
//! cgroup, and its twin in a cgroup v1 `pids` hierarchy where `pids` is there, see
//! [`crate::pids_v1`]), the limits written into them, and the pool that reuses empty ones so
//! that a spawn neither creates nor removes a cgroup. The sweep of dead executors' bases and
//! their hand-over to the command user live here too.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::spawn::CgroupTarget;
/// Where job cgroups are created, if anywhere.
#[derive(Debug)]
pub struct CgroupBase {
    pub dir: PathBuf,
    /// Job cgroups have `pids.max` (the `pids` controller is enabled below the base, or
    /// each job has a twin in the cgroup v1 `pids` hierarchy).
    pub pids: bool,
    /// Where the job twins in the cgroup v1 `pids` hierarchy are made, when `pids.max` comes
    /// from there (see [`crate::pids_v1`]).
    pub pids_v1: Option<PathBuf>,
    /// Job cgroups have `memory.max`.
    pub memory: bool,
}

/// The limits written into a job cgroup (`confinement.job_limits`); `None` is "max".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobLimits {
    pub pids_max: Option<u64>,
    pub memory_max: Option<u64>,
}

/// The value a cgroup limit file takes for `limit`.
pub fn limit_value(limit: Option<u64>) -> String {
    limit.map_or_else(|| "max".to_string(), |n| n.to_string())
}

/// Enables `controllers` for the children of `base` where its parent delegates them;
/// returns which of them job cgroups get.
fn enable_controllers(base: &Path) -> (bool, bool) {
    let available = std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    let has = |c: &str| available.split_whitespace().any(|x| x == c);
    let on = |c: &str| {
        has(c) && std::fs::write(base.join("cgroup.subtree_control"), format!("+{c}")).is_ok()
    };
    (on("pids"), on("memory"))
}

static BASE: OnceLock<Option<CgroupBase>> = OnceLock::new();
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Finds a writable cgroup v2 directory for job cgroups: a child of the executor's own cgroup.
pub fn cgroup_base() -> Option<&'static CgroupBase> {
    BASE.get_or_init(detect_cgroup_base).as_ref()
}

/// This process's own cgroup v2 directory, where executors create their bases.
pub fn own_cgroup_dir() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .trim_start_matches('/');
    Some(mount.join(rel))
}

/// The job-cgroup base of the executor `pid`, when that executor was started in our own
/// cgroup (as `serve` starts it) and made one.
pub fn base_of(pid: u32) -> Option<PathBuf> {
    let base = own_cgroup_dir()?.join(format!("iii-shell-{pid}"));
    base.is_dir().then_some(base)
}

/// Kills every process in a job-cgroup base and all its job cgroups (`cgroup.kill` on the
/// base reaches the whole subtree, setsid daemons included), waits up to 5 s for them to be
/// gone and removes the cgroups. Used on the base of an executor that died: what it started
/// must not outlive it. True when the base is gone.
pub fn kill_base(base: &Path) -> bool {
    let _ = std::fs::write(base.join("cgroup.kill"), "1");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let populated = std::fs::read_to_string(base.join("cgroup.events"))
            .map(|t| !t.lines().any(|l| l.trim() == "populated 0"))
            .unwrap_or(false);
        if !populated || std::time::Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    remove_empty_base(base);
    !base.exists()
}

fn detect_cgroup_base() -> Option<CgroupBase> {
    let parent = own_cgroup_dir()?;
    sweep_stale_bases(&parent);
    let dir = parent.join(format!("iii-shell-{}", std::process::id()));
    // A base with our own pid is an earlier process's whose pid we reuse (a container's
    // executor often has the same small pid every time): what it holds is not ours, and its
    // job cgroups' names would collide with ours. It goes like any stale base.
    if dir.is_dir() {
        kill_base(&dir);
    }
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            tracing::info!(error = %e, path = %dir.display(), "no writable cgroup v2 hierarchy: job trees are tracked by session and parentage only");
            return None;
        }
    }
    if !dir.join("cgroup.kill").exists() {
        tracing::info!("cgroup.kill unavailable (kernel < 5.14): job cgroups disabled");
        let _ = std::fs::remove_dir(&dir);
        return None;
    }
    let (v2_pids, memory) = enable_controllers(&dir);
    let pids_v1 = if v2_pids {
        None
    } else {
        match crate::pids_v1::create_base() {
            Ok(d) => {
                tracing::info!(path = %d.display(), "the pids controller is bound to a cgroup v1 hierarchy: each job gets a twin there for its pids.max");
                Some(d)
            }
            Err(why) => {
                tracing::warn!(path = %dir.display(), "the pids controller is available neither for cgroup v2 job cgroups nor as a cgroup v1 hierarchy ({why}): confinement.job_limits.pids_max cannot be enforced, and RLIMIT_NPROC does not bind root; delegate the pids controller to iii-shell's cgroup to enforce it");
                None
            }
        }
    };
    let pids = v2_pids || pids_v1.is_some();
    tracing::debug!(path = %dir.display(), pids, v1 = pids_v1.is_some(), memory, "job cgroups enabled");
    let base = CgroupBase {
        dir,
        pids,
        pids_v1,
        memory,
    };
    check_clone3(&base);
    Some(base)
}

/// Makes sure a child created inside a fresh job cgroup by clone3 survives; otherwise clone3
/// is switched off and children join by writing `cgroup.procs`. (A kernel kills such a child
/// when the job cgroup's kill count differs from that of the spawner's own cgroup, which
/// happens if the executor was moved into a cgroup that had been killed before.)
fn check_clone3(base: &CgroupBase) {
    if !crate::clone3::available() {
        return;
    }
    let dir = base.dir.join("clone3-check");
    let _ = std::fs::create_dir(&dir);
    let result = std::fs::File::open(&dir)
        .map_err(|e| e.to_string())
        .and_then(|f| crate::clone3::self_test(std::os::fd::AsRawFd::as_raw_fd(&f)));
    let _ = std::fs::remove_dir(&dir);
    if let Err(why) = result {
        crate::clone3::disable(&why);
    }
}

/// The bases under `parent` (`iii-shell-<pid>`) of executors that no longer run: neither
/// this process nor a live one.
pub fn stale_bases(parent: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("iii-shell-"))
                .and_then(|p| p.parse::<u32>().ok())
                .is_some_and(|pid| {
                    pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
                })
        })
        .map(|e| e.path())
        .collect()
}

/// Kills what is left in the job-cgroup bases of executors that no longer exist, and removes
/// them. An executor runs without capabilities once hardened, so when the cgroup parent is
/// only writable with CAP_DAC_OVERRIDE it cannot remove its own base on exit; the next
/// executor, which sweeps before it drops its capabilities, does. A dead executor's commands
/// (an executor killed with SIGKILL leaves them running) are killed first: nothing it
/// started outlives it, even when no supervisor did it already.
pub fn sweep_stale_bases(parent: &Path) {
    for base in stale_bases(parent) {
        if base.join("cgroup.kill").exists() {
            kill_base(&base);
        } else {
            remove_empty_base(&base);
        }
    }
}

/// Removes a base whose cgroups hold no process: its job cgroups, then itself (one that
/// still holds processes stays).
pub fn remove_empty_base(base: &Path) {
    if let Ok(jobs) = std::fs::read_dir(base) {
        for j in jobs.flatten() {
            if j.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir(j.path());
            }
        }
    }
    let _ = std::fs::remove_dir(base);
}

/// Set when the job cgroups could not be handed to the command user: jobs then run without
/// a cgroup, and process-tree kill falls back to sessions and parentage.
static UNUSABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The leaf the executor moves itself into before it hands the base to the command user, so
/// that the base is the common ancestor of every migration it makes (cgroup v2 delegation).
pub const EXECUTOR_LEAF: &str = "executor";

/// Whether commands get job cgroups.
pub fn cgroups_usable() -> bool {
    cgroup_base().is_some() && !UNUSABLE.load(Ordering::Relaxed)
}

/// Before the executor leaves root: moves itself into `<base>/executor` and hands the base
/// (directory, `cgroup.procs`, `cgroup.subtree_control`, `cgroup.threads`) and that leaf to
/// `uid:gid`, the way systemd delegates a subtree. If any step fails, job cgroups are turned
/// off (logged; `doctor` shows it).
pub fn hand_cgroup_base_to(uid: u32, gid: u32) {
    let Some(base) = cgroup_base() else { return };
    let leaf = base.dir.join(EXECUTOR_LEAF);
    let r = (|| -> std::io::Result<()> {
        match std::fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        std::fs::write(leaf.join("cgroup.procs"), "0")?;
        let owner = (
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        );
        for p in [
            base.dir.clone(),
            base.dir.join("cgroup.procs"),
            base.dir.join("cgroup.subtree_control"),
            base.dir.join("cgroup.threads"),
            leaf.clone(),
            leaf.join("cgroup.procs"),
            leaf.join("cgroup.threads"),
        ] {
            nix::unistd::chown(&p, owner.0, owner.1).map_err(std::io::Error::from)?;
        }
        if let Some(v1) = &base.pids_v1 {
            crate::pids_v1::hand_base_to(v1, uid, gid)?;
        }
        Ok(())
    })();
    if let Err(e) = r {
        UNUSABLE.store(true, Ordering::Relaxed);
        tracing::warn!(error = %e, path = %base.dir.display(), "cannot hand the job cgroups to the command user: commands run without job cgroups and a kill falls back to sessions and parentage; delegate a writable cgroup v2 subtree to the executor (systemd Delegate=yes)");
    }
}

/// Empty job cgroups kept for the next commands, so a spawn neither creates nor removes one.
static POOL: Mutex<Vec<JobCgroup>> = Mutex::new(Vec::new());
/// How many empty job cgroups are kept; beyond that they are removed.
const POOL_MAX: usize = 8;

/// What `cgroup.events` says of a job cgroup.
#[derive(Debug, PartialEq, Eq)]
enum Occupancy {
    Empty,
    Populated,
    /// Removed behind our back.
    Gone,
}

/// The cgroup of one job. Cgroups are reused: once a job's cgroup is empty it goes back to a
/// small pool, and a later job starts in it. A cgroup is only ever handed out empty, and only
/// one job owns it at a time.
#[derive(Debug)]
pub struct JobCgroup {
    pub dir: PathBuf,
    /// The directory (`O_PATH`), for `clone3(CLONE_INTO_CGROUP)`.
    dir_fd: OwnedFd,
    /// `cgroup.procs`, open for writing, for kernels without `CLONE_INTO_CGROUP`.
    procs: OwnedFd,
    /// Set by [`JobCgroup::kill`]. A killed cgroup is never reused: the kernel compares a
    /// cgroup's kill count with the parent's when clone3 creates a child inside it, and kills
    /// the child when they differ, so a once-killed cgroup would kill every later command.
    killed: std::sync::atomic::AtomicBool,
    /// The limits last written into it (None: none written yet). A pooled cgroup is reused
    /// under whatever policy is in force then, so [`JobCgroup::take_for`] rewrites them when
    /// they differ.
    limits: Option<JobLimits>,
    /// Its twin in the cgroup v1 `pids` hierarchy, where `pids.max` comes from there.
    pids_v1: Option<crate::pids_v1::PidsJob>,
}

impl JobCgroup {
    /// An empty job cgroup: one from the pool, or a new one.
    pub fn take() -> Option<JobCgroup> {
        while let Some(cg) = POOL.lock().ok().and_then(|mut p| p.pop()) {
            if !cg.twin_gone() {
                return Some(cg);
            }
            // Its twin went while it was pooled: a child started here could not join it.
            cg.remove();
        }
        Self::create()
    }

    /// Its cgroup v1 `pids` twin was removed behind our back (another executor's sweep of
    /// what it took for a dead one's base): every child started here would fail to join it
    /// (ENODEV), so the cgroup is not reused.
    fn twin_gone(&self) -> bool {
        self.pids_v1.as_ref().is_some_and(|t| !t.dir.exists())
    }

    /// An empty job cgroup with `limits` in force. A cgroup whose limits cannot be written
    /// is not used (removed), so a job never runs under another policy's limits.
    pub fn take_for(limits: JobLimits) -> Option<JobCgroup> {
        for _ in 0..2 {
            let mut cg = Self::take()?;
            if cg.apply_limits(limits).is_ok() {
                return Some(cg);
            }
            cg.retire();
            let _ = cg.recycle();
        }
        None
    }

    /// Writes `limits` where they differ from what the cgroup has, for the controllers the
    /// base enabled. (Called only on an empty cgroup.)
    pub fn apply_limits(&mut self, limits: JobLimits) -> std::io::Result<()> {
        if self.limits == Some(limits) {
            return Ok(());
        }
        let (pids, memory) = cgroup_base().map_or((false, false), |b| (b.pids, b.memory));
        let old = self.limits;
        if pids && old.map(|o| o.pids_max) != Some(limits.pids_max) {
            match &self.pids_v1 {
                Some(v1) => v1.set_max(&limit_value(limits.pids_max))?,
                None => std::fs::write(self.dir.join("pids.max"), limit_value(limits.pids_max))?,
            }
        }
        if memory && old.map(|o| o.memory_max) != Some(limits.memory_max) {
            std::fs::write(self.dir.join("memory.max"), limit_value(limits.memory_max))?;
        }
        self.limits = Some(limits);
        Ok(())
    }

    /// Creates a new job cgroup and opens what a spawn needs to start a child in it.
    pub fn create() -> Option<JobCgroup> {
        if UNUSABLE.load(Ordering::Relaxed) {
            return None;
        }
        let base = cgroup_base()?;
        let name = format!("job-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let dir = base.dir.join(&name);
        std::fs::create_dir(&dir).ok()?;
        // The twin first: a job whose pids.max cannot be had gets no cgroup at all, so that
        // it never runs under a limit `doctor` claims and the kernel does not apply.
        let pids_v1 = match &base.pids_v1 {
            None => None,
            Some(v1) => match crate::pids_v1::PidsJob::create(v1, &name) {
                Ok(twin) => Some(twin),
                Err(e) => {
                    tracing::warn!(error = %e, path = %v1.display(), "cannot make a job's twin in the cgroup v1 pids hierarchy; the command runs without a job cgroup");
                    let _ = std::fs::remove_dir(&dir);
                    return None;
                }
            },
        };
        let opened = (|| {
            use std::os::unix::fs::OpenOptionsExt;
            let dir_fd = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
                .open(&dir)?;
            let procs = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))?;
            std::io::Result::Ok((dir_fd.into(), procs.into()))
        })();
        match opened {
            Ok((dir_fd, procs)) => Some(JobCgroup {
                dir,
                dir_fd,
                procs,
                killed: std::sync::atomic::AtomicBool::new(false),
                limits: None,
                pids_v1,
            }),
            Err(_) => {
                let _ = std::fs::remove_dir(&dir);
                if let Some(twin) = pids_v1 {
                    twin.remove();
                }
                None
            }
        }
    }

    /// How a spawn puts its child here.
    pub fn target(&self) -> CgroupTarget {
        use std::os::fd::AsRawFd;
        CgroupTarget {
            dir: self.dir_fd.as_raw_fd(),
            procs: self.procs.as_raw_fd(),
            pids_procs: self.pids_v1.as_ref().map_or(-1, |t| t.procs.as_raw_fd()),
        }
    }

    /// Marks the cgroup as not to be reused (it is removed once empty).
    pub fn retire(&self) {
        self.killed.store(true, Ordering::SeqCst);
    }

    pub fn kill(&self) {
        self.retire();
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
    }

    /// True when no live process is left in the cgroup (`populated 0` in `cgroup.events`).
    /// A cgroup removed behind our back counts as empty.
    pub fn is_empty(&self) -> bool {
        !matches!(self.occupancy(), Occupancy::Populated)
    }

    /// Reads `cgroup.events` through the directory descriptor: three system calls (open,
    /// read, close), where a read by path also walked the path and stat'ed the file. This runs
    /// after every command.
    fn occupancy(&self) -> Occupancy {
        use std::io::Read;
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: openat on a directory descriptor we own, with a NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                self.dir_fd.as_raw_fd(),
                c"cgroup.events".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            // Gone (removed behind our back): not reused. Any other error (out of
            // descriptors, say) counts as populated: try again later.
            return if e.raw_os_error() == Some(libc::ENOENT) {
                Occupancy::Gone
            } else {
                Occupancy::Populated
            };
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        let mut buf = [0u8; 256];
        let n = match file.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return Occupancy::Gone,
            Err(_) => return Occupancy::Populated,
        };
        let text = String::from_utf8_lossy(&buf[..n]);
        if text.lines().any(|l| l.trim() == "populated 0") {
            Occupancy::Empty
        } else {
            Occupancy::Populated
        }
    }

    /// Removes the cgroup once it is empty; returns false while processes remain.
    pub fn remove(&self) -> bool {
        let v2 = std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists();
        let v1 = self.pids_v1.as_ref().is_none_or(|t| t.remove());
        v2 && v1
    }

    /// Gives an empty cgroup back: kept in the pool for the next job, or removed when the
    /// pool is full. Returns it when it still holds processes.
    pub fn recycle(self) -> Result<(), JobCgroup> {
        match self.occupancy() {
            Occupancy::Populated => return Err(self),
            Occupancy::Gone => {
                // Its v1 twin is still there (and empty: it held the same processes).
                self.remove();
                return Ok(());
            }
            Occupancy::Empty => {}
        }
        if self.killed.load(Ordering::SeqCst) || self.twin_gone() {
            self.remove();
            return Ok(());
        }
        if let Ok(mut pool) = POOL.lock() {
            if pool.len() < POOL_MAX {
                pool.push(self);
                return Ok(());
            }
        }
        self.remove();
        Ok(())
    }
}

/// Kills every job cgroup and removes the base (executor shutdown).
pub fn kill_all_cgroups() {
    let Some(base) = cgroup_base() else { return };
    if let Ok(mut pool) = POOL.lock() {
        pool.clear();
    }
    if let Ok(rd) = std::fs::read_dir(&base.dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() && e.file_name() != EXECUTOR_LEAF {
                let _ = std::fs::write(p.join("cgroup.kill"), "1");
                remove_when_empty(&p);
            }
        }
    }
    let _ = std::fs::remove_dir(&base.dir);
    if let Some(v1) = &base.pids_v1 {
        crate::pids_v1::remove_base(v1);
    }
}

fn remove_when_empty(p: &Path) {
    for _ in 0..50 {
        if std::fs::remove_dir(p).is_ok() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_removes_bases_of_dead_executors_only() {
        let dir = tempfile::tempdir().unwrap();
        // A pid that cannot exist (above pid_max) and one that always does (init).
        let dead = dir.path().join("iii-shell-4294967294");
        let live = dir.path().join("iii-shell-1");
        let other = dir.path().join("not-ours-4294967294");
        std::fs::create_dir_all(dead.join("job-1")).unwrap();
        std::fs::create_dir_all(&live).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        sweep_stale_bases(dir.path());
        assert!(!dead.exists(), "a dead executor's base is swept");
        assert!(live.exists(), "a live executor's base is kept");
        assert!(
            other.exists(),
            "directories that are not ours are left alone"
        );
    }

    /// A job cgroup removed behind our back takes its v1 `pids` twin with it when it is
    /// given back: the twin is not left behind until the executor exits.
    #[test]
    fn a_removed_cgroup_given_back_leaves_no_v1_twin() {
        if cgroup_base().is_none_or(|b| b.pids_v1.is_none()) {
            iii_shell_confine::requirement::unmet("no cgroup v1 pids hierarchy here");
            return;
        }
        let cg = JobCgroup::create().expect("a job cgroup");
        let twin = cg.pids_v1.as_ref().expect("a v1 twin").dir.clone();
        assert!(twin.is_dir());
        std::fs::remove_dir(&cg.dir).unwrap();
        assert!(cg.recycle().is_ok());
        assert!(!twin.exists(), "{} was left behind", twin.display());
    }

    /// A job cgroup whose v1 `pids` twin was removed behind our back (another executor's
    /// sweep, say) is not pooled: every child started in it would fail to join the twin.
    #[test]
    fn a_cgroup_whose_v1_twin_is_gone_is_not_pooled() {
        if cgroup_base().is_none_or(|b| b.pids_v1.is_none()) {
            iii_shell_confine::requirement::unmet("no cgroup v1 pids hierarchy here");
            return;
        }
        let cg = JobCgroup::create().expect("a job cgroup");
        let dir = cg.dir.clone();
        std::fs::remove_dir(&cg.pids_v1.as_ref().expect("a v1 twin").dir).unwrap();
        // What a command started in it gets.
        let mut plan = crate::spawn::SpawnPlan::new(
            "/bin/true",
            &["true".to_string()],
            Vec::<(String, String)>::new(),
            crate::spawn::dev_null().unwrap(),
            crate::spawn::dev_null().unwrap(),
            crate::spawn::dev_null().unwrap(),
        )
        .unwrap();
        plan.cgroup = Some(cg.target());
        let err = crate::spawn::spawn(&plan).expect_err("no twin to join");
        assert_eq!(err.raw_os_error(), Some(libc::ENODEV), "{err}");
        drop(plan);
        assert!(cg.recycle().is_ok());
        assert!(
            !POOL.lock().unwrap().iter().any(|c| c.dir == dir),
            "a cgroup without its twin went back to the pool"
        );
        assert!(!dir.exists(), "{} was left behind", dir.display());

        // Its twin goes while it is pooled: take() does not hand it out. (Other tests share
        // the pool, so everything pooled is taken, then given back.)
        let cg = JobCgroup::create().expect("a job cgroup");
        let (dir, twin) = (cg.dir.clone(), cg.pids_v1.as_ref().unwrap().dir.clone());
        POOL.lock().unwrap().push(cg);
        std::fs::remove_dir(&twin).unwrap();
        let pooled = POOL.lock().unwrap().len();
        let taken: Vec<JobCgroup> = (0..pooled).filter_map(|_| JobCgroup::take()).collect();
        assert!(
            taken.iter().all(|c| c.dir != dir),
            "handed out without its twin"
        );
        assert!(!dir.exists(), "{} was left behind", dir.display());
        for c in taken {
            let _ = c.recycle();
        }
    }

    #[test]
    fn occupancy_follows_cgroup_events_and_a_removed_cgroup_is_not_pooled() {
        if cgroup_base().is_none() {
            iii_shell_confine::requirement::unmet("no writable cgroup v2 hierarchy here");
            return;
        }
        let cg = JobCgroup::create().expect("a job cgroup");
        assert_eq!(cg.occupancy(), Occupancy::Empty);

        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        std::fs::write(cg.dir.join("cgroup.procs"), child.id().to_string()).unwrap();
        assert_eq!(cg.occupancy(), Occupancy::Populated);
        assert!(!cg.is_empty());
        let _ = child.kill();
        let _ = child.wait();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while cg.occupancy() != Occupancy::Empty && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(cg.occupancy(), Occupancy::Empty);

        // Removed behind our back: gone, and recycling drops it instead of pooling it.
        let dir = cg.dir.clone();
        std::fs::remove_dir(&dir).unwrap();
        assert_eq!(cg.occupancy(), Occupancy::Gone);
        assert!(cg.is_empty());
        assert!(cg.recycle().is_ok());
        assert!(
            !POOL.lock().unwrap().iter().any(|c| c.dir == dir),
            "a removed cgroup went back to the pool"
        );
    }
}
