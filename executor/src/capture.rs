//! Bounded capture of a child's output.

use std::os::fd::OwnedFd;

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

/// Bytes kept up to a cap; the rest is read and discarded so the child never blocks on a
/// full pipe.
#[derive(Debug, Default, Clone)]
pub struct Capture {
    pub bytes: Vec<u8>,
    pub cap: usize,
    pub truncated: bool,
}

impl Capture {
    pub fn new(cap: usize) -> Self {
        Capture {
            bytes: Vec::new(),
            cap,
            truncated: false,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        let room = self.cap.saturating_sub(self.bytes.len());
        if chunk.len() > room {
            self.truncated = true;
        }
        self.bytes
            .extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    /// The text of the capture: cut back to a UTF-8 character boundary when truncation split
    /// a character, with invalid sequences replaced (U+FFFD).
    pub fn text(&self) -> String {
        let mut bytes = self.bytes.as_slice();
        if self.truncated {
            if let Err(e) = std::str::from_utf8(bytes) {
                // An incomplete sequence at the very end (error_len None) was split by the cap.
                let valid = e.valid_up_to();
                if e.error_len().is_none() && valid + 4 > bytes.len() {
                    bytes = &bytes[..valid];
                }
            }
        }
        String::from_utf8_lossy(bytes).into_owned()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_and_boundaries() {
        let mut c = Capture::new(4);
        c.push(b"abcd");
        assert!(!c.truncated);
        assert_eq!(c.text(), "abcd");
        c.push(b"e");
        assert!(c.truncated);

        let mut c = Capture::new(5);
        c.push("ab€".as_bytes()); // 2 + 3 bytes: fits exactly
        assert_eq!(c.text(), "ab€");
        let mut c = Capture::new(4);
        c.push("ab€".as_bytes()); // the cap splits the euro sign
        assert!(c.truncated);
        assert_eq!(c.text(), "ab");

        let mut c = Capture::new(10);
        c.push(&[b'a', 0xff, b'b']);
        assert_eq!(c.text(), "a\u{fffd}b");
    }
}
