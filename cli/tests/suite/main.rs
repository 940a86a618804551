//! The system tests of `iii-shell`, one binary (ripgrep's `tests/` is the model): a module
//! per surface, the helpers in [`common`]. A test is `<module>::<name>`, so
//! `cargo test -p iii-shell --test suite -- fs_host::` runs one file's tests.
//!
//! The fuzzers (`cli/tests/fuzz/`) are a binary of their own: they are CPU-bound for the
//! whole run and would slow the timing-sensitive cases here on a small machine.

#[macro_use]
mod common;

mod changed_feed;
mod cli;
mod coder;
mod coder_engine;
mod coder_form;
mod console_page;
mod console_ui;
mod engine_config;
mod engine_connect;
mod engine_invocations;
mod engine_many_hosts;
mod engine_reconnect;
mod escape_suite;
mod exec;
mod executor_socket;
mod fs_engine;
mod fs_host;
mod fs_limits;
mod hardening;
mod install_deb;
mod interop_real_engine;
mod jailed_defaults;
mod job_drive;
mod jobs;
mod launcher;
mod logs;
mod messages;
mod prestart;
mod process_lifecycle;
mod pty;
mod sandbox_forwarding;
mod schema_conformance;
mod seed_items;
mod serve_smoke;
mod state_store;
mod telemetry;
mod turns_engine;
