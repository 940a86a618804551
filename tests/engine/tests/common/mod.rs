//! A hand-driven worker socket for protocol-level assertions.
#![allow(dead_code)]

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use iii_test_engine::Message;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const WAIT: Duration = Duration::from_secs(5);

pub struct RawWorker {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    pub worker_id: String,
    pub reattach_token: String,
    pub hello: Value,
}

impl RawWorker {
    /// Connects to `/` and reads the `workerregistered` frame.
    pub async fn connect(url: &str) -> RawWorker {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("connect");
        let mut worker = RawWorker {
            ws,
            worker_id: String::new(),
            reattach_token: String::new(),
            hello: Value::Null,
        };
        let hello = worker.recv().await;
        assert_eq!(hello["type"], "workerregistered", "{hello}");
        worker.worker_id = hello["worker_id"].as_str().expect("worker_id").to_string();
        worker.reattach_token = hello["reattach_token"]
            .as_str()
            .expect("reattach_token")
            .to_string();
        worker.hello = hello;
        worker
    }

    pub async fn send(&mut self, frame: Value) {
        self.ws
            .send(Message::text(frame.to_string()))
            .await
            .expect("send");
    }

    pub async fn send_text(&mut self, text: &str) {
        self.ws.send(Message::text(text)).await.expect("send");
    }

    pub async fn send_message(&mut self, msg: Message) {
        self.ws.send(msg).await.expect("send");
    }

    /// Next WebSocket message of any kind.
    pub async fn recv_message(&mut self) -> Message {
        tokio::time::timeout(WAIT, self.ws.next())
            .await
            .expect("timed out waiting for a message")
            .expect("socket ended")
            .expect("socket error")
    }

    /// `engine::workers::register` as fire-and-forget (the SDK way).
    pub async fn register(&mut self, data: Value) {
        self.send(json!({
            "type": "invokefunction",
            "invocation_id": null,
            "function_id": "engine::workers::register",
            "action": {"type": "void"},
            "data": data,
        }))
        .await;
    }

    /// Next JSON text frame, or `None` when the socket ended / nothing came within `wait`.
    pub async fn try_recv(&mut self, wait: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let msg = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .ok()??;
            match msg {
                Ok(Message::Text(t)) => {
                    return Some(serde_json::from_str(t.as_str()).expect("json"))
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    pub async fn recv(&mut self) -> Value {
        self.try_recv(WAIT)
            .await
            .expect("expected a frame from the engine")
    }

    /// Skips frames until one of `frame_type` arrives.
    pub async fn recv_type(&mut self, frame_type: &str) -> Value {
        loop {
            let frame = self.recv().await;
            if frame["type"] == frame_type {
                return frame;
            }
        }
    }

    /// True if the engine ended the socket within `wait`.
    pub async fn closed_within(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return false,
                Ok(None) | Ok(Some(Err(_))) | Ok(Some(Ok(Message::Close(_)))) => return true,
                Ok(Some(Ok(_))) => {}
            }
        }
    }
}
