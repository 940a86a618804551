//! The launcher: turns a prepared, validated command into a confined, supervised process
//! tree. The executor decides what runs (its policy, its jail, `prepare.rs`); this crate
//! starts it and looks after it.
//!
//! * [`child`]: the one child routine, what a new process does between its clone and
//!   `execve` (raw system calls only, no allocation).
//! * [`spawn`]: the clone (`CLONE_VM | CLONE_VFORK | CLONE_PIDFD`), and [`clone3`], which
//!   starts a child inside its job cgroup; [`prestarted`], processes set up ahead of a call.
//! * [`run_as`]: the user commands act as, and the executor's switch to it.
//! * [`cgroups`] and [`pids_v1`]: the job groups; [`process_limits`]: which limits bind.
//! * [`reaper`], [`tree`] and [`procfs`]: reaping, and killing a job's whole tree.
//!
//! It depends on `confine`, `policy` and `protocol` only: never on the executor.

pub mod cgroups;
pub mod child;
pub mod clone3;
pub mod pids_v1;
pub mod prestarted;
pub mod process_limits;
pub mod procfs;
pub mod reaper;
pub mod run_as;
pub mod spawn;
pub mod tree;
