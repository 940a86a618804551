//! Streamed writes (broker → executor) and reads (executor → broker), with credit-based
//! back-pressure: at most [`STREAM_WINDOW`] chunks are in flight per request, and a peer that
//! stops draining for [`STREAM_IDLE`] ends the stream instead of wedging the executor.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use iii_shell_protocol::fs::WriteResponse;
use iii_shell_protocol::messages::{ServerFrame, STREAM_CHUNK};
use tokio::sync::{mpsc, Semaphore};

use super::ops::{check_write_cap, echo_input, temp_for, write_target};
use crate::error::ExecError;
use crate::FsPolicy;

/// Longest pause between two chunks before a stream is abandoned.
pub const STREAM_IDLE: Duration = Duration::from_secs(30);

/// One item of a request's input stream.
#[derive(Debug)]
pub enum StreamItem {
    Data(Vec<u8>),
    End(Option<String>),
}

/// Receives a streamed write into a temp file and commits it atomically at the end.
pub async fn write_stream(
    policy: &FsPolicy,
    path: &str,
    mode: u32,
    parents: bool,
    inbound: &mut mpsc::Receiver<StreamItem>,
    ack: impl Fn(),
) -> Result<WriteResponse, ExecError> {
    let parent = write_target(policy, path, mode, parents)?;
    let mut tmp = temp_for(&parent, mode).map_err(|e| echo_input(e, path))?;
    loop {
        let item = tokio::time::timeout(STREAM_IDLE, inbound.recv())
            .await
            .map_err(|_| {
                ExecError::Internal(format!("write stream idle for {STREAM_IDLE:?}; abandoned"))
            })?;
        match item {
            Some(StreamItem::Data(chunk)) => {
                check_write_cap(policy, tmp.written + chunk.len() as u64, path)?;
                tmp.write(&chunk)?;
                ack();
            }
            Some(StreamItem::End(None)) => break,
            Some(StreamItem::End(Some(e))) => {
                return Err(ExecError::Internal(format!("write stream failed: {e}")))
            }
            None => {
                return Err(ExecError::Internal(
                    "write stream ended without a close".into(),
                ))
            }
        }
    }
    let written = tmp.commit()?;
    Ok(WriteResponse {
        bytes_written: written,
        path: parent.path.to_string_lossy().into_owned(),
        files: Vec::new(),
    })
}

/// Streams an open file to the broker in chunks, waiting for credit before each one. Reads
/// stop at `cap` bytes (0 = unlimited) even if the file grows meanwhile.
pub async fn read_stream(
    mut file: std::fs::File,
    id: u64,
    out: mpsc::Sender<ServerFrame>,
    credits: Arc<Semaphore>,
    cap: u64,
) {
    let mut sent = 0u64;
    let mut buf = vec![0u8; STREAM_CHUNK];
    let error = loop {
        match tokio::time::timeout(STREAM_IDLE, credits.acquire()).await {
            Ok(Ok(permit)) => permit.forget(),
            Ok(Err(_)) => break Some("stream cancelled".to_string()),
            Err(_) => break Some(format!("reader did not drain for {STREAM_IDLE:?}")),
        }
        let n = match file.read(&mut buf) {
            Ok(n) => n,
            Err(e) => break Some(format!("read failed: {e}")),
        };
        if n == 0 {
            break None;
        }
        if cap > 0 && sent + n as u64 > cap {
            break Some(format!(
                "the file grew past fs.max_read_bytes ({cap}) while being read"
            ));
        }
        sent += n as u64;
        if out
            .send(ServerFrame::StreamData {
                id,
                data: buf[..n].to_vec(),
            })
            .await
            .is_err()
        {
            return;
        }
    };
    let _ = out.send(ServerFrame::StreamEnd { id, error }).await;
}
