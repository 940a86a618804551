//! Who emits: the instrumentation scope and the worker's identity, which every span, log
//! record and metric carries. A leaf the telemetry modules share.

/// The instrumentation scope of everything this worker emits.
pub const SCOPE: &str = "iii-shell";

/// Who this worker is, for the resource of everything it sends.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The worker name registered with the engine (`III_WORKER_NAME`).
    pub worker_name: String,
    pub namespace: Option<String>,
}
