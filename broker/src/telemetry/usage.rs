//! Samples the worker's gauges every `telemetry.metrics_interval_ms` and has them sent.
//!
//! The broker reads its own memory and CPU through `/proc/self/stat` and `statm` descriptors
//! opened before it confined itself ([`open_self_stat`]; Landlock allows it no file
//! afterwards); the executor reports its own and the supervisor's (`Request::Usage`). The
//! memory gauge counts the three processes' own pages and their shared file-backed pages once
//! ([`iii_shell_confine::proc_stat::combined_rss`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::trace::UsageReport;

use super::metrics::Gauges;
use super::Hub;
use crate::engine::EngineLink;
use crate::services::Services;

use iii_shell_confine::proc_stat::{combined_rss, Files, Sample};

/// Opens `/proc/self/stat` and `statm` for later reads (hand them to [`run`]). Call it
/// before [`crate::confine::confine_self`].
pub fn open_self_stat() -> Option<Files> {
    Files::open(None)
}

/// The broker's own memory and CPU time: through `own` (from [`open_self_stat`]), else by
/// opening `/proc/self` now.
pub fn broker_sample(own: Option<&Files>) -> Option<Sample> {
    match own {
        Some(f) => f.read(),
        None => iii_shell_confine::proc_stat::read_pid(None),
    }
}

fn sample_of(u: iii_shell_protocol::trace::ProcessUsage) -> Sample {
    Sample {
        rss_bytes: u.rss_bytes,
        file_bytes: u.file_bytes,
        cpu_micros: u.cpu_micros,
    }
}

/// CPU use between two samples of total CPU time, in percent of one core. A total that went
/// down (a respawned executor starts from zero) counts as no use.
pub fn cpu_percent(prev_micros: u64, now_micros: u64, wall: Duration) -> f64 {
    let wall_us = wall.as_micros() as f64;
    if wall_us <= 0.0 {
        return 0.0;
    }
    now_micros.saturating_sub(prev_micros) as f64 * 100.0 / wall_us
}

/// The gauges from one round of samples.
pub fn gauges(
    worker_id: String,
    broker: Option<Sample>,
    executor: Option<&UsageReport>,
    sandbox_jobs: u64,
    cpu_percent: f64,
    uptime: Duration,
) -> Gauges {
    let mut processes: Vec<Sample> = broker.into_iter().collect();
    let (jobs, ptys) = match executor {
        Some(u) => {
            processes.push(sample_of(u.executor));
            processes.extend(u.supervisor.map(sample_of));
            (u.running_jobs, u.pty_sessions)
        }
        None => (0, 0),
    };
    Gauges {
        worker_id,
        rss_bytes: combined_rss(&processes),
        cpu_percent,
        uptime_seconds: uptime.as_secs_f64(),
        running_jobs: jobs + sandbox_jobs,
        pty_sessions: ptys,
    }
}

/// Total CPU time of the three processes.
fn cpu_total(
    broker: Option<iii_shell_confine::proc_stat::Sample>,
    executor: Option<&UsageReport>,
) -> u64 {
    broker.map_or(0, |b| b.cpu_micros)
        + executor.map_or(0, |u| {
            u.executor.cpu_micros + u.supervisor.map_or(0, |s| s.cpu_micros)
        })
}

/// Runs the sampler until the process ends; `own` are the broker's `/proc/self` files
/// ([`open_self_stat`]).
pub async fn run(hub: &'static Hub, services: Arc<Services>, link: EngineLink, own: Option<Files>) {
    let started = Instant::now();
    let mut prev: Option<(u64, Instant)> = None;
    // The first sample soon after the engine gave us an id, then one per interval.
    let mut wait = Duration::from_secs(1);
    loop {
        tokio::time::sleep(wait).await;
        wait = hub.metrics_interval();
        if !hub.enabled() {
            prev = None;
            continue;
        }
        let Some(worker_id) = link.worker_id() else {
            wait = Duration::from_secs(1);
            continue;
        };
        let executor = match tokio::time::timeout(
            Duration::from_secs(5),
            services.executor.call(Request::Usage),
        )
        .await
        {
            Ok(Ok(Reply::Usage(u))) => Some(u),
            _ => None,
        };
        let broker = broker_sample(own.as_ref());
        let total = cpu_total(broker, executor.as_ref());
        let now = Instant::now();
        let pct = prev.map_or(0.0, |(p, at)| cpu_percent(p, total, now - at));
        prev = Some((total, now));
        let g = gauges(
            worker_id,
            broker,
            executor.as_ref(),
            services.sandbox_jobs.running() as u64,
            pct,
            started.elapsed(),
        );
        if let Ok(mut l) = hub.metrics.latest.lock() {
            *l = Some(g);
        }
        let _ = tokio::task::spawn_blocking(move || hub.metrics.collect()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iii_shell_protocol::trace::ProcessUsage;

    #[test]
    fn cpu_percent_is_the_share_of_one_core() {
        assert_eq!(
            cpu_percent(1_000_000, 1_500_000, Duration::from_secs(1)),
            50.0
        );
        assert_eq!(cpu_percent(0, 2_000_000, Duration::from_secs(1)), 200.0);
        assert_eq!(cpu_percent(5_000_000, 1_000, Duration::from_secs(1)), 0.0);
        assert_eq!(cpu_percent(0, 10, Duration::ZERO), 0.0);
    }

    #[test]
    fn the_memory_gauge_is_the_three_processes_together() {
        let u = UsageReport {
            executor: ProcessUsage {
                rss_bytes: 3_000,
                file_bytes: 2_000,
                cpu_micros: 7,
            },
            supervisor: Some(ProcessUsage {
                rss_bytes: 500,
                file_bytes: 400,
                cpu_micros: 1,
            }),
            running_jobs: 2,
            pty_sessions: 1,
        };
        let b = Some(Sample {
            rss_bytes: 10_000,
            file_bytes: 2_500,
            cpu_micros: 100,
        });
        assert_eq!(
            gauges(
                "w1".into(),
                b,
                Some(&u),
                3,
                12.5,
                Duration::from_millis(2500)
            ),
            Gauges {
                worker_id: "w1".into(),
                // Own pages 7500 + 1000 + 100, the shared file pages once (2500).
                rss_bytes: 11_100,
                cpu_percent: 12.5,
                uptime_seconds: 2.5,
                running_jobs: 5,
                pty_sessions: 1,
            }
        );
        assert_eq!(cpu_total(b, Some(&u)), 108);
        // Without an executor answer: the broker alone.
        assert_eq!(
            gauges("w".into(), b, None, 0, 0.0, Duration::ZERO).rss_bytes,
            10_000
        );
    }
}
