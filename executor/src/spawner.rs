//! A thread that holds the commands' Landlock domain, so children inherit it.
//!
//! Landlock domains belong to a thread's credentials, and a child created with `CLONE_VM`
//! from a thread starts with that thread's credentials. Applying the command ruleset once to a
//! dedicated thread, and spawning every command of the policy from it, spares each child its
//! own `landlock_restrict_self`, which copies the whole ruleset into a new domain (66–97 µs
//! with the default rules on a small VM; see BENCHMARKS.md). The executor's own threads stay
//! unconfined by Landlock, since a reload may widen the jail and a domain cannot be widened:
//! each policy gets its own spawner thread, which ends when the policy is dropped.
//!
//! The runtime thread hands a plan over and waits for the result, as it waited for the
//! vfork-style clone before: spawns stay serialized. If the thread cannot restrict itself
//! (no no_new_privs and no CAP_SYS_ADMIN) there is no spawner, and each child applies the
//! ruleset itself as before.

use std::os::fd::RawFd;
use std::sync::mpsc;

use crate::spawn::{spawn, Child, SpawnPlan};

struct Job {
    plan: SpawnPlan,
    done: mpsc::SyncSender<std::io::Result<Child>>,
}

#[derive(Debug)]
pub struct Spawner {
    jobs: mpsc::Sender<Job>,
}

impl Spawner {
    /// Starts a thread that applies the Landlock ruleset `ruleset` to itself. None if it
    /// could not (the reason is logged once per policy).
    pub fn start(ruleset: RawFd) -> Option<Spawner> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<(), std::io::Error>>(1);
        let started = std::thread::Builder::new()
            .name("iii-spawner".into())
            .spawn(move || {
                // SAFETY: landlock_restrict_self only changes this thread's credentials; the
                // ruleset fd stays open until `ready_rx` has the answer (the caller keeps it).
                let rc = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) };
                let restricted = if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                };
                let ok = restricted.is_ok();
                let _ = ready_tx.send(restricted);
                if !ok {
                    return;
                }
                while let Ok(job) = rx.recv() {
                    let result = spawn(&job.plan);
                    // The child's ends of its pipes close here, before the runtime waits on them.
                    drop(job.plan);
                    let _ = job.done.send(result);
                }
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "no spawner thread; each command applies its Landlock ruleset itself");
            return None;
        }
        match ready_rx.recv() {
            Ok(Ok(())) => Some(Spawner { jobs }),
            Ok(Err(e)) => {
                tracing::info!(error = %e, "the spawner thread cannot take the command Landlock domain; each command applies it itself");
                None
            }
            Err(_) => None,
        }
    }

    /// Spawns `plan` from the spawner thread, waiting for the result. Gives the plan back if
    /// the thread is gone, so the caller can spawn it directly.
    pub fn spawn(&self, plan: SpawnPlan) -> Result<std::io::Result<Child>, Box<SpawnPlan>> {
        let (done, result) = mpsc::sync_channel(1);
        if let Err(mpsc::SendError(job)) = self.jobs.send(Job { plan, done }) {
            return Err(Box::new(job.plan));
        }
        // The thread answers every job it takes; a closed channel means it died mid-job.
        Ok(result.recv().unwrap_or_else(|_| {
            Err(std::io::Error::other(
                "the spawner thread ended during a spawn",
            ))
        }))
    }
}
