//! Log setup: `tracing` to stderr, filtered by `RUST_LOG`.

use tracing_subscriber::EnvFilter;

static DEFAULT: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The filter chosen at start-up (passed on to a spawned executor).
pub fn default_filter() -> String {
    DEFAULT.get().cloned().unwrap_or_else(|| "info".into())
}

pub fn init(default_filter: &str) {
    let _ = DEFAULT.set(default_filter.to_string());
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
