//! `iii-shell serve`: the worker. Connects to the engine, runs the configuration lifecycle,
//! keeps an executor running, and serves every function until SIGTERM/SIGINT.

use std::sync::Arc;
use std::time::Duration;

use crate::cli::ServeArgs;
use crate::cmd_executor::shutdown_signal;
use crate::engine::endpoint::{namespace, resolve_url, spawn_probe, worker_name};
use crate::engine::frames::ErrorBody;
use crate::engine::{EngineLink, Invoker, LinkOptions};
use crate::functions::{dispatch, CallMeta};
use crate::lifecycle::{load_seed, Lifecycle, ON_CHANGE_ID};
use crate::services::Services;
use crate::supervisor::Supervisor;

pub async fn run(args: ServeArgs) -> i32 {
    // A seed file that exists but does not parse aborts boot before anything else happens.
    let seed = match load_seed(&args.config) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}; refusing to start (fix or remove the file)");
            return 1;
        }
    };
    let url = resolve_url(args.url.as_deref());
    spawn_probe(&url);

    let services = Services::new();
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "cannot locate our own binary to start the executor");
            return 1;
        }
    };
    let supervisor = match Supervisor::start(services.clone(), exe, Vec::new()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}");
            return 1;
        }
    };

    let lifecycle_slot: Arc<std::sync::OnceLock<Arc<Lifecycle>>> = Arc::default();
    let invoker: Invoker = {
        let services = services.clone();
        let slot = lifecycle_slot.clone();
        Arc::new(move |function_id: String, data: serde_json::Value, metadata: Option<serde_json::Value>| {
            let services = services.clone();
            let slot = slot.clone();
            Box::pin(async move {
                if function_id == ON_CHANGE_ID {
                    return match slot.get() {
                        Some(lc) => Ok(lc.on_change().await),
                        None => Err(ErrorBody::new("S216", "configuration lifecycle not started")),
                    };
                }
                dispatch(&services, &function_id, data, CallMeta { metadata }).await.map_err(ErrorBody::from)
            })
        })
    };
    let opts = LinkOptions::new(url, worker_name(), namespace());
    let link = EngineLink::start(opts, invoker);
    services.set_engine(link.clone());
    let lifecycle = Lifecycle::new(link.clone(), services.clone(), seed);
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
            1
        }
        _ = shutdown_signal() => {
            tracing::info!("shutting down: no new calls; answering the ones in flight");
            link.drain(Duration::from_secs(30)).await;
            0
        }
    };
    link.stop();
    supervisor.shutdown().await;
    tracing::info!("stopped");
    code
}
