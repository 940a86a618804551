//! The broker's end of the executor socket: handshake, multiplexed calls, pushed events.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iii_shell_protocol::frame::{read_frame, write_frame};
use iii_shell_protocol::messages::{ClientFrame, Event, Hello, Reply, Request, ServerFrame, MAGIC};
use iii_shell_protocol::{Code, WireError, PROTOCOL_VERSION};
use tokio::net::UnixStream;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Reply, WireError>>>>>;

/// A live, handshaken connection to an executor. Cheap to clone.
#[derive(Clone)]
pub struct ExecutorClient {
    tx: mpsc::Sender<ClientFrame>,
    pending: Pending,
    next_id: Arc<AtomicU64>,
    events: broadcast::Sender<Event>,
    closed: watch::Receiver<bool>,
    /// The executor's pid, from its handshake.
    pub pid: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("executor refused the connection: {0}")]
    Refused(String),
    #[error("executor handshake failed: {0}")]
    Handshake(String),
}

/// The error every in-flight call gets when the executor goes away.
pub fn executor_lost() -> WireError {
    WireError::new(Code::S216, "the executor went away before answering")
}

impl ExecutorClient {
    /// Performs the handshake and starts the reader and writer tasks.
    pub async fn connect(stream: UnixStream) -> Result<ExecutorClient, ConnectError> {
        let (mut rd, mut wr) = stream.into_split();
        let hello = ClientFrame::Hello(Hello { magic: MAGIC, version: PROTOCOL_VERSION });
        write_frame(&mut wr, &hello).await.map_err(|e| ConnectError::Handshake(e.to_string()))?;
        let pid = match tokio::time::timeout(Duration::from_secs(10), read_frame::<_, ServerFrame>(&mut rd)).await {
            Ok(Ok(ServerFrame::HelloAck { version, pid })) if version == PROTOCOL_VERSION => pid,
            Ok(Ok(ServerFrame::HelloAck { version, .. })) => {
                return Err(ConnectError::Refused(format!(
                    "protocol version mismatch: broker speaks {PROTOCOL_VERSION}, executor speaks {version}"
                )))
            }
            Ok(Ok(ServerFrame::Refused { reason })) => return Err(ConnectError::Refused(reason)),
            Ok(Ok(_)) => return Err(ConnectError::Handshake("unexpected first frame".into())),
            Ok(Err(e)) => return Err(ConnectError::Handshake(e.to_string())),
            Err(_) => return Err(ConnectError::Handshake("no answer within 10 s".into())),
        };

        let (tx, mut rx) = mpsc::channel::<ClientFrame>(256);
        let pending: Pending = Arc::default();
        let (events, _) = broadcast::channel(1024);
        let (closed_tx, closed) = watch::channel(false);

        tokio::spawn(async move {
            while let Some(frame) = rx.recv().await {
                if let Err(e) = write_frame(&mut wr, &frame).await {
                    tracing::warn!(error = %e, "write to executor failed");
                    break;
                }
            }
        });
        let (p, ev) = (pending.clone(), events.clone());
        tokio::spawn(async move {
            loop {
                match read_frame::<_, ServerFrame>(&mut rd).await {
                    Ok(ServerFrame::Reply { id, result }) => {
                        let waiter = p.lock().ok().and_then(|mut m| m.remove(&id));
                        if let Some(w) = waiter {
                            let _ = w.send(result);
                        }
                    }
                    Ok(ServerFrame::Event(e)) => {
                        let _ = ev.send(e);
                    }
                    Ok(other) => tracing::warn!(?other, "unexpected frame from executor"),
                    Err(e) => {
                        tracing::warn!(error = %e, "executor connection ended");
                        break;
                    }
                }
            }
            let waiters: Vec<_> = p.lock().map(|mut m| m.drain().collect()).unwrap_or_default();
            for (_, w) in waiters {
                let _ = w.send(Err(executor_lost()));
            }
            let _ = closed_tx.send(true);
        });
        Ok(ExecutorClient { tx, pending, next_id: Arc::new(AtomicU64::new(1)), events, closed, pid })
    }

    /// Sends a request and waits for its reply. Dropping the future cancels the request on
    /// the executor (a foreground command is killed).
    pub async fn call(&self, request: Request) -> Result<Reply, WireError> {
        if *self.closed.borrow() {
            return Err(executor_lost());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut m) = self.pending.lock() {
            m.insert(id, tx);
        }
        let guard = CancelOnDrop { id, tx: self.tx.clone(), pending: self.pending.clone(), armed: true };
        if self.tx.send(ClientFrame::Request { id, request }).await.is_err() {
            return Err(executor_lost());
        }
        let result = rx.await.unwrap_or_else(|_| Err(executor_lost()));
        guard.disarm();
        result
    }

    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    /// Resolves when the connection to the executor has ended.
    pub async fn closed(&self) {
        let mut c = self.closed.clone();
        let _ = c.wait_for(|v| *v).await;
    }
}

struct CancelOnDrop {
    id: u64,
    tx: mpsc::Sender<ClientFrame>,
    pending: Pending,
    armed: bool,
}

impl CancelOnDrop {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            if let Ok(mut m) = self.pending.lock() {
                m.remove(&self.id);
            }
            let _ = self.tx.try_send(ClientFrame::Cancel { id: self.id });
        }
    }
}
