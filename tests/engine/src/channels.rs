//! Data channels (§7): `engine::channels::create` and the
//! `/ws/channels/{id}?key=…&dir=read|write` sockets.
//!
//! A channel is a bounded queue of WebSocket messages (binary and text, kept
//! as they are) with one writer and one reader end, each usable by exactly one
//! socket. The writer's Close (or socket loss) becomes a Close — end of
//! stream — on the reader; if the reader goes away, the writer stops being
//! read and is dropped.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use uuid::Uuid;

use crate::protocol::{ChannelDirection, ErrorBody};
use crate::state::{Channel, Shared};

const DEFAULT_BUFFER: usize = 64;
const MAX_BUFFER: usize = 1024;
/// How long to wait for the peer's side of a closing handshake.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

#[derive(Deserialize)]
struct CreateInput {
    #[serde(default)]
    buffer_size: Option<usize>,
}

/// `engine::channels::create` `{buffer_size?}` → `{writer, reader}` refs.
pub(crate) fn create(shared: &Shared, data: Value) -> Result<Value, ErrorBody> {
    let input: CreateInput = serde_json::from_value(data).map_err(ErrorBody::deserialization)?;
    let size = input
        .buffer_size
        .unwrap_or(DEFAULT_BUFFER)
        .clamp(1, MAX_BUFFER);
    let (tx, rx) = mpsc::channel(size);
    let channel_id = Uuid::new_v4();
    let access_key = Uuid::new_v4();
    shared.update(|st| {
        st.channels.insert(
            channel_id,
            Channel {
                access_key,
                writer: Some(tx),
                reader: Some(rx),
            },
        )
    });
    let end = |direction: &str| {
        json!({
            "channel_id": channel_id.to_string(),
            "access_key": access_key.to_string(),
            "direction": direction,
        })
    };
    Ok(json!({"writer": end("write"), "reader": end("read")}))
}

/// Validates an upgrade request for a channel end (unknown id / wrong key → `None` = 404).
pub(crate) fn check_request(shared: &Shared, channel_id: &str, key: Option<&str>) -> Option<Uuid> {
    let id = Uuid::parse_str(channel_id).ok()?;
    let key = Uuid::parse_str(key?).ok()?;
    let st = shared.lock();
    let channel = st.channels.get(&id)?;
    (channel.access_key == key).then_some(id)
}

/// Serves one upgraded channel socket.
pub(crate) async fn run_end(
    shared: Arc<Shared>,
    mut ws: WebSocketStream<TcpStream>,
    channel_id: Uuid,
    direction: ChannelDirection,
) {
    enum End {
        Writer(mpsc::Sender<Message>),
        Reader(mpsc::Receiver<Message>),
    }
    let end = shared.update(|st| {
        let channel = st.channels.get_mut(&channel_id)?;
        match direction {
            ChannelDirection::Write => channel.writer.take().map(End::Writer),
            ChannelDirection::Read => channel.reader.take().map(End::Reader),
        }
    });
    match end {
        Some(End::Writer(tx)) => run_writer(ws, tx).await,
        Some(End::Reader(rx)) => run_reader(ws, rx).await,
        None => {
            tracing::debug!(%channel_id, ?direction, "channel end already taken; closing");
            let _ = ws.close(None).await;
        }
    }
}

async fn run_writer(mut ws: WebSocketStream<TcpStream>, tx: mpsc::Sender<Message>) {
    loop {
        match ws.next().await {
            Some(Ok(msg @ (Message::Binary(_) | Message::Text(_)))) => {
                if tx.send(msg).await.is_err() {
                    // Reader gone: stop consuming the writer and drop its socket.
                    return;
                }
            }
            Some(Ok(Message::Close(_))) => break,
            Some(Ok(_)) => {}
            Some(Err(_)) | None => {
                drop(tx);
                return;
            }
        }
    }
    drop(tx); // reader sees end of stream
              // Keep polling so tungstenite flushes its Close reply, then ends.
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

async fn run_reader(ws: WebSocketStream<TcpStream>, mut rx: mpsc::Receiver<Message>) {
    let (mut sink, mut stream) = ws.split();
    loop {
        tokio::select! {
            item = rx.recv() => match item {
                Some(msg) => {
                    if sink.send(msg).await.is_err() {
                        return;
                    }
                }
                None => {
                    // Writer finished: Close without a code = end of stream.
                    let _ = sink.send(Message::Close(None)).await;
                    let _ = tokio::time::timeout(CLOSE_GRACE, async {
                        while let Some(Ok(_)) = stream.next().await {}
                    })
                    .await;
                    return;
                }
            },
            incoming = stream.next() => match incoming {
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
        }
    }
}
