//! Terminal sessions (`shell::pty::*`): a program on a PTY, its output ring, its credentials
//! and where its output goes.
//!
//! Everything a session is lives here, in the executor, so a session outlives the broker's
//! engine connection and the broker itself: a broker that comes back subscribes again and
//! is sent everything its predecessor had not acknowledged.
//!
//! Output path: a reader task per session appends what the program writes to the session's
//! [`ring::Ring`] and wakes the *pusher*, which runs for the connection that subscribed
//! ([`Request::PtySubscribe`](iii_shell_protocol::messages::Request::PtySubscribe)). The pusher sends each attached session's unsent output as one
//! [`PtyEvent::Output`] (coalesced), at most [`WINDOW`] bytes ahead of what the broker has
//! acknowledged. Output past the window waits in the ring (and is coalesced further) until
//! the broker catches up. While the consumer keeps up, the reader stops reading rather than let
//! the ring evict output not yet acknowledged, and the program waits in `write`; a consumer
//! that falls behind is not waited for, and what the ring cannot keep is reported by the next
//! push as a gap ([`pacing`]).

pub mod admission;
pub mod creds;
pub mod pacing;
pub mod process;
pub mod ring;

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iii_shell_policy::sync::lock;
use iii_shell_protocol::messages::{Event, ServerFrame};
use iii_shell_protocol::pty::{
    parse_output_target, Attached, CloseResponse, DetachResponse, OpenResponse, PtyEvent, PtyExit,
    PtyOp, PtyReply, RawFrame, ResizeResponse, SessionStatus, SessionSummary, SessionsResponse,
    WriteResponse,
};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{watch, Notify};

use iii_shell_files::error::ExecError;
use iii_shell_files::fs::{Continuation, RequestIo};
use iii_shell_launch::reaper::ROOTS;
use iii_shell_launch::reaper::{self, ExitStatus};
use iii_shell_launch::spawn;
use iii_shell_launch::tree::JobTree;
use pacing::Pace;
use ring::Ring;

/// Bytes pushed to the broker and not yet acknowledged, per session, at most: as many full
/// pushes as may be unacknowledged (the broker has one delivery in flight, the next ready and
/// a third filling).
pub const WINDOW: usize = MAX_UNACKED_PUSHES * PUSH_BYTES;
/// Largest single push: what one delivery carries at most.
pub const PUSH_BYTES: usize = iii_shell_protocol::pty::DELIVERY_BYTES;
/// Pushes per session not acknowledged yet, at most. The first output after a quiet spell
/// goes out at once (a keystroke's echo); under a flood, output waits in the ring while a
/// few pushes are in flight and leaves in large pieces, instead of one event per read.
pub const MAX_UNACKED_PUSHES: usize = 4;
/// How long a write waits for a program that does not read its input.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the exit waits for output the program wrote just before it.
const DRAIN_WAIT: Duration = Duration::from_millis(500);
/// How often retention is enforced without a request.
const PRUNE_EVERY: Duration = Duration::from_secs(5);

/// The mutable part of a session.
struct State {
    ring: Ring,
    access_key: String,
    reconnect_token: String,
    /// Current output target; `None` while detached.
    target: Option<String>,
    /// The page family of the session's owner (kept while detached).
    ui: String,
    /// The caller holding the session ([`admission`]): the one that opened it, or the last
    /// to attach to it or adopt it.
    holder: String,
    /// Bumped whenever the target changes; pushes and acks name it.
    epoch: u64,
    /// Pushes of this epoch wait until the broker has answered the attach (or open) that
    /// started it, so its replay reaches the consumer before any live frame.
    released: bool,
    /// Last sequence pushed / acknowledged in this epoch.
    pushed: u64,
    acked: u64,
    /// `(last sequence, bytes)` of each push not acknowledged yet.
    unacked: VecDeque<(u64, usize)>,
    /// After a rewind: the bounds of the pushes to send again, exactly as before.
    resend: VecDeque<u64>,
    exit: Option<PtyExit>,
    exit_pushed: bool,
    exit_acked: bool,
    detached_at: Option<Instant>,
    exited_at: Option<Instant>,
    size: (u16, u16),
    /// Whether the reader waits for the consumer ([`pacing`]).
    pace: Pace,
}

impl State {
    fn status(&self) -> SessionStatus {
        match &self.exit {
            Some(e) => SessionStatus::Exited {
                exit_code: e.exit_code,
                signal: e.signal.clone(),
                error: e.error.clone(),
            },
            None if self.target.is_some() => SessionStatus::Attached,
            None => SessionStatus::Detached,
        }
    }

    fn in_flight(&self) -> usize {
        self.unacked.iter().map(|u| u.1).sum()
    }

    /// A new target (or none): a new epoch whose pushes start after what was just
    /// replayed, or at the end of the ring.
    fn retarget(&mut self, target: Option<String>) {
        self.epoch += 1;
        self.released = false;
        if target.is_none() {
            self.detached_at = Some(Instant::now());
        } else {
            self.detached_at = None;
        }
        self.target = target;
        self.pace.retarget(Instant::now());
        self.ring.seal();
        self.pushed = self.ring.last();
        self.acked = self.pushed;
        self.unacked.clear();
        self.resend.clear();
        // An exit already known is reported in the attach's own status.
        self.exit_pushed = self.exit.is_some();
        self.exit_acked = self.exit_pushed;
    }

    /// Forget what was pushed but not acknowledged (the connection it went to is gone).
    fn rewind(&mut self) {
        self.pushed = self.acked;
        let again: Vec<u64> = self.unacked.drain(..).map(|u| u.0).collect();
        // Bounds of earlier rewinds not re-sent yet come after these.
        let rest: Vec<u64> = self.resend.drain(..).filter(|&b| b > self.acked).collect();
        let newest = again.last().copied().unwrap_or(0);
        self.resend.extend(again);
        self.resend.extend(rest.into_iter().filter(|&b| b > newest));
        self.exit_pushed = self.exit_acked;
    }
}

pub struct Session {
    id: String,
    cwd: String,
    program: Option<String>,
    pid: i32,
    master: AsyncFd<OwnedFd>,
    write_lock: tokio::sync::Mutex<()>,
    tree: Arc<JobTree>,
    st: Mutex<State>,
    reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// True once the root has been reaped.
    done: watch::Receiver<bool>,
    /// Wakes a reader that waits for the consumer ([`pacing`]): an acknowledgement, or a
    /// change of who receives the output.
    room: Notify,
}

impl Session {
    fn summary(&self) -> SessionSummary {
        let mut st = lock(&self.st);
        // The sequence reported must name a frame that no longer grows: a page that resumes
        // with `after_sequence` from it would otherwise miss what is appended to that frame.
        st.ring.seal();
        SessionSummary {
            session_id: self.id.clone(),
            cwd: self.cwd.clone(),
            status: st.status(),
            sequence: st.ring.last(),
            frames: st.ring.frame_count(),
            frame_bytes: st.ring.byte_count(),
            truncated: st.ring.truncated(),
            pid: u32::try_from(self.pid).ok(),
            program: self.program.clone(),
            output_function_id: st.target.clone(),
            ui: Some(st.ui.clone()),
        }
    }

    /// Kills the whole tree and waits (bounded) until the root has been reaped.
    async fn terminate(&self) {
        if let Some(r) = lock(&self.reader).take() {
            r.abort();
        }
        self.tree.kill();
        let mut done = self.done.clone();
        let _ = tokio::time::timeout(Duration::from_secs(5), done.wait_for(|d| *d)).await;
        // Descendants that were mid-fork during the first pass.
        self.tree.kill();
    }
}

#[derive(Default)]
struct Inner {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Wakes the pusher.
    wake: Notify,
    /// The current subscription (0: none).
    subscription: AtomicU64,
    pruner: AtomicBool,
    /// `(exited, detached)` retention of the newest policy seen.
    retention: Mutex<Option<(Duration, Duration)>>,
}

impl Inner {
    /// Drops exited sessions past their retention and kills detached ones past theirs.
    async fn prune(&self) {
        let Some((exited, detached)) = *lock(&self.retention) else {
            return;
        };
        let now = Instant::now();
        let expired: Vec<Arc<Session>> = {
            let mut t = lock(&self.sessions);
            let ids: Vec<String> = t
                .iter()
                .filter(|(_, s)| {
                    let st = lock(&s.st);
                    match (st.exited_at, st.detached_at) {
                        (Some(at), _) => now.duration_since(at) >= exited,
                        (None, Some(at)) => now.duration_since(at) >= detached,
                        _ => false,
                    }
                })
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| t.remove(id)).collect()
        };
        for s in expired {
            tracing::info!(session_id = %s.id, "pty session removed: its retention ran out");
            s.terminate().await;
        }
    }

    fn start_pruner(self: &Arc<Self>) {
        if self.pruner.swap(true, Ordering::SeqCst) {
            return;
        }
        let inner = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(PRUNE_EVERY).await;
                let Some(inner) = inner.upgrade() else { return };
                inner.prune().await;
            }
        });
    }

    /// The pushes due now, for subscription `sub` (`None` when it was replaced).
    fn due(&self, sub: u64) -> Option<Vec<PtyEvent>> {
        if self.subscription.load(Ordering::SeqCst) != sub {
            return None;
        }
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        let mut out = Vec::new();
        for s in sessions {
            let mut st = lock(&s.st);
            let Some(target) = st.target.clone() else {
                continue;
            };
            if !st.released {
                continue;
            }
            let room = if st.unacked.len() >= MAX_UNACKED_PUSHES {
                0
            } else {
                WINDOW.saturating_sub(st.in_flight())
            };
            let mut ev = None;
            let mut repeat = false;
            if room > 0 {
                let after = st.pushed;
                let (taken, again) = match st.resend.pop_front() {
                    Some(bound) => (st.ring.take_range(after, bound), true),
                    None => (st.ring.take_after(after, room.min(PUSH_BYTES)), false),
                };
                repeat = again && taken.is_some();
                if let Some((first, last, data, gap)) = taken {
                    let owed = st.in_flight();
                    st.pace.pushed(Instant::now(), owed);
                    st.pushed = last;
                    st.unacked.push_back((last, data.len()));
                    ev = Some((first, last, data, gap));
                }
            }
            let caught_up = st.pushed >= st.ring.last();
            let exit = match (st.exit.clone(), caught_up && !st.exit_pushed) {
                (Some(e), true) => {
                    st.exit_pushed = true;
                    Some(e)
                }
                _ => None,
            };
            if ev.is_none() && exit.is_none() {
                continue;
            }
            let (first, sequence, data, gap) = ev.unwrap_or((0, st.pushed, Vec::new(), false));
            out.push(PtyEvent::Output {
                session_id: s.id.clone(),
                epoch: st.epoch,
                target,
                first,
                sequence,
                data,
                gap,
                exit,
                repeat,
            });
        }
        // One event per session: the small ones (an echo) go out before the floods' large
        // ones, so they do not wait behind them on the socket.
        out.sort_by_key(|ev| {
            let PtyEvent::Output { data, .. } = ev;
            data.len()
        });
        Some(out)
    }
}

/// Every session of this executor.
#[derive(Default)]
pub struct Table {
    inner: Arc<Inner>,
    /// Serialises the session-count check with the spawn, so the cap cannot be overshot.
    open_lock: tokio::sync::Mutex<()>,
}

/// Longest session id a refusal repeats (ours are 36-byte UUIDs; a caller's can be anything).
const SHOWN_ID_BYTES: usize = 64;

fn not_found(id: &str) -> ExecError {
    let mut end = id.len().min(SHOWN_ID_BYTES);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    let more = if end < id.len() { "…" } else { "" };
    ExecError::Missing(format!(
        "no such pty session, or the credential does not match: {:?}{more}",
        &id[..end]
    ))
}

fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

/// How the session's root ended, as the wire reports it.
pub fn exit_of(st: ExitStatus) -> PtyExit {
    match st {
        ExitStatus::Exited(c) => PtyExit {
            exit_code: u32::try_from(c).ok(),
            signal: None,
            error: None,
        },
        ExitStatus::Signaled(s) => PtyExit {
            exit_code: None,
            signal: Some(signal_name(s)),
            error: None,
        },
    }
}

impl Table {
    fn get(&self, id: &str) -> Result<Arc<Session>, ExecError> {
        lock(&self.inner.sessions)
            .get(id)
            .cloned()
            .ok_or_else(|| not_found(id))
    }

    /// The session, if `key` is its current access key.
    fn with_key(&self, id: &str, key: &str) -> Result<Arc<Session>, ExecError> {
        let s = self.get(id)?;
        let ok = creds::matches(key, &lock(&s.st).access_key);
        if ok {
            Ok(s)
        } else {
            Err(not_found(id))
        }
    }

    /// Admits an open by `caller` ([`admission::admit`]), removing the session that exited
    /// first when only exited sessions stand in the way.
    async fn make_room(
        &self,
        cfg: &iii_shell_policy::config::PtyConfig,
        caller: &str,
    ) -> Result<(), ExecError> {
        let (census, oldest_exited) = {
            let t = lock(&self.inner.sessions);
            let mut c = admission::Census::default();
            let mut oldest: Option<(Instant, String)> = None;
            for (id, s) in t.iter() {
                let st = lock(&s.st);
                match st.exited_at {
                    Some(at) => {
                        c.exited += 1;
                        if oldest.as_ref().is_none_or(|o| at < o.0) {
                            oldest = Some((at, id.clone()));
                        }
                    }
                    None => {
                        c.running += 1;
                        c.running_of_caller += usize::from(st.holder == caller);
                    }
                }
            }
            (c, oldest.map(|o| o.1))
        };
        match admission::admit(cfg, caller, &census) {
            admission::Admission::Open => Ok(()),
            admission::Admission::Refuse(m) => Err(ExecError::Plain(m)),
            admission::Admission::EvictOldestExited => {
                let gone = oldest_exited.and_then(|id| lock(&self.inner.sessions).remove(&id));
                if let Some(s) = gone {
                    tracing::info!(session_id = %s.id, "pty session removed: it had exited and an open needed its slot (the session that exited first goes first)");
                    s.terminate().await;
                }
                Ok(())
            }
        }
    }

    /// Running sessions `caller` holds, besides session `except`.
    fn running_held_by(&self, caller: &str, except: &str) -> usize {
        lock(&self.inner.sessions)
            .iter()
            .filter(|(id, s)| {
                let st = lock(&s.st);
                id.as_str() != except && st.exit.is_none() && st.holder == caller
            })
            .count()
    }

    /// The sessions held (running, or exited and not yet closed).
    pub fn len(&self) -> usize {
        lock(&self.inner.sessions).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Kills every session (executor shutdown).
    pub fn kill_all(&self) {
        for s in lock(&self.inner.sessions).values() {
            s.tree.kill();
        }
    }

    /// Makes `io`'s connection the one output goes to, until `cancel` (its end).
    pub(crate) fn subscribe(&self, io: &RequestIo, cancel: Arc<Notify>) -> Continuation {
        let sub = self.inner.subscription.fetch_add(1, Ordering::SeqCst) + 1;
        for s in lock(&self.inner.sessions).values() {
            let mut st = lock(&s.st);
            st.rewind();
            // A broker that was not there for the attach cannot be waiting to answer it.
            st.released = true;
            // A new receiver, judged afresh.
            st.pace.retarget(Instant::now());
            s.room.notify_one();
        }
        let inner = self.inner.clone();
        let out = io.out.clone();
        inner.wake.notify_one();
        Box::pin(async move {
            'serve: loop {
                let Some(events) = inner.due(sub) else {
                    tracing::debug!(sub, "pty subscription replaced");
                    return;
                };
                if events.is_empty() {
                    tokio::select! {
                        _ = inner.wake.notified() => continue,
                        _ = cancel.notified() => break,
                    }
                }
                for ev in events {
                    let PtyEvent::Output { data, sequence, .. } = &ev;
                    tracing::trace!(bytes = data.len(), sequence, "pty output pushed");
                    if out.send(ServerFrame::Event(Event::Pty(ev))).await.is_err() {
                        break 'serve;
                    }
                }
            }
            // The connection is gone: whatever it was sent and did not acknowledge goes to
            // the next subscriber.
            let _ = inner
                .subscription
                .compare_exchange(sub, 0, Ordering::SeqCst, Ordering::SeqCst);
            for s in lock(&inner.sessions).values() {
                lock(&s.st).rewind();
                s.room.notify_one();
            }
        })
    }

    async fn open(
        &self,
        policy: Arc<crate::policy::Policy>,
        spec: iii_shell_protocol::pty::OpenSpec,
    ) -> Result<PtyReply, ExecError> {
        let _guard = self.open_lock.lock().await;
        self.make_room(&policy.config.pty, &spec.caller).await?;
        let ui = parse_output_target(&spec.output_function_id)
            .map(|t| t.ui.to_string())
            .ok_or_else(|| {
                ExecError::Invalid(iii_shell_protocol::pty::bad_output_target(
                    &spec.output_function_id,
                ))
            })?;
        let started = process::start(&policy, &spec).await?;
        let process::Started {
            child,
            cgroup,
            master,
            cwd,
            program,
        } = started;
        let pid = child.pid;
        let tree = Arc::new(JobTree::new(pid, cgroup));
        let fail = |e: String| {
            tracing::error!(pid, error = %e, "cannot watch a new pty session; killing it");
            tree.kill();
            let _ = reaper::try_reap_blocking(&child.pidfd);
            if let Ok(mut roots) = ROOTS.lock() {
                roots.retain(|&p| p != pid);
            }
            tree.reaped.store(true, Ordering::SeqCst);
            crate::started::release_later(tree.clone());
            ExecError::Internal(format!("pty: {e}"))
        };
        let (access_key, reconnect_token) = match (creds::fresh(), creds::fresh()) {
            (Ok(a), Ok(r)) => (a, r),
            (Err(e), _) | (_, Err(e)) => return Err(fail(format!("no randomness: {e}"))),
        };
        // SAFETY: an OwnedFd keeps its descriptor open and unchanged for as long as the
        // AsyncFd owns it, which is what `register_with_interest` requires.
        let master = match unsafe {
            AsyncFd::register_with_interest(master, Interest::READABLE | Interest::WRITABLE)
        } {
            Ok(m) => m,
            Err(e) => return Err(fail(e.into_parts().1.to_string())),
        };
        let spawn::Child { pidfd, .. } = child;
        // SAFETY: as for the master above.
        let pidfd = match unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) } {
            Ok(p) => p,
            Err(e) => {
                let (pidfd, e) = e.into_parts();
                tracing::error!(pid, error = %e, "cannot watch a new pty session; killing it");
                tree.kill();
                let _ = reaper::try_reap_blocking(&pidfd);
                if let Ok(mut roots) = ROOTS.lock() {
                    roots.retain(|&p| p != pid);
                }
                tree.reaped.store(true, Ordering::SeqCst);
                crate::started::release_later(tree.clone());
                return Err(ExecError::Internal(format!("pty: {e}")));
            }
        };
        let id = uuid::Uuid::new_v4().to_string();
        let (done_tx, done_rx) = watch::channel(false);
        let session = Arc::new(Session {
            id: id.clone(),
            cwd: cwd.clone(),
            program: program.clone(),
            pid,
            master,
            write_lock: tokio::sync::Mutex::new(()),
            tree: tree.clone(),
            st: Mutex::new(State {
                ring: Ring::new(),
                access_key: access_key.clone(),
                reconnect_token: reconnect_token.clone(),
                target: Some(spec.output_function_id.clone()),
                ui,
                holder: spec.caller.clone(),
                epoch: 1,
                released: false,
                pushed: 0,
                acked: 0,
                unacked: VecDeque::new(),
                resend: VecDeque::new(),
                exit: None,
                exit_pushed: false,
                exit_acked: false,
                detached_at: None,
                exited_at: None,
                size: (spec.cols, spec.rows),
                pace: Pace::new(Instant::now()),
            }),
            reader: Mutex::new(None),
            done: done_rx,
            room: Notify::new(),
        });
        let (read_done_tx, read_done_rx) = watch::channel(false);
        let reader = tokio::spawn(read_loop(
            session.clone(),
            Arc::downgrade(&self.inner),
            read_done_tx,
        ));
        *lock(&session.reader) = Some(reader);
        tokio::spawn(wait_loop(
            session.clone(),
            Arc::downgrade(&self.inner),
            pidfd,
            read_done_rx,
            done_tx,
        ));
        lock(&self.inner.sessions).insert(id.clone(), session);
        self.inner.start_pruner();
        tracing::info!(session_id = %id, pid, "pty session opened");
        Ok(PtyReply::Opened(
            OpenResponse {
                session_id: id,
                access_key,
                reconnect_token,
                cwd,
                pid: u32::try_from(pid).ok(),
                program,
            },
            1,
        ))
    }

    async fn write(&self, s: Arc<Session>, data: Vec<u8>) -> Result<PtyReply, ExecError> {
        let _order = s.write_lock.lock().await;
        let mut written = 0usize;
        let deadline = tokio::time::Instant::now() + WRITE_TIMEOUT;
        while written < data.len() {
            let step = s.master.async_io(Interest::WRITABLE, |fd| {
                // SAFETY: write(2) reads at most the given length from a live slice.
                let n = unsafe {
                    libc::write(
                        fd.as_raw_fd(),
                        data[written..].as_ptr() as *const libc::c_void,
                        data.len() - written,
                    )
                };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match tokio::time::timeout_at(deadline, step).await {
                Ok(Ok(n)) => written += n,
                Ok(Err(e)) if written > 0 => {
                    tracing::debug!(session_id = %s.id, error = %e, "pty write stopped early");
                    break;
                }
                Ok(Err(e)) => {
                    return Err(ExecError::Internal(format!(
                        "cannot write to the session: {e}"
                    )))
                }
                // The program does not read its input: report what went in.
                Err(_) => break,
            }
        }
        Ok(PtyReply::Written(WriteResponse { written }))
    }

    fn attached(&self, s: &Session, st: &mut State, after_sequence: u64) -> Attached {
        let replay = st.ring.replay(after_sequence);
        Attached {
            access_key: st.access_key.clone(),
            reconnect_token: st.reconnect_token.clone(),
            cwd: s.cwd.clone(),
            frames: replay
                .frames
                .into_iter()
                .map(|(sequence, data)| RawFrame { sequence, data })
                .collect(),
            next_sequence: replay.next_sequence,
            truncated: replay.truncated,
            status: st.status(),
            epoch: st.epoch,
        }
    }

    fn apply_size(s: &Session, st: &mut State, cols: u16, rows: u16) -> Result<(), ExecError> {
        process::check_size(cols, rows)?;
        if st.exit.is_none() && st.size != (cols, rows) {
            process::resize(s.master.get_ref(), cols, rows)
                .map_err(|e| ExecError::Internal(format!("resize: {e}")))?;
        }
        st.size = (cols, rows);
        Ok(())
    }

    pub async fn handle_op(
        &self,
        policy: Option<Arc<crate::policy::Policy>>,
        op: PtyOp,
    ) -> Result<PtyReply, ExecError> {
        if let Some(p) = &policy {
            *lock(&self.inner.retention) = Some((
                Duration::from_secs(p.config.pty.exited_retention_secs),
                Duration::from_secs(p.config.pty.detached_retention_secs),
            ));
        }
        if !matches!(op, PtyOp::Ack { .. } | PtyOp::Release { .. }) {
            self.inner.prune().await;
        }
        match op {
            PtyOp::Open(spec) => {
                let policy = policy
                    .ok_or_else(|| ExecError::Internal("executor has no policy yet".into()))?;
                self.open(policy, spec).await
            }
            PtyOp::Write {
                session_id,
                access_key,
                data,
            } => {
                let s = self.with_key(&session_id, &access_key)?;
                if data.len() > iii_shell_protocol::pty::MAX_WRITE_BYTES {
                    return Err(ExecError::TooLarge(format!(
                        "write of {} bytes exceeds the {} byte limit per call",
                        data.len(),
                        iii_shell_protocol::pty::MAX_WRITE_BYTES
                    )));
                }
                if lock(&s.st).exit.is_some() {
                    return Err(ExecError::Invalid(format!(
                        "pty session {session_id} has exited: its program reads no more input"
                    )));
                }
                self.write(s, data).await
            }
            PtyOp::Resize {
                session_id,
                access_key,
                cols,
                rows,
            } => {
                let s = self.with_key(&session_id, &access_key)?;
                let mut st = lock(&s.st);
                Self::apply_size(&s, &mut st, cols, rows)?;
                Ok(PtyReply::Resized(ResizeResponse { cols, rows }))
            }
            PtyOp::Attach {
                session_id,
                reconnect_token,
                after_sequence,
                cols,
                rows,
                output_function_id,
                caller,
            } => {
                let target = parse_output_target(&output_function_id).ok_or_else(|| {
                    ExecError::Invalid(iii_shell_protocol::pty::bad_output_target(
                        &output_function_id,
                    ))
                })?;
                process::check_size(cols, rows)?;
                let s = self.get(&session_id)?;
                let mut st = lock(&s.st);
                if !creds::matches(&reconnect_token, &st.reconnect_token) {
                    return Err(not_found(&session_id));
                }
                Self::apply_size(&s, &mut st, cols, rows)?;
                st.ui = target.ui.to_string();
                st.holder = caller;
                st.retarget(Some(output_function_id.clone()));
                s.room.notify_one();
                Ok(PtyReply::Attached(self.attached(
                    &s,
                    &mut st,
                    after_sequence,
                )))
            }
            PtyOp::Adopt {
                session_id,
                output_function_id,
                cols,
                rows,
                after_sequence,
                caller,
            } => {
                let target = parse_output_target(&output_function_id).ok_or_else(|| {
                    ExecError::Invalid(iii_shell_protocol::pty::bad_output_target(
                        &output_function_id,
                    ))
                })?;
                process::check_size(cols, rows)?;
                let s = self.get(&session_id)?;
                let held = self.running_held_by(&caller, &session_id);
                let (access_key, reconnect_token) = (
                    creds::fresh()
                        .map_err(|e| ExecError::Internal(format!("no randomness: {e}")))?,
                    creds::fresh()
                        .map_err(|e| ExecError::Internal(format!("no randomness: {e}")))?,
                );
                let mut st = lock(&s.st);
                if st.target.is_some() {
                    return Err(ExecError::Invalid(format!(
                        "pty session {session_id} is attached: adopt only takes a session nobody is attached to"
                    )));
                }
                if st.ui != target.ui {
                    return Err(ExecError::Invalid(format!(
                        "pty session {session_id} belongs to the {:?} console page, not {:?}: adopt only moves a session within its own page",
                        st.ui, target.ui
                    )));
                }
                let cfg = policy
                    .as_ref()
                    .map(|p| &p.config.pty)
                    .ok_or_else(|| ExecError::Internal("executor has no policy yet".into()))?;
                admission::may_adopt(cfg.adopt, &session_id, &st.holder, &caller)
                    .map_err(ExecError::Invalid)?;
                if st.exit.is_none() && st.holder != caller {
                    admission::may_hold_one_more(cfg, &caller, held).map_err(ExecError::Plain)?;
                }
                Self::apply_size(&s, &mut st, cols, rows)?;
                st.holder = caller;
                st.access_key = access_key;
                st.reconnect_token = reconnect_token;
                st.retarget(Some(output_function_id.clone()));
                s.room.notify_one();
                tracing::info!(session_id = %session_id, "pty session adopted; its credentials were rotated");
                Ok(PtyReply::Attached(self.attached(
                    &s,
                    &mut st,
                    after_sequence,
                )))
            }
            PtyOp::Detach {
                session_id,
                access_key,
            } => {
                let s = self.with_key(&session_id, &access_key)?;
                let mut st = lock(&s.st);
                if st.target.is_some() {
                    st.retarget(None);
                    s.room.notify_one();
                }
                Ok(PtyReply::Detached(
                    DetachResponse {
                        status: st.status(),
                    },
                    st.epoch,
                ))
            }
            PtyOp::Close {
                session_id,
                access_key,
            } => {
                // Checked and removed under the table's lock: an adopt that rotates the key
                // in between cannot win a session this close then kills.
                let s = {
                    let mut t = lock(&self.inner.sessions);
                    let held = t
                        .get(&session_id)
                        .is_some_and(|s| creds::matches(&access_key, &lock(&s.st).access_key));
                    held.then(|| t.remove(&session_id)).flatten()
                }
                .ok_or_else(|| not_found(&session_id))?;
                s.terminate().await;
                tracing::info!(session_id = %session_id, "pty session closed");
                Ok(PtyReply::Closed(CloseResponse { closed: true }))
            }
            PtyOp::Sessions => {
                let mut sessions: Vec<SessionSummary> = lock(&self.inner.sessions)
                    .values()
                    .map(|s| s.summary())
                    .collect();
                sessions.sort_by(|a, b| a.session_id.cmp(&b.session_id));
                Ok(PtyReply::Sessions(SessionsResponse { sessions }))
            }
            PtyOp::Ack {
                session_id,
                epoch,
                sequence,
                exit,
            } => {
                if let Ok(s) = self.get(&session_id) {
                    let mut st = lock(&s.st);
                    if st.epoch == epoch {
                        let before = st.acked;
                        st.acked = st.acked.max(sequence.min(st.pushed));
                        let acked = st.acked;
                        while st.unacked.front().is_some_and(|u| u.0 <= acked) {
                            st.unacked.pop_front();
                        }
                        if exit && st.exit_pushed {
                            st.exit_acked = true;
                        }
                        let owed = st.ring.bytes_after(acked);
                        st.pace.acked(Instant::now(), acked > before, owed);
                        s.room.notify_one();
                    }
                }
                self.inner.wake.notify_one();
                Ok(PtyReply::Done)
            }
            PtyOp::Release { session_id, epoch } => {
                if let Ok(s) = self.get(&session_id) {
                    let mut st = lock(&s.st);
                    if st.epoch == epoch {
                        st.released = true;
                        st.pace.retarget(Instant::now());
                        s.room.notify_one();
                    }
                }
                self.inner.wake.notify_one();
                Ok(PtyReply::Done)
            }
            PtyOp::TargetGone { session_id, epoch } => {
                if let Ok(s) = self.get(&session_id) {
                    let mut st = lock(&s.st);
                    if st.epoch == epoch && st.target.is_some() {
                        tracing::info!(session_id = %session_id, "the session's output function is gone; detached (output waits in the ring)");
                        st.retarget(None);
                        s.room.notify_one();
                    }
                }
                Ok(PtyReply::Done)
            }
        }
    }
}

/// Reads the program's output into the ring until the PTY reports that every process of
/// the session has let go of it (EIO) or the session is closed.
async fn read_loop(s: Arc<Session>, table: std::sync::Weak<Inner>, done: watch::Sender<bool>) {
    let mut buf = vec![0u8; pacing::READ_BYTES];
    loop {
        // A consumer that keeps up is waited for rather than sent a gap (see `pacing`).
        loop {
            let step = {
                let subscribed = table
                    .upgrade()
                    .is_some_and(|t| t.subscription.load(Ordering::SeqCst) != 0);
                // Once the program has exited, what is left in the PTY is read at once (the
                // exit waits for it only briefly).
                let running = !s.tree.reaped.load(Ordering::SeqCst);
                let mut st = lock(&s.st);
                let now = pacing::Now {
                    at: Instant::now(),
                    delivering: running && subscribed && st.released && st.target.is_some(),
                    unacked: st.ring.bytes_after(st.acked),
                };
                st.pace.step(now)
            };
            match step {
                pacing::Step::Read => break,
                pacing::Step::Wait(left) => {
                    let _ = tokio::time::timeout(left, s.room.notified()).await;
                }
            }
        }
        let r = s.master.async_io(Interest::READABLE, |fd| {
            // SAFETY: read(2) writes at most `buf.len()` bytes into `buf`.
            let n = unsafe {
                libc::read(
                    fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                )
            };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match r.await {
            Ok(0) => break,
            Ok(n) => {
                lock(&s.st).ring.push(&buf[..n]);
                match table.upgrade() {
                    Some(t) => t.wake.notify_one(),
                    None => break,
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                if e.raw_os_error() != Some(libc::EIO) {
                    tracing::warn!(session_id = %s.id, error = %e, "reading a pty session failed");
                }
                break;
            }
        }
    }
    let _ = done.send(true);
}

/// Waits for the session's root to exit, reaps it, lets the last output drain, kills what is
/// left of the tree, and records the exit.
async fn wait_loop(
    s: Arc<Session>,
    table: std::sync::Weak<Inner>,
    pidfd: AsyncFd<OwnedFd>,
    mut read_done: watch::Receiver<bool>,
    done: watch::Sender<bool>,
) {
    let status = loop {
        match reaper::try_reap(pidfd.get_ref()) {
            Ok(Some(st)) => break Ok(st),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        match pidfd.readable().await {
            Ok(mut g) => g.clear_ready(),
            Err(e) => break Err(e),
        }
    };
    if let Ok(mut roots) = ROOTS.lock() {
        roots.retain(|&p| p != s.pid);
    }
    s.tree.reaped.store(true, Ordering::SeqCst);
    let _ = done.send(true);
    // Output the program wrote just before it exited is still in the PTY: read it first. A
    // descendant that keeps the PTY open past that is killed (the terminal hung up).
    let drained = tokio::time::timeout(DRAIN_WAIT, read_done.wait_for(|d| *d))
        .await
        .is_ok();
    s.tree.kill();
    if !drained {
        let _ = tokio::time::timeout(DRAIN_WAIT, read_done.wait_for(|d| *d)).await;
    }
    crate::started::release_later(s.tree.clone());
    let exit = match status {
        Ok(st) => exit_of(st),
        Err(e) => PtyExit {
            exit_code: None,
            signal: None,
            error: Some(format!("cannot wait for the program: {e}")),
        },
    };
    tracing::info!(session_id = %s.id, ?exit, "pty session program exited");
    {
        let mut st = lock(&s.st);
        st.exit = Some(exit);
        st.exited_at = Some(Instant::now());
    }
    if let Some(t) = table.upgrade() {
        t.wake.notify_one();
    }
}
