//! The executor's side of the socket: peer check, handshake, request multiplexing.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iii_shell_policy::sync::lock;
use iii_shell_protocol::frame::{encode, read_frame, write_frame, FrameError};
use iii_shell_protocol::fs::FsOp;
use iii_shell_protocol::messages::{ClientFrame, Hello, ServerFrame, MAGIC, STREAM_WINDOW};
use iii_shell_protocol::sink::{send_now, send_queued, Sent, SharedWriter};
use iii_shell_protocol::{Code, WireError, PROTOCOL_VERSION};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Notify, Semaphore};

use iii_shell_files::fs::stream::StreamItem;
use iii_shell_files::fs::RequestIo;

use crate::{panic_reply, Executor};

/// Per-request stream state of one connection.
#[derive(Default)]
struct Streams {
    inbound: HashMap<u64, mpsc::Sender<StreamItem>>,
    credits: HashMap<u64, Arc<Semaphore>>,
}

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// The uid of the process at the other end of a Unix socket (SO_PEERCRED).
pub fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let cred =
        nix::sys::socket::getsockopt(&stream.as_fd(), nix::sys::socket::sockopt::PeerCredentials)
            .map_err(std::io::Error::from)?;
    Ok(cred.uid())
}

/// Checks the peer's uid against the one the executor was told to expect.
pub fn check_peer(stream: &UnixStream, expected_uid: u32) -> Result<(), String> {
    match peer_uid(stream) {
        Ok(uid) if uid == expected_uid => Ok(()),
        Ok(uid) => Err(format!(
            "peer uid {uid} is not the expected broker uid {expected_uid}"
        )),
        Err(e) => Err(format!("cannot read peer credentials: {e}")),
    }
}

/// The refusal text for a version mismatch; both sides log it.
pub fn version_mismatch(ours: u32, theirs: u32) -> String {
    format!("protocol version mismatch: executor speaks {ours}, broker speaks {theirs}; run the broker and executor from the same iii-shell release")
}

/// Requests one connection may have in flight at once. Past it a request is refused (S216)
/// rather than queued: the read loop must keep reading, because the requests in flight need
/// their stream data, acknowledgements and cancels.
pub const MAX_IN_FLIGHT: usize = 4096;

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The id names a request still in flight on this connection.
    DuplicateId(u64),
    /// `max` requests are in flight already.
    TooMany { max: usize },
}

impl Refusal {
    pub fn to_wire(&self) -> WireError {
        match self {
            Refusal::DuplicateId(id) => WireError::new(
                Code::S210,
                format!("request id {id} is already in flight on this connection: refused, nothing was done (the broker numbers requests uniquely; a repeat is a bug in the peer)"),
            ),
            Refusal::TooMany { max } => WireError::new(
                Code::S216,
                format!("the executor already has {max} requests in flight on this connection: refused, nothing was done; retry when some have finished"),
            ),
        }
    }
}

/// Whether a request with `id` may start: never under an id still in flight (the first one
/// keeps its cancel handle and its reply), and only while a slot is free.
pub fn admit(id_in_flight: bool, id: u64, slot_free: bool, max: usize) -> Result<(), Refusal> {
    if id_in_flight {
        return Err(Refusal::DuplicateId(id));
    }
    if !slot_free {
        return Err(Refusal::TooMany { max });
    }
    Ok(())
}

/// Serves one broker connection until it closes. Never panics on bad input: a malformed or
/// oversized frame is logged and closes the connection.
pub async fn serve_connection(exec: Arc<Executor>, stream: UnixStream) {
    serve_connection_limited(exec, stream, MAX_IN_FLIGHT).await
}

/// [`serve_connection`] with at most `max_in_flight` requests in flight.
pub async fn serve_connection_limited(
    exec: Arc<Executor>,
    stream: UnixStream,
    max_in_flight: usize,
) {
    let (rd, mut wr) = stream.into_split();
    let mut rd = tokio::io::BufReader::with_capacity(iii_shell_protocol::frame::READ_BUFFER, rd);
    // From here on the write half is shared by the writer task and direct replies.
    match tokio::time::timeout(HELLO_TIMEOUT, read_frame::<_, ClientFrame>(&mut rd)).await {
        Ok(Ok(ClientFrame::Hello(Hello { magic, version }))) if magic == MAGIC => {
            if version != PROTOCOL_VERSION {
                let reason = version_mismatch(PROTOCOL_VERSION, version);
                tracing::error!("{reason}");
                let _ = write_frame(&mut wr, &ServerFrame::Refused { reason }).await;
                return;
            }
        }
        Ok(Ok(_)) => {
            tracing::warn!("connection refused: the first frame was not a hello");
            let _ = write_frame(
                &mut wr,
                &ServerFrame::Refused {
                    reason: "expected hello".into(),
                },
            )
            .await;
            return;
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "connection closed during handshake");
            return;
        }
        Err(_) => {
            tracing::warn!("connection closed: no hello within {HELLO_TIMEOUT:?}");
            return;
        }
    }
    if write_frame(
        &mut wr,
        &ServerFrame::HelloAck {
            version: PROTOCOL_VERSION,
            pid: std::process::id(),
        },
    )
    .await
    .is_err()
    {
        return;
    }

    let wr: SharedWriter = Arc::new(tokio::sync::Mutex::new(wr));
    let (tx, mut rx) = mpsc::channel::<ServerFrame>(256);
    let mut events = exec.events.subscribe();
    let writer_half = wr.clone();
    let relay = exec.log_relay.clone();
    let writer = tokio::spawn(async move {
        loop {
            let frame = tokio::select! {
                f = rx.recv() => match f { Some(f) => f, None => break },
                // The executor's WARN and ERROR events, for the broker to ship (telemetry on).
                _ = relay.ready() => {
                    let logs = relay.take();
                    if logs.is_empty() {
                        continue;
                    }
                    ServerFrame::Logs(logs)
                }
                ev = events.recv() => match ev {
                    Ok(ev) => ServerFrame::Event(ev),
                    // Never a silent gap: the broker tells every change-feed binding.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::error!(lost = n, "events to the broker fell behind and {n} were dropped; change-feed subscribers get an overflow signal");
                        ServerFrame::Event(iii_shell_protocol::messages::Event::EventsLost { count: n })
                    }
                    Err(_) => break,
                },
            };
            match send_queued(&writer_half, &frame).await {
                Ok(()) => {}
                // Nothing was written: drop that frame, keep the connection.
                Err(FrameError::TooLarge(n)) => {
                    tracing::warn!(
                        bytes = n,
                        "a frame to the broker exceeded the frame limit; dropped it"
                    )
                }
                Err(e) => {
                    tracing::warn!(error = %e, "write to broker failed");
                    break;
                }
            }
        }
    });

    let inflight: Arc<Mutex<HashMap<u64, Arc<Notify>>>> = Arc::default();
    let streams: Arc<Mutex<Streams>> = Arc::default();
    let slots = Arc::new(Semaphore::new(max_in_flight));
    let staging = iii_shell_files::fs::staging::Staging::default();
    loop {
        match read_frame::<_, ClientFrame>(&mut rd).await {
            Ok(ClientFrame::Request { id, request, trace }) => {
                let cancel = Arc::new(Notify::new());
                let admitted = {
                    let mut m = lock(&inflight);
                    let permit = slots.clone().try_acquire_owned().ok();
                    match admit(m.contains_key(&id), id, permit.is_some(), max_in_flight) {
                        Ok(()) => {
                            m.insert(id, cancel.clone());
                            Ok(permit)
                        }
                        Err(refusal) => Err(refusal),
                    }
                };
                let permit = match admitted {
                    Ok(permit) => permit,
                    Err(refusal) => {
                        tracing::warn!(
                            id,
                            kind = request.kind(),
                            "request refused: {}",
                            refusal.to_wire().message
                        );
                        let result = Err(refusal.to_wire());
                        reply(&wr, &tx, ServerFrame::Reply { id, result }).await;
                        continue;
                    }
                };
                let credits = Arc::new(Semaphore::new(STREAM_WINDOW));
                let inbound = if matches!(
                    request.fs_op(),
                    Some(FsOp::WriteStream { .. } | FsOp::WriteStage { .. })
                ) {
                    let (stx, srx) = mpsc::channel(STREAM_WINDOW + 2);
                    lock(&streams).inbound.insert(id, stx);
                    Some(srx)
                } else {
                    None
                };
                lock(&streams).credits.insert(id, credits.clone());
                let mut io = RequestIo {
                    id,
                    inbound,
                    out: tx.clone(),
                    credits,
                    staging: staging.clone(),
                };
                let (exec, tx, inflight, streams, wr) = (
                    exec.clone(),
                    tx.clone(),
                    inflight.clone(),
                    streams.clone(),
                    wr.clone(),
                );
                let received = std::time::Instant::now();
                // A request that carries a trace context records its spans.
                let traced = iii_shell_protocol::call_trace::begin(trace, request.kind());
                tokio::spawn(async move {
                    let kind = request.kind();
                    let coder = panic_reply::is_coder(&request);
                    let queued_us = received.elapsed().as_micros() as u64;
                    // A panicking handler is answered like a failed one, and the id is freed
                    // below as after any reply: no caller waits for an answer that never comes.
                    let recorder = traced.as_ref().map(|t| t.recorder.clone());
                    // Inside the request's trace, so its log lines (the panic's too) join it.
                    let (result, cont) = iii_shell_protocol::call_trace::scope(recorder, async {
                        let handled = panic_reply::caught(async {
                            if panic_reply::injected_fault(&request) {
                                panic!("injected test fault");
                            }
                            exec.handle(request, cancel, &mut io).await
                        })
                        .await;
                        handled.unwrap_or_else(|panic| {
                            tracing::error!(
                                id,
                                kind,
                                panic = %panic,
                                "request handler panicked: this is a bug in iii-shell, please report it with this line; the call got an internal error and the executor goes on serving"
                            );
                            (Err(panic_reply::internal_error(id, kind, coder)), None)
                        })
                    })
                    .await;
                    if let Err(e) = &result {
                        tracing::debug!(id, kind, code = %e.code, "request failed: {}", e.message);
                    }
                    let spans = traced.map(|mut t| {
                        if let Err(e) = &result {
                            t.span.fail(e.code.as_str());
                        }
                        drop(t.span);
                        t.recorder.take()
                    });
                    reply(&wr, &tx, ServerFrame::Reply { id, result }).await;
                    // After the reply, and never waiting: spans are dropped when the writer
                    // is backed up.
                    if let Some(spans) = spans.filter(|s| !s.is_empty()) {
                        let _ = tx.try_send(ServerFrame::Spans(spans));
                    }
                    tracing::trace!(
                        id,
                        kind,
                        queued_us,
                        replied_us = received.elapsed().as_micros() as u64,
                        "request served"
                    );
                    if let Some(cont) = cont {
                        if let Err(panic) = panic_reply::caught(cont).await {
                            tracing::error!(
                                id,
                                kind,
                                panic = %panic,
                                "the work after a reply panicked: this is a bug in iii-shell, please report it with this line; the executor goes on serving"
                            );
                        }
                    }
                    lock(&inflight).remove(&id);
                    let mut st = lock(&streams);
                    st.inbound.remove(&id);
                    st.credits.remove(&id);
                    drop(st);
                    drop(permit);
                });
            }
            Ok(ClientFrame::StreamData { id, data }) => {
                let sender = lock(&streams).inbound.get(&id).cloned();
                if let Some(s) = sender {
                    if s.try_send(StreamItem::Data(data)).is_err() {
                        tracing::warn!(
                            id,
                            "broker overran the stream window; aborting that stream"
                        );
                        lock(&streams).inbound.remove(&id);
                    }
                }
            }
            Ok(ClientFrame::StreamEnd { id, error }) => {
                let sender = lock(&streams).inbound.remove(&id);
                if let Some(s) = sender {
                    let _ = s.try_send(StreamItem::End(error));
                }
            }
            Ok(ClientFrame::StreamAck { id }) => {
                if let Some(c) = lock(&streams).credits.get(&id) {
                    c.add_permits(1);
                }
            }
            Ok(ClientFrame::Cancel { id }) => {
                if let Some(n) = inflight.lock().ok().and_then(|m| m.get(&id).cloned()) {
                    n.notify_one();
                }
            }
            Ok(ClientFrame::Hello(_)) => {
                tracing::warn!("unexpected second hello; closing the connection");
                break;
            }
            Err(FrameError::Closed) => {
                tracing::debug!("broker closed the connection");
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, "bad frame from broker; closing the connection");
                break;
            }
        }
    }
    // The broker is gone: stop every foreground call it was waiting for, and every stream.
    if let Ok(m) = inflight.lock() {
        for n in m.values() {
            n.notify_one();
        }
    }
    {
        let mut st = lock(&streams);
        st.inbound.clear();
        for c in st.credits.values() {
            c.close();
        }
    }
    // Staged batches belong to this connection: their unnamed temp files go with them.
    iii_shell_files::fs::staging::clear(&staging);
    // Watchers serve the broker that asked for them; a reconnecting broker starts them again.
    exec.watches.clear();
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
}

/// Sends a reply: written directly when the socket is free (no hop through the writer task),
/// queued for the writer task otherwise.
async fn reply(wr: &SharedWriter, tx: &mpsc::Sender<ServerFrame>, frame: ServerFrame) {
    let frame = match encode(&frame) {
        Ok(bytes) => match send_now(wr, bytes) {
            Ok(Sent::Done) => return,
            Ok(Sent::Busy) => frame,
            Err(e) => {
                tracing::warn!(error = %e, "write to broker failed");
                return;
            }
        },
        Err(e) => oversized_reply(frame, &e),
    };
    let _ = tx.send(frame).await;
}

/// The last line of defence behind the reply budgets: a reply that cannot be encoded (over
/// the frame limit) is answered with an S218 error for the same id, so the call returns
/// instead of waiting forever.
fn oversized_reply(frame: ServerFrame, e: &FrameError) -> ServerFrame {
    let ServerFrame::Reply { id, .. } = frame else {
        return frame;
    };
    tracing::warn!(id, error = %e, "reply too large for a frame; answering S218 instead");
    ServerFrame::Reply {
        id,
        result: Err(iii_shell_protocol::WireError::new(
            iii_shell_protocol::Code::S218,
            format!("the reply is too large to send ({e}); narrow the request (a smaller max_matches, a narrower path or glob)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iii_shell_protocol::fs::{FsReply, LsResponse};
    use iii_shell_protocol::messages::Reply;

    #[test]
    fn admission_cases() {
        let cases = [
            (false, 1, true, Ok(())),
            (true, 7, true, Err(Refusal::DuplicateId(7))),
            (true, 7, false, Err(Refusal::DuplicateId(7))),
            (false, 8, false, Err(Refusal::TooMany { max: 4 })),
        ];
        for (in_flight, id, free, want) in cases {
            assert_eq!(
                admit(in_flight, id, free, 4),
                want,
                "{in_flight} {id} {free}"
            );
        }
        assert_eq!(Refusal::DuplicateId(7).to_wire().code, "S210");
        assert_eq!(Refusal::TooMany { max: 4 }.to_wire().code, "S216");
        assert!(Refusal::TooMany { max: 4 }
            .to_wire()
            .message
            .starts_with("the executor already has 4 requests in flight"));
    }

    #[test]
    fn an_oversized_reply_becomes_an_s218_error_for_the_same_id() {
        let big = LsResponse {
            entries: (0..200_000)
                .map(|i| iii_shell_protocol::fs::FsEntry {
                    name: format!("{i:0>250}"),
                    is_dir: false,
                    is_symlink: false,
                    mode: "0644".into(),
                    size: 0,
                    mtime: 0,
                })
                .collect(),
        };
        let frame = ServerFrame::Reply {
            id: 7,
            result: Ok(Reply::Fs(FsReply::Ls(big))),
        };
        let e = encode(&frame).unwrap_err();
        let small = oversized_reply(frame, &e);
        match &small {
            ServerFrame::Reply {
                id: 7,
                result: Err(w),
            } => {
                assert_eq!(w.code, "S218");
                assert!(w.message.contains("too large"), "{w:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(encode(&small).is_ok());
    }
}
