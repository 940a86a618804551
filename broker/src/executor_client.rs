//! The broker's end of the executor socket: handshake, multiplexed calls, pushed events.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use iii_shell_protocol::frame::{encode, read_frame, write_frame, FrameError};
use iii_shell_protocol::messages::{
    ClientFrame, Event, Hello, Reply, Request, ServerFrame, MAGIC, STREAM_WINDOW,
};
use iii_shell_protocol::sink::{send_now, send_queued, Sent, SharedWriter};
use iii_shell_protocol::{Code, WireError, PROTOCOL_VERSION};
use tokio::net::UnixStream;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::call_deadline::{no_answer, CallBounds};
use crate::pending_calls::PendingCalls;

type Pending = PendingCalls;

/// What became of one request sent to one executor.
pub enum Attempt {
    /// The executor answered, or the call failed after its request may have reached it.
    Answered(Result<Reply, WireError>),
    /// The connection had ended before a byte of the request was written: no executor saw
    /// it, so it may go to the next one.
    Unsent(Request),
}

/// Why a request was not sent.
enum NotSent {
    /// The connection is gone; the request comes back untouched.
    Gone(Request),
    /// Refused before writing (too large to encode): the call's answer.
    Refused(WireError),
}

/// Per-request stream routing: chunks of the executor's output, and credits for our input.
#[derive(Default)]
struct StreamRoutes {
    output: HashMap<u64, mpsc::UnboundedSender<StreamChunk>>,
    credits: HashMap<u64, Arc<tokio::sync::Semaphore>>,
}

type Routes = Arc<Mutex<StreamRoutes>>;

/// One item of an executor output stream.
#[derive(Debug)]
pub enum StreamChunk {
    Data(Vec<u8>),
    End(Option<String>),
}

/// The executor's output stream of one request (a streamed read). Each chunk taken is
/// acknowledged, which lets the executor send one more.
pub struct OutputStream {
    id: u64,
    rx: mpsc::UnboundedReceiver<StreamChunk>,
    tx: mpsc::Sender<ClientFrame>,
    routes: Routes,
    done: bool,
    /// The longest wait for the next chunk.
    idle: Duration,
}

impl OutputStream {
    /// The next chunk; `None` at a clean end, `Some(Err)` when reading failed midway.
    pub async fn next(&mut self) -> Option<Result<Vec<u8>, String>> {
        if self.done {
            return None;
        }
        let next = match tokio::time::timeout(self.idle, self.rx.recv()).await {
            Ok(next) => next,
            Err(_) => {
                self.done = true;
                // Dropped with `done`: cancel the executor's side here.
                let _ = self.tx.try_send(ClientFrame::Cancel { id: self.id });
                return Some(Err(format!(
                    "the executor sent no stream data within {} ms",
                    self.idle.as_millis()
                )));
            }
        };
        match next {
            Some(StreamChunk::Data(d)) => {
                let _ = self.tx.send(ClientFrame::StreamAck { id: self.id }).await;
                Some(Ok(d))
            }
            Some(StreamChunk::End(None)) => {
                self.done = true;
                None
            }
            Some(StreamChunk::End(Some(e))) => {
                self.done = true;
                Some(Err(e))
            }
            None => {
                self.done = true;
                Some(Err("the executor went away mid-stream".into()))
            }
        }
    }
}

impl Drop for OutputStream {
    fn drop(&mut self) {
        if let Ok(mut r) = self.routes.lock() {
            r.output.remove(&self.id);
        }
        if !self.done {
            // Abandoned by the consumer: stop the executor's side.
            let _ = self.tx.try_send(ClientFrame::Cancel { id: self.id });
        }
    }
}

/// A live, handshaken connection to an executor. Cheap to clone.
#[derive(Clone)]
pub struct ExecutorClient {
    tx: mpsc::Sender<ClientFrame>,
    /// The socket's write half, for requests written without a hop through the writer task.
    wr: SharedWriter,
    pending: Pending,
    next_id: Arc<AtomicU64>,
    events: broadcast::Sender<Event>,
    closed: watch::Receiver<bool>,
    routes: Routes,
    /// Where terminal-session output goes (see [`ExecutorClient::pty_events`]).
    pty: PtyRoute,
    /// The executor's pid, from its handshake.
    pub pid: u32,
    /// How long each call may wait for its answer.
    bounds: CallBounds,
}

type PtyRoute = Arc<Mutex<Option<mpsc::UnboundedSender<iii_shell_protocol::pty::PtyEvent>>>>;

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
        let (rd, mut wr) = stream.into_split();
        let mut rd =
            tokio::io::BufReader::with_capacity(iii_shell_protocol::frame::READ_BUFFER, rd);
        let hello = ClientFrame::Hello(Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
        });
        write_frame(&mut wr, &hello)
            .await
            .map_err(|e| ConnectError::Handshake(e.to_string()))?;
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

        let wr: SharedWriter = Arc::new(tokio::sync::Mutex::new(wr));
        let writer_half = wr.clone();
        let (tx, mut rx) = mpsc::channel::<ClientFrame>(256);
        let pending: Pending = PendingCalls::default();
        let (events, _) = broadcast::channel(1024);
        let (closed_tx, closed) = watch::channel(false);

        let pending_w = pending.clone();
        tokio::spawn(async move {
            while let Some(frame) = rx.recv().await {
                match send_queued(&writer_half, &frame).await {
                    Ok(()) => {}
                    // Refused while encoding, before a byte was written: the connection is
                    // intact, so fail that one request instead of every call in flight.
                    Err(iii_shell_protocol::frame::FrameError::TooLarge(n)) => {
                        tracing::warn!(
                            bytes = n,
                            "a frame for the executor is over the size limit; failing that request"
                        );
                        if let ClientFrame::Request { id, .. } = &frame {
                            if let Some(w) = pending_w.take(*id) {
                                let _ = w.send(Err(WireError::new(
                                    Code::S216,
                                    format!("request of {n} bytes exceeds the executor socket's frame limit"),
                                )));
                            }
                        }
                    }
                    Err(e) => {
                        // The executor is gone: every call in flight is answered now (the
                        // frames still queued behind this one included), and no new one is
                        // registered on this connection.
                        tracing::warn!(error = %e, "write to executor failed; its calls in flight fail with S216 and new calls wait for the next executor");
                        pending_w.close(executor_lost);
                        break;
                    }
                }
            }
        });
        let routes: Routes = Arc::default();
        let pty: PtyRoute = Arc::default();
        let (p, ev, rt, pty_r) = (pending.clone(), events.clone(), routes.clone(), pty.clone());
        tokio::spawn(async move {
            loop {
                match read_frame::<_, ServerFrame>(&mut rd).await {
                    Ok(ServerFrame::Reply { id, result }) => {
                        if let Some(w) = p.take(id) {
                            let _ = w.send(result);
                        }
                    }
                    // Session output is never broadcast (a lagging receiver would lose it): it
                    // goes to the one consumer, whose backlog the executor's window bounds.
                    Ok(ServerFrame::Event(Event::Pty(e))) => {
                        if let Some(tx) = pty_r.lock().ok().and_then(|g| g.clone()) {
                            let _ = tx.send(e);
                        }
                    }
                    Ok(ServerFrame::Event(e)) => {
                        let _ = ev.send(e);
                    }
                    Ok(ServerFrame::StreamData { id, data }) => {
                        if let Some(out) = rt.lock().ok().and_then(|r| r.output.get(&id).cloned()) {
                            let _ = out.send(StreamChunk::Data(data));
                        }
                    }
                    Ok(ServerFrame::StreamEnd { id, error }) => {
                        if let Some(out) = rt.lock().ok().and_then(|mut r| r.output.remove(&id)) {
                            let _ = out.send(StreamChunk::End(error));
                        }
                    }
                    Ok(ServerFrame::StreamAck { id }) => {
                        if let Some(c) = rt.lock().ok().and_then(|r| r.credits.get(&id).cloned()) {
                            c.add_permits(1);
                        }
                    }
                    Ok(ServerFrame::Spans(spans)) => {
                        if let Some(hub) = crate::telemetry::active() {
                            hub.emit_executor_spans(spans);
                        }
                    }
                    Ok(ServerFrame::Logs(logs)) => {
                        if let Some(hub) = crate::telemetry::active() {
                            hub.relay_executor_logs(logs);
                        }
                    }
                    Ok(other) => tracing::warn!(?other, "unexpected frame from executor"),
                    Err(iii_shell_protocol::frame::FrameError::Closed) => {
                        tracing::debug!("executor connection closed");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "executor connection ended");
                        break;
                    }
                }
            }
            if let Ok(mut r) = rt.lock() {
                r.output.clear();
                for c in r.credits.values() {
                    c.close();
                }
            }
            p.close(executor_lost);
            if let Ok(mut g) = pty_r.lock() {
                g.take();
            }
            let _ = closed_tx.send(true);
        });
        Ok(ExecutorClient {
            tx,
            wr,
            pending,
            next_id: Arc::new(AtomicU64::new(1)),
            events,
            closed,
            routes,
            pty,
            pid,
            bounds: CallBounds::DEFAULT,
        })
    }

    /// This client with other call deadlines.
    pub fn with_bounds(mut self, bounds: CallBounds) -> ExecutorClient {
        self.bounds = bounds;
        self
    }

    /// Sends a request and waits for its reply. Dropping the future cancels the request on
    /// the executor (a foreground command is killed).
    pub async fn call(&self, request: Request) -> Result<Reply, WireError> {
        match self.attempt(request, None).await {
            Attempt::Answered(result) => result,
            Attempt::Unsent(_) => Err(executor_lost()),
        }
    }

    /// Sends `request` and waits for its answer until its deadline, or until `until` when
    /// that comes first. A request that never left (the connection had ended) comes back as
    /// [`Attempt::Unsent`].
    pub async fn attempt(&self, request: Request, until: Option<Instant>) -> Attempt {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.attempt_with_id(id, request, until).await
    }

    /// The deadlines of this client's calls.
    pub fn bounds(&self) -> CallBounds {
        self.bounds
    }

    async fn attempt_with_id(&self, id: u64, request: Request, until: Option<Instant>) -> Attempt {
        let kind = request.kind();
        let bound = self.bounds.deadline(&request);
        let due = match (bound, until) {
            (Some(b), Some(u)) => Some(u.min(Instant::now() + b)),
            (Some(b), None) => Some(Instant::now() + b),
            (None, u) => u,
        };
        // Inside a traced call: this round trip's span, whose context the request carries.
        let trip = crate::telemetry::call_span::round_trip(kind);
        let trace = trip.as_ref().and_then(|t| t.context);
        let call = async {
            let (rx, guard) = match self.send_request(id, request, trace).await {
                Ok(sent) => sent,
                Err(NotSent::Gone(request)) => return Attempt::Unsent(request),
                Err(NotSent::Refused(e)) => return Attempt::Answered(Err(e)),
            };
            let result = rx.await.unwrap_or_else(|_| Err(executor_lost()));
            guard.disarm();
            Attempt::Answered(result)
        };
        let attempt = match due {
            // Past the deadline the future is dropped, and with it the guard that cancels
            // the request on the executor.
            Some(due) => tokio::time::timeout_at(due, call).await.unwrap_or_else(|_| {
                let bound = bound.unwrap_or_default();
                tracing::warn!(
                    id,
                    kind,
                    bound_ms = bound.as_millis() as u64,
                    "the executor did not answer in time; the call failed with S216. Check that the executor process runs (not stopped or wedged)"
                );
                Attempt::Answered(Err(no_answer(kind, bound)))
            }),
            None => call.await,
        };
        if let Some(t) = trip {
            match &attempt {
                Attempt::Answered(result) => t.finish(result),
                Attempt::Unsent(_) => t.finish::<Reply>(&Err(executor_lost())),
            }
        }
        attempt
    }

    async fn call_with_id(&self, id: u64, request: Request) -> Result<Reply, WireError> {
        match self.attempt_with_id(id, request, None).await {
            Attempt::Answered(result) => result,
            Attempt::Unsent(_) => Err(executor_lost()),
        }
    }

    /// Registers the waiter of `id` and queues its request frame. The guard cancels the
    /// request if it is dropped before being disarmed. A request that cannot be written
    /// because the connection ended comes back ([`NotSent::Gone`]).
    async fn send_request(
        &self,
        id: u64,
        request: Request,
        trace: Option<iii_shell_protocol::trace::TraceContext>,
    ) -> Result<(oneshot::Receiver<Result<Reply, WireError>>, CancelOnDrop), NotSent> {
        if self.is_closed() {
            return Err(NotSent::Gone(request));
        }
        let (tx, rx) = oneshot::channel();
        if !self.pending.register(id, tx) {
            return Err(NotSent::Gone(request));
        }
        let guard = CancelOnDrop {
            id,
            tx: self.tx.clone(),
            pending: self.pending.clone(),
            armed: true,
        };
        let frame = ClientFrame::Request { id, request, trace };
        let bytes = match encode(&frame) {
            Ok(b) => b,
            Err(e) => {
                guard.disarm_quietly();
                return Err(NotSent::Refused(refused_frame(e)));
            }
        };
        let unsent = match send_now(&self.wr, bytes) {
            Ok(Sent::Done) => None,
            Ok(Sent::Busy) => self.tx.send(frame).await.err().map(|e| e.0),
            Err(e) => {
                // Nothing of the frame was written: the executor never saw it.
                tracing::warn!(error = %e, "write to executor failed; the call goes to the next executor");
                self.pending.close(executor_lost);
                Some(frame)
            }
        };
        match unsent {
            None => Ok((rx, guard)),
            Some(frame) => {
                guard.disarm_quietly();
                match frame {
                    ClientFrame::Request { request, .. } => Err(NotSent::Gone(request)),
                    _ => Err(NotSent::Refused(executor_lost())),
                }
            }
        }
    }

    /// Sends a request whose reply is followed by an output stream (a streamed read).
    pub async fn call_with_output(
        &self,
        request: Request,
    ) -> Result<(Reply, OutputStream), WireError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (otx, orx) = mpsc::unbounded_channel();
        if let Ok(mut r) = self.routes.lock() {
            r.output.insert(id, otx);
        }
        let stream = OutputStream {
            id,
            rx: orx,
            tx: self.tx.clone(),
            routes: self.routes.clone(),
            done: false,
            idle: self.bounds.fixed,
        };
        let reply = self.call_with_id(id, request).await?;
        Ok((reply, stream))
    }

    /// Sends a request and then its input stream (a streamed write), at most
    /// [`STREAM_WINDOW`] unacknowledged chunks at a time. `input` yields chunks, `Err` when
    /// the source failed, and ends (None) at a clean close.
    pub async fn call_with_input(
        &self,
        request: Request,
        mut input: mpsc::Receiver<Result<Vec<u8>, String>>,
    ) -> Result<Reply, WireError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let credits = Arc::new(tokio::sync::Semaphore::new(STREAM_WINDOW));
        if let Ok(mut r) = self.routes.lock() {
            r.credits.insert(id, credits.clone());
        }
        let tx = self.tx.clone();
        let idle = self.bounds.fixed;
        let kind = request.kind();
        // Ends with `true` when the executor stopped taking the stream (no credit in time).
        let pump = async move {
            loop {
                let permit = match tokio::time::timeout(idle, credits.acquire()).await {
                    Ok(Ok(permit)) => permit,
                    Ok(Err(_)) => return false,
                    Err(_) => return true,
                };
                permit.forget();
                let frame = match input.recv().await {
                    Some(Ok(data)) => ClientFrame::StreamData { id, data },
                    Some(Err(e)) => ClientFrame::StreamEnd { id, error: Some(e) },
                    None => ClientFrame::StreamEnd { id, error: None },
                };
                let end = matches!(frame, ClientFrame::StreamEnd { .. });
                if tx.send(frame).await.is_err() || end {
                    return false;
                }
            }
        };
        // The request frame must be queued before the first chunk of its stream: the executor
        // drops chunks for an id it does not know yet, and the lost credits would stall the
        // stream until its idle limit.
        let trip = crate::telemetry::call_span::round_trip(kind);
        let trace = trip.as_ref().and_then(|t| t.context);
        let (rx, guard) = match self.send_request(id, request, trace).await {
            Ok(started) => started,
            Err(e) => {
                if let Ok(mut r) = self.routes.lock() {
                    r.credits.remove(&id);
                }
                return Err(match e {
                    NotSent::Gone(_) => executor_lost(),
                    NotSent::Refused(e) => e,
                });
            }
        };
        let call = async move { rx.await.unwrap_or_else(|_| Err(executor_lost())) };
        tokio::pin!(call);
        tokio::pin!(pump);
        let mut pumping = true;
        // Once the whole input is sent, the answer is due within the fixed bound.
        let answer_due = tokio::time::sleep(Duration::MAX);
        tokio::pin!(answer_due);
        let (result, timed_out) = loop {
            tokio::select! {
                r = &mut call => break (r, false),
                stalled = &mut pump, if pumping => {
                    if stalled {
                        break (Err(no_answer(kind, idle)), true);
                    }
                    pumping = false;
                    answer_due.as_mut().reset(tokio::time::Instant::now() + idle);
                }
                _ = &mut answer_due, if !pumping => break (Err(no_answer(kind, idle)), true),
            }
        };
        if timed_out {
            tracing::warn!(
                id,
                kind,
                "the executor did not take or answer a streamed request in time; the call failed with S216. Check that the executor process runs (not stopped or wedged)"
            );
            // Dropping the armed guard cancels the request on the executor.
            drop(guard);
        } else {
            guard.disarm();
        }
        if let Ok(mut r) = self.routes.lock() {
            r.credits.remove(&id);
        }
        if let Some(t) = trip {
            t.finish(&result);
        }
        result
    }

    /// Terminal-session output pushed by the executor, from now on (a second call takes the
    /// stream over). Ends when the connection does.
    pub fn pty_events(&self) -> mpsc::UnboundedReceiver<iii_shell_protocol::pty::PtyEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        if let Ok(mut g) = self.pty.lock() {
            *g = Some(tx);
        }
        rx
    }

    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// The connection has ended (the reader saw it close, or a write failed).
    pub fn is_closed(&self) -> bool {
        *self.closed.borrow() || self.pending.is_closed()
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

    /// For a request that was never sent: forget its waiter, send no cancel.
    fn disarm_quietly(mut self) {
        self.pending.take(self.id);
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.pending.take(self.id);
            let _ = self.tx.try_send(ClientFrame::Cancel { id: self.id });
        }
    }
}

/// The answer of a request refused while encoding, before a byte was written.
fn refused_frame(e: FrameError) -> WireError {
    match e {
        FrameError::TooLarge(n) => {
            tracing::warn!(
                bytes = n,
                "a frame for the executor is over the size limit; failing that request"
            );
            WireError::new(
                Code::S216,
                format!("request of {n} bytes exceeds the executor socket's frame limit"),
            )
        }
        other => WireError::new(Code::S216, format!("cannot encode the request: {other}")),
    }
}
