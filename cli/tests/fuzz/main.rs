//! The fuzzers of `iii-shell` (proptest, stable Rust), one binary apart from `suite`: each
//! is CPU-bound for its whole run. `cargo test -p iii-shell --test fuzz -- fuzz_validate::`
//! runs one of them.

mod fuzz_requests;
mod fuzz_validate;
