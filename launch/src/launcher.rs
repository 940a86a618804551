//! [`Launcher`]: the one owner of what starting commands keeps between calls: the job cgroups
//! (their base, the names handed out, the pool of empty ones), whether clone3 works, whether
//! processes are pre-started, the command user, and `/dev/null`.
//!
//! Two launchers in one process are independent: each has its own cgroup base (of another
//! name), its own pool and its own clone3 record, and neither sees the other's jobs. What
//! they share is what the kernel keeps per process: the seccomp filter this process holds
//! (`iii_shell_confine::seccomp::PROCESS`, with the clone3 secret it admits) and the orphans
//! a child subreaper is handed (`reaper::ROOTS`).

use std::os::fd::OwnedFd;
use std::sync::Arc;

use iii_shell_protocol::config::Config;

use crate::cgroups::{JobCgroups, JobLimits};
use crate::clone3::Clone3;
use crate::plan::{ChildConfinement, SpawnPlan};
use crate::prestarted::{Prestart, Prestarted};
use crate::run_as::{Applied, RunAs};
use crate::spawn::{Child, DevNull};

/// How a launcher is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The name of its job-cgroup base, a directory beside this process's own cgroup (and its
    /// twin in a cgroup v1 `pids` hierarchy); `None` for no job cgroups, so that job trees are
    /// tracked by session and parentage only.
    pub cgroup_base: Option<String>,
    /// Pre-start command processes where the kernel allows it (`III_SHELL_PRESTART=0` still
    /// turns it off).
    pub prestart: bool,
}

impl Settings {
    /// The executor's: the base `iii-shell-<pid>`, which the supervisor kills when the
    /// executor dies and the next executor's sweep removes. One launcher per process may use
    /// it: a launcher that finds a base of its name takes it for a dead process's and kills it.
    pub fn executor() -> Settings {
        Settings {
            cgroup_base: Some(JobCgroups::default_name()),
            prestart: true,
        }
    }

    /// A base of its own, `iii-shell-<pid>-<random>`: any number of these live in one process
    /// (tests, library use). A base left behind is swept once this process is gone.
    pub fn private() -> Settings {
        let tag = getrandom::u64().unwrap_or_else(|_| {
            // No kernel randomness: the address of a fresh allocation is unique while it lives.
            Box::into_raw(Box::new(0u8)) as u64
        });
        Settings {
            cgroup_base: Some(format!("{}-{tag:016x}", JobCgroups::default_name())),
            prestart: true,
        }
    }

    /// No job cgroups and no pre-started processes: plain spawns.
    pub fn plain() -> Settings {
        Settings {
            cgroup_base: None,
            prestart: false,
        }
    }
}

/// Starts commands and owns what that keeps between calls (see the module docs).
#[derive(Debug)]
pub struct Launcher {
    clone3: Arc<Clone3>,
    cgroups: Arc<JobCgroups>,
    prestart: Prestart,
    run_as: RunAs,
    null: DevNull,
}

impl Launcher {
    /// A launcher set up as `settings` says. Nothing is made yet: the cgroup base is found
    /// (and created) the first time it is needed, or by [`Launcher::settle`].
    pub fn new(settings: Settings) -> Launcher {
        let clone3 = Arc::new(Clone3::default());
        let cgroups = match settings.cgroup_base {
            Some(name) => JobCgroups::new(name, clone3.clone()),
            None => JobCgroups::none(clone3.clone()),
        };
        let prestart = Prestart::from_env();
        if !settings.prestart {
            prestart.disable();
        }
        Launcher {
            clone3,
            cgroups,
            prestart,
            run_as: RunAs::default(),
            null: DevNull::default(),
        }
    }

    /// Finds or makes the job-cgroup base now (the executor does it at start-up, while it
    /// still holds the capabilities the sweep of dead executors' bases may need).
    pub fn settle(&self) {
        let _ = self.cgroups.base();
    }

    /// Whether clone3 with `CLONE_INTO_CGROUP` is used.
    pub fn clone3(&self) -> &Clone3 {
        &self.clone3
    }

    /// The job cgroups.
    pub fn cgroups(&self) -> &Arc<JobCgroups> {
        &self.cgroups
    }

    /// The command user.
    pub fn run_as(&self) -> &RunAs {
        &self.run_as
    }

    /// Applies the command user `config` asks for ([`RunAs::apply`]), handing the job
    /// cgroups to it.
    pub fn apply_run_as(&self, config: &Config) -> Result<(), String> {
        self.run_as.apply(config, &self.cgroups)
    }

    /// What [`Launcher::apply_run_as`] applied, if anything.
    pub fn applied_run_as(&self) -> Option<Applied> {
        self.run_as.applied()
    }

    /// A new descriptor of `/dev/null` (read-only, close-on-exec).
    pub fn dev_null(&self) -> std::io::Result<OwnedFd> {
        self.null.open()
    }

    /// Starts `plan`'s child ([`crate::spawn::spawn`]).
    pub fn spawn(&self, plan: &SpawnPlan) -> std::io::Result<Child> {
        crate::spawn::spawn(plan, &self.clone3)
    }

    /// Whether processes are pre-started.
    pub fn prestarting(&self) -> bool {
        self.prestart.enabled(&self.clone3)
    }

    /// `on`, `off` or `unavailable`, for `doctor`.
    pub fn prestart_availability(&self) -> &'static str {
        self.prestart.availability(&self.clone3, &self.cgroups)
    }

    /// Turns pre-started processes off for the life of the launcher.
    pub fn disable_prestart(&self) {
        self.prestart.disable();
    }

    /// Pre-starts a command process confined by `confinement`, in a job cgroup with
    /// `limits` ([`Prestarted::start`]); ENOSYS when this launcher does not pre-start.
    pub fn prestart(
        &self,
        confinement: &ChildConfinement,
        limits: JobLimits,
    ) -> std::io::Result<Prestarted> {
        if !self.prestarting() {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSYS));
        }
        Prestarted::start(&self.cgroups, &self.clone3, &self.null, confinement, limits)
    }

    /// Kills every job cgroup and removes the base (shutdown).
    pub fn kill_all(&self) {
        self.cgroups.kill_all();
    }
}
