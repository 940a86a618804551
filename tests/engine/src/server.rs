//! The single TCP listener and its routes (§1.1):
//! `/` worker socket, `/otel` telemetry socket (accepted and drained),
//! `/ws/channels/{id}?key=…&dir=read|write` data channels. Anything else,
//! and channel requests with an unknown id or wrong key, get HTTP 404 before
//! the upgrade.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{StatusCode, Uri};
use tokio_tungstenite::tungstenite::Message;

use crate::protocol::{percent_decode, ChannelDirection};
use crate::state::Shared;
use crate::{channels, connection};

#[derive(Debug, Clone, Copy)]
enum Route {
    Worker,
    Otel,
    Channel(uuid::Uuid, ChannelDirection),
}

/// Binds `127.0.0.1:port`, retrying briefly while a just-closed port is busy.
pub(crate) async fn bind(port: u16) -> io::Result<TcpListener> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut attempt = 0;
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && port != 0 && attempt < 50 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

pub(crate) fn spawn_accept_loop(shared: Arc<Shared>, listener: TcpListener) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let task = tokio::spawn(serve_socket(shared.clone(), stream));
            shared.track_task(task.abort_handle());
        }
    })
}

fn route_for(shared: &Shared, uri: &Uri) -> Option<Route> {
    match uri.path() {
        "/" => return Some(Route::Worker),
        "/otel"
            if shared
                .otel_accepted
                .load(std::sync::atomic::Ordering::SeqCst) =>
        {
            return Some(Route::Otel)
        }
        _ => {}
    }
    let channel_id = uri.path().strip_prefix("/ws/channels/")?;
    let mut key = None;
    let mut dir = None;
    for pair in uri.query().unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "key" => key = percent_decode(v),
            "dir" => dir = Some(v.to_string()),
            _ => {}
        }
    }
    let direction = match dir.as_deref() {
        Some("read") => ChannelDirection::Read,
        Some("write") => ChannelDirection::Write,
        _ => return None,
    };
    let id = channels::check_request(shared, channel_id, key.as_deref())?;
    Some(Route::Channel(id, direction))
}

fn not_found() -> ErrorResponse {
    let mut response = ErrorResponse::new(Some("Not Found".to_string()));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

// The callback's error type is tungstenite's `ErrorResponse`.
#[allow(clippy::result_large_err)]
async fn serve_socket(shared: Arc<Shared>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut route = None;
    let callback = |request: &Request, response: Response| match route_for(&shared, request.uri()) {
        Some(r) => {
            route = Some(r);
            Ok(response)
        }
        None => Err(not_found()),
    };
    let handshake = tokio_tungstenite::accept_hdr_async(stream, callback);
    let ws = match tokio::time::timeout(shared.settings.handshake_timeout, handshake).await {
        Ok(Ok(ws)) => ws,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "websocket handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!("websocket handshake timed out");
            return;
        }
    };
    match route {
        Some(Route::Worker) => connection::run(shared, ws).await,
        Some(Route::Channel(id, dir)) => channels::run_end(shared, ws, id, dir).await,
        Some(Route::Otel) => serve_otel(shared, ws).await,
        None => {}
    }
}

/// A telemetry-only socket: binary frames with a telemetry prefix are stored, everything else
/// is ignored; closed when the test bumps the otel epoch.
async fn serve_otel(shared: Arc<Shared>, mut ws: tokio_tungstenite::WebSocketStream<TcpStream>) {
    let mut epoch = shared.otel_epoch.subscribe();
    epoch.borrow_and_update();
    loop {
        tokio::select! {
            m = ws.next() => match m {
                Some(Ok(Message::Binary(b))) => {
                    shared.update(|st| {
                        if !st.telemetry.ingest(&b) {
                            tracing::warn!("unrecognized binary frame on /otel (dropped)");
                        }
                    });
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
            _ = epoch.changed() => {
                let _ = ws.send(Message::Close(None)).await;
                break;
            }
        }
    }
}
