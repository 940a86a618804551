//! Delivering terminal-session output to each session's output function through the engine.
//!
//! The executor pushes each attached session's output ([`PtyEvent::Output`], coalesced, at
//! most its window ahead of our acknowledgements). Here every session has a *lane*: output
//! that arrives while an invocation is in flight is coalesced into the next one (up to
//! [`DELIVERY_BYTES`]), so a slow engine or consumer gets fewer, larger frames. A lane invokes
//! one frame at a time, in order, and acknowledges it to the executor once the invocation
//! returned; while one is in flight it takes the next and encodes it, so the engine never
//! waits for us between two. Invocations are built as text ([`EngineLink::prepare_call`]): the
//! base64 is written once, straight into the frame.
//!
//! Bulk deliveries of all sessions take turns ([`BULK_IN_FLIGHT`]), so a keystroke's echo in
//! one session never waits behind several floods at each hop; small ones
//! ([`INTERACTIVE_BYTES`]) do not wait at all, and a consumer that does not answer gives its
//! turn back after [`BULK_PATIENCE`].
//!
//! Payload of each invocation (the shape the original console page reads):
//! `{session_id, sequence, data: base64|null, eof, exit_code, signal, error, truncated}`;
//! `sequence` is the last frame included, `truncated` says frames before these were evicted
//! from the ring before they could be sent (replay with `attach` reports the same).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use iii_shell_policy::sync::lock;
use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::pty::{PtyEvent, PtyExit, PtyOp, DELIVERY_BYTES};
use serde_json::Value;

use crate::engine::{EngineLink, PreparedCall};
use crate::executor_client::ExecutorClient;
use crate::slots::{EngineSlot, ExecutorSlot};

/// Deliveries of one session in flight at once. Not more: the engine runs every invocation in
/// a task of its own, so two in flight can reach the page out of order, and a page drops a
/// delivery whose `sequence` is not above the last it applied.
pub const IN_FLIGHT: usize = 1;
/// How long one delivery may take before it counts as done (the consumer can replay what
/// it missed with `attach`).
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause before retrying a delivery the engine connection dropped.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long after an attachment starts an output function the engine does not know yet is
/// waited for, rather than taken for gone. A page registers its function and then opens (or
/// attaches) the session; the engine gives no answer to a registration, and a real engine
/// may apply it after it has routed the open, so the first deliveries can meet
/// `function_not_found` for a function that is about to exist.
const FIRST_DELIVERY_GRACE: Duration = Duration::from_secs(3);

/// Output waiting for one invocation.
#[derive(Debug, Clone, PartialEq)]
struct Batch {
    epoch: u64,
    target: String,
    last: u64,
    data: Vec<u8>,
    gap: bool,
    exit: Option<PtyExit>,
    /// A push repeated after a reconnect: delivered alone, with its original bounds.
    repeat: bool,
}

impl Batch {
    /// A later push of the same attachment joins this batch while the two fit one delivery
    /// ([`DELIVERY_BYTES`]); repeats always go alone.
    fn mergeable(&self, later: &Batch) -> bool {
        self.epoch == later.epoch
            && self.target == later.target
            && !self.repeat
            && !later.repeat
            && self.data.len() + later.data.len() <= DELIVERY_BYTES
    }

    /// Takes in a later push of the same attachment.
    fn absorb(&mut self, later: Batch) {
        self.last = later.last.max(self.last);
        self.data.extend_from_slice(&later.data);
        self.gap |= later.gap;
        if later.exit.is_some() {
            self.exit = later.exit;
        }
    }
}

#[derive(Default)]
struct LaneState {
    /// Pushes of older attachments are dropped (the session was detached or re-attached).
    floor: u64,
    /// Batches waiting, oldest first (only repeats keep their own entry).
    pending: std::collections::VecDeque<Batch>,
    running: bool,
    /// The newest `(epoch, sequence, with exit)` taken in: a push the executor repeats
    /// (after a reconnect, with the same bounds) is recognised by it and not delivered twice.
    seen: (u64, u64, bool),
    /// The attachment that started last and when, until one of its deliveries succeeded
    /// (see [`FIRST_DELIVERY_GRACE`]).
    fresh: Option<(u64, std::time::Instant)>,
}

pub struct Delivery {
    lanes: Mutex<HashMap<String, Arc<Mutex<LaneState>>>>,
    /// Bytes of bulk output in flight to consumers, over all sessions ([`BULK_IN_FLIGHT`]).
    bulk: tokio::sync::Semaphore,
    /// Where acknowledgements go.
    executor: Arc<ExecutorSlot>,
    /// Where output goes.
    engine: Arc<EngineSlot>,
}

impl Default for Delivery {
    fn default() -> Self {
        Delivery::new(Arc::default(), Arc::default())
    }
}

/// Bulk output in flight through the engine at once, over all sessions. Every delivery in
/// flight sits in front of a keystroke's echo at each hop (the broker's socket, the engine,
/// the page's socket), so floods in several sessions take turns: together they move as fast
/// as one (the engine is the bottleneck either way) and an echo waits behind one delivery at
/// most.
pub const BULK_IN_FLIGHT: usize = DELIVERY_BYTES;
/// How long a bulk delivery counts against [`BULK_IN_FLIGHT`] at most: one whose consumer
/// has not answered by then gives its share back, so a page that stops answering cannot hold
/// up other sessions' output (a delivery normally takes about a millisecond).
pub const BULK_PATIENCE: Duration = Duration::from_millis(100);
/// A delivery this small (an echo, a prompt, a line of output) never waits for bulk.
pub const INTERACTIVE_BYTES: usize = 16 * 1024;

/// The share of [`BULK_IN_FLIGHT`] a delivery of `bytes` takes: none when it is interactive.
fn bulk_permits(bytes: usize) -> u32 {
    if bytes <= INTERACTIVE_BYTES {
        0
    } else {
        bytes.min(BULK_IN_FLIGHT) as u32
    }
}

/// Appends the invocation payload for `batch` of `session_id` to `out`, as JSON text: the
/// base64 goes straight into the frame (its alphabet needs no escaping), so a delivery's bytes
/// are encoded once and copied by nothing but the socket.
fn write_payload(out: &mut String, session_id: &str, b: &Batch) {
    fn string_or_null(out: &mut String, v: Option<&str>) {
        match v {
            Some(v) => out.push_str(&Value::from(v).to_string()),
            None => out.push_str("null"),
        }
    }
    let exit = b.exit.as_ref();
    out.push_str(r#"{"session_id":"#);
    string_or_null(out, Some(session_id));
    out.push_str(r#","sequence":"#);
    out.push_str(&b.last.to_string());
    out.push_str(r#","data":"#);
    if b.data.is_empty() {
        out.push_str("null");
    } else {
        out.push('"');
        base64::engine::general_purpose::STANDARD.encode_string(&b.data, out);
        out.push('"');
    }
    out.push_str(r#","eof":"#);
    out.push_str(if exit.is_some() { "true" } else { "false" });
    out.push_str(r#","exit_code":"#);
    match exit.and_then(|e| e.exit_code) {
        Some(c) => out.push_str(&c.to_string()),
        None => out.push_str("null"),
    }
    out.push_str(r#","signal":"#);
    string_or_null(out, exit.and_then(|e| e.signal.as_deref()));
    out.push_str(r#","error":"#);
    string_or_null(out, exit.and_then(|e| e.error.as_deref()));
    out.push_str(r#","truncated":"#);
    out.push_str(if b.gap { "true" } else { "false" });
    out.push_str(r#","repeat":"#);
    out.push_str(if b.repeat { "true" } else { "false" });
    out.push('}');
}

/// The invocation of the output function carrying `batch`.
fn prepare(session_id: &str, batch: &Batch) -> PreparedCall {
    EngineLink::prepare_call(&batch.target, batch.data.len() / 3 * 4 + 256, |out| {
        write_payload(out, session_id, batch)
    })
}

/// Past this many lanes, a new one first drops the lanes of sessions whose exit was handed on
/// and that have nothing pending. A session that expires by retention sends no event, so
/// without this its lane would stay for the broker's lifetime and a caller opening and
/// abandoning sessions would grow the broker without bound. Lanes of live sessions are
/// bounded by `pty.max_sessions`, which the executor enforces.
const LANES_BEFORE_PRUNING: usize = 256;

impl Delivery {
    /// A delivery that sends output through `engine` and acknowledgements to `executor`.
    pub fn new(executor: Arc<ExecutorSlot>, engine: Arc<EngineSlot>) -> Delivery {
        Delivery {
            lanes: Mutex::default(),
            bulk: tokio::sync::Semaphore::new(BULK_IN_FLIGHT),
            executor,
            engine,
        }
    }

    fn lane(&self, id: &str) -> Arc<Mutex<LaneState>> {
        let mut lanes = lock(&self.lanes);
        if let Some(lane) = lanes.get(id) {
            return lane.clone();
        }
        if lanes.len() >= LANES_BEFORE_PRUNING {
            // Lock order: the map, then a lane (as in `remove`); no path takes them reversed.
            lanes.retain(|_, lane| {
                let l = lock(lane);
                l.running || !l.pending.is_empty() || !l.seen.2
            });
        }
        lanes.entry(id.to_string()).or_default().clone()
    }

    /// A new attachment `epoch` of `session_id` started: older output is not delivered.
    pub fn started(&self, session_id: &str, epoch: u64) {
        let lane = self.lane(session_id);
        let mut l = lock(&lane);
        l.floor = l.floor.max(epoch);
        let floor = l.floor;
        l.pending.retain(|p| p.epoch >= floor);
        l.fresh = Some((epoch, std::time::Instant::now()));
    }

    /// The session is gone.
    pub fn remove(&self, session_id: &str) {
        if let Some(lane) = lock(&self.lanes).remove(session_id) {
            let mut l = lock(&lane);
            l.pending.clear();
            l.floor = u64::MAX;
        }
    }

    fn on_event(self: &Arc<Self>, ev: PtyEvent) {
        let PtyEvent::Output {
            session_id,
            epoch,
            target,
            sequence,
            data,
            gap,
            exit,
            repeat,
            ..
        } = ev;
        let batch = Batch {
            epoch,
            target,
            last: sequence,
            data,
            gap,
            exit,
            repeat,
        };
        let lane = self.lane(&session_id);
        let spawn = {
            let mut l = lock(&lane);
            if epoch < l.floor {
                return;
            }
            let (e, seq, exited) = l.seen;
            if e == epoch && batch.last <= seq && (batch.exit.is_none() || exited) {
                return;
            }
            l.seen = (
                epoch,
                batch.last,
                batch.exit.is_some() || (e == epoch && exited),
            );
            l.floor = epoch;
            let floor = l.floor;
            l.pending.retain(|p| p.epoch >= floor);
            match l.pending.back_mut() {
                Some(p) if p.mergeable(&batch) => p.absorb(batch),
                _ => l.pending.push_back(batch),
            }
            !std::mem::replace(&mut l.running, true)
        };
        if spawn {
            tokio::spawn(run_lane(self.clone(), session_id, lane));
        }
    }
}

/// The next batch of a lane that is still current, or `None` (and the lane marked idle when
/// `last`) when nothing is pending.
fn next_batch(lane: &Mutex<LaneState>, last: bool) -> Option<Batch> {
    let mut l = lock(lane);
    let floor = l.floor;
    while let Some(b) = l.pending.pop_front() {
        if b.epoch >= floor {
            return Some(b);
        }
    }
    if last {
        l.running = false;
    }
    None
}

/// Delivers a lane's output, one invocation at a time and in order, until nothing is pending.
/// While one is in flight the next is taken and encoded, so the engine never waits for us
/// between two deliveries; what arrives after that is coalesced into the one after.
async fn run_lane(delivery: Arc<Delivery>, session_id: String, lane: Arc<Mutex<LaneState>>) {
    let mut ready: Option<(Batch, PreparedCall)> = None;
    loop {
        let (batch, call) = match ready.take() {
            Some((b, c)) if b.epoch >= lock(&lane).floor => (b, c),
            Some(_) => continue,
            None => match next_batch(&lane, true) {
                Some(b) => {
                    let c = prepare(&session_id, &b);
                    (b, c)
                }
                None => return,
            },
        };
        // Held until the answer or BULK_PATIENCE; the semaphore is never closed.
        let bulk = match bulk_permits(batch.data.len()) {
            0 => None,
            n => delivery.bulk.acquire_many(n).await.ok(),
        };
        if batch.epoch < lock(&lane).floor {
            // Re-attached (or gone) while it waited for its turn.
            continue;
        }
        let sent = loop {
            match delivery.engine.get() {
                Ok(link) => match link.send_prepared(&call) {
                    Some(sent) => break sent,
                    None => {
                        let _ = tokio::time::timeout(RETRY_PAUSE, link.connected()).await;
                    }
                },
                Err(_) => tokio::time::sleep(RETRY_PAUSE).await,
            }
        };
        let sent_at = std::time::Instant::now();
        if let Some(b) = next_batch(&lane, false) {
            let c = prepare(&session_id, &b);
            ready = Some((b, c));
        }
        let answer = sent.answer(DELIVERY_TIMEOUT);
        tokio::pin!(answer);
        let outcome = match bulk {
            Some(permit) => tokio::select! {
                r = &mut answer => r,
                _ = tokio::time::sleep(BULK_PATIENCE) => {
                    drop(permit);
                    answer.await
                }
            },
            None => answer.await,
        };
        tracing::trace!(session_id = %session_id, bytes = batch.data.len(), frame = call.len(), answered_us = sent_at.elapsed().as_micros() as u64, next_ready = ready.is_some(), "pty output delivered");
        // Undelivered: it goes back in front of the one taken meanwhile, which goes back too.
        let put_back = |batch: Batch, ready: &mut Option<(Batch, PreparedCall)>| {
            if let Some((b, _)) = ready.take() {
                requeue(&lane, b);
            }
            requeue(&lane, batch);
        };
        match outcome {
            Ok(_) => {
                lock(&lane).fresh = None;
            }
            Err(e) if e.code == "function_not_found" && young(&lane, batch.epoch) => {
                // The page's function may not be registered yet: wait for it, in order.
                put_back(batch, &mut ready);
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
            Err(e) if e.code == "function_not_found" => {
                tracing::info!(session_id = %session_id, target = %batch.target, "pty output function is gone; detaching the session");
                {
                    let mut l = lock(&lane);
                    l.floor = l.floor.max(batch.epoch + 1);
                    let floor = l.floor;
                    l.pending.retain(|p| p.epoch >= floor);
                }
                send(
                    &delivery.executor,
                    PtyOp::TargetGone {
                        session_id: session_id.clone(),
                        epoch: batch.epoch,
                    },
                );
                continue;
            }
            Err(e) if e.code == "connection_lost" => {
                put_back(batch, &mut ready);
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
            Err(e) => {
                // The consumer answered with an error or not at all: counted as delivered
                // (re-sending could loop forever); it can replay with `attach`.
                tracing::debug!(session_id = %session_id, code = %e.code, "pty output delivery failed: {}", e.message);
            }
        }
        send(
            &delivery.executor,
            PtyOp::Ack {
                session_id: session_id.clone(),
                epoch: batch.epoch,
                sequence: batch.last,
                exit: batch.exit.is_some(),
            },
        );
    }
}

/// True while attachment `epoch` is within [`FIRST_DELIVERY_GRACE`] of its start and none of
/// its deliveries has succeeded yet.
fn young(lane: &Mutex<LaneState>, epoch: u64) -> bool {
    lock(lane)
        .fresh
        .is_some_and(|(e, at)| e == epoch && at.elapsed() < FIRST_DELIVERY_GRACE)
}

/// Puts an undelivered batch back in front of what arrived meanwhile (unless a newer
/// attachment made it obsolete).
fn requeue(lane: &Mutex<LaneState>, mut batch: Batch) {
    let mut l = lock(lane);
    if batch.epoch < l.floor {
        return;
    }
    match l.pending.front() {
        Some(later) if batch.mergeable(later) => {
            if let Some(later) = l.pending.pop_front() {
                batch.absorb(later);
            }
            l.pending.push_front(batch);
        }
        _ => l.pending.push_front(batch),
    }
}

/// Sends a session operation whose answer nobody waits for.
pub fn send(executor: &Arc<ExecutorSlot>, op: PtyOp) {
    let executor = executor.clone();
    tokio::spawn(async move {
        if let Err(e) = executor.call(Request::Pty(op)).await {
            tracing::debug!(code = %e.code, "pty notice to the executor failed: {}", e.message);
        }
    });
}

/// Makes `client` push session output to us, and delivers it.
pub fn subscribe(delivery: &Arc<Delivery>, client: &ExecutorClient) {
    let mut rx = client.pty_events();
    let delivery = delivery.clone();
    let client = client.clone();
    tokio::spawn(async move {
        match client.call(Request::PtySubscribe).await {
            Ok(Reply::Pty(_)) => {}
            Ok(_) => {
                tracing::error!("the executor does not serve terminal sessions (unexpected reply to subscribe); restart it from the same iii-shell release");
                return;
            }
            Err(e) => {
                tracing::warn!(code = %e.code, "subscribing to terminal output failed: {}", e.message);
                return;
            }
        }
        while let Some(ev) = rx.recv().await {
            delivery.on_event(ev);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b(epoch: u64, last: u64, data: &[u8]) -> Batch {
        Batch {
            epoch,
            target: "t".into(),
            last,
            data: data.to_vec(),
            gap: false,
            exit: None,
            repeat: false,
        }
    }

    #[test]
    fn bulk_permits_by_size() {
        assert_eq!(bulk_permits(0), 0);
        assert_eq!(bulk_permits(INTERACTIVE_BYTES), 0);
        assert_eq!(bulk_permits(INTERACTIVE_BYTES + 1), 16 * 1024 + 1);
        assert_eq!(bulk_permits(DELIVERY_BYTES), 192 * 1024);
        // A repeat pushed with larger bounds takes the whole budget, not more.
        assert_eq!(bulk_permits(10 * DELIVERY_BYTES), 192 * 1024);
        assert_eq!(BULK_IN_FLIGHT, DELIVERY_BYTES);
    }

    #[test]
    fn lanes_of_finished_sessions_do_not_accumulate() {
        let d = Delivery::default();
        let live = d.lane("live");
        for i in 0..1000 {
            let lane = d.lane(&format!("s{i}"));
            lock(&lane).seen = (1, 1, true);
        }
        let n = lock(&d.lanes).len();
        assert!(n <= LANES_BEFORE_PRUNING + 1, "{n} lanes kept");
        // A session that has not exited keeps its lane, and so does one with output pending.
        assert!(Arc::ptr_eq(&live, &d.lane("live")));
        let busy = d.lane("busy");
        {
            let mut l = lock(&busy);
            l.seen = (1, 1, true);
            l.pending.push_back(b(1, 2, b"x"));
        }
        for i in 1000..1600 {
            let lane = d.lane(&format!("s{i}"));
            lock(&lane).seen = (1, 1, true);
        }
        assert!(Arc::ptr_eq(&busy, &d.lane("busy")));
        assert!(Arc::ptr_eq(&live, &d.lane("live")));
        assert!(lock(&d.lanes).len() <= LANES_BEFORE_PRUNING + 1);
    }

    #[test]
    fn batches_coalesce_in_order() {
        let mut a = b(1, 3, b"ab");
        let mut later = b(1, 5, b"cd");
        later.gap = true;
        later.exit = Some(PtyExit {
            exit_code: Some(3),
            signal: None,
            error: None,
        });
        a.absorb(later);
        assert_eq!(a.last, 5);
        assert_eq!(a.data, b"abcd");
        assert!(a.gap);
        assert_eq!(
            payload("s", &a),
            json!({"session_id": "s", "sequence": 5, "data": "YWJjZA==", "eof": true,
                   "exit_code": 3, "signal": null, "error": null, "truncated": true,
                   "repeat": false})
        );
        assert_eq!(payload("s", &b(1, 7, b""))["data"], Value::Null);
    }

    /// The payload as the consumer parses it.
    fn payload(session_id: &str, batch: &Batch) -> Value {
        let mut out = String::new();
        write_payload(&mut out, session_id, batch);
        serde_json::from_str(&out).expect("the payload is JSON")
    }

    /// Every field of the seeds' shape, with strings that need escaping, a signal and an
    /// error, and the invocation frame around it.
    #[test]
    fn the_payload_and_its_frame_are_exact_json() {
        let mut x = b(4, 9, &[0, 255, b'"', b'\\', b'\n']);
        x.repeat = true;
        x.exit = Some(PtyExit {
            exit_code: None,
            signal: Some("SIGKILL".into()),
            error: Some("cannot \"wait\"\n\u{1}".into()),
        });
        x.target = "iii::a-ui::pty-output::console-b".into();
        assert_eq!(
            payload("s\"1", &x),
            json!({"session_id": "s\"1", "sequence": 9, "data": "AP8iXAo=", "eof": true,
                   "exit_code": null, "signal": "SIGKILL", "error": "cannot \"wait\"\n\u{1}",
                   "truncated": false, "repeat": true})
        );
        let call = prepare("s\"1", &x);
        let frame: Value = serde_json::from_slice(call.frame_bytes()).expect("the frame is JSON");
        assert_eq!(frame["type"], "invokefunction");
        assert_eq!(frame["function_id"], "iii::a-ui::pty-output::console-b");
        assert!(uuid::Uuid::parse_str(frame["invocation_id"].as_str().unwrap()).is_ok());
        assert_eq!(frame["data"], payload("s\"1", &x));
        assert_eq!(frame.as_object().unwrap().len(), 4);
    }
}
