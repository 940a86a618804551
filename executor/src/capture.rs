//! Reading a child's output pipe into a bounded [`Capture`] (the capture itself, and its
//! truncation, are shared policy: `iii_shell_policy::capture`).

use std::os::fd::OwnedFd;

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

pub use iii_shell_policy::capture::Capture;

/// The first read buffer of a pipe. Most commands print less than this; a 64 KiB buffer for
/// each of a call's two pipes cost 200 concurrent calls 25 MB of heap, which the allocator then
/// kept.
pub const FIRST_READ: usize = 4 * 1024;
/// The largest read buffer: a pipe's default capacity.
pub const MAX_READ: usize = 64 * 1024;

/// The read buffer's capacity after a read of `n` bytes into one of `capacity`: doubled when
/// the read filled it, up to [`MAX_READ`]. Reads go into spare capacity, so no byte of it is
/// zeroed.
pub fn next_read_capacity(capacity: usize, n: usize) -> usize {
    if n >= capacity && capacity < MAX_READ {
        (capacity * 2).clamp(FIRST_READ, MAX_READ)
    } else {
        capacity
    }
}

fn grow_read(buf: &mut Vec<u8>, n: usize) {
    let want = next_read_capacity(buf.capacity(), n);
    if want > buf.capacity() {
        buf.clear();
        buf.reserve_exact(want);
    }
}

/// The read end of a child's pipe, pumped into a [`Capture`].
///
/// The pipe stays open after EOF, until the collector is dropped: closing it (and taking it
/// out of epoll) costs a few microseconds that a call's reply need not wait for.
pub struct Collector {
    rx: Option<pipe::Receiver>,
    eof: bool,
    pub capture: Capture,
}

impl Collector {
    pub fn new(fd: OwnedFd, cap: usize) -> std::io::Result<Self> {
        // Our own pipe, made non-blocking by `spawn::pipe`: no need for tokio to check it.
        let rx = pipe::Receiver::from_owned_fd_unchecked(fd)?;
        Ok(Collector {
            rx: Some(rx),
            eof: false,
            capture: Capture::new(cap),
        })
    }

    /// Whether the pipe reached EOF (or was abandoned).
    pub fn at_eof(&self) -> bool {
        self.eof
    }

    /// Reads until EOF. Cancel-safe: bytes already read are kept in the capture.
    pub async fn pump(&mut self) {
        let mut buf = Vec::with_capacity(FIRST_READ);
        while let (false, Some(rx)) = (self.eof, self.rx.as_mut()) {
            buf.clear();
            match rx.read_buf(&mut buf).await {
                Ok(0) | Err(_) => self.eof = true,
                Ok(n) => {
                    self.capture.push(&buf[..n]);
                    grow_read(&mut buf, n);
                }
            }
        }
    }

    /// Reads until EOF, handing every chunk to `publish` (a job's shared capture and output
    /// rings) as it arrives.
    pub async fn pump_with(&mut self, mut publish: impl FnMut(&[u8])) {
        let mut buf = Vec::with_capacity(FIRST_READ);
        while let (false, Some(rx)) = (self.eof, self.rx.as_mut()) {
            buf.clear();
            match rx.read_buf(&mut buf).await {
                Ok(0) | Err(_) => self.eof = true,
                Ok(n) => {
                    publish(&buf[..n]);
                    grow_read(&mut buf, n);
                }
            }
        }
    }

    /// Gives up on the pipe (a holder outside the job keeps it open) and closes it.
    pub fn abandon(&mut self) {
        self.rx = None;
        self.eof = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_buffer_doubles_only_when_a_read_fills_it() {
        let k = 1024;
        let cases = [
            (4 * k, 10, 4 * k),
            (4 * k, 4 * k - 1, 4 * k),
            (4 * k, 4 * k, 8 * k),
            (8 * k, 8 * k, 16 * k),
            (32 * k, 32 * k, 64 * k),
            (64 * k, 64 * k, 64 * k),
            (0, 0, 4 * k),
        ];
        for (cap, n, want) in cases {
            assert_eq!(next_read_capacity(cap, n), want, "{cap} {n}");
        }
    }
}
