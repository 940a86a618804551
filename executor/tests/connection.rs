//! One broker connection, served in-process over a real socket pair: a duplicate request id
//! is refused (the first request keeps its cancel handle and its reply), and a connection
//! has a bounded number of requests in flight.

use std::sync::Arc;
use std::time::Duration;

use iii_shell_executor::server::serve_connection_limited;
use iii_shell_executor::Executor;
use iii_shell_protocol::config::Config;
use iii_shell_protocol::frame::{read_frame, write_frame};
use iii_shell_protocol::messages::{
    ClientFrame, ExecSpec, Hello, Reply, Request, ServerFrame, MAGIC,
};
use iii_shell_protocol::{WireError, PROTOCOL_VERSION};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

const WAIT: Duration = Duration::from_secs(20);

struct Peer {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
}

impl Peer {
    /// A connection to an executor with a policy (the built-in default) and at most
    /// `max_in_flight` requests in flight.
    async fn start(max_in_flight: usize) -> Peer {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let exec = Arc::new(Executor::new());
        tokio::spawn(serve_connection_limited(exec, theirs, max_in_flight));
        let (rd, wr) = ours.into_split();
        let mut p = Peer { rd, wr };
        p.send(ClientFrame::Hello(Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
        }))
        .await;
        match read_frame::<_, ServerFrame>(&mut p.rd).await.unwrap() {
            ServerFrame::HelloAck { .. } => {}
            other => panic!("{other:?}"),
        }
        let config_json = serde_json::to_string(&Config::builtin_default()).unwrap();
        p.request(
            1,
            Request::SetPolicy {
                generation: 1,
                config_json,
            },
        )
        .await;
        match p.reply().await {
            (1, Ok(Reply::PolicyAccepted { generation: 1, .. })) => {}
            other => panic!("{other:?}"),
        }
        p
    }

    async fn send(&mut self, f: ClientFrame) {
        write_frame(&mut self.wr, &f).await.unwrap();
    }

    async fn request(&mut self, id: u64, request: Request) {
        self.send(ClientFrame::Request {
            id,
            request,
            trace: None,
        })
        .await;
    }

    /// The next reply (events skipped).
    async fn reply(&mut self) -> (u64, Result<Reply, WireError>) {
        tokio::time::timeout(WAIT, async {
            loop {
                match read_frame::<_, ServerFrame>(&mut self.rd).await.unwrap() {
                    ServerFrame::Reply { id, result } => return (id, result),
                    ServerFrame::Event(_) => continue,
                    other => panic!("unexpected frame {other:?}"),
                }
            }
        })
        .await
        .expect("a reply in time")
    }
}

fn sleep_long() -> Request {
    Request::Exec(ExecSpec {
        argv: vec!["sleep".into(), "60".into()],
        cwd: None,
        env: Vec::new(),
        stdin: None,
        timeout_ms: 120_000,
        network: None,
        limits: Default::default(),
    })
}

fn assert_cancelled(reply: (u64, Result<Reply, WireError>), want: u64) {
    match reply {
        (id, Err(e)) if id == want => {
            assert_eq!(
                (e.code.as_str(), e.message.as_str()),
                ("S216", "call cancelled")
            )
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_duplicate_request_id_is_refused_and_the_first_request_keeps_its_cancel() {
    let mut p = Peer::start(16).await;
    p.request(2, sleep_long()).await;
    p.request(2, Request::Ping).await;
    let (id, result) = p.reply().await;
    assert_eq!(id, 2);
    let e = result.expect_err("the repeat is refused, not served");
    assert_eq!(e.code, "S210", "{e:?}");
    assert!(
        e.message
            .starts_with("request id 2 is already in flight on this connection"),
        "{e:?}"
    );
    // The first request still answers to its own cancel.
    p.send(ClientFrame::Cancel { id: 2 }).await;
    assert_cancelled(p.reply().await, 2);
    // Once it has finished, the id may be used again.
    let mut answered = false;
    for n in 0..100 {
        p.request(2, Request::Ping).await;
        match p.reply().await {
            (2, Ok(Reply::Pong)) => {
                answered = true;
                break;
            }
            (2, Err(e)) if e.code == "S210" => {
                tokio::time::sleep(Duration::from_millis(10 * (n + 1))).await
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(answered, "the id stayed in flight after its reply");
}

#[tokio::test]
async fn a_connection_has_a_bounded_number_of_requests_in_flight() {
    let mut p = Peer::start(2).await;
    p.request(2, sleep_long()).await;
    p.request(3, sleep_long()).await;
    p.request(4, Request::Ping).await;
    let (id, result) = p.reply().await;
    assert_eq!(id, 4);
    let e = result.expect_err("a third request is refused");
    assert_eq!(e.code, "S216", "{e:?}");
    assert!(
        e.message
            .starts_with("the executor already has 2 requests in flight on this connection"),
        "{e:?}"
    );
    // A slot frees when a request finishes.
    p.send(ClientFrame::Cancel { id: 2 }).await;
    assert_cancelled(p.reply().await, 2);
    let mut answered = false;
    for n in 5..105 {
        p.request(n, Request::Ping).await;
        match p.reply().await {
            (id, Ok(Reply::Pong)) if id == n => {
                answered = true;
                break;
            }
            (id, Err(e)) if id == n && e.code == "S216" => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(answered, "no slot came free");
    p.send(ClientFrame::Cancel { id: 3 }).await;
    assert_cancelled(p.reply().await, 3);
}
