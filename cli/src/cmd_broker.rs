//! `iii-shell broker`: the network half. Connects to the engine, runs the configuration
//! lifecycle and serves every function until SIGTERM/SIGINT, forwarding work to an executor
//! it reaches through an inherited socket (`serve`) or a socket path (separate units).

use std::sync::Arc;
use std::time::Duration;

use crate::cli::{BrokerArgs, ServeArgs};
use crate::cmd_executor::shutdown_signal;
use iii_shell_broker::confine::{confine_self, drop_user, lookup_user};
use iii_shell_broker::engine::endpoint::{namespace, resolve_url, spawn_probe, worker_name};
use iii_shell_broker::engine::frames::ErrorBody;
use iii_shell_broker::engine::{EngineLink, Invoker, LinkOptions};
use iii_shell_broker::executor_source::ExecutorSource;
use iii_shell_broker::functions::{dispatch, CallMeta};
use iii_shell_broker::lifecycle::{Lifecycle, ON_CHANGE_ID};
use iii_shell_broker::services::Services;
use iii_shell_protocol::config::Config;

/// Everything the broker does before its async runtime exists: find the executor, read the
/// seed, drop to the unprivileged user if still root, and confine itself (Landlock applies
/// to the calling thread and the threads it creates later, so this must come first).
/// Also returns the broker's own `/proc/self` files, opened while it still may.
pub fn prepare(
    serve: &mut ServeArgs,
    args: &BrokerArgs,
) -> Result<(Config, ExecutorSource, Option<OwnStat>), i32> {
    // The worker's memory and CPU gauges read this; Landlock allows no open later.
    let own_stat = iii_shell_broker::telemetry::usage::open_self_stat();
    // The telemetry SDK's batching threads allocate little and rarely: one malloc arena for
    // the whole broker, instead of one per thread, each keeping its freed memory.
    crate::heap::one_arena();
    if args.control_fd.is_some() {
        // Spawned by `serve`: go away with our supervisor.
        // SAFETY: PR_SET_PDEATHSIG only sets a process attribute.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) };
    }
    let seed = match args.seed_fd {
        // SAFETY: `serve` handed us this descriptor number; nothing else here uses it.
        Some(fd) => match unsafe { read_start_up(fd) } {
            Ok(s) => {
                if s.url.is_some() {
                    serve.url = s.url;
                }
                s.seed
            }
            Err(e) => {
                tracing::error!(
                    "bad --seed-fd {fd}: {e}; start the broker through `iii-shell serve`"
                );
                return Err(1);
            }
        },
        None => match serve.seed() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("{e}; refusing to start (fix or remove the file)");
                return Err(1);
            }
        },
    };
    let source = match (args.executor_fd, &args.executor_socket) {
        // SAFETY: `serve` handed us these descriptor numbers; nothing else here uses them.
        (Some(fd), _) => unsafe { ExecutorSource::inherited(fd, args.control_fd) },
        (None, Some(path)) => ExecutorSource::Path(path.clone()),
        (None, None) => {
            tracing::error!("iii-shell broker needs --executor-socket PATH");
            return Err(2);
        }
    };
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let dropped = lookup_user(&seed.confinement.broker_user).and_then(|(u, g)| drop_user(u, g));
        if let Err(e) = dropped {
            tracing::error!("refusing to run the broker as root: {e}; start it as an unprivileged user (User= in the unit), or set confinement.broker_user to one");
            return Err(1);
        }
    }
    match confine_self(&seed.confinement) {
        Ok(r) => {
            for p in &r.problems {
                tracing::warn!("broker confinement is best-effort here: {p}");
            }
            tracing::info!(uid = r.uid, gid = r.gid, landlock = %r.landlock, seccomp = %r.seccomp, "broker confined");
        }
        Err(e) => {
            tracing::error!("{e}; confinement.mode is strict, so the broker does not start with less: run `iii-shell doctor`, or set confinement.mode: best_effort");
            return Err(1);
        }
    }
    Ok((seed, source, own_stat))
}

/// What `serve` hands the broker through `--seed-fd`.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct StartUp {
    pub seed: serde_json::Value,
    pub url: Option<String>,
}

/// The decoded [`StartUp`].
struct StartUpConfig {
    seed: Config,
    url: Option<String>,
}

/// Reads the start-up document from an inherited descriptor and closes it.
///
/// # Safety
/// `fd` must be an open descriptor this process owns and nothing else uses.
unsafe fn read_start_up(fd: i32) -> Result<StartUpConfig, String> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    // SAFETY: guaranteed by the caller; the File closes it when dropped.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut text = String::new();
    f.take(64 << 20)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    let s: StartUp = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let seed = Config::from_value(&s.seed).map_err(|e| e.0)?;
    Ok(StartUpConfig { seed, url: s.url })
}

/// The broker's own `/proc/self/stat` and `statm`, for its gauges.
pub type OwnStat = iii_shell_confine::proc_stat::Files;

/// The broker's status when it stops itself on purpose (a configuration id it cannot make,
/// no executor to serve with, the engine's fatal refusal): the supervisor exits with it
/// rather than start a broker that would stop the same way
/// ([`crate::cmd_serve::replace_broker_after`]).
pub const STOPPED_ON_PURPOSE: i32 = 1;

pub async fn run(
    args: ServeArgs,
    seed: Config,
    source: ExecutorSource,
    own_stat: Option<OwnStat>,
) -> i32 {
    let under_supervisor = matches!(
        source,
        ExecutorSource::Inherited {
            control: Some(_),
            ..
        }
    );
    tokio::spawn(crate::heap::trim_when_quiet());
    let url = resolve_url(args.url.as_deref());
    let config_id = match iii_shell_broker::worker_identity::config_id(
        args.config_id.as_deref(),
        namespace().as_deref(),
    ) {
        Ok(id) => id,
        Err(e) => {
            tracing::error!("{e}");
            return STOPPED_ON_PURPOSE;
        }
    };
    tracing::info!(config_id = %config_id, "this worker's configuration id is '{config_id}'");
    spawn_probe(&url);

    let services = Services::new();
    // The change feed restarts its watchers on every executor, the first one included.
    let changed = iii_shell_broker::changed::ChangedFeed::new(
        services.executor.clone(),
        services.engine.clone(),
    );
    {
        let feed = changed.clone();
        services.on_executor_ready(Box::new(move |client| feed.attach(client)));
    }
    let executors = match source.start(services.clone()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}; the broker needs its executor: start iii-shell-executor (or run `iii-shell serve`, which starts both)");
            return STOPPED_ON_PURPOSE;
        }
    };

    let lifecycle_slot: Arc<std::sync::OnceLock<Arc<Lifecycle>>> = Arc::default();
    let invoker: Invoker = {
        let services = services.clone();
        let slot = lifecycle_slot.clone();
        Arc::new(
            move |function_id: String,
                  data: serde_json::Value,
                  metadata: Option<serde_json::Value>| {
                let services = services.clone();
                let slot = slot.clone();
                Box::pin(async move {
                    if function_id == ON_CHANGE_ID {
                        return match slot.get() {
                            Some(lc) => Ok(lc.on_change().await),
                            None => Err(ErrorBody::new(
                                "S216",
                                "configuration lifecycle not started",
                            )),
                        };
                    }
                    dispatch(&services, &function_id, data, CallMeta { metadata })
                        .await
                        .map_err(ErrorBody::from)
                })
            },
        )
    };
    let mut opts = LinkOptions::new(url, worker_name(), namespace());
    if under_supervisor {
        // SAFETY: getppid cannot fail.
        opts.pid = unsafe { libc::getppid() } as u32;
    }
    let identity = iii_shell_broker::telemetry::Identity {
        worker_name: opts.name.clone(),
        namespace: opts.namespace.clone(),
    };
    let engine_url = opts.url.clone();
    let link = EngineLink::start(opts, invoker);
    // Spans, logs and gauges for the engine's telemetry socket (on unless the configuration
    // in force says `telemetry.enabled: false`).
    let hub = iii_shell_broker::telemetry::install(&engine_url, identity);
    hub.apply(&seed.telemetry);
    tokio::spawn(iii_shell_broker::telemetry::usage::run(
        hub,
        services.clone(),
        link.clone(),
        own_stat,
    ));
    link.set_trigger_provider(Arc::new(iii_shell_broker::changed::Provider(changed)));
    services.set_engine(link.clone());
    let lifecycle = Lifecycle::new(link.clone(), services.clone(), seed, config_id);
    let _ = lifecycle_slot.set(lifecycle.clone());

    let booted = {
        let lc = lifecycle.clone();
        async move {
            lc.boot(Duration::from_secs(2)).await;
            // Re-sync after every reconnect that follows the boot. The connection epoch also
            // catches a reconnect that completes between two polls.
            let mut seen = lc.link.connection_epoch();
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let now = lc.link.connection_epoch();
                if now != seen && lc.link.is_connected() {
                    seen = now;
                    lc.resync().await;
                }
            }
        }
    };
    let code = tokio::select! {
        _ = booted => 0,
        why = link.fatal() => {
            tracing::error!("stopping: {why}");
            STOPPED_ON_PURPOSE
        }
        _ = shutdown_signal() => {
            tracing::info!("shutting down: no new calls; answering the ones in flight");
            link.drain(Duration::from_secs(30)).await;
            0
        }
    };
    // What is still batched goes out before the engine link closes (at most 1 s).
    if let Some(hub) = iii_shell_broker::telemetry::active() {
        let _ = tokio::task::spawn_blocking(move || hub.flush()).await;
        let until = tokio::time::Instant::now() + Duration::from_secs(1);
        while !hub.outbox.is_empty() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    link.stop();
    executors.shutdown(&services).await;
    tracing::info!("stopped");
    code
}
