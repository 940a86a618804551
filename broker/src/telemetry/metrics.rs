//! The worker's gauges and counters.
//!
//! Gauges (each with `worker.id`, the id the engine gave the current connection, and
//! `worker.name`; `engine::workers::info` shows the first three):
//!
//! | Name | Unit | What |
//! |---|---|---|
//! | `iii.worker.memory.rss` | By | resident memory of the supervisor, the broker and the executor together, the binary's shared pages once |
//! | `iii.worker.cpu.percent` | % | their CPU use since the previous sample (100 = one core) |
//! | `iii.worker.uptime_seconds` | s | since the broker started |
//! | `iii.shell.jobs.running` | | running background jobs (host and sandbox) |
//! | `iii.shell.pty.sessions` | | terminal sessions |
//!
//! Counters (cumulative): `iii.shell.calls` {`function_id`, `outcome` = ok / error},
//! `iii.shell.denials` {`code`} (see [`denial_code`]), `iii.shell.spawns` (commands and
//! terminal sessions the executor started), `iii.shell.executor.respawns`, and
//! `iii.shell.telemetry.dropped` (batches the outbox dropped).
//!
//! The reader never collects on its own: [`super::usage`] samples the gauges every
//! `telemetry.metrics_interval_ms` and then asks for one collection ([`Meters::collect`]), so
//! a reload changes the cadence at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::{
    Counter, Meter, MeterProvider as _, ObservableCounter, ObservableGauge,
};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;

use super::identity::{Identity, SCOPE};
use super::otlp;
use super::outbox::Outbox;

/// One sample of the gauges.
#[derive(Debug, Clone, PartialEq)]
pub struct Gauges {
    pub worker_id: String,
    pub rss_bytes: u64,
    pub cpu_percent: f64,
    pub uptime_seconds: f64,
    pub running_jobs: u64,
    pub pty_sessions: u64,
}

/// The label a failed call is counted under in `iii.shell.denials`: every refusal of a
/// request (S210–S215, S217, S218, their C-codes, and `invocation_failed`, the code of argv,
/// denylist and job-limit refusals). Internal failures (S216, C216) and the engine's own
/// codes are not denials.
pub fn denial_code(code: &str) -> Option<&str> {
    match code {
        "S210" | "S211" | "S212" | "S213" | "S214" | "S215" | "S217" | "S218" | "C210" | "C211"
        | "C212" | "C213" | "C214" | "C215" | "C217" | "C218" | "invocation_failed" => Some(code),
        _ => None,
    }
}

pub struct Meters {
    provider: SdkMeterProvider,
    calls: Counter<u64>,
    denials: Counter<u64>,
    spawns: Counter<u64>,
    respawns: Counter<u64>,
    /// The latest sample, read by the gauges' callbacks.
    pub latest: Arc<Mutex<Option<Gauges>>>,
    _gauges: Vec<ObservableGauge<u64>>,
    _f_gauges: Vec<ObservableGauge<f64>>,
    _dropped: ObservableCounter<u64>,
}

fn gauge_u64(
    meter: &Meter,
    latest: &Arc<Mutex<Option<Gauges>>>,
    name: &'static str,
    unit: &'static str,
    description: &'static str,
    worker_name: &str,
    read: fn(&Gauges) -> u64,
) -> ObservableGauge<u64> {
    let latest = latest.clone();
    let name_attr = KeyValue::new("worker.name", worker_name.to_string());
    meter
        .u64_observable_gauge(name)
        .with_unit(unit)
        .with_description(description)
        .with_callback(move |o| {
            if let Some(g) = latest.lock().ok().and_then(|g| g.clone()) {
                o.observe(
                    read(&g),
                    &[
                        KeyValue::new("worker.id", g.worker_id.clone()),
                        name_attr.clone(),
                    ],
                );
            }
        })
        .build()
}

fn gauge_f64(
    meter: &Meter,
    latest: &Arc<Mutex<Option<Gauges>>>,
    name: &'static str,
    unit: &'static str,
    description: &'static str,
    worker_name: &str,
    read: fn(&Gauges) -> f64,
) -> ObservableGauge<f64> {
    let latest = latest.clone();
    let name_attr = KeyValue::new("worker.name", worker_name.to_string());
    meter
        .f64_observable_gauge(name)
        .with_unit(unit)
        .with_description(description)
        .with_callback(move |o| {
            if let Some(g) = latest.lock().ok().and_then(|g| g.clone()) {
                o.observe(
                    read(&g),
                    &[
                        KeyValue::new("worker.id", g.worker_id.clone()),
                        name_attr.clone(),
                    ],
                );
            }
        })
        .build()
}

impl Meters {
    pub fn new(outbox: Arc<Outbox>, resource: Resource, identity: &Identity) -> Meters {
        // Collections are asked for by the sampler; the reader's own timer is a fallback.
        let reader = PeriodicReader::builder(otlp::Metrics {
            outbox: outbox.clone(),
        })
        .with_interval(Duration::from_secs(24 * 3600))
        .build();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(resource)
            .build();
        let meter = provider.meter(SCOPE);
        let latest: Arc<Mutex<Option<Gauges>>> = Arc::default();
        let wn = identity.worker_name.as_str();
        let gauges = vec![
            gauge_u64(
                &meter,
                &latest,
                "iii.worker.memory.rss",
                "By",
                "Resident memory of the supervisor, broker and executor",
                wn,
                |g| g.rss_bytes,
            ),
            gauge_u64(
                &meter,
                &latest,
                "iii.shell.jobs.running",
                "{job}",
                "Running background jobs",
                wn,
                |g| g.running_jobs,
            ),
            gauge_u64(
                &meter,
                &latest,
                "iii.shell.pty.sessions",
                "{session}",
                "Terminal sessions",
                wn,
                |g| g.pty_sessions,
            ),
        ];
        let f_gauges = vec![
            gauge_f64(
                &meter,
                &latest,
                "iii.worker.cpu.percent",
                "%",
                "CPU use of the worker's processes (100 = one core)",
                wn,
                |g| g.cpu_percent,
            ),
            gauge_f64(
                &meter,
                &latest,
                "iii.worker.uptime_seconds",
                "s",
                "Worker uptime",
                wn,
                |g| g.uptime_seconds,
            ),
        ];
        let ob = outbox.clone();
        let dropped = meter
            .u64_observable_counter("iii.shell.telemetry.dropped")
            .with_description(
                "Telemetry batches dropped because the engine's telemetry socket was down or slow",
            )
            .with_callback(move |o| o.observe(ob.dropped().frames, &[]))
            .build();
        Meters {
            calls: meter
                .u64_counter("iii.shell.calls")
                .with_description("Calls by function and outcome")
                .build(),
            denials: meter
                .u64_counter("iii.shell.denials")
                .with_description("Refused calls by wire code")
                .build(),
            spawns: meter
                .u64_counter("iii.shell.spawns")
                .with_description("Commands and terminal sessions started")
                .build(),
            respawns: meter
                .u64_counter("iii.shell.executor.respawns")
                .with_description("Executors started after the first")
                .build(),
            provider,
            latest,
            _gauges: gauges,
            _f_gauges: f_gauges,
            _dropped: dropped,
        }
    }

    /// Counts one answered call (`code` = the wire code of a failure).
    pub fn call_ended(&self, function_id: &str, code: Option<&str>) {
        let outcome = if code.is_some() { "error" } else { "ok" };
        self.calls.add(
            1,
            &[
                KeyValue::new("function_id", function_id.to_string()),
                KeyValue::new("outcome", outcome),
            ],
        );
        if let Some(c) = code.and_then(denial_code) {
            self.denials.add(1, &[KeyValue::new("code", c.to_string())]);
        }
    }

    pub fn spawned(&self) {
        self.spawns.add(1, &[]);
    }

    pub fn respawned(&self) {
        self.respawns.add(1, &[]);
    }

    /// One collection of every instrument into the outbox. Blocks while the reader
    /// collects: call it off the async threads.
    pub fn collect(&self) {
        let _ = self.provider.force_flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_are_refusals_not_internal_failures() {
        for (code, want) in [
            ("S210", Some("S210")),
            ("S211", Some("S211")),
            ("S215", Some("S215")),
            ("S218", Some("S218")),
            ("C215", Some("C215")),
            ("invocation_failed", Some("invocation_failed")),
            ("S216", None),
            ("C216", None),
            ("timeout", None),
            ("function_not_found", None),
        ] {
            assert_eq!(denial_code(code), want, "{code}");
        }
    }
}
