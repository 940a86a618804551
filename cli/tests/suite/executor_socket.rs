//! `iii-shell executor --socket PATH`: the handshake, hostile and broken peers, the peer-uid
//! check and the socket's mode, driven with raw frames.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use iii_shell_broker::executor_client::ExecutorClient;
use iii_shell_protocol::frame::{read_frame, write_frame, MAX_FRAME_BYTES};
use iii_shell_protocol::messages::{ClientFrame, Hello, Reply, Request, ServerFrame, MAGIC};
use iii_shell_protocol::PROTOCOL_VERSION;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// A running `iii-shell executor --socket`, killed on drop.
struct Executor {
    child: Child,
    path: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Executor {
    /// Starts an executor and waits until it listens.
    async fn start(extra: &[&str]) -> Executor {
        let mut e = Executor::spawn(extra);
        // Logged once the socket is bound, chmod-ed and handed to the peer uid.
        let up = eventually(Duration::from_secs(10), || {
            e.log().contains("executor listening")
        })
        .await;
        assert!(
            up && e.path.exists(),
            "executor is not listening; exit: {:?}; log:\n{}",
            e.child.try_wait(),
            e.log()
        );
        e
    }

    fn spawn(extra: &[&str]) -> Executor {
        let dir = tempdir();
        let path = dir.path().join("executor.sock");
        let log = dir.path().join("executor.log");
        let child = Command::new(bin())
            .arg("executor")
            .arg("--socket")
            .arg(&path)
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn executor");
        Executor {
            child,
            path,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn assert_alive(&mut self) {
        assert_eq!(
            self.child.try_wait().unwrap(),
            None,
            "executor died; log:\n{}",
            self.log()
        );
    }

    async fn connect(&self) -> UnixStream {
        UnixStream::connect(&self.path).await.expect("connect")
    }

    /// A new connection that completes the handshake and answers a ping.
    async fn handshake(&self) -> UnixStream {
        let mut s = self.connect().await;
        hello(&mut s, PROTOCOL_VERSION).await;
        match recv(&mut s).await {
            ServerFrame::HelloAck { version, pid } => {
                assert_eq!(version, PROTOCOL_VERSION);
                assert_eq!(pid, self.child.id());
            }
            other => panic!("expected HelloAck, got {other:?}"),
        }
        let n = 42;
        write_frame(
            &mut s,
            &ClientFrame::Request {
                id: n,
                request: Request::Ping,
                trace: None,
            },
        )
        .await
        .unwrap();
        match recv(&mut s).await {
            ServerFrame::Reply {
                id,
                result: Ok(Reply::Pong),
            } => assert_eq!(id, n),
            other => panic!("expected Pong, got {other:?}"),
        }
        s
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn hello(s: &mut UnixStream, version: u32) {
    write_frame(
        s,
        &ClientFrame::Hello(Hello {
            magic: MAGIC,
            version,
        }),
    )
    .await
    .unwrap();
}

async fn recv(s: &mut UnixStream) -> ServerFrame {
    tokio::time::timeout(Duration::from_secs(10), read_frame::<_, ServerFrame>(s))
        .await
        .expect("no frame within 10 s")
        .expect("a frame")
}

/// Reads until the executor closes the connection; returns what it sent before that.
/// Panics if the connection stays open for `limit`.
async fn closed_within(s: &mut UnixStream, limit: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let res = tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        res.is_ok(),
        "the executor kept the connection open for {limit:?} (got {got:?})"
    );
    got
}

#[tokio::test]
async fn handshake_ping_and_socket_mode() {
    let mut e = Executor::start(&[]).await;
    let md = std::fs::metadata(&e.path).unwrap();
    assert_eq!(
        md.permissions().mode() & 0o777,
        0o600,
        "socket mode {:o}",
        md.permissions().mode()
    );
    assert_eq!(
        md.uid(),
        nix::unistd::getuid().as_raw(),
        "owned by the expected peer (our uid by default)"
    );

    let mut s = e.handshake().await;
    // Requests are answered by id, several per connection; the job table needs no policy.
    write_frame(
        &mut s,
        &ClientFrame::Request {
            id: 7,
            request: Request::JobList,
            trace: None,
        },
    )
    .await
    .unwrap();
    match recv(&mut s).await {
        ServerFrame::Reply {
            id: 7,
            result: Ok(Reply::JobList(l)),
        } => assert_eq!(l.count, 0),
        other => panic!("{other:?}"),
    }
    // Work before any policy is refused, not crashed on.
    let spec = iii_shell_protocol::messages::ExecSpec {
        argv: vec!["true".into()],
        cwd: None,
        env: vec![],
        stdin: None,
        timeout_ms: 1000,
        network: None,
        limits: Default::default(),
    };
    write_frame(
        &mut s,
        &ClientFrame::Request {
            id: 8,
            request: Request::Exec(spec),
            trace: None,
        },
    )
    .await
    .unwrap();
    match recv(&mut s).await {
        ServerFrame::Reply {
            id: 8,
            result: Err(err),
        } => assert!(err.message.contains("no policy"), "{err:?}"),
        other => panic!("{other:?}"),
    }
    // A second connection is served alongside the first.
    let mut s2 = e.handshake().await;
    let _ = s2.shutdown().await;
    e.assert_alive();
    drop(s);

    // SIGTERM: a clean exit that removes the socket file.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(e.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let exited = eventually(Duration::from_secs(10), || {
        e.child.try_wait().ok().flatten().is_some()
    })
    .await;
    assert!(exited, "executor ignored SIGTERM");
    assert!(e.child.wait().unwrap().success());
    assert!(!e.path.exists(), "socket file left behind");
}

#[tokio::test]
async fn version_mismatch_and_non_hello_are_refused() {
    let mut e = Executor::start(&[]).await;

    let mut s = e.connect().await;
    hello(&mut s, PROTOCOL_VERSION + 1).await;
    match recv(&mut s).await {
        ServerFrame::Refused { reason } => {
            assert!(reason.contains("protocol version mismatch"), "{reason}");
            assert!(
                reason.contains(&format!("{}", PROTOCOL_VERSION + 1)),
                "names the peer's version: {reason}"
            );
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    assert!(
        closed_within(&mut s, Duration::from_secs(5))
            .await
            .is_empty(),
        "nothing follows a refusal"
    );
    assert!(
        eventually(Duration::from_secs(5), || e
            .log()
            .contains("protocol version mismatch"))
        .await,
        "{}",
        e.log()
    );

    // Wrong magic, or a request before the hello.
    let mut s = e.connect().await;
    write_frame(
        &mut s,
        &ClientFrame::Hello(Hello {
            magic: *b"notshell",
            version: PROTOCOL_VERSION,
        }),
    )
    .await
    .unwrap();
    assert!(matches!(recv(&mut s).await, ServerFrame::Refused { .. }));
    closed_within(&mut s, Duration::from_secs(5)).await;
    let mut s = e.connect().await;
    write_frame(
        &mut s,
        &ClientFrame::Request {
            id: 1,
            request: Request::Ping,
            trace: None,
        },
    )
    .await
    .unwrap();
    assert!(matches!(recv(&mut s).await, ServerFrame::Refused { .. }));
    closed_within(&mut s, Duration::from_secs(5)).await;

    e.assert_alive();
    e.handshake().await;
}

/// A fake executor that answers any hello with `answer`.
async fn fake_executor(
    answer: ServerFrame,
) -> (
    tempfile::TempDir,
    PathBuf,
    tokio::task::JoinHandle<ClientFrame>,
) {
    let dir = tempdir();
    let path = dir.path().join("fake.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let task = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let first: ClientFrame = read_frame(&mut s).await.unwrap();
        write_frame(&mut s, &answer).await.unwrap();
        // Keep the connection open a moment so the client judges the frame, not the EOF.
        tokio::time::sleep(Duration::from_millis(500)).await;
        first
    });
    (dir, path, task)
}

async fn connect_err(path: &Path) -> String {
    let stream = UnixStream::connect(path).await.unwrap();
    match ExecutorClient::connect(stream).await {
        Ok(_) => panic!("the broker accepted the handshake"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn broker_refuses_an_executor_of_another_version() {
    let (_dir, path, task) = fake_executor(ServerFrame::HelloAck {
        version: PROTOCOL_VERSION + 7,
        pid: 1,
    })
    .await;
    let msg = connect_err(&path).await;
    assert!(msg.contains("protocol version mismatch"), "{msg}");
    assert!(msg.contains(&format!("{}", PROTOCOL_VERSION + 7)), "{msg}");
    match task.await.unwrap() {
        ClientFrame::Hello(h) => assert_eq!((h.magic, h.version), (MAGIC, PROTOCOL_VERSION)),
        other => panic!("the broker's first frame was {other:?}"),
    }

    // An executor's refusal reaches the broker with its reason.
    let (_dir, path, _task) = fake_executor(ServerFrame::Refused {
        reason: "go away: test reason".into(),
    })
    .await;
    let msg = connect_err(&path).await;
    assert!(msg.contains("go away: test reason"), "{msg}");

    // And the real executor refuses a broker of another version: covered from the broker
    // side too, through the same client, against a matching executor it works.
    let e = Executor::start(&[]).await;
    let client = ExecutorClient::connect(e.connect().await)
        .await
        .expect("same-version handshake");
    assert_eq!(client.pid, e.child.id());
    assert!(matches!(client.call(Request::Ping).await, Ok(Reply::Pong)));
}

#[tokio::test]
async fn malformed_handshake_frames_close_only_that_connection() {
    let mut e = Executor::start(&[]).await;
    let too_big = (MAX_FRAME_BYTES as u32 + 1).to_be_bytes().to_vec();
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        (
            "garbage",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            false,
        ),
        ("oversized", too_big.clone(), false),
        ("u32::MAX length", vec![0xff; 4], false),
        (
            "undecodable body",
            [&4u32.to_be_bytes()[..], &[0xff, 0xff, 0xff, 0xff]].concat(),
            false,
        ),
        (
            "unknown variant",
            [&1u32.to_be_bytes()[..], &[0x09]].concat(),
            false,
        ),
        ("empty body", 0u32.to_be_bytes().to_vec(), false),
        (
            "short body then EOF",
            [&100u32.to_be_bytes()[..], b"abc"].concat(),
            true,
        ),
        ("half a length prefix then EOF", vec![0, 0], true),
    ];
    for (name, bytes, then_eof) in cases {
        let mut s = e.connect().await;
        s.write_all(&bytes).await.unwrap();
        if then_eof {
            s.shutdown().await.unwrap();
        }
        let got = closed_within(&mut s, Duration::from_secs(10)).await;
        assert!(got.is_empty(), "{name}: the executor answered {got:?}");
        e.assert_alive();
        // The executor is still serving new connections.
        e.handshake().await;
    }
    let log = e.log();
    assert!(
        log.contains("exceeds the"),
        "the oversized frame was not logged:\n{log}"
    );
    assert!(
        log.contains("malformed frame"),
        "the undecodable frame was not logged:\n{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_hello_timeout() {
    let mut e = Executor::start(&[]).await;
    let mut silent = e.connect().await;
    // Other connections are served meanwhile.
    e.handshake().await;
    let got = closed_within(&mut silent, Duration::from_secs(15)).await;
    assert!(got.is_empty(), "{got:?}");
    assert!(
        eventually(Duration::from_secs(5), || e
            .log()
            .contains("no hello within"))
        .await,
        "{}",
        e.log()
    );
    e.assert_alive();
    e.handshake().await;
}

#[tokio::test]
async fn malformed_frame_after_the_handshake_closes_the_connection() {
    let mut e = Executor::start(&[]).await;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "undecodable",
            [&2u32.to_be_bytes()[..], &[0xff, 0xff]].concat(),
        ),
        (
            "oversized",
            (MAX_FRAME_BYTES as u32 + 1).to_be_bytes().to_vec(),
        ),
        ("garbage", b"\x00\x00\x00\x05hello-not-postcard".to_vec()),
    ];
    for (name, bytes) in cases {
        let mut s = e.handshake().await;
        s.write_all(&bytes).await.unwrap();
        let got = closed_within(&mut s, Duration::from_secs(10)).await;
        assert!(got.is_empty(), "{name}: {got:?}");
        e.assert_alive();
    }
    // A second hello on a live connection also ends it.
    let mut s = e.handshake().await;
    hello(&mut s, PROTOCOL_VERSION).await;
    closed_within(&mut s, Duration::from_secs(10)).await;

    e.assert_alive();
    e.handshake().await;
    let log = e.log();
    assert!(log.contains("bad frame from broker"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test]
async fn only_the_expected_peer_uid_may_connect() {
    let our_uid = nix::unistd::getuid().as_raw();
    let other_uid = if our_uid == 12345 { 12346 } else { 12345 };
    let foreign_hello = || {
        ClientFrame::Hello(Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
        })
    };
    if our_uid == 0 {
        // The socket is handed to the expected peer; root can still connect, and is refused.
        let mut e = Executor::start(&["--peer-uid", &other_uid.to_string()]).await;
        let md = std::fs::metadata(&e.path).unwrap();
        assert_eq!(
            (md.uid(), md.permissions().mode() & 0o777),
            (other_uid, 0o600)
        );
        for _ in 0..2 {
            let mut s = e.connect().await;
            // The executor may already have closed the connection; a failed write is fine.
            let _ = write_frame(&mut s, &foreign_hello()).await;
            let got = closed_within(&mut s, Duration::from_secs(10)).await;
            assert!(got.is_empty(), "a foreign peer got an answer: {got:?}");
        }
        let refusal = format!("peer uid {our_uid} is not the expected broker uid {other_uid}");
        assert!(
            eventually(Duration::from_secs(5), || e.log().contains(&refusal)).await,
            "{}",
            e.log()
        );
        e.assert_alive();
    } else {
        // Unprivileged: the executor cannot even hand the socket to another uid, or the
        // socket's mode keeps us out. Either way no handshake happens.
        let mut e = Executor::spawn(&["--peer-uid", &other_uid.to_string()]);
        let settled = eventually(Duration::from_secs(10), || {
            e.log().contains("executor listening") || e.child.try_wait().ok().flatten().is_some()
        })
        .await;
        assert!(settled, "{}", e.log());
        if e.child.try_wait().unwrap().is_none() {
            if let Ok(mut s) = UnixStream::connect(&e.path).await {
                let _ = write_frame(&mut s, &foreign_hello()).await;
                let got = closed_within(&mut s, Duration::from_secs(10)).await;
                assert!(got.is_empty(), "a foreign peer got an answer: {got:?}");
            }
        }
    }
    let e = Executor::start(&["--peer-uid", &our_uid.to_string()]).await;
    e.handshake().await;
}

/// A request whose handler panics is answered with an internal error for its id, the id is
/// free again at once, and the executor goes on serving (the fault is injected by the
/// `test-faults` build of the tests' binary).
#[tokio::test]
async fn a_panicking_handler_is_answered_and_its_id_freed() {
    use iii_shell_protocol::fs::FsOp;
    let mut e = Executor::start(&[]).await;
    let mut s = e.handshake().await;
    let fault = Request::Fs(FsOp::Stat {
        path: iii_shell_executor::panic_reply::FAULT_PATH.into(),
    });
    write_frame(
        &mut s,
        &ClientFrame::Request {
            id: 11,
            request: fault,
            trace: None,
        },
    )
    .await
    .unwrap();
    match tokio::time::timeout(Duration::from_secs(10), recv(&mut s)).await {
        Ok(ServerFrame::Reply {
            id: 11,
            result: Err(err),
        }) => {
            assert_eq!(err.code.as_str(), "S216", "{err:?}");
            assert_eq!(
                err.message,
                "internal error in the executor while serving this fs request (id 11); the \
                 details are in the executor's log (ERROR \"request handler panicked\"); the \
                 executor goes on serving"
            );
        }
        Ok(other) => panic!("expected an error reply for id 11, got {other:?}"),
        Err(_) => panic!("no reply within 10 s for a request whose handler panicked"),
    }
    // The id left the in-flight table: the same id is served again, not refused as a
    // duplicate (S210 "still in flight").
    write_frame(
        &mut s,
        &ClientFrame::Request {
            id: 11,
            request: Request::JobList,
            trace: None,
        },
    )
    .await
    .unwrap();
    match recv(&mut s).await {
        ServerFrame::Reply {
            id: 11,
            result: Ok(Reply::JobList(l)),
        } => assert_eq!(l.count, 0),
        other => panic!("the freed id was not served: {other:?}"),
    }
    // ... and the next call on the same connection too.
    write_frame(
        &mut s,
        &ClientFrame::Request {
            id: 12,
            request: Request::Ping,
            trace: None,
        },
    )
    .await
    .unwrap();
    match recv(&mut s).await {
        ServerFrame::Reply {
            id: 12,
            result: Ok(Reply::Pong),
        } => {}
        other => panic!("expected Pong, got {other:?}"),
    }
    e.assert_alive();
    let log = e.log();
    assert!(
        log.contains("request handler panicked") && log.contains("injected test fault"),
        "the panic is logged as an ERROR with its message:\n{log}"
    );
}
