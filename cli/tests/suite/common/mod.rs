//! The one helper tree of the system tests (`cli/tests/suite/`, one binary). Every module
//! that needs it says `use crate::common;` and `use common::*;` (the escape suite adds
//! `use common::escape::*;`).
//!
//! - [`basics`]: paths as payload strings, temp dirs, polling, reading a file tree back.
//! - [`procs`]: `/proc` reads (command lines, children, zombies), unique markers for test
//!   commands, the executor's job cgroups.
//! - [`configs`]: the built-in default jailed to a temp root, as a `Config` or a JSON value.
//! - [`harness`]: `Harness`, a real executor behind the broker library, called in-process.
//! - [`jail`]: `Jail`, a jail next to an "outside" directory holding a secret.
//! - [`socket_executor`]: a standalone `iii-shell executor --socket`.
//! - [`engine`]: `Worker`, the real `iii-shell serve` against the in-process test engine.
//! - [`escape`]: the escape suite's command runners, syscall probes and pinned executors.
//!
//! The pty bench compiles this tree on its own too and uses only part of it, hence the
//! `dead_code` and `unused_imports` allowances.
#![allow(dead_code)]

pub mod basics;
pub mod configs;
pub mod engine;
#[macro_use]
pub mod escape;
pub mod harness;
pub mod jail;
pub mod procs;
pub mod socket_executor;

#[allow(unused_imports)]
pub use {basics::*, configs::*, engine::*, harness::*, jail::*, procs::*, socket_executor::*};
