//! The two connections every part of the broker reaches: the executor in use and the engine
//! link. Services, the terminal-output delivery and the change feed each hold these slots;
//! none of them holds another.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::{Code, WireError};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::call_deadline::no_executor;
use crate::engine::EngineLink;
use crate::executor_client::{executor_lost, Attempt, ExecutorClient, OutputStream};

/// The executor connection in use; replaced when a respawned executor comes up.
///
/// Where a dead executor is replaced (`serve`'s supervisor respawns it, separate units
/// reconnect: [`ExecutorSlot::expect_replacements`]), a call that finds no live executor
/// waits for the next one, within the call's own deadline, instead of failing at once; and
/// a request that could not be written because its executor had just died (nothing of it
/// reached that executor) goes to the next one the same way. A request that did reach a
/// dying executor is answered with S216: it may have run, so it is never sent twice.
pub struct ExecutorSlot {
    client: RwLock<Option<ExecutorClient>>,
    /// Bumped at every [`ExecutorSlot::set`]: what waiting calls watch.
    installed: watch::Sender<u64>,
    replaced: AtomicBool,
}

impl Default for ExecutorSlot {
    fn default() -> Self {
        ExecutorSlot {
            client: RwLock::default(),
            installed: watch::Sender::new(0),
            replaced: AtomicBool::new(false),
        }
    }
}

impl ExecutorSlot {
    pub fn set(&self, c: ExecutorClient) {
        *self.client.write().unwrap_or_else(|p| p.into_inner()) = Some(c);
        self.installed.send_modify(|n| *n += 1);
    }

    pub fn clear(&self) {
        *self.client.write().unwrap_or_else(|p| p.into_inner()) = None;
        self.replaced.store(false, Ordering::Relaxed);
        self.installed.send_modify(|n| *n += 1);
    }

    /// From now on a dead executor is replaced: calls wait for the next one.
    pub fn expect_replacements(&self) {
        self.replaced.store(true, Ordering::Relaxed);
    }

    pub fn get(&self) -> Option<ExecutorClient> {
        self.client.read().ok().and_then(|g| g.clone())
    }

    /// A live executor, waiting until `until` for one to be installed when the one in the
    /// slot is dead and a replacement is expected. `None`: there is none, and none came.
    async fn live(&self, until: Option<Instant>) -> Option<ExecutorClient> {
        loop {
            let mut changed = self.installed.subscribe();
            let c = self.get()?;
            if !c.is_closed() {
                return Some(c);
            }
            if !self.replaced.load(Ordering::Relaxed) {
                return None;
            }
            match until {
                Some(u) => match tokio::time::timeout_at(u, changed.changed()).await {
                    Ok(Ok(())) => continue,
                    _ => return None,
                },
                None => {
                    if changed.changed().await.is_err() {
                        return None;
                    }
                }
            }
        }
    }

    /// When a call of `request` that starts now must be answered, by the deadlines of the
    /// executor in the slot (live or not); `None` for a call without a deadline.
    fn due(&self, request: &Request) -> Option<Instant> {
        let bound = self.get()?.bounds().deadline(request)?;
        Some(Instant::now() + bound)
    }

    pub async fn call(&self, request: Request) -> Result<Reply, WireError> {
        let due = self.due(&request);
        let bound = self.get().and_then(|c| c.bounds().deadline(&request));
        let mut request = request;
        loop {
            let Some(c) = self.live(due).await else {
                return Err(self.none_live(request.kind(), bound));
            };
            match c.attempt(request, due).await {
                Attempt::Answered(result) => return result,
                Attempt::Unsent(r) => request = r,
            }
        }
    }

    /// The error of a call that found no live executor: S216 at once where none is
    /// expected, or once its deadline passed waiting for one.
    fn none_live(&self, kind: &str, bound: Option<std::time::Duration>) -> WireError {
        match bound {
            Some(b) if self.replaced.load(Ordering::Relaxed) && self.get().is_some() => {
                no_executor(kind, b)
            }
            _ => executor_lost(),
        }
    }

    pub async fn call_with_output(
        &self,
        request: Request,
    ) -> Result<(Reply, OutputStream), WireError> {
        let bound = self.get().and_then(|c| c.bounds().deadline(&request));
        match self.live(self.due(&request)).await {
            Some(c) => c.call_with_output(request).await,
            None => Err(self.none_live(request.kind(), bound)),
        }
    }

    pub async fn call_with_input(
        &self,
        request: Request,
        input: tokio::sync::mpsc::Receiver<Result<Vec<u8>, String>>,
    ) -> Result<Reply, WireError> {
        let bound = self.get().and_then(|c| c.bounds().deadline(&request));
        match self.live(self.due(&request)).await {
            Some(c) => c.call_with_input(request, input).await,
            None => Err(self.none_live(request.kind(), bound)),
        }
    }
}

/// The engine connection, once serving (absent under `iii-shell call`).
#[derive(Default)]
pub struct EngineSlot {
    link: RwLock<Option<EngineLink>>,
}

impl EngineSlot {
    pub fn set(&self, link: EngineLink) {
        *self.link.write().unwrap_or_else(|p| p.into_inner()) = Some(link);
    }

    /// The engine link, or S216 when running without one (`iii-shell call`).
    pub fn get(&self) -> Result<EngineLink, WireError> {
        self.link
            .read()
            .ok()
            .and_then(|g| g.clone())
            .ok_or_else(|| WireError::new(Code::S216, "this needs an engine connection (data channels and sandbox targets go through the engine); run under `iii-shell serve`"))
    }
}

#[cfg(test)]
mod tests {
    //! Calls against fake executors on socketpairs: one that answers every request, one
    //! that reads requests and never answers, one that stops reading.
    use super::*;
    use crate::call_deadline::CallBounds;
    use iii_shell_protocol::frame::{read_frame, write_frame};
    use iii_shell_protocol::messages::{ClientFrame, ServerFrame};
    use iii_shell_protocol::PROTOCOL_VERSION;
    use std::time::Duration;
    use tokio::net::UnixStream;

    #[derive(Clone, Copy, PartialEq)]
    enum Fake {
        /// Answers every request with `Pong`.
        Answers,
        /// Reads requests and answers none.
        Silent,
        /// Shuts its reading side after the handshake: writes to it fail (EPIPE), and
        /// it never closes its writing side, so the broker's reader sees no EOF.
        DeafAfterHello,
    }

    /// A handshaken client on a fake executor of `pid` behaving as `fake`.
    async fn fake_executor(pid: u32, fake: Fake) -> ExecutorClient {
        let (ours, theirs) = UnixStream::pair().unwrap();
        tokio::spawn(async move {
            let (rd, mut wr) = theirs.into_split();
            let mut rd = tokio::io::BufReader::new(rd);
            let Ok(ClientFrame::Hello(_)) = read_frame::<_, ClientFrame>(&mut rd).await else {
                return;
            };
            let ack = ServerFrame::HelloAck {
                version: PROTOCOL_VERSION,
                pid,
            };
            write_frame(&mut wr, &ack).await.unwrap();
            if fake == Fake::DeafAfterHello {
                let std = rd.into_inner().reunite(wr).unwrap().into_std().unwrap();
                std.shutdown(std::net::Shutdown::Read).unwrap();
                // Keep the writing side open for as long as the test runs.
                tokio::time::sleep(Duration::from_secs(3600)).await;
                drop(std);
                return;
            }
            while let Ok(frame) = read_frame::<_, ClientFrame>(&mut rd).await {
                if let (ClientFrame::Request { id, .. }, Fake::Answers) = (frame, fake) {
                    let reply = ServerFrame::Reply {
                        id,
                        result: Ok(Reply::Pong),
                    };
                    if write_frame(&mut wr, &reply).await.is_err() {
                        return;
                    }
                }
            }
        });
        ExecutorClient::connect(ours)
            .await
            .unwrap()
            .with_bounds(CallBounds {
                fixed: Duration::from_secs(30),
                margin: Duration::from_secs(5),
            })
    }

    /// A client whose connection has already ended.
    async fn dead_executor() -> ExecutorClient {
        let (ours, theirs) = UnixStream::pair().unwrap();
        tokio::spawn(async move {
            let (rd, mut wr) = theirs.into_split();
            let mut rd = tokio::io::BufReader::new(rd);
            let _ = read_frame::<_, ClientFrame>(&mut rd).await;
            let ack = ServerFrame::HelloAck {
                version: PROTOCOL_VERSION,
                pid: 1,
            };
            let _ = write_frame(&mut wr, &ack).await;
        });
        let c = ExecutorClient::connect(ours).await.unwrap();
        c.closed().await;
        c
    }

    #[tokio::test]
    async fn a_call_while_the_executor_is_replaced_waits_for_the_next_one() {
        let slot = std::sync::Arc::new(ExecutorSlot::default());
        slot.set(dead_executor().await);
        slot.expect_replacements();
        let call = {
            let slot = slot.clone();
            tokio::spawn(async move { slot.call(Request::Ping).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !call.is_finished(),
            "the call did not wait for the next executor"
        );
        slot.set(fake_executor(2, Fake::Answers).await);
        let reply = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("answered once the new executor came")
            .unwrap();
        assert!(matches!(reply, Ok(Reply::Pong)), "{reply:?}");
    }

    #[tokio::test]
    async fn a_call_waits_for_the_next_executor_no_longer_than_its_deadline() {
        let slot = ExecutorSlot::default();
        slot.set(dead_executor().await.with_bounds(CallBounds {
            fixed: Duration::from_millis(1500),
            margin: Duration::from_secs(1),
        }));
        slot.expect_replacements();
        let e = slot.call(Request::Ping).await.unwrap_err();
        assert_eq!(e.code, Code::S216);
        assert!(
            e.message
                .starts_with("no executor took this ping request within 1500 ms"),
            "{}",
            e.message
        );
    }

    #[tokio::test]
    async fn without_a_replacement_a_dead_executor_fails_the_call_at_once() {
        let slot = ExecutorSlot::default();
        slot.set(dead_executor().await);
        let e = tokio::time::timeout(Duration::from_secs(5), slot.call(Request::Ping))
            .await
            .expect("at once")
            .unwrap_err();
        assert_eq!(e.code, Code::S216);
        assert_eq!(e.message, "the executor went away before answering");
    }

    /// The executor stops reading (it is dying) while a call waits for its answer: the next
    /// write hits a broken pipe, and that answers the waiting call as well, long before its
    /// 30 s deadline, while the unsent request goes to the next executor.
    #[tokio::test]
    async fn a_broken_pipe_answers_the_calls_in_flight() {
        let slot = std::sync::Arc::new(ExecutorSlot::default());
        slot.expect_replacements();
        let deaf = fake_executor(3, Fake::DeafAfterHello).await;
        slot.set(deaf.clone());
        // Until the first write fails the client cannot know; the first call's write may
        // land in the socket buffer before the peer's shutdown is seen.
        let first = {
            let deaf = deaf.clone();
            tokio::spawn(async move { deaf.call(Request::Ping).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = {
            let slot = slot.clone();
            tokio::spawn(async move { slot.call(Request::Ping).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        slot.set(fake_executor(4, Fake::Answers).await);
        let first = tokio::time::timeout(Duration::from_secs(10), first)
            .await
            .expect("the call in flight was answered when the pipe broke")
            .unwrap();
        let e = first.unwrap_err();
        assert_eq!(e.code, Code::S216, "{e:?}");
        let second = tokio::time::timeout(Duration::from_secs(10), second)
            .await
            .expect("the unsent call went to the next executor")
            .unwrap();
        assert!(matches!(second, Ok(Reply::Pong)), "{second:?}");
        assert!(deaf.is_closed());
    }

    /// A silent executor holds a call only until its deadline (the answer is S216).
    #[tokio::test]
    async fn a_silent_executor_answers_by_the_deadline() {
        let slot = ExecutorSlot::default();
        slot.expect_replacements();
        slot.set(
            fake_executor(5, Fake::Silent)
                .await
                .with_bounds(CallBounds {
                    fixed: Duration::from_millis(400),
                    margin: Duration::from_millis(100),
                }),
        );
        let e = slot.call(Request::Ping).await.unwrap_err();
        assert_eq!(e.code, Code::S216);
        assert!(
            e.message
                .starts_with("the executor did not answer this ping request within 400 ms"),
            "{}",
            e.message
        );
    }
}
