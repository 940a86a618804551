//! Engine data channels: `ws://HOST:PORT/ws/channels/{id}?key=…&dir=read|write`.

use futures_util::{SinkExt, StreamExt};
use iii_shell_protocol::fs::{ContentDirection, ContentRef};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use super::frames::ErrorBody;
use super::EngineLink;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What passes unencoded in the channel's path segment and `key` value: RFC 3986's
/// unreserved characters. Every other byte is `%XX`.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

fn encode(s: &str) -> String {
    utf8_percent_encode(s, UNRESERVED).to_string()
}

/// The URL of one end of a channel.
pub fn channel_url(base: &str, r: &ContentRef, dir: ContentDirection) -> String {
    let d = match dir {
        ContentDirection::Read => "read",
        ContentDirection::Write => "write",
    };
    format!(
        "{}/ws/channels/{}?key={}&dir={d}",
        base.trim_end_matches('/'),
        encode(&r.channel_id),
        encode(&r.access_key)
    )
}

/// Longest wait for a channel end's WebSocket upgrade.
const OPEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Opens one end of a channel on the engine we are connected to.
pub async fn open(link: &EngineLink, r: &ContentRef, dir: ContentDirection) -> Result<Ws, String> {
    let url = channel_url(&super::endpoint::base_url(&link.options().url), r, dir);
    // Bounded: an engine that accepts the TCP connection but never answers the upgrade must
    // not hold the call forever.
    let (ws, _) = tokio::time::timeout(
        OPEN_TIMEOUT,
        tokio_tungstenite::connect_async_with_config(url.as_str(), None, true),
    )
    .await
    .map_err(|_| {
        format!(
            "cannot open channel {}: no answer within {OPEN_TIMEOUT:?}",
            r.channel_id
        )
    })?
    .map_err(|e| format!("cannot open channel {}: {e}", r.channel_id))?;
    Ok(ws)
}

/// Creates a channel; returns (writer, reader) refs.
pub async fn create(link: &EngineLink) -> Result<(ContentRef, ContentRef), ErrorBody> {
    let v = link
        .call("engine::channels::create", json!({"buffer_size": 64}))
        .await?;
    let parse = |k: &str| {
        serde_json::from_value::<ContentRef>(v.get(k).cloned().unwrap_or_default()).map_err(|e| {
            ErrorBody::new(
                "S216",
                format!("bad engine::channels::create response: {e}"),
            )
        })
    };
    Ok((parse("writer")?, parse("reader")?))
}

/// Reads a channel's binary frames into `tx` until the writer closes. Text frames are
/// ignored. Ends with `Err` on a broken socket, or after `idle` without a frame.
pub async fn pump_reader(
    mut ws: Ws,
    tx: tokio::sync::mpsc::Sender<Result<Vec<u8>, String>>,
    idle: std::time::Duration,
) {
    loop {
        let next = match tokio::time::timeout(idle, ws.next()).await {
            Ok(n) => n,
            Err(_) => {
                let _ = tx.send(Err(format!("channel idle for {idle:?}"))).await;
                return;
            }
        };
        match next {
            Some(Ok(Message::Binary(b))) => {
                if tx.send(Ok(b.to_vec())).await.is_err() {
                    return;
                }
            }
            Some(Ok(Message::Close(_))) | None => return,
            Some(Ok(_)) => continue,
            Some(Err(e)) => {
                let _ = tx.send(Err(format!("channel read failed: {e}"))).await;
                return;
            }
        }
    }
}

/// Sends binary frames on a writer end, then a Close.
pub struct ChannelWriter {
    ws: Ws,
}

impl ChannelWriter {
    pub fn new(ws: Ws) -> Self {
        ChannelWriter { ws }
    }

    pub async fn send(&mut self, data: Vec<u8>) -> Result<(), String> {
        self.ws
            .send(Message::Binary(data.into()))
            .await
            .map_err(|e| e.to_string())
    }

    /// Reports a failure in-band (`{"error": …}` text frame), as iii readers expect.
    pub async fn fail(&mut self, error: &str) {
        let _ = self
            .ws
            .send(Message::Text(json!({"error": error}).to_string().into()))
            .await;
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_urls_encode_everything_but_the_unreserved_characters() {
        let r = ContentRef {
            channel_id: "ch-1_a.b~c".into(),
            access_key: "k/e y?&=%+é".into(),
            direction: ContentDirection::Read,
        };
        assert_eq!(
            channel_url("ws://127.0.0.1:49134/", &r, ContentDirection::Read),
            "ws://127.0.0.1:49134/ws/channels/ch-1_a.b~c?key=k%2Fe%20y%3F%26%3D%25%2B%C3%A9&dir=read"
        );
        assert_eq!(
            channel_url("ws://h:1", &r, ContentDirection::Write),
            "ws://h:1/ws/channels/ch-1_a.b~c?key=k%2Fe%20y%3F%26%3D%25%2B%C3%A9&dir=write"
        );
    }
}
