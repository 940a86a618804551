//! The policy the executor enforces, compiled from the `shell` configuration document.
//!
//! The broker sends the whole document; the executor parses and validates it itself, so a
//! compromised broker cannot hand it a policy the configuration rules would refuse.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use iii_shell_protocol::config::{Config, NetworkAccess};

use crate::command_ruleset::{self, strict_refusal, Reuse, Ruleset};
use crate::confine::{landlock_rules, seccomp, special_bits, Rlimits};
use iii_shell_launch::spawn::ChildConfinement;
use iii_shell_launch::{Launcher, Settings};

use iii_shell_files::ready::Ready;
use iii_shell_files::FsPolicy;
use iii_shell_policy::denylist::Denylist;

/// The policy in force. Its filesystem half (`config`, `jail`) is an [`FsPolicy`], which the
/// files crate takes; a `Policy` derefs to it, so `policy.config` and `policy.jail` read as
/// fields and `&Policy` passes where `&FsPolicy` is asked.
#[derive(Debug)]
pub struct Policy {
    pub generation: u64,
    /// The configuration and the jail.
    pub fs: Arc<FsPolicy>,
    pub denylist: Denylist,
    /// The executor's environment filtered by `env.inherit` / `env.allow`: what every command
    /// starts from before its per-call overrides.
    pub base_env: std::collections::BTreeMap<String, String>,
    /// The same, as C strings ready for execve: what a terminal session starts from.
    pub base_envp: Arc<iii_shell_launch::spawn::EnvBlock>,
    /// What `shell::exec` and `shell::exec_bg` commands start from: `base_env` with the
    /// non-terminal defaults (no pager, no git credential prompt) where it has none
    /// ([`iii_shell_policy::env_policy::non_terminal_env`]).
    pub command_envp: Arc<iii_shell_launch::spawn::EnvBlock>,
    /// The `HOME` in `base_env`, and where it comes from ([`Policy::settle_home`]).
    pub home: iii_shell_files::home::Home,
    /// What holds for the command user under this policy ([`Policy::settle_user`]).
    pub user: UserFacts,
    /// Landlock ruleset, seccomp program and rlimits for every command spawned under it.
    pub commands: CommandConfinement,
    /// What starts its commands: the executor's launcher once the executor accepted it
    /// ([`Policy::with_launcher`]); a plain one (no job cgroups, nothing pre-started) for a
    /// policy built on its own.
    pub launcher: Arc<Launcher>,
    /// A command process started ahead of time under this policy (see `prestarted`).
    prestarted: std::sync::Mutex<Vec<iii_shell_launch::prestarted::Prestarted>>,
    /// Set when a newer policy replaced this one: it starts no more command processes.
    retired: AtomicBool,
    /// What it took over from the policy before it: with nothing, it walks its roots itself;
    /// with the record, it builds only its ruleset; with the ruleset, nothing is left to do.
    /// And whether that work has been started ([`Policy::start_walk`]).
    taken: Reuse,
    walk_started: std::sync::Once,
}

#[derive(Debug)]
pub struct CommandConfinement {
    /// Set once the walk for protected entries is done ([`Policy::build`] starts it): the
    /// carve-out for protected entries needs to know where they are. Commands wait for it
    /// ([`CommandConfinement::ready`]); nothing else does.
    pub landlock: Arc<Ready<Ruleset>>,
    /// Gaps found when the policy was built (seccomp's), reported with the ruleset's own.
    pub gaps: Vec<String>,
    pub seccomp: Option<Arc<seccomp::Filter>>,
    /// False when the executor's own filter (inherited by every child) is the same one:
    /// loading it again per spawn would only cost time.
    pub seccomp_per_spawn: bool,
    /// What each command loads: the per-spawn deny filter when there is one, behind the
    /// special-bits rule when that is not in the executor's own filter already (see
    /// `confine::special_bits`).
    pub spawn_filter: Option<Arc<seccomp::Filter>>,
    /// Where the special-bits rule sits for this policy.
    pub special_bits: special_bits::Placement,
    pub rlimits: Rlimits,
    /// The network modes: what is configured, and what a command under `deny` loads.
    pub network: NetworkFilters,
}

/// The network half of a policy's command confinement (`confinement.network`).
#[derive(Debug)]
pub struct NetworkFilters {
    /// `confinement.network` as configured.
    pub configured: NetworkAccess,
    /// What commands not asking for anything else run as (see
    /// [`iii_shell_policy::network::enforce`]).
    pub runs_as: NetworkAccess,
    /// What a command running as `deny` loads: the socket-family rule
    /// (`confine::network_block`) in front of the spawn filter. Built here, in the parent.
    pub deny_filter: Arc<seccomp::Filter>,
    /// Set once a call ran tighter than it asked (its WARN is logged once per policy).
    warned: AtomicBool,
}

impl NetworkFilters {
    fn new(configured: NetworkAccess, spawn_filter: Option<&Arc<seccomp::Filter>>) -> Self {
        NetworkFilters {
            configured,
            runs_as: iii_shell_policy::network::enforce(
                configured,
                configured,
                loopback_available(),
            )
            .runs_as,
            deny_filter: Arc::new(iii_shell_confine::network_block::with(
                spawn_filter.map(|f| &**f),
            )),
            warned: AtomicBool::new(false),
        }
    }

    /// What a call asking for `requested` runs under: S210 when it is wider than the
    /// configuration; when it cannot be enforced, S216 under `strict`, otherwise `deny` with
    /// one WARN.
    pub fn for_call(
        &self,
        requested: Option<NetworkAccess>,
        strict: bool,
    ) -> Result<NetworkAccess, iii_shell_files::error::ExecError> {
        use iii_shell_files::error::ExecError;
        use iii_shell_policy::network;
        let wanted = network::for_call(self.configured, requested).map_err(ExecError::Invalid)?;
        let e = network::enforce(self.configured, wanted, loopback_available());
        if let Some(missing) = e.missing {
            if strict {
                return Err(ExecError::Internal(format!(
                    "network {} cannot be enforced (confinement.mode: strict): missing {missing}",
                    network::name(wanted)
                )));
            }
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(wanted = network::name(wanted), missing, "a command asked for a network mode this executor cannot enforce and runs as deny instead (no network at all); to enforce it, provide what is missing or use confinement.mode: strict to refuse such calls");
            }
        }
        Ok(e.runs_as)
    }
}

/// Whether commands can get a network namespace of their own (`loopback`). Not yet: the
/// executor makes none, so `loopback` runs as `deny` (or is refused under `strict`).
pub fn loopback_available() -> bool {
    false
}

/// What each command loads: the per-spawn deny filter (when the live list differs from the
/// executor's), with the special-bits rule in front when it is placed per spawn.
fn spawn_filter(
    seccomp: &Option<Arc<seccomp::Filter>>,
    per_spawn: bool,
    placement: special_bits::Placement,
) -> Option<Arc<seccomp::Filter>> {
    let deny = seccomp.as_ref().filter(|_| per_spawn);
    match placement {
        special_bits::Placement::PerSpawn => Some(Arc::new(special_bits::with(deny.map(|f| &**f)))),
        special_bits::Placement::Off | special_bits::Placement::Inherited => deny.cloned(),
    }
}

impl CommandConfinement {
    /// Everything but the Landlock ruleset, which [`CommandConfinement::finish`] builds once
    /// the protected entries are known. The gaps known now (Landlock off or partial, seccomp)
    /// refuse a strict policy here.
    pub fn build(config: &Config) -> Result<CommandConfinement, String> {
        let seccomp = if config.confinement.seccomp {
            iii_shell_launch::clone3::register_seccomp_exception();
            Some(Arc::new(seccomp::build(&config.confinement.seccomp_allow)?))
        } else {
            None
        };
        let seccomp_per_spawn = match (&seccomp, seccomp::PROCESS.baseline()) {
            (Some(f), Some(base)) => f.denied != base,
            (Some(_), None) => true,
            (None, _) => false,
        };
        // A policy the executor's filter contradicts (special bits allowed under the rule)
        // is refused by `replace_special_bits`, after the envelope's checks; until then the
        // rule the kernel enforces is the inherited one.
        let placement = special_bits::placement(
            config.fs.allow_special_bits,
            config.confinement.seccomp,
            special_bits::in_executor(),
        )
        .unwrap_or(special_bits::Placement::Inherited);
        let spawn = spawn_filter(&seccomp, seccomp_per_spawn, placement);
        let c = CommandConfinement {
            landlock: Arc::default(),
            gaps: Vec::new(),
            network: NetworkFilters::new(config.confinement.network, spawn.as_ref()),
            spawn_filter: spawn,
            special_bits: placement,
            seccomp,
            seccomp_per_spawn,
            rlimits: Rlimits::from_config(&config.confinement.rlimits),
        };
        let mut extra_gaps = Vec::new();
        if let (Some(f), Some(base)) = (&c.seccomp, seccomp::PROCESS.baseline()) {
            for name in base.iter().filter(|n| !f.denied.contains(n)) {
                extra_gaps.push(format!(
                    "{} is re-allowed by confinement.seccomp_allow but the executor's own filter still denies it: put it in the pinned envelope and restart the executor",
                    name.trim_start_matches("SYS_")
                ));
            }
        }
        let net = config.confinement.network;
        if let Some(missing) =
            iii_shell_policy::network::enforce(net, net, loopback_available()).missing
        {
            extra_gaps.push(format!(
                "confinement.network {} runs as deny: missing {missing}",
                iii_shell_policy::network::name(net)
            ));
        }
        let mut c = c;
        c.gaps = extra_gaps;
        let mut known = landlock_rules::known_gaps(config);
        known.extend(c.gaps.iter().cloned());
        if c.seccomp.is_none() {
            known.push("seccomp is disabled".into());
        }
        if let Some(refusal) = strict_refusal(config, &known) {
            return Err(refusal);
        }
        Ok(c)
    }

    /// [`CommandConfinement::build`] with its ruleset built here, around `protected`: for a
    /// caller that has no walk to wait for (benches, tests).
    pub fn build_now(
        config: &Config,
        protected: &iii_shell_files::jail::Protected,
    ) -> Result<CommandConfinement, String> {
        let c = CommandConfinement::build(config)?;
        c.landlock
            .set(command_ruleset::finish(config, protected, &c.gaps));
        Ok(c)
    }

    /// The ruleset, once it is built (and not refused).
    pub fn ruleset(&self) -> Option<&landlock_rules::CommandRuleset> {
        self.landlock.get().and_then(|r| r.as_ref().ok())
    }

    /// Waits until commands can start under this policy: its ruleset is built.
    pub async fn ready(&self) -> Result<(), iii_shell_files::error::ExecError> {
        match self.landlock.wait().await {
            Ok(_) => Ok(()),
            Err(e) => Err(iii_shell_files::error::ExecError::Internal(e.clone())),
        }
    }

    /// Places the special-bits rule again, after the executor's first policy settled whether
    /// its own filter holds it (`confine::special_bits::settle`).
    pub fn replace_special_bits(
        &mut self,
        allow_special_bits: bool,
        seccomp: bool,
    ) -> Result<(), String> {
        let placement =
            special_bits::placement(allow_special_bits, seccomp, special_bits::in_executor())?;
        self.special_bits = placement;
        self.spawn_filter = spawn_filter(&self.seccomp, self.seccomp_per_spawn, placement);
        self.network = NetworkFilters::new(self.network.configured, self.spawn_filter.as_ref());
        Ok(())
    }

    /// What a spawned child applies to itself under the policy's own network mode; an error
    /// before [`CommandConfinement::ready`] (a command is never started without its ruleset).
    pub fn child(&self) -> Result<ChildConfinement, iii_shell_files::error::ExecError> {
        self.child_as(self.network.runs_as)
    }

    /// [`CommandConfinement::child`] running as `network` (what
    /// [`NetworkFilters::for_call`] settled).
    pub fn child_as(
        &self,
        network: NetworkAccess,
    ) -> Result<ChildConfinement, iii_shell_files::error::ExecError> {
        use iii_shell_files::error::ExecError;
        use std::os::fd::AsRawFd;
        let ruleset = match self.landlock.get() {
            Some(Ok(r)) => r,
            Some(Err(e)) => return Err(ExecError::Internal(e.clone())),
            None => {
                return Err(ExecError::Internal(
                    "the command ruleset is not built yet".into(),
                ))
            }
        };
        Ok(ChildConfinement {
            rlimits: self.rlimits,
            no_new_privs: true,
            landlock_fd: ruleset.fd.as_ref().map(|f| f.as_raw_fd()),
            seccomp: if network == NetworkAccess::Deny {
                Some(self.network.deny_filter.clone())
            } else {
                self.spawn_filter.clone()
            },
        })
    }
}

fn launch_limits(
    l: &iii_shell_policy::config::JobLimitsConfig,
) -> iii_shell_launch::cgroups::JobLimits {
    iii_shell_launch::cgroups::JobLimits {
        pids_max: l.pids_max,
        memory_max: l.memory_max_bytes,
        cpu_max_percent: l.cpu_max_percent,
    }
}

impl std::ops::Deref for Policy {
    type Target = FsPolicy;

    fn deref(&self) -> &FsPolicy {
        &self.fs
    }
}

impl Policy {
    /// The limits of each job's cgroup under this policy.
    pub fn job_limits(&self) -> iii_shell_launch::cgroups::JobLimits {
        launch_limits(&self.config.confinement.job_limits)
    }

    /// The limits of one call's job cgroup: this policy's, tightened by the call's `limits`
    /// (checked again here: a value above the policy's is S210 naming the field).
    pub fn job_limits_for(
        &self,
        call: &iii_shell_policy::call_limits::CallLimits,
    ) -> Result<iii_shell_launch::cgroups::JobLimits, iii_shell_files::error::ExecError> {
        let limits =
            iii_shell_policy::call_limits::tighten(&self.config.confinement.job_limits, call)
                .map_err(|e| iii_shell_files::error::ExecError::Invalid(e.to_string()))?;
        self.check_limit_controllers(&limits)?;
        Ok(launch_limits(&limits))
    }

    /// Whether the job cgroups can enforce `limits`: strict mode refuses a limit without its
    /// controller (S216 naming it); best effort runs without it and warns once per controller.
    pub fn check_limit_controllers(
        &self,
        limits: &iii_shell_policy::config::JobLimitsConfig,
    ) -> Result<(), iii_shell_files::error::ExecError> {
        use iii_shell_policy::limit_controllers::{decide, Controllers, Decision};
        let cgroups = self.launcher.cgroups();
        let have = match cgroups.base().filter(|_| cgroups.usable()) {
            Some(b) => Controllers {
                memory: b.memory_controller().is_some(),
                cpu: b.cpu_controller().is_some(),
                pids: b.pids_controller().is_some(),
            },
            None => Controllers::default(),
        };
        match decide(self.config.confinement.mode, limits, have) {
            Decision::Run => Ok(()),
            Decision::Refuse(why) => Err(iii_shell_files::error::ExecError::Internal(why)),
            Decision::RunWithout(gone) => {
                crate::limit_reason::warn_once_without(&gone);
                Ok(())
            }
        }
    }
    /// Builds the policy for `config_json` ([`Policy::build_after`] with no predecessor).
    pub fn build(generation: u64, config_json: &str) -> Result<Policy, String> {
        Policy::build_after(generation, config_json, None)
    }

    /// [`Policy::build`], sharing `previous`'s walk (done or under way) when both walk the same
    /// roots with the same denylist and globs (`ScanKey`), and its command ruleset too when
    /// the confinement settings are the same (`command_ruleset::reuse`): a reload that changes
    /// neither builds nothing of them. No part of it grows with the tree: the walk and the command ruleset
    /// are made off the call path ([`Policy::start_walk`]), and only commands wait for them.
    pub fn build_after(
        generation: u64,
        config_json: &str,
        previous: Option<&Policy>,
    ) -> Result<Policy, String> {
        let value: serde_json::Value =
            serde_json::from_str(config_json).map_err(|e| format!("policy is not JSON: {e}"))?;
        let config = Config::from_value(&value).map_err(|e| e.0)?;
        // A relative working_dir is resolved by the broker, which knows the worker's start-up
        // directory; the executor does not guess one. (`turns.data_dir` is resolved there
        // too; the executor does not use it.)
        if let Some(wd) = config.working_dir.as_deref() {
            if !wd.starts_with('/') {
                return Err(format!(
                    "working_dir {wd:?} is relative: the broker resolves it against the worker's \
                     start-up directory before the executor sees it"
                ));
            }
        }
        let denylist = Denylist::compile(&config.denylist_patterns)?;
        let mut fs = FsPolicy::build(config)?;
        let before = previous.map(|p| {
            let stopped = p.jail.protected().is_some_and(|r| r.truncated);
            (p.fs.scan_key(), &p.config.confinement, stopped)
        });
        let taken = command_ruleset::reuse(before, fs.scan_key(), &fs.config.confinement);
        if let Some(prev) = previous.filter(|_| taken != Reuse::Nothing) {
            // Its walk fills the shared record: make sure it is under way (it is for the
            // executor's current policy, started when that was accepted).
            prev.start_walk();
            fs.jail.share_protected(prev.jail.protected_cell().clone());
        }
        let config = &fs.config;
        let mut commands = CommandConfinement::build(config)?;
        if let Some(prev) = previous.filter(|_| taken == Reuse::Ruleset) {
            commands.landlock = prev.commands.landlock.clone();
        }
        let base_env = iii_shell_policy::env_policy::build_env(
            config.env.inherit,
            &config.env.allow,
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
            &[],
        );
        let (base_envp, command_envp) = env_blocks(&base_env)?;
        let home = iii_shell_files::home::Home::unsettled(base_env.get("HOME").map(String::as_str));
        let fs = Arc::new(fs);
        Ok(Policy {
            generation,
            fs,
            denylist,
            base_env,
            base_envp,
            command_envp,
            home,
            user: UserFacts::default(),
            commands,
            launcher: Arc::new(Launcher::new(Settings::plain())),
            prestarted: std::sync::Mutex::new(Vec::new()),
            retired: AtomicBool::new(false),
            taken,
            walk_started: std::sync::Once::new(),
        })
    }

    /// Starts (once) the walk for protected entries, unless the record is shared, and the
    /// command ruleset build after it, on a thread of their own. The executor starts it when
    /// it accepts the policy, after the command user is settled (a second thread would stop
    /// the executor from dropping its set-up capabilities); a command starts it if nobody did.
    pub fn start_walk(&self) {
        if self.taken == Reuse::Ruleset {
            return;
        }
        self.walk_started.call_once(|| {
            command_ruleset::walk_then_finish(
                self.fs.clone(),
                self.commands.landlock.clone(),
                self.commands.gaps.clone(),
                self.taken == Reuse::Nothing,
            );
        });
    }

    /// Waits until commands can start under this policy: its ruleset is built (starting the
    /// walk if nobody did).
    pub async fn commands_ready(&self) -> Result<(), iii_shell_files::error::ExecError> {
        self.start_walk();
        self.commands.ready().await
    }

    /// [`Policy::commands_ready`] on this thread: the ruleset, or why commands are refused.
    pub fn commands_ruleset_blocking(&self) -> &Ruleset {
        self.start_walk();
        self.commands.landlock.wait_blocking()
    }

    /// The policy with its commands started by `launcher` (the executor's).
    pub fn with_launcher(mut self, launcher: Arc<Launcher>) -> Policy {
        self.launcher = launcher;
        self
    }

    /// Gives commands the `HOME` the policy calls for (`iii_shell_files::home`), creating the
    /// per-worker default when that is the one. Runs once the executor acts as the command
    /// user (after `run_as::apply`), so a directory it creates is that user's; not part of
    /// [`Policy::build`], which `check-config` runs and which must not touch the host.
    pub fn settle_home(&mut self) -> Result<(), String> {
        let identity = iii_shell_files::home::identity(&self.config);
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        let forwarded = self.base_env.get("HOME").cloned();
        let home =
            iii_shell_files::home::settle(&self.config, forwarded.as_deref(), uid, &identity);
        if home.path != forwarded {
            match &home.path {
                Some(h) => self.base_env.insert("HOME".into(), h.clone()),
                None => self.base_env.remove("HOME"),
            };
            (self.base_envp, self.command_envp) = env_blocks(&self.base_env)?;
        }
        self.home = home;
        Ok(())
    }

    /// Settles what holds for the command user (the executor acts as it by now): the
    /// terminal shell and what to say about it, and the directories it cannot enter.
    pub fn settle_user(&mut self, applied: Option<&iii_shell_launch::run_as::Applied>) {
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        let account = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten();
        let shell = shell_for(
            account.as_ref(),
            self.base_env.get("SHELL").map(String::as_str),
        );
        // A root executor that switched (or stayed root): `applied` says so, and why.
        let terminal = iii_shell_policy::terminal::note(
            applied.is_some(),
            uid,
            account.as_ref().map(|a| a.name.as_str()),
            applied.map_or("", |a| a.why.as_str()),
            &shell,
        );
        let mut reach = Vec::new();
        let wd = self.config.working_dir.iter().map(|w| (w.as_str(), false));
        let roots = self.config.fs.host_roots.iter().map(|r| (r.as_str(), true));
        for (path, root) in roots.chain(wd) {
            if !can_enter(path) {
                reach.push(iii_shell_policy::home::unreachable_gap(path, root, uid));
            }
        }
        self.user = UserFacts {
            shell,
            terminal,
            reach,
        };
    }

    /// The network mode a call asking for `requested` runs under
    /// ([`NetworkFilters::for_call`]; `strict` from this policy).
    pub fn network_for(
        &self,
        requested: Option<NetworkAccess>,
    ) -> Result<NetworkAccess, iii_shell_files::error::ExecError> {
        let strict =
            self.config.confinement.mode == iii_shell_protocol::config::ConfinementMode::Strict;
        self.commands.network.for_call(requested, strict)
    }

    /// Whether a pre-started process (confined under the policy's own network mode) can take
    /// a call asking for `requested`: only when the call runs under that same mode.
    pub fn prestarted_fits(&self, requested: Option<NetworkAccess>) -> bool {
        requested.is_none()
            || self
                .network_for(requested)
                .is_ok_and(|n| n == self.commands.network.runs_as)
    }

    /// A pre-started command process: a ready one if there is one, else one still setting
    /// itself up (the launch waits for it: its setup is already under way, which beats
    /// starting over). Dead ones are discarded.
    pub fn take_prestarted(&self) -> Option<iii_shell_launch::prestarted::Prestarted> {
        use iii_shell_launch::prestarted::State;
        let mut pool = self.prestarted.lock().ok()?;
        let mut dead = Vec::new();
        let mut pick: Option<(usize, bool)> = None;
        let mut i = 0;
        while i < pool.len() {
            match pool[i].claimed_state() {
                State::Dead => dead.push(pool.swap_remove(i)),
                State::Ready if pick.is_none_or(|(_, ready)| !ready) => {
                    pick = Some((i, true));
                    i += 1;
                }
                State::Starting if pick.is_none() => {
                    pick = Some((i, false));
                    i += 1;
                }
                _ => i += 1,
            }
        }
        let taken = pick.map(|(i, _)| pool.swap_remove(i));
        drop(pool);
        drop(dead);
        taken
    }

    /// Stops starting command processes under this policy and ends the waiting ones. The
    /// flag is set under the pool's lock, which every refill and give-back checks it under,
    /// so none can slip a process in after.
    fn retire(&self) {
        let waiting = match self.prestarted.lock() {
            Ok(mut pool) => {
                self.retired.store(true, Ordering::Relaxed);
                std::mem::take(&mut *pool)
            }
            Err(_) => return,
        };
        // Ended (killed and reaped) outside the lock.
        drop(waiting);
    }

    /// Gives back a pre-started process a call took but did not use.
    pub fn put_back_prestarted(&self, w: iii_shell_launch::prestarted::Prestarted) {
        if let Ok(mut pool) = self.prestarted.lock() {
            if pool.len() < iii_shell_launch::prestarted::POOL
                && !self.retired.load(Ordering::Relaxed)
            {
                pool.push(w);
            }
        }
        // Otherwise `w` is ended here, after the lock is released.
    }

    /// Tops the pool of pre-started processes up (after a call, off its path).
    pub fn refill_prestarted(&self) {
        if !self.launcher.prestarting() {
            return;
        }
        let Ok(mut pool) = self.prestarted.lock() else {
            return;
        };
        if self.retired.load(Ordering::Relaxed) {
            return;
        }
        // A waiting process that died (killed from outside, say) sends no SIGCHLD: prune it
        // here, after every call, so it neither lingers as a zombie job root nor holds up the
        // orphan reaper.
        let (dead, live): (Vec<_>, Vec<_>) = pool
            .drain(..)
            .partition(|w| w.state() == iii_shell_launch::prestarted::State::Dead);
        *pool = live;
        drop(dead);
        while pool.len() < iii_shell_launch::prestarted::POOL {
            let Ok(child) = self.commands.child() else {
                // Not ready (or refused): the first command after the walk tops it up.
                return;
            };
            match self.launcher.prestart(&child, self.job_limits()) {
                Ok(w) => pool.push(w),
                Err(e) => {
                    tracing::debug!(error = %e, "no pre-started command process");
                    return;
                }
            }
        }
    }
}

/// The shell of a terminal session without a program, for the command user `account` (its
/// passwd entry, if it has one) and the forwarded `SHELL` ([`iii_shell_policy::terminal`]).
pub fn shell_for(
    account: Option<&nix::unistd::User>,
    forwarded: Option<&str>,
) -> iii_shell_policy::terminal::ShellChoice {
    use std::os::unix::fs::PermissionsExt;
    let account = account.map(|u| iii_shell_policy::terminal::Account {
        name: u.name.clone(),
        shell: u.shell.to_string_lossy().into_owned(),
    });
    iii_shell_policy::terminal::choose_shell(account.as_ref(), forwarded, |p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// What holds for the command user under a policy, settled once when it is installed.
#[derive(Debug, Clone, Default)]
pub struct UserFacts {
    /// The shell of a terminal session without a program.
    pub shell: iii_shell_policy::terminal::ShellChoice,
    /// What to say once about terminal sessions (INFO, and `doctor`).
    pub terminal: Option<String>,
    /// The roots and `working_dir` the command user cannot enter (WARN, `doctor`,
    /// `shell::config-status`).
    pub reach: Vec<String>,
}

/// Whether this process (acting as the command user) may search `path`.
fn can_enter(path: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(path) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::X_OK, libc::AT_EACCESS) == 0 }
}

type EnvBlocks = (
    Arc<iii_shell_launch::spawn::EnvBlock>,
    Arc<iii_shell_launch::spawn::EnvBlock>,
);

/// The execve blocks of `base_env`: as it is (terminal sessions), and with the non-terminal
/// defaults (`shell::exec`, `shell::exec_bg`).
fn env_blocks(base_env: &std::collections::BTreeMap<String, String>) -> Result<EnvBlocks, String> {
    use iii_shell_launch::spawn::EnvBlock;
    let block = |env: &std::collections::BTreeMap<String, String>| {
        EnvBlock::new(env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .map(Arc::new)
            .map_err(|e| format!("forwarded environment: {e}"))
    };
    Ok((
        block(base_env)?,
        block(&iii_shell_policy::env_policy::non_terminal_env(base_env))?,
    ))
}

/// The newest accepted policy; each request takes one snapshot and keeps it to the end.
#[derive(Debug, Default)]
pub struct PolicyStore {
    current: RwLock<Option<Arc<Policy>>>,
}

impl PolicyStore {
    pub fn get(&self) -> Option<Arc<Policy>> {
        self.current.read().ok().and_then(|g| g.clone())
    }

    /// Installs `p`. The policy it replaces starts no more command processes, and the ones
    /// it has waiting are ended now rather than when its last request finishes.
    pub fn set(&self, p: Policy) {
        let old = match self.current.write() {
            Ok(mut g) => g.replace(Arc::new(p)),
            Err(_) => return,
        };
        if let Some(old) = old {
            old.retire();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The executor never resolves a relative working_dir itself: the broker does.
    #[test]
    fn a_relative_working_dir_is_refused() {
        let mut c = Config::builtin_default();
        c.working_dir = Some("./data".into());
        let err = Policy::build(1, &serde_json::to_string(&c).unwrap()).unwrap_err();
        assert!(
            err.starts_with("working_dir \"./data\" is relative: the broker resolves it"),
            "{err}"
        );
        c.working_dir = Some("/tmp".into());
        assert!(Policy::build(1, &serde_json::to_string(&c).unwrap()).is_ok());
    }
}
