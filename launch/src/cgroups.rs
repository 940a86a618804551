//! Job cgroups: where they live (a base per executor in cgroup v2, next to the executor's own
//! cgroup, and its twins in the cgroup v1 `pids`, `memory` and `cpu` hierarchies where those
//! controllers are there, see [`crate::pids_v1`]), the limits written into them (see
//! [`crate::limit_files`]), and the pool that reuses empty ones so
//! that a spawn neither creates nor removes a cgroup. The sweep of dead executors' bases and
//! their hand-over to the command user live here too.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

pub use crate::bases::{
    base_of, kill_base, own_cgroup_dir, remove_empty_base, stale_bases, sweep_stale_bases,
};
use crate::clone3::Clone3;
use crate::limit_files;
use crate::pids_v1::{Controller, V1Twin};
use crate::plan::CgroupTarget;

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
    /// Job cgroups have `memory.max` (the cgroup v2 `memory` controller).
    pub memory: bool,
    /// Where the job twins in the cgroup v1 `memory` hierarchy are made, when the memory
    /// limit comes from there.
    pub memory_v1: Option<PathBuf>,
    /// Job cgroups have `cpu.max` (the cgroup v2 `cpu` controller).
    pub cpu: bool,
    /// Where the job twins in the cgroup v1 `cpu` hierarchy are made, when the CPU limit
    /// comes from there.
    pub cpu_v1: Option<PathBuf>,
}

impl CgroupBase {
    /// The controller that enforces a job's memory limit: "cgroup v2", "cgroup v1", or none.
    pub fn memory_controller(&self) -> Option<&'static str> {
        controller_kind(self.memory, self.memory_v1.is_some())
    }

    /// The controller that enforces a job's CPU limit.
    pub fn cpu_controller(&self) -> Option<&'static str> {
        controller_kind(self.cpu, self.cpu_v1.is_some())
    }

    /// The controller that enforces a job's `pids.max`.
    pub fn pids_controller(&self) -> Option<&'static str> {
        controller_kind(self.pids && self.pids_v1.is_none(), self.pids_v1.is_some())
    }

    fn v1_bases(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.pids_v1, &self.memory_v1, &self.cpu_v1]
            .into_iter()
            .flatten()
    }
}

fn controller_kind(v2: bool, v1: bool) -> Option<&'static str> {
    if v2 {
        Some("cgroup v2")
    } else if v1 {
        Some("cgroup v1")
    } else {
        None
    }
}

/// The limits written into a job cgroup (`confinement.job_limits`, tightened per call);
/// `None` is "max".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobLimits {
    pub pids_max: Option<u64>,
    pub memory_max: Option<u64>,
    /// A share of one CPU, in percent (250: two and a half CPUs).
    pub cpu_max_percent: Option<u32>,
}

/// Enables `pids`, `memory` and `cpu` for the children of `base` where its parent delegates
/// them; returns which of them job cgroups get.
fn enable_controllers(base: &Path) -> (bool, bool, bool) {
    let available = std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    let has = |c: &str| available.split_whitespace().any(|x| x == c);
    let on = |c: &str| {
        has(c) && std::fs::write(base.join("cgroup.subtree_control"), format!("+{c}")).is_ok()
    };
    (on("pids"), on("memory"), on("cpu"))
}

/// The base of job twins in the v1 hierarchy of `controller`, where cgroup v2 does not have
/// it (`in_v2`) and a v1 hierarchy does.
fn v1_base(name: &str, controller: Controller, in_v2: bool) -> Option<PathBuf> {
    if in_v2 {
        return None;
    }
    let c = controller.name();
    match crate::pids_v1::create_base(name, controller) {
        Ok(d) => {
            tracing::info!(path = %d.display(), "the {c} controller is bound to a cgroup v1 hierarchy: each job gets a twin there for its limit");
            Some(d)
        }
        Err(why) => {
            tracing::warn!("the {c} controller is available neither for cgroup v2 job cgroups nor as a cgroup v1 hierarchy ({why}): a {c} limit in confinement.job_limits cannot be enforced; delegate the {c} controller to iii-shell's cgroup to enforce it");
            None
        }
    }
}

/// Finds a writable cgroup v2 directory for job cgroups: `name`, a child of the executor's own
/// cgroup.
fn detect_cgroup_base(name: &str, clone3: &Clone3) -> Option<CgroupBase> {
    let parent = own_cgroup_dir()?;
    sweep_stale_bases(&parent);
    let dir = parent.join(name);
    // A base of our name is an earlier process's whose pid we reuse (a container's executor
    // often has the same small pid every time): what it holds is not ours, and its job
    // cgroups' names would collide with ours. It goes like any stale base.
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
    let (v2_pids, memory, cpu) = enable_controllers(&dir);
    let pids_v1 = v1_base(name, Controller::Pids, v2_pids);
    let memory_v1 = v1_base(name, Controller::Memory, memory);
    let cpu_v1 = v1_base(name, Controller::Cpu, cpu);
    let pids = v2_pids || pids_v1.is_some();
    tracing::debug!(path = %dir.display(), pids, v1 = pids_v1.is_some(), memory, cpu, "job cgroups enabled");
    let base = CgroupBase {
        dir,
        pids,
        pids_v1,
        memory,
        memory_v1,
        cpu,
        cpu_v1,
    };
    check_clone3(&base, clone3);
    Some(base)
}

/// Makes sure a child created inside a fresh job cgroup by clone3 survives; otherwise clone3
/// is switched off and children join by writing `cgroup.procs`. (A kernel kills such a child
/// when the job cgroup's kill count differs from that of the spawner's own cgroup, which
/// happens if the executor was moved into a cgroup that had been killed before.)
fn check_clone3(base: &CgroupBase, clone3: &Clone3) {
    if !clone3.available() {
        return;
    }
    let dir = base.dir.join("clone3-check");
    let _ = std::fs::create_dir(&dir);
    let result = std::fs::File::open(&dir)
        .map_err(|e| e.to_string())
        .and_then(|f| crate::clone3::self_test(std::os::fd::AsRawFd::as_raw_fd(&f)));
    let _ = std::fs::remove_dir(&dir);
    if let Err(why) = result {
        clone3.disable(&why);
    }
}

/// The leaf the executor moves itself into before it hands the base to the command user, so
/// that the base is the common ancestor of every migration it makes (cgroup v2 delegation).
pub const EXECUTOR_LEAF: &str = "executor";

/// One launcher's job cgroups: its base (found the first time it is asked for), the names it
/// hands out, whether the command user could be given them, and the pool that reuses empty
/// ones so that a spawn neither creates nor removes a cgroup. Two launchers in one process
/// have two of these, with bases of different names, and never see each other's cgroups.
#[derive(Debug)]
pub struct JobCgroups {
    /// The base's directory name beside the executor's own cgroup (`iii-shell-<pid>`).
    name: String,
    clone3: Arc<Clone3>,
    base: OnceLock<Option<CgroupBase>>,
    next: AtomicU64,
    /// Set when the job cgroups could not be handed to the command user: jobs then run
    /// without a cgroup, and process-tree kill falls back to sessions and parentage.
    unusable: AtomicBool,
    /// Empty job cgroups kept for the next commands.
    pool: Mutex<Vec<JobCgroup>>,
}

impl JobCgroups {
    /// Job cgroups under a base called `name` (see [`JobCgroups::default_name`]); clone3 is
    /// checked against it, and switched off in `clone3` when a child it starts there dies.
    pub fn new(name: impl Into<String>, clone3: Arc<Clone3>) -> Arc<JobCgroups> {
        Arc::new(JobCgroups {
            name: name.into(),
            clone3,
            base: OnceLock::new(),
            next: AtomicU64::new(1),
            unusable: AtomicBool::new(false),
            pool: Mutex::new(Vec::new()),
        })
    }

    /// None at all: every job runs without a cgroup (tracked by session and parentage).
    pub fn none(clone3: Arc<Clone3>) -> Arc<JobCgroups> {
        let cgroups = Self::new(String::new(), clone3);
        let _ = cgroups.base.set(None);
        cgroups
    }

    /// The executor's base name, `iii-shell-<pid>`: the one the supervisor and the next
    /// executor's sweep look for.
    pub fn default_name() -> String {
        format!("iii-shell-{}", std::process::id())
    }

    /// Where job cgroups are created, if anywhere (found, and made, the first time).
    pub fn base(&self) -> Option<&CgroupBase> {
        self.base
            .get_or_init(|| detect_cgroup_base(&self.name, &self.clone3))
            .as_ref()
    }

    /// Whether commands get job cgroups.
    pub fn usable(&self) -> bool {
        self.base().is_some() && !self.unusable.load(Ordering::Relaxed)
    }

    /// Before the executor leaves root: moves itself into `<base>/executor` and hands the
    /// base (directory, `cgroup.procs`, `cgroup.subtree_control`, `cgroup.threads`) and that
    /// leaf to `uid:gid`, the way systemd delegates a subtree. If any step fails, job cgroups
    /// are turned off (logged; `doctor` shows it).
    pub fn hand_to(&self, uid: u32, gid: u32) {
        let Some(base) = self.base() else { return };
        if let Err(e) = hand_base_to(base, uid, gid) {
            self.unusable.store(true, Ordering::Relaxed);
            tracing::warn!(error = %e, path = %base.dir.display(), "cannot hand the job cgroups to the command user: commands run without job cgroups and a kill falls back to sessions and parentage; delegate a writable cgroup v2 subtree to the executor (systemd Delegate=yes)");
        }
    }

    /// An empty job cgroup: one from the pool, or a new one.
    pub fn take(self: &Arc<Self>) -> Option<JobCgroup> {
        while let Some(cg) = self.pool.lock().ok().and_then(|mut p| p.pop()) {
            if !cg.twin_gone() {
                return Some(cg);
            }
            // Its twin went while it was pooled: a child started here could not join it.
            cg.remove();
        }
        self.create()
    }

    /// An empty job cgroup with `limits` in force. A cgroup whose limits cannot be written
    /// is not used (removed), so a job never runs under another policy's limits.
    pub fn take_for(self: &Arc<Self>, limits: JobLimits) -> Option<JobCgroup> {
        for _ in 0..2 {
            let mut cg = self.take()?;
            if cg.apply_limits(limits).is_ok() {
                return Some(cg);
            }
            cg.retire();
            let _ = cg.recycle();
        }
        None
    }

    /// Creates a new job cgroup and opens what a spawn needs to start a child in it.
    pub fn create(self: &Arc<Self>) -> Option<JobCgroup> {
        if self.unusable.load(Ordering::Relaxed) {
            return None;
        }
        let base = self.base()?;
        let name = format!("job-{}", self.next.fetch_add(1, Ordering::Relaxed));
        JobCgroup::create_in(base, &name, Arc::downgrade(self))
    }

    /// Kills every job cgroup and removes the base (executor shutdown).
    pub fn kill_all(&self) {
        let Some(base) = self.base() else { return };
        if let Ok(mut pool) = self.pool.lock() {
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
        for v1 in base.v1_bases() {
            crate::pids_v1::remove_base(v1);
        }
    }

    /// Keeps an empty cgroup for the next job; gives it back when the pool is full.
    fn keep(&self, cg: JobCgroup) -> Result<(), JobCgroup> {
        match self.pool.lock() {
            Ok(mut pool) if pool.len() < POOL_MAX => {
                pool.push(cg);
                Ok(())
            }
            _ => Err(cg),
        }
    }
}

/// [`JobCgroups::hand_to`]'s steps.
fn hand_base_to(base: &CgroupBase, uid: u32, gid: u32) -> std::io::Result<()> {
    let leaf = base.dir.join(EXECUTOR_LEAF);
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
    for v1 in base.v1_bases() {
        crate::pids_v1::hand_base_to(v1, uid, gid)?;
    }
    Ok(())
}

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
    /// under whatever policy is in force then, so [`JobCgroups::take_for`] rewrites them when
    /// they differ.
    limits: Option<JobLimits>,
    /// Its twin in the cgroup v1 `pids` hierarchy, where `pids.max` comes from there.
    pids_v1: Option<Box<V1Twin>>,
    /// Its twins in the cgroup v1 `memory` and `cpu` hierarchies, where those limits come
    /// from there.
    memory_v1: Option<Box<V1Twin>>,
    cpu_v1: Option<Box<V1Twin>>,
    /// Which limits its base offers in cgroup v2 (`pids.max`, `memory.max`, `cpu.max`).
    pids: bool,
    memory: bool,
    cpu: bool,
    /// The memory controller's OOM-kill count when the current job was given the cgroup
    /// (the count of a reused cgroup keeps earlier jobs' kills).
    oom_base: u64,
    /// The job cgroups it came from, whose pool it goes back to (none once they are gone).
    owner: Weak<JobCgroups>,
}

impl JobCgroup {
    /// Its cgroup v1 `pids` twin was removed behind our back (another executor's sweep of
    /// what it took for a dead one's base): every child started here would fail to join it
    /// (ENODEV), so the cgroup is not reused.
    fn twin_gone(&self) -> bool {
        self.twins().any(|t| !t.dir.exists())
    }

    fn twins(&self) -> impl Iterator<Item = &V1Twin> {
        [&self.pids_v1, &self.memory_v1, &self.cpu_v1]
            .into_iter()
            .flatten()
            .map(|t| &**t)
    }

    /// Writes `files` into the v1 twin `twin`, or into the v2 cgroup where there is none;
    /// a swap file that does not exist (no swap accounting) is skipped.
    fn write_files(
        &self,
        twin: Option<&V1Twin>,
        files: Vec<(&'static str, String)>,
    ) -> std::io::Result<()> {
        let dir = twin.map_or(&self.dir, |t| &t.dir);
        for (file, value) in files {
            let path = dir.join(file);
            if limit_files::optional(file) && !path.exists() {
                continue;
            }
            std::fs::write(&path, &value)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        }
        Ok(())
    }

    /// The OOM killer's kill count in the job's memory cgroup (0 without one).
    fn oom_count(&self) -> u64 {
        let file = match (&self.memory_v1, self.memory) {
            (Some(t), _) => t.dir.join("memory.oom_control"),
            (None, true) => self.dir.join("memory.events"),
            (None, false) => return 0,
        };
        std::fs::read_to_string(file).map_or(0, |t| limit_files::oom_kills(&t))
    }

    /// True when the OOM killer killed a process of this job since it was given the cgroup:
    /// the job hit its memory limit.
    pub fn oom_killed(&self) -> bool {
        self.oom_count() > self.oom_base
    }

    /// The limits written into it for the current job.
    pub fn limits(&self) -> Option<JobLimits> {
        self.limits
    }

    /// The limit files of this job cgroup as the kernel has them: (file, value), for each
    /// controller it has (for `doctor` and tests).
    pub fn read_back(&self) -> Vec<(String, String)> {
        let read = |dir: &Path, f: &str| {
            std::fs::read_to_string(dir.join(f))
                .map_or_else(|e| format!("unreadable: {e}"), |v| v.trim().to_string())
        };
        let mut out = Vec::new();
        let mut add = |twin: Option<&V1Twin>, v2: bool, files: &[&str]| {
            let dir = match (twin, v2) {
                (Some(t), _) => &t.dir,
                (None, true) => &self.dir,
                (None, false) => return,
            };
            for f in files {
                out.push((f.to_string(), read(dir, f)));
            }
        };
        add(self.pids_v1.as_deref(), self.pids, &["pids.max"]);
        add(
            self.memory_v1.as_deref(),
            self.memory,
            if self.memory_v1.is_some() {
                &["memory.limit_in_bytes"]
            } else {
                &["memory.max"]
            },
        );
        add(
            self.cpu_v1.as_deref(),
            self.cpu,
            if self.cpu_v1.is_some() {
                &["cpu.cfs_quota_us", "cpu.cfs_period_us"]
            } else {
                &["cpu.max"]
            },
        );
        out
    }

    /// Writes `limits` where they differ from what the cgroup has, for the controllers the
    /// base enabled. (Called only on an empty cgroup.)
    pub fn apply_limits(&mut self, limits: JobLimits) -> std::io::Result<()> {
        // The job about to start is answerable only for kills from now on.
        self.oom_base = self.oom_count();
        if self.limits == Some(limits) {
            return Ok(());
        }
        let old = self.limits;
        // Unknown until written: a failed write leaves the cgroup unused (see `take_for`).
        self.limits = None;
        if self.pids && old.map(|o| o.pids_max) != Some(limits.pids_max) {
            self.write_files(self.pids_v1.as_deref(), limit_files::pids(limits.pids_max))?;
        }
        if old.map(|o| o.memory_max) != Some(limits.memory_max) {
            match (&self.memory_v1, self.memory) {
                (Some(t), _) => {
                    self.write_files(Some(t), limit_files::v1_memory(limits.memory_max))?
                }
                (None, true) => {
                    self.write_files(None, limit_files::v2_memory(limits.memory_max))?
                }
                (None, false) => {}
            }
        }
        if old.map(|o| o.cpu_max_percent) != Some(limits.cpu_max_percent) {
            match (&self.cpu_v1, self.cpu) {
                (Some(t), _) => {
                    self.write_files(Some(t), limit_files::v1_cpu(limits.cpu_max_percent))?
                }
                (None, true) => {
                    self.write_files(None, limit_files::v2_cpu(limits.cpu_max_percent))?
                }
                (None, false) => {}
            }
        }
        self.limits = Some(limits);
        Ok(())
    }

    /// Creates the job cgroup `name` under `base` and opens what a spawn needs to start a
    /// child in it.
    fn create_in(base: &CgroupBase, name: &str, owner: Weak<JobCgroups>) -> Option<JobCgroup> {
        let dir = base.dir.join(name);
        std::fs::create_dir(&dir).ok()?;
        // The twins first: a job whose limits cannot be had gets no cgroup at all, so that
        // it never runs under a limit `doctor` claims and the kernel does not apply.
        let mut twins: Vec<Option<Box<V1Twin>>> = Vec::with_capacity(3);
        for v1 in [&base.pids_v1, &base.memory_v1, &base.cpu_v1] {
            let Some(v1) = v1 else {
                twins.push(None);
                continue;
            };
            match V1Twin::create(v1, name) {
                Ok(twin) => twins.push(Some(Box::new(twin))),
                Err(e) => {
                    tracing::warn!(error = %e, path = %v1.display(), "cannot make a job's twin in a cgroup v1 hierarchy; the command runs without a job cgroup");
                    let _ = std::fs::remove_dir(&dir);
                    for t in twins.iter().flatten() {
                        t.remove();
                    }
                    return None;
                }
            }
        }
        let cpu_v1 = twins.pop().flatten();
        let memory_v1 = twins.pop().flatten();
        let pids_v1 = twins.pop().flatten();
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
                memory_v1,
                cpu_v1,
                pids: base.pids,
                memory: base.memory,
                cpu: base.cpu,
                oom_base: 0,
                owner,
            }),
            Err(_) => {
                let _ = std::fs::remove_dir(&dir);
                for twin in [pids_v1, memory_v1, cpu_v1].iter().flatten() {
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
            v1_procs: [&self.pids_v1, &self.memory_v1, &self.cpu_v1]
                .map(|t| t.as_ref().map_or(-1, |t| t.procs.as_raw_fd())),
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
        // Every twin is tried, not only up to the first that stays.
        let v1 = self
            .twins()
            .map(|t| t.remove())
            .collect::<Vec<_>>()
            .iter()
            .all(|r| *r);
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
        let rest = match self.owner.upgrade() {
            Some(owner) => owner.keep(self),
            None => Err(self),
        };
        if let Err(cg) = rest {
            cg.remove();
        }
        Ok(())
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

    /// Job cgroups of a test's own, under a base of its own name (removed by the caller's
    /// `kill_all`).
    fn job_cgroups(test: &str) -> Arc<JobCgroups> {
        JobCgroups::new(
            format!("{}-{test}", JobCgroups::default_name()),
            Arc::new(Clone3::default()),
        )
    }

    /// A job cgroup removed behind our back takes its v1 `pids` twin with it when it is
    /// given back: the twin is not left behind until the executor exits.
    #[test]
    fn a_removed_cgroup_given_back_leaves_no_v1_twin() {
        let cgroups = job_cgroups("v1-twin-left");
        if cgroups.base().is_none_or(|b| b.pids_v1.is_none()) {
            cgroups.kill_all();
            iii_shell_confine::requirement::unmet("no cgroup v1 pids hierarchy here");
            return;
        }
        let cg = cgroups.create().expect("a job cgroup");
        let twin = cg.pids_v1.as_ref().expect("a v1 twin").dir.clone();
        assert!(twin.is_dir());
        std::fs::remove_dir(&cg.dir).unwrap();
        assert!(cg.recycle().is_ok());
        assert!(!twin.exists(), "{} was left behind", twin.display());
        cgroups.kill_all();
    }

    /// A job cgroup whose v1 `pids` twin was removed behind our back (another executor's
    /// sweep, say) is not pooled: every child started in it would fail to join the twin.
    #[test]
    fn a_cgroup_whose_v1_twin_is_gone_is_not_pooled() {
        let cgroups = job_cgroups("v1-twin-gone");
        if cgroups.base().is_none_or(|b| b.pids_v1.is_none()) {
            cgroups.kill_all();
            iii_shell_confine::requirement::unmet("no cgroup v1 pids hierarchy here");
            return;
        }
        let cg = cgroups.create().expect("a job cgroup");
        let dir = cg.dir.clone();
        std::fs::remove_dir(&cg.pids_v1.as_ref().expect("a v1 twin").dir).unwrap();
        // What a command started in it gets.
        let mut plan = crate::spawn::SpawnPlan::new(
            "/bin/true",
            &["true".to_string()],
            Vec::<(String, String)>::new(),
            crate::spawn::open_dev_null().unwrap(),
            crate::spawn::open_dev_null().unwrap(),
            crate::spawn::open_dev_null().unwrap(),
        )
        .unwrap();
        plan.cgroup = Some(cg.target());
        let err = crate::spawn::spawn(&plan, &cgroups.clone3).expect_err("no twin to join");
        assert_eq!(err.raw_os_error(), Some(libc::ENODEV), "{err}");
        drop(plan);
        assert!(cg.recycle().is_ok());
        assert!(
            !cgroups.pool.lock().unwrap().iter().any(|c| c.dir == dir),
            "a cgroup without its twin went back to the pool"
        );
        assert!(!dir.exists(), "{} was left behind", dir.display());

        // Its twin goes while it is pooled: take() does not hand it out.
        let cg = cgroups.create().expect("a job cgroup");
        let (dir, twin) = (cg.dir.clone(), cg.pids_v1.as_ref().unwrap().dir.clone());
        cgroups.pool.lock().unwrap().push(cg);
        std::fs::remove_dir(&twin).unwrap();
        let pooled = cgroups.pool.lock().unwrap().len();
        let taken: Vec<JobCgroup> = (0..pooled).filter_map(|_| cgroups.take()).collect();
        assert!(
            taken.iter().all(|c| c.dir != dir),
            "handed out without its twin"
        );
        assert!(!dir.exists(), "{} was left behind", dir.display());
        for c in taken {
            let _ = c.recycle();
        }
        cgroups.kill_all();
    }

    #[test]
    fn occupancy_follows_cgroup_events_and_a_removed_cgroup_is_not_pooled() {
        let cgroups = job_cgroups("occupancy");
        if cgroups.base().is_none() {
            iii_shell_confine::requirement::unmet("no writable cgroup v2 hierarchy here");
            return;
        }
        let cg = cgroups.create().expect("a job cgroup");
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
            !cgroups.pool.lock().unwrap().iter().any(|c| c.dir == dir),
            "a removed cgroup went back to the pool"
        );
        cgroups.kill_all();
    }
}
