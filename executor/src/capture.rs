//! Reading a child's output pipe into a bounded [`Capture`] (the capture itself, and its
//! truncation, are shared policy: `iii_shell_policy::capture`).

use std::os::fd::OwnedFd;

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

pub use iii_shell_policy::capture::Capture;

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
        // Read into spare capacity: no 64 KiB of zeroes per command.
        let mut buf = Vec::with_capacity(64 * 1024);
        while let (false, Some(rx)) = (self.eof, self.rx.as_mut()) {
            buf.clear();
            match rx.read_buf(&mut buf).await {
                Ok(0) | Err(_) => self.eof = true,
                Ok(n) => self.capture.push(&buf[..n]),
            }
        }
    }

    /// Reads until EOF, publishing every chunk into a shared capture.
    pub async fn pump_into(&mut self, shared: &std::sync::Mutex<Capture>) {
        let mut buf = Vec::with_capacity(64 * 1024);
        while let (false, Some(rx)) = (self.eof, self.rx.as_mut()) {
            buf.clear();
            match rx.read_buf(&mut buf).await {
                Ok(0) | Err(_) => self.eof = true,
                Ok(n) => shared
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(&buf[..n]),
            }
        }
    }

    /// Gives up on the pipe (a holder outside the job keeps it open) and closes it.
    pub fn abandon(&mut self) {
        self.rx = None;
        self.eof = true;
    }
}
