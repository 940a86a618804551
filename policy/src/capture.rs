//! Bounded capture of a command's output: bytes kept up to a cap, the rest counted as
//! truncation, and the text cut back to a character boundary.

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
