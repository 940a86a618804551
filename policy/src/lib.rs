//! The policy both halves of iii-shell share: pure computation, no system calls, no I/O.
//!
//! The broker checks a request with these functions before it forwards it; the executor
//! checks it again with the same functions before it acts. Keeping them in one crate that
//! neither half owns is what makes the two checks the same check.
//!
//! * [`config`]: the `shell` configuration document, its validation and migration hints.
//! * [`widening`]: the one decision "does this reload grant more than before".
//! * [`error`]: the `{code, message}` wire error and its typed codes.
//! * [`denylist`]: the advisory command denylist.
//! * [`env_policy`]: the dangerous-environment gate and the forwarded base environment.
//! * [`home`]: which `HOME` commands get, and where a command without a `cwd` starts.
//! * [`terminal`]: which shell a terminal session gets, and what is said about it.
//! * [`argv`]: argv rules.
//! * [`command`]: the one command validator (argv, denylist, env, cwd, timeouts).
//! * [`mode`]: file-mode and owner rules of the fs surface.
//! * [`capture`]: bounded output capture and its truncation at a character boundary.
//! * [`network`]: the order of the network modes, and a call's tightening of its own.
//! * [`job_output`]: a job's output rings for `shell::job::read`: offsets, what a reader missed.
//! * [`sync`]: the poison-recovering [`sync::lock`] every crate uses.

pub mod argv;
pub mod call_limits;
pub mod capture;
pub mod command;
pub mod config;
pub mod denylist;
pub mod env_policy;
pub mod error;
pub mod home;
pub mod job_output;
pub mod limit_controllers;
pub mod mode;
pub mod network;
pub mod sync;
pub mod terminal;
pub mod widening;

pub use error::{Code, PolicyError, WireCode, WireError};
