//! Which process and memory limits actually bind a command, and why not where they do not:
//! `pids.max` and `memory.max` of the job cgroup, and `RLIMIT_NPROC`. Reported by `doctor`.
//!
//! The kernel ignores `RLIMIT_NPROC` for uid 0 (root is exempt in `copy_process` whatever its
//! capabilities), and for any other uid it counts every process of that uid on the host, not
//! one job's. `pids.max` binds every uid, per job, where the job cgroup has the cgroup v2
//! `pids` controller or, on a host whose `pids` controller is bound to a cgroup v1
//! hierarchy (where v2 cannot offer it), where each job has a twin there
//! ([`crate::pids_v1`]).

/// What the limits depend on, read from the live executor and policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitInputs {
    /// Job cgroups exist (a writable cgroup v2 hierarchy with `cgroup.kill`).
    pub job_cgroups: bool,
    /// Job cgroups have the `pids` controller (on v2, or through a v1 twin).
    pub pids_controller: bool,
    /// ... and it is the cgroup v1 `pids` hierarchy's.
    pub pids_v1: bool,
    /// Job cgroups have the `memory` controller (on v2, or through a v1 twin).
    pub memory_controller: bool,
    /// ... and it is the cgroup v1 `memory` hierarchy's.
    pub memory_v1: bool,
    /// Job cgroups have the `cpu` controller (on v2, or through a v1 twin).
    pub cpu_controller: bool,
    /// ... and it is the cgroup v1 `cpu` hierarchy's.
    pub cpu_v1: bool,
    /// `confinement.job_limits.cpu_max_percent`.
    pub cpu_max: Option<u32>,
    /// `confinement.job_limits.pids_max`.
    pub pids_max: Option<u64>,
    /// `confinement.job_limits.memory_max_bytes`.
    pub memory_max: Option<u64>,
    /// `confinement.rlimits.max_processes`.
    pub max_processes: Option<u64>,
    /// The uid commands run as.
    pub command_uid: u32,
}

const NO_CGROUPS: &str =
    "no job cgroups (no writable cgroup v2 hierarchy with cgroup.kill for the executor)";

fn cgroup_limit(
    i: &LimitInputs,
    controller: bool,
    value: Option<u64>,
    what: &str,
    key: &str,
    v1: bool,
) -> String {
    match value {
        None => format!("not set ({key} is null)"),
        Some(_) if !i.job_cgroups => format!("NOT enforced: {NO_CGROUPS}"),
        Some(_) if !controller => format!(
            "NOT enforced: the cgroup v2 {what} controller is not available to iii-shell's cgroup (bound to a cgroup v1 hierarchy on this host, or not delegated: add +{what} to the parent's cgroup.subtree_control)"
        ),
        Some(n) if v1 => format!(
            "enforced: {n} per job (the job's twin in the cgroup v1 {what} hierarchy)"
        ),
        Some(n) => format!("enforced: {n} per job (the job cgroup)"),
    }
}

/// One line per limit: (`pids.max` | `memory.max` | `RLIMIT_NPROC`, what holds and why).
pub fn report(i: &LimitInputs) -> Vec<(String, String)> {
    let nproc = match i.max_processes {
        None => "not set (confinement.rlimits.max_processes is null)".to_string(),
        Some(n) if i.command_uid == 0 => format!(
            "set to {n} but NOT binding: commands run as uid 0, which the kernel exempts from RLIMIT_NPROC"
        ),
        Some(n) => format!(
            "enforced: {n} processes of uid {} on the whole host (every process of that uid counts, not one job's)",
            i.command_uid
        ),
    };
    vec![
        (
            "pids.max".to_string(),
            cgroup_limit(
                i,
                i.pids_controller,
                i.pids_max,
                "pids",
                "confinement.job_limits.pids_max",
                i.pids_v1,
            ),
        ),
        (
            "memory.max".to_string(),
            cgroup_limit(
                i,
                i.memory_controller,
                i.memory_max,
                "memory",
                "confinement.job_limits.memory_max_bytes",
                i.memory_v1,
            ),
        ),
        (
            "cpu.max".to_string(),
            cgroup_limit(
                i,
                i.cpu_controller,
                i.cpu_max.map(u64::from),
                "cpu",
                "confinement.job_limits.cpu_max_percent",
                i.cpu_v1,
            ),
        ),
        ("RLIMIT_NPROC".to_string(), nproc),
    ]
}

/// True when something bounds how many processes one command may start.
pub fn processes_bounded(i: &LimitInputs) -> bool {
    let pids = i.pids_max.is_some() && i.job_cgroups && i.pids_controller;
    let nproc = i.max_processes.is_some() && i.command_uid != 0;
    pids || nproc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> LimitInputs {
        LimitInputs {
            job_cgroups: true,
            pids_controller: true,
            pids_v1: false,
            memory_controller: true,
            pids_max: Some(1024),
            memory_max: None,
            memory_v1: false,
            cpu_controller: true,
            cpu_v1: false,
            cpu_max: None,
            max_processes: Some(20),
            command_uid: 0,
        }
    }

    fn line(i: &LimitInputs, key: &str) -> String {
        report(i).into_iter().find(|(k, _)| k == key).unwrap().1
    }

    #[test]
    fn everything_available_as_root() {
        let i = base();
        assert_eq!(
            report(&i),
            vec![
                ("pids.max".to_string(), "enforced: 1024 per job (the job cgroup)".to_string()),
                (
                    "memory.max".to_string(),
                    "not set (confinement.job_limits.memory_max_bytes is null)".to_string()
                ),
                (
                    "cpu.max".to_string(),
                    "not set (confinement.job_limits.cpu_max_percent is null)".to_string()
                ),
                (
                    "RLIMIT_NPROC".to_string(),
                    "set to 20 but NOT binding: commands run as uid 0, which the kernel exempts from RLIMIT_NPROC".to_string()
                ),
            ]
        );
        assert!(processes_bounded(&i));
    }

    #[test]
    fn pids_controller_bound_to_v1() {
        let i = LimitInputs {
            pids_controller: false,
            ..base()
        };
        assert_eq!(
            line(&i, "pids.max"),
            "NOT enforced: the cgroup v2 pids controller is not available to iii-shell's cgroup (bound to a cgroup v1 hierarchy on this host, or not delegated: add +pids to the parent's cgroup.subtree_control)"
        );
        // Root, no pids controller: nothing bounds a fork bomb.
        assert!(!processes_bounded(&i));
        // A run_as user is bounded by RLIMIT_NPROC.
        let u = LimitInputs {
            command_uid: 4242,
            ..i
        };
        assert_eq!(
            line(&u, "RLIMIT_NPROC"),
            "enforced: 20 processes of uid 4242 on the whole host (every process of that uid counts, not one job's)"
        );
        assert!(processes_bounded(&u));
    }

    #[test]
    fn pids_from_a_v1_twin() {
        let i = LimitInputs {
            pids_v1: true,
            memory_max: Some(1 << 30),
            ..base()
        };
        assert_eq!(
            line(&i, "pids.max"),
            "enforced: 1024 per job (the job's twin in the cgroup v1 pids hierarchy)"
        );
        assert_eq!(
            line(&i, "memory.max"),
            "enforced: 1073741824 per job (the job cgroup)"
        );
        assert!(processes_bounded(&i));
    }

    #[test]
    fn no_job_cgroups() {
        let i = LimitInputs {
            job_cgroups: false,
            memory_max: Some(1 << 30),
            ..base()
        };
        let want = format!("NOT enforced: {NO_CGROUPS}");
        assert_eq!(line(&i, "pids.max"), want);
        assert_eq!(line(&i, "memory.max"), want);
        assert!(!processes_bounded(&i));
    }

    #[test]
    fn memory_enforced_and_nothing_set() {
        let i = LimitInputs {
            memory_max: Some(1 << 30),
            ..base()
        };
        assert_eq!(
            line(&i, "memory.max"),
            "enforced: 1073741824 per job (the job cgroup)"
        );
        let none = LimitInputs {
            pids_max: None,
            max_processes: None,
            command_uid: 4242,
            ..base()
        };
        assert_eq!(
            line(&none, "RLIMIT_NPROC"),
            "not set (confinement.rlimits.max_processes is null)"
        );
        assert_eq!(
            line(&none, "pids.max"),
            "not set (confinement.job_limits.pids_max is null)"
        );
        assert!(!processes_bounded(&none));
    }
}
