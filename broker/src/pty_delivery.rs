//! Delivering terminal-session output to each session's output function through the engine.
//!
//! The executor pushes each attached session's output ([`PtyEvent::Output`], coalesced, at
//! most its window ahead of our acknowledgements). Here every session has a *lane*: output
//! that arrives while an invocation is in flight is coalesced into the next one, so a slow
//! engine or consumer gets fewer, larger frames and the program is never held up (what does
//! not fit the window waits in the executor's ring). A lane invokes one frame at a time, in
//! order, and acknowledges it to the executor once the invocation returned.
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
use iii_shell_protocol::pty::{PtyEvent, PtyExit, PtyOp};
use serde_json::{json, Value};

use crate::executor_client::ExecutorClient;
use crate::services::Services;

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
    fn mergeable(&self, later: &Batch) -> bool {
        self.epoch == later.epoch && self.target == later.target && !self.repeat && !later.repeat
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

#[derive(Default)]
pub struct Delivery {
    lanes: Mutex<HashMap<String, Arc<Mutex<LaneState>>>>,
}

/// The invocation payload for `batch` of `session_id`.
fn payload(session_id: &str, b: &Batch) -> Value {
    let data =
        (!b.data.is_empty()).then(|| base64::engine::general_purpose::STANDARD.encode(&b.data));
    let exit = b.exit.as_ref();
    json!({
        "session_id": session_id,
        "sequence": b.last,
        "data": data,
        "eof": exit.is_some(),
        "exit_code": exit.and_then(|e| e.exit_code),
        "signal": exit.and_then(|e| e.signal.clone()),
        "error": exit.and_then(|e| e.error.clone()),
        "truncated": b.gap,
        "repeat": b.repeat,
    })
}

/// Past this many lanes, a new one first drops the lanes of sessions whose exit was handed on
/// and that have nothing pending. A session that expires by retention sends no event, so
/// without this its lane would stay for the broker's lifetime and a caller opening and
/// abandoning sessions would grow the broker without bound. Lanes of live sessions are
/// bounded by `pty.max_sessions`, which the executor enforces.
const LANES_BEFORE_PRUNING: usize = 256;

impl Delivery {
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

    fn on_event(self: &Arc<Self>, services: &Arc<Services>, ev: PtyEvent) {
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
            tokio::spawn(run_lane(services.clone(), session_id, lane));
        }
    }
}

/// Delivers a lane's output, one invocation at a time, until nothing is pending.
async fn run_lane(services: Arc<Services>, session_id: String, lane: Arc<Mutex<LaneState>>) {
    loop {
        let batch = {
            let mut l = lock(&lane);
            let floor = l.floor;
            match l.pending.pop_front() {
                Some(b) if b.epoch >= floor => b,
                Some(_) => continue,
                None => {
                    l.running = false;
                    return;
                }
            }
        };
        let link = loop {
            match services.engine() {
                Ok(link) => break link,
                Err(_) => tokio::time::sleep(RETRY_PAUSE).await,
            }
        };
        let body = payload(&session_id, &batch);
        match link
            .call_with_timeout(&batch.target, body, DELIVERY_TIMEOUT)
            .await
        {
            Ok(_) => {
                lock(&lane).fresh = None;
            }
            Err(e) if e.code == "function_not_found" && young(&lane, batch.epoch) => {
                // The page's function may not be registered yet: wait for it, in order.
                requeue(&lane, batch);
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
                    &services,
                    PtyOp::TargetGone {
                        session_id: session_id.clone(),
                        epoch: batch.epoch,
                    },
                );
                continue;
            }
            Err(e) if e.code == "connection_lost" => {
                // Not delivered: put it back in front of whatever came meanwhile.
                requeue(&lane, batch);
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
            &services,
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
pub fn send(services: &Arc<Services>, op: PtyOp) {
    let services = services.clone();
    tokio::spawn(async move {
        if let Err(e) = services.executor.call(Request::Pty(op)).await {
            tracing::debug!(code = %e.code, "pty notice to the executor failed: {}", e.message);
        }
    });
}

/// Makes `client` push session output to us, and delivers it.
pub fn subscribe(services: &Arc<Services>, client: &ExecutorClient) {
    let mut rx = client.pty_events();
    let services = services.clone();
    let client = client.clone();
    tokio::spawn(async move {
        match client.call(Request::Pty(PtyOp::Subscribe)).await {
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
        let delivery = services.pty.clone();
        while let Some(ev) = rx.recv().await {
            delivery.on_event(&services, ev);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let p = payload("s", &a);
        assert_eq!(
            p,
            json!({"session_id": "s", "sequence": 5, "data": "YWJjZA==", "eof": true,
                   "exit_code": 3, "signal": null, "error": null, "truncated": true,
                   "repeat": false})
        );
        assert_eq!(payload("s", &b(1, 7, b""))["data"], Value::Null);
    }
}
