//! The engine's telemetry socket: a second WebSocket, on `<engine url>/otel`, that carries
//! the outbox's binary frames and nothing else.
//!
//! It never holds a call up: calls only ever push into the [`Outbox`]. This task takes
//! frames in order and sends them; a send that fails, or takes longer than
//! [`SEND_TIMEOUT`] (a slow or wedged engine), drops the connection, and the task connects
//! again after [`backoff`]. Meanwhile the outbox drops its oldest frames and counts them; the
//! first drop of an outage is logged once.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use super::outbox::Outbox;

/// The longest one frame may take to send before the socket is taken for wedged.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// The telemetry socket's URL: the engine URL with `/otel` as its path (any path, query or
/// trailing slash of the engine URL is replaced).
pub fn otel_url(engine_url: &str) -> String {
    let (scheme, rest) = match engine_url.split_once("://") {
        Some((s, r)) => (s, r),
        None => ("ws", engine_url),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    format!("{scheme}://{authority}/otel")
}

/// How long to wait before connection attempt `attempt` (0 = the first retry): 1 s,
/// doubling, at most 30 s.
pub fn backoff(attempt: u32) -> Duration {
    let secs = 1u64 << attempt.min(5);
    Duration::from_secs(secs.min(30))
}

/// The engine only ever sends Pongs and a Close here: a small read buffer, and frames
/// written as they come (each is one whole batch).
fn ws_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0)
        .max_message_size(Some(1 << 20))
}

/// Runs the socket until the process ends.
pub async fn run(url: String, outbox: Arc<Outbox>) {
    let mut attempt: u32 = 0;
    let mut outage_logged = false;
    let mut dropped_at_loss = outbox.dropped();
    loop {
        match tokio_tungstenite::connect_async_with_config(url.as_str(), Some(ws_config()), true)
            .await
        {
            Ok((ws, _)) => {
                attempt = 0;
                let d = outbox.dropped();
                if outage_logged {
                    tracing::info!(
                        url = %url,
                        dropped_batches = d.frames - dropped_at_loss.frames,
                        dropped_items = d.items - dropped_at_loss.items,
                        "telemetry socket to the engine is up again"
                    );
                } else {
                    tracing::debug!(url = %url, "telemetry socket to the engine connected");
                }
                outage_logged = false;
                let why = serve(ws, &outbox).await;
                tracing::debug!(url = %url, "telemetry socket lost: {why}");
                dropped_at_loss = outbox.dropped();
            }
            Err(e) => {
                tracing::debug!(url = %url, error = %e, "telemetry socket connect failed");
            }
        }
        // Said once per outage, and only once something was really lost.
        let d = outbox.dropped();
        if !outage_logged && d.frames > dropped_at_loss.frames {
            outage_logged = true;
            tracing::warn!(
                url = %url,
                dropped_batches = d.frames - dropped_at_loss.frames,
                "telemetry for the engine is being dropped, oldest first: its telemetry socket is down or too slow (calls are not affected). Check that the engine is up and serves /otel, or set telemetry.enabled: false"
            );
        }
        tokio::time::sleep(backoff(attempt)).await;
        attempt = attempt.saturating_add(1);
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Sends frames until the socket fails; returns why.
async fn serve(ws: Ws, outbox: &Outbox) -> String {
    let (mut sink, mut stream) = ws.split();
    loop {
        let frame = tokio::select! {
            f = outbox.next() => f,
            // The engine sends nothing here but Pongs and a Close; a read error or end is
            // the socket going away.
            m = stream.next() => match m {
                Some(Ok(Message::Close(_))) | None => return "closed by the engine".into(),
                Some(Err(e)) => return e.to_string(),
                Some(Ok(_)) => continue,
            },
        };
        let send = sink.send(Message::Binary(frame.bytes.clone().into()));
        match tokio::time::timeout(SEND_TIMEOUT, send).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                outbox.put_back(frame);
                return e.to_string();
            }
            Err(_) => {
                outbox.put_back(frame);
                return format!("a frame took longer than {SEND_TIMEOUT:?} to send");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_otel_url_replaces_the_engine_urls_path() {
        assert_eq!(
            otel_url("ws://127.0.0.1:49134"),
            "ws://127.0.0.1:49134/otel"
        );
        assert_eq!(
            otel_url("ws://127.0.0.1:49134/"),
            "ws://127.0.0.1:49134/otel"
        );
        assert_eq!(
            otel_url("wss://engine.example:443/ws?x=1"),
            "wss://engine.example:443/otel"
        );
        assert_eq!(otel_url("localhost:1"), "ws://localhost:1/otel");
    }

    #[test]
    fn backoff_doubles_from_one_second_to_thirty() {
        let got: Vec<u64> = (0..8).map(|a| backoff(a).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(backoff(u32::MAX), Duration::from_secs(30));
    }
}
