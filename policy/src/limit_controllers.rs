//! What happens to a call whose job limits ask for a controller the kernel does not give the
//! job cgroups (no `memory` controller in cgroup v2 nor a v1 hierarchy, say): in
//! `confinement.mode: strict` the call is refused (S216 naming what is missing); otherwise it
//! runs without that limit, and the worker warns once per missing controller.

use crate::config::{ConfinementMode, JobLimitsConfig};

/// Which limit controllers the job cgroups have (either cgroup version).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Controllers {
    pub memory: bool,
    pub cpu: bool,
    pub pids: bool,
}

/// What to do with a call, given its limits and the controllers there are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Every limit asked for is enforced.
    Run,
    /// Runs without the limits named (best effort): the worker warns once for each.
    RunWithout(Vec<&'static str>),
    /// Strict mode: the message of the S216 refusal.
    Refuse(String),
}

/// The limits of `limits` whose controller is not in `have`, by their config key.
pub fn missing(limits: &JobLimitsConfig, have: Controllers) -> Vec<&'static str> {
    [
        (
            limits.memory_max_bytes.is_some() && !have.memory,
            "memory_max_bytes (memory)",
        ),
        (
            limits.cpu_max_percent.is_some() && !have.cpu,
            "cpu_max_percent (cpu)",
        ),
        (limits.pids_max.is_some() && !have.pids, "pids_max (pids)"),
    ]
    .into_iter()
    .filter_map(|(gone, name)| gone.then_some(name))
    .collect()
}

/// The decision for a call with `limits` (the worker's, tightened by the call's) under `mode`.
pub fn decide(mode: ConfinementMode, limits: &JobLimitsConfig, have: Controllers) -> Decision {
    let gone = missing(limits, have);
    match (gone.is_empty(), mode) {
        (true, _) => Decision::Run,
        (false, ConfinementMode::Strict) => Decision::Refuse(format!(
            "strict confinement cannot enforce the job limits {}: no cgroup controller for them \
             (neither in cgroup v2 nor as a cgroup v1 hierarchy); delegate the controller to \
             iii-shell's cgroup, or drop the limit",
            gone.join(", ")
        )),
        (false, ConfinementMode::BestEffort) => Decision::RunWithout(gone),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(mem: bool, cpu: bool, pids: bool) -> JobLimitsConfig {
        JobLimitsConfig {
            memory_max_bytes: mem.then_some(64 << 20),
            cpu_max_percent: cpu.then_some(50),
            pids_max: pids.then_some(64),
        }
    }

    const ALL: Controllers = Controllers {
        memory: true,
        cpu: true,
        pids: true,
    };
    const NONE: Controllers = Controllers {
        memory: false,
        cpu: false,
        pids: false,
    };

    #[test]
    fn every_limit_with_its_controller_runs_in_either_mode() {
        for mode in [ConfinementMode::Strict, ConfinementMode::BestEffort] {
            assert_eq!(decide(mode, &limits(true, true, true), ALL), Decision::Run);
            // A limit not asked for needs no controller.
            assert_eq!(
                decide(mode, &limits(false, false, false), NONE),
                Decision::Run
            );
        }
    }

    #[test]
    fn strict_refuses_naming_each_missing_controller() {
        let have = Controllers { pids: true, ..NONE };
        assert_eq!(
            decide(ConfinementMode::Strict, &limits(true, true, true), have),
            Decision::Refuse(
                "strict confinement cannot enforce the job limits memory_max_bytes (memory), \
                 cpu_max_percent (cpu): no cgroup controller for them (neither in cgroup v2 \
                 nor as a cgroup v1 hierarchy); delegate the controller to iii-shell's \
                 cgroup, or drop the limit"
                    .into()
            )
        );
    }

    #[test]
    fn best_effort_runs_without_the_missing_ones() {
        let have = Controllers {
            memory: true,
            ..NONE
        };
        assert_eq!(
            decide(
                ConfinementMode::BestEffort,
                &limits(true, false, true),
                have
            ),
            Decision::RunWithout(vec!["pids_max (pids)"])
        );
    }
}
