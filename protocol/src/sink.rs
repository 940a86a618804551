//! Writing frames to a socket shared by many tasks, without a task hop when it is free.
//!
//! Each side of the broker↔executor socket has a writer task fed by a channel, which keeps
//! frames whole and in order. Going through it costs a wake-up per frame, though, and on the
//! request/reply path that is a good part of a round trip. So a reply (or request) is first
//! written directly: when no one else holds the write half and the socket takes the whole
//! frame at once, it is done without leaving the calling task. Otherwise the caller queues it
//! for the writer task as before.
//!
//! The direct write never awaits while holding the half, so a caller that is cancelled can
//! never leave a partial frame behind: a frame the socket took only part of is finished by a
//! spawned task that still holds the lock.

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::Mutex;

/// The write half of the socket, shared by the writer task and direct writers.
pub type SharedWriter = Arc<Mutex<OwnedWriteHalf>>;

/// What became of a direct write.
#[derive(Debug)]
pub enum Sent {
    /// Written, or being finished by a task of its own; either way it is on its way, whole.
    Done,
    /// Someone else is writing: queue the frame instead.
    Busy,
}

/// Writes one encoded frame now if the socket is free. See the module docs.
pub fn send_now(wr: &SharedWriter, bytes: Vec<u8>) -> std::io::Result<Sent> {
    let Ok(mut w) = wr.clone().try_lock_owned() else {
        return Ok(Sent::Busy);
    };
    let written = match w.try_write(&bytes) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(e),
    };
    if written < bytes.len() {
        // The socket buffer is full: finish in a task that holds the lock (so nothing can be
        // interleaved) and that no caller can cancel. A write error there means the
        // connection is gone, which the reading side reports.
        tokio::spawn(async move {
            let _ = w.write_all(&bytes[written..]).await;
        });
    }
    Ok(Sent::Done)
}

/// Encodes and writes one frame, waiting for the socket (the writer task's path).
pub async fn send_queued<T: serde::Serialize>(
    wr: &SharedWriter,
    frame: &T,
) -> Result<(), crate::frame::FrameError> {
    let bytes = crate::frame::encode(frame)?;
    let mut w = wr.lock().await;
    w.write_all(&bytes).await?;
    Ok(())
}
