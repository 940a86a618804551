//! The two halves of the broker↔executor socket, each registered only for what it waits on.
//!
//! Tokio's own split registers the socket for reading **and** writing. A Unix stream socket
//! signals "writable" every time its peer consumes data, so each frame one side reads wakes
//! the other side's reactor for nothing: the executor reading a request woke the broker, and
//! the broker reading the reply woke the executor, each time on the critical path of a call
//! (a context switch, and an inter-processor wake-up when the two sit on different CPUs).
//!
//! Here the read half is registered for readability only. The write half writes without any
//! registration while the socket takes the bytes, which on this socket is nearly always; only
//! when a write would block does it register a duplicate descriptor for writability, and it
//! drops that registration as soon as a write goes through again.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// Splits a connected stream into a read half and a write half (see the module docs).
pub fn split(stream: tokio::net::UnixStream) -> std::io::Result<(ReadHalf, WriteHalf)> {
    // into_std deregisters the socket from the reactor and leaves it non-blocking.
    let std = stream.into_std()?;
    std.set_nonblocking(true)?;
    let writer = std.try_clone()?;
    // SAFETY: a std UnixStream owns its descriptor and keeps it open and unchanged for as
    // long as the AsyncFd owns the stream, which is what `register_with_interest` requires.
    let fd = unsafe { AsyncFd::register_with_interest(std, Interest::READABLE) }
        .map_err(std::io::Error::from)?;
    Ok((
        ReadHalf { fd },
        WriteHalf {
            sock: writer,
            waiter: None,
        },
    ))
}

/// The reading side; registered for readability only.
pub struct ReadHalf {
    fd: AsyncFd<UnixStream>,
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|inner| inner.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // Would block: the readiness was cleared; wait for the next edge.
                Err(_) => continue,
            }
        }
    }
}

/// The writing side. Dropping it shuts the socket down for writing, as tokio's write half
/// does, so the peer sees end-of-file even while this side still reads.
pub struct WriteHalf {
    sock: UnixStream,
    /// A duplicate of `sock` registered for writability while a write is blocked.
    waiter: Option<AsyncFd<UnixStream>>,
}

impl WriteHalf {
    /// Writes what the socket takes now without waiting; `WouldBlock` when it takes nothing.
    pub fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            match (&self.sock).write(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        loop {
            match this.try_write(buf) {
                Ok(n) => {
                    // Writable again: stop listening for it (see the module docs).
                    this.waiter = None;
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            if this.waiter.is_none() {
                // Registering reports the current state, so an edge that came between the
                // failed write and this registration is not lost.
                let dup = this.sock.try_clone()?;
                // SAFETY: as in `split`: the AsyncFd owns the duplicate stream, whose
                // descriptor stays open and unchanged until the AsyncFd is dropped.
                let waiter = unsafe { AsyncFd::register_with_interest(dup, Interest::WRITABLE) }
                    .map_err(std::io::Error::from)?;
                this.waiter = Some(waiter);
            }
            let Some(waiter) = this.waiter.as_ref() else {
                continue;
            };
            let mut guard = ready!(waiter.poll_write_ready(cx))?;
            // Cleared before the retry: an edge after this point sets it again.
            guard.clear_ready();
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(self.sock.shutdown(Shutdown::Write))
    }
}

impl Drop for WriteHalf {
    fn drop(&mut self) {
        let _ = self.sock.shutdown(Shutdown::Write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn frames_both_ways_and_a_write_that_must_wait() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (mut ar, mut aw) = split(a).unwrap();
        let (mut br, mut bw) = split(b).unwrap();

        aw.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        br.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");

        // Far more than the socket buffer holds: the writer has to wait for the reader.
        let big: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
        let expect = big.clone();
        let writer = tokio::spawn(async move {
            bw.write_all(&big).await.unwrap();
            bw
        });
        let mut back = vec![0u8; expect.len()];
        ar.read_exact(&mut back).await.unwrap();
        assert!(back == expect, "bytes differ after a blocked write");
        let bw = writer.await.unwrap();

        // Dropping a write half is end-of-file for the peer, while its read half lives on.
        drop(bw);
        let mut rest = Vec::new();
        ar.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        drop(br);
    }

    const EPOLLIN: u32 = 0x001;
    const EPOLLOUT: u32 = 0x004;

    /// The events each epoll instance of this process watches for `fd`, from
    /// `/proc/self/fdinfo` (`tfd: <fd> events: <hex> …` lines).
    fn epoll_interest(fd: i32) -> Vec<u32> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
            let is_epoll = std::fs::read_link(entry.path())
                .map(|l| l.to_string_lossy().contains("eventpoll"))
                .unwrap_or(false);
            if !is_epoll {
                continue;
            }
            let info = format!("/proc/self/fdinfo/{}", entry.file_name().to_string_lossy());
            for line in std::fs::read_to_string(info).unwrap_or_default().lines() {
                let mut words = line.split_whitespace();
                if words.next() == Some("tfd:") && words.next() == Some(&fd.to_string()) {
                    words.next(); // "events:"
                    if let Some(hex) = words.next() {
                        found.push(u32::from_str_radix(hex, 16).unwrap());
                    }
                }
            }
        }
        found
    }

    #[tokio::test]
    async fn only_the_read_half_is_registered_and_only_for_reading() {
        use std::os::fd::AsRawFd;
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (ar, mut aw) = split(a).unwrap();
        let read_fd = ar.fd.as_raw_fd();
        // (The reactor holds its epoll descriptor twice, so one registration can show twice.)
        let interest = epoll_interest(read_fd);
        assert!(!interest.is_empty(), "the read half is not registered");
        for events in &interest {
            assert_ne!(events & EPOLLIN, 0, "not registered for input: {events:#x}");
            assert_eq!(events & EPOLLOUT, 0, "registered for output: {events:#x}");
        }
        assert!(epoll_interest(aw.sock.as_raw_fd()).is_empty());

        // A write that had to wait registers a duplicate for output, and drops it after.
        let chunk = vec![7u8; 1 << 16];
        while aw.try_write(&chunk).is_ok() {}
        let blocked =
            tokio::time::timeout(std::time::Duration::from_millis(50), aw.write_all(&chunk)).await;
        assert!(blocked.is_err(), "the socket buffer never filled");
        let waiter_fd = aw.waiter.as_ref().map(|w| w.as_raw_fd()).unwrap();
        let interest = epoll_interest(waiter_fd);
        assert!(!interest.is_empty(), "the blocked write registered nothing");
        assert!(interest.iter().all(|e| e & EPOLLOUT != 0), "{interest:?}");

        // Once the peer drains the socket the write goes through and the registration goes.
        let drain = tokio::spawn(async move {
            let mut sink = vec![0u8; 1 << 16];
            let mut b = b;
            loop {
                match tokio::io::AsyncReadExt::read(&mut b, &mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        });
        aw.write_all(&chunk).await.unwrap();
        assert!(aw.waiter.is_none(), "still registered after the write");
        assert!(epoll_interest(waiter_fd).is_empty());
        drop(aw);
        drop(ar);
        drain.await.unwrap();
    }
}
