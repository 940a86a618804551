//! Per-call limits (`limits` on `shell::exec`, `shell::exec_bg`, `shell::pty::open`): a call
//! may tighten the worker's `confinement.job_limits` for its own job, never loosen them. The
//! broker checks a call with [`tighten`], and the executor checks it again.
//!
//! A per-call value above the worker's is refused with S210 naming the field (a value where
//! the worker has no limit tightens, and is taken): refusing says what went wrong, where
//! clamping would run the command under a limit the caller did not ask for.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::JobLimitsConfig;

/// The limits one call asks for; each absent one is the worker's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "CallLimits")]
pub struct CallLimits {
    /// Bytes of memory this command's whole process tree may use; at most the worker's confinement.job_limits.memory_max_bytes (S210 above it).
    #[serde(default)]
    pub memory_max_bytes: Option<u64>,
    /// Share of one CPU in percent (100 = one CPU) for this command's whole tree; at least 1, at most the worker's confinement.job_limits.cpu_max_percent (S210 above it).
    #[serde(default)]
    pub cpu_max_percent: Option<u32>,
    /// Processes and threads in this command's whole tree; at least 1, at most the worker's confinement.job_limits.pids_max (S210 above it).
    #[serde(default)]
    pub pids_max: Option<u64>,
}

/// Why a call's limits were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallLimitError {
    #[error("'limits.{field}' {asked} is above the worker's confinement.job_limits.{field} ({worker}): a call may only tighten a limit")]
    Widens {
        field: &'static str,
        asked: u64,
        worker: u64,
    },
    #[error("'limits.{field}' must be at least 1")]
    Zero { field: &'static str },
}

/// The job limits of one call: the worker's, each tightened by the call's where it asks.
pub fn tighten(
    worker: &JobLimitsConfig,
    call: &CallLimits,
) -> Result<JobLimitsConfig, CallLimitError> {
    Ok(JobLimitsConfig {
        memory_max_bytes: one(
            "memory_max_bytes",
            worker.memory_max_bytes,
            call.memory_max_bytes,
        )?,
        cpu_max_percent: one(
            "cpu_max_percent",
            worker.cpu_max_percent.map(u64::from),
            call.cpu_max_percent.map(u64::from),
        )?
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        pids_max: one("pids_max", worker.pids_max, call.pids_max)?,
    })
}

fn one(
    field: &'static str,
    worker: Option<u64>,
    call: Option<u64>,
) -> Result<Option<u64>, CallLimitError> {
    match (worker, call) {
        (_, Some(0)) => Err(CallLimitError::Zero { field }),
        (Some(w), Some(c)) if c > w => Err(CallLimitError::Widens {
            field,
            asked: c,
            worker: w,
        }),
        (_, Some(c)) => Ok(Some(c)),
        (w, None) => Ok(w),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> JobLimitsConfig {
        JobLimitsConfig {
            pids_max: Some(1024),
            memory_max_bytes: Some(1 << 30),
            cpu_max_percent: None,
        }
    }

    #[test]
    fn nothing_asked_is_the_workers_limits() {
        assert_eq!(tighten(&worker(), &CallLimits::default()), Ok(worker()));
    }

    #[test]
    fn a_call_tightens_each_limit_and_sets_one_the_worker_has_not() {
        let call = CallLimits {
            memory_max_bytes: Some(64 << 20),
            cpu_max_percent: Some(20),
            pids_max: Some(16),
        };
        assert_eq!(
            tighten(&worker(), &call),
            Ok(JobLimitsConfig {
                pids_max: Some(16),
                memory_max_bytes: Some(64 << 20),
                cpu_max_percent: Some(20),
            })
        );
        // Equal to the worker's is not a widening.
        let same = CallLimits {
            pids_max: Some(1024),
            ..CallLimits::default()
        };
        assert_eq!(tighten(&worker(), &same).unwrap().pids_max, Some(1024));
    }

    #[test]
    fn a_call_above_the_worker_is_refused_naming_the_field() {
        let call = CallLimits {
            pids_max: Some(1025),
            ..CallLimits::default()
        };
        let e = tighten(&worker(), &call).unwrap_err();
        assert_eq!(
            e,
            CallLimitError::Widens {
                field: "pids_max",
                asked: 1025,
                worker: 1024
            }
        );
        assert_eq!(
            e.to_string(),
            "'limits.pids_max' 1025 is above the worker's confinement.job_limits.pids_max (1024): a call may only tighten a limit"
        );
        let mem = CallLimits {
            memory_max_bytes: Some((1 << 30) + 1),
            ..CallLimits::default()
        };
        assert!(matches!(
            tighten(&worker(), &mem),
            Err(CallLimitError::Widens {
                field: "memory_max_bytes",
                ..
            })
        ));
        let cpu_worker = JobLimitsConfig {
            cpu_max_percent: Some(50),
            ..worker()
        };
        let cpu = CallLimits {
            cpu_max_percent: Some(51),
            ..CallLimits::default()
        };
        assert!(matches!(
            tighten(&cpu_worker, &cpu),
            Err(CallLimitError::Widens {
                field: "cpu_max_percent",
                ..
            })
        ));
    }

    #[test]
    fn zero_is_refused() {
        let call = CallLimits {
            cpu_max_percent: Some(0),
            ..CallLimits::default()
        };
        assert_eq!(
            tighten(&worker(), &call),
            Err(CallLimitError::Zero {
                field: "cpu_max_percent"
            })
        );
    }
}
