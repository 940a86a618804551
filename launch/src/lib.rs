//! The launcher: turns a prepared, validated command into a confined, supervised process
//! tree. The executor decides what runs (its policy, its jail, `prepare.rs`); this crate
//! starts it and looks after it, through one owner object, [`Launcher`].
//!
//! The layers go one way (each module imports only from the layers before it):
//!
//! 1. plan: [`plan`], what a spawn is given (C strings, descriptors, the cgroup target, the
//!    child's confinement), plain data; [`wait`], a child's end through its pidfd;
//!    [`procfs`], `/proc` reads; [`process_limits`], which limits bind, and [`limit_files`],
//!    what they are written as (pure).
//! 2. child: [`privileges`], the privilege seam (every step that drops privileges or
//!    confines a process, one trait, the real system calls and a recording fake for the
//!    tests); [`child`], the one child routine, what a new process does between its clone
//!    and `execve` (raw system calls only, no allocation), generic over that seam.
//! 3. spawn: [`clone3`], a child started inside its job cgroup; [`spawn`], the clone.
//! 4. supervise: the job groups ([`bases`], [`pids_v1`], [`cgroups`]), [`reaper`] (orphans
//!    and job roots), [`tree`] (a job's whole tree killed), [`prestarted`] (processes set
//!    up ahead of a call), [`run_as`] (the command user), and [`launcher`], which owns them.
//!
//! It depends on `confine`, `policy` and `protocol` only: never on the executor.

pub mod bases;
pub mod cgroups;
pub mod child;
pub mod clone3;
pub mod launcher;
pub mod limit_files;
pub mod pids_v1;
pub mod plan;
pub mod prestarted;
pub mod privileges;
pub mod process_limits;
pub mod procfs;
pub mod reaper;
pub mod run_as;
pub mod spawn;
pub mod stack;
pub mod tree;
pub mod wait;

pub use launcher::{Launcher, Settings};
