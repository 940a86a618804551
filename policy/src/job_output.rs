//! A job's output as `shell::job::read` sees it: each stream (stdout, stderr, and the two
//! merged in arrival order) is a bounded ring of its newest bytes, addressed by absolute
//! offsets counted from the job's first byte. A reader names the offset it has read up to; a
//! reader that fell behind the ring is told exactly how many bytes it missed, never silently
//! skipped ahead. Pure arithmetic, no I/O.

use std::collections::VecDeque;

/// The newest bytes of one stream, at most `cap` of them.
#[derive(Debug, Clone)]
pub struct OutputRing {
    buf: VecDeque<u8>,
    /// Absolute offset of `buf[0]`: how many bytes have fallen out of the ring.
    start: u64,
    cap: usize,
}

/// What one read of a ring returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingSlice {
    /// Absolute offset of the first byte of `bytes` (past the asked offset by `missed`).
    pub offset: u64,
    pub bytes: Vec<u8>,
    /// The offset to ask next.
    pub next_offset: u64,
    /// Bytes between the asked offset and `offset` that fell out of the ring.
    pub missed: u64,
}

/// The asked offset is past every byte the stream has produced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("offset {offset} is past the end of the stream ({end} bytes so far)")]
pub struct PastEnd {
    pub offset: u64,
    pub end: u64,
}

impl OutputRing {
    /// A ring keeping at most `cap` bytes (at least 1).
    pub fn new(cap: usize) -> Self {
        OutputRing {
            buf: VecDeque::new(),
            start: 0,
            cap: cap.max(1),
        }
    }

    /// Appends `chunk`; the oldest bytes fall out past the cap.
    pub fn push(&mut self, chunk: &[u8]) {
        let chunk = if chunk.len() > self.cap {
            let skipped = chunk.len() - self.cap;
            self.start += self.buf.len() as u64 + skipped as u64;
            self.buf.clear();
            &chunk[skipped..]
        } else {
            chunk
        };
        let over = (self.buf.len() + chunk.len()).saturating_sub(self.cap);
        self.buf.drain(..over);
        self.start += over as u64;
        self.buf.extend(chunk);
    }

    /// Absolute offset one past the newest byte: every byte the stream has produced.
    pub fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    /// Bytes the ring holds now.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// At most `max` bytes from `offset` on. An offset behind the ring starts at its oldest
    /// byte and counts the gap as `missed`; one past [`OutputRing::end`] is an error.
    pub fn read(&self, offset: u64, max: usize) -> Result<RingSlice, PastEnd> {
        let end = self.end();
        if offset > end {
            return Err(PastEnd { offset, end });
        }
        let from = offset.max(self.start);
        let skip = (from - self.start) as usize;
        let take = (self.buf.len() - skip).min(max);
        let bytes: Vec<u8> = self.buf.range(skip..skip + take).copied().collect();
        Ok(RingSlice {
            offset: from,
            next_offset: from + take as u64,
            missed: from - offset,
            bytes,
        })
    }
}

/// How many of `bytes` a reply carries so that it does not end inside a UTF-8 character when
/// it can end before it: a character cut at the end (by `max_bytes`, or not yet all written)
/// is left for the next read. When the stream has `ended`, or nothing would be left, every
/// byte goes.
pub fn utf8_cut(bytes: &[u8], ended: bool) -> usize {
    if ended {
        return bytes.len();
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        // An incomplete sequence at the very end: `error_len` is None only then.
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => e.valid_up_to(),
        Err(_) => bytes.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(offset: u64, bytes: &[u8], next_offset: u64, missed: u64) -> RingSlice {
        RingSlice {
            offset,
            bytes: bytes.to_vec(),
            next_offset,
            missed,
        }
    }

    #[test]
    fn reads_within_the_ring_are_exact() {
        let mut r = OutputRing::new(8);
        assert_eq!(r.read(0, 10), Ok(slice(0, b"", 0, 0)));
        r.push(b"abc");
        r.push(b"de");
        assert_eq!(r.end(), 5);
        assert_eq!(r.read(0, 10), Ok(slice(0, b"abcde", 5, 0)));
        assert_eq!(r.read(1, 2), Ok(slice(1, b"bc", 3, 0)));
        assert_eq!(r.read(5, 2), Ok(slice(5, b"", 5, 0)));
        assert_eq!(r.read(6, 2), Err(PastEnd { offset: 6, end: 5 }));
        assert_eq!(r.read(0, 0), Ok(slice(0, b"", 0, 0)));
    }

    #[test]
    fn a_reader_behind_the_ring_is_told_exactly_what_it_missed() {
        let mut r = OutputRing::new(4);
        r.push(b"abcdef"); // 6 bytes into 4: "ab" fall out at once
        assert_eq!((r.end(), r.len()), (6, 4));
        assert_eq!(r.read(0, 10), Ok(slice(2, b"cdef", 6, 2)));
        r.push(b"g"); // "c" falls out
        assert_eq!(r.read(0, 2), Ok(slice(3, b"de", 5, 3)));
        assert_eq!(r.read(2, 10), Ok(slice(3, b"defg", 7, 1)));
        assert_eq!(r.read(3, 10), Ok(slice(3, b"defg", 7, 0)));
        // A chunk larger than the ring, onto a full ring: 4 old + 3 skipped bytes fall out.
        r.push(b"1234567");
        assert_eq!((r.end(), r.len()), (14, 4));
        assert_eq!(r.read(7, 10), Ok(slice(10, b"4567", 14, 3)));
    }

    #[test]
    fn a_chunk_exactly_the_ring_replaces_it() {
        let mut r = OutputRing::new(3);
        r.push(b"ab");
        r.push(b"xyz");
        assert_eq!(r.read(0, 9), Ok(slice(2, b"xyz", 5, 2)));
        let mut z = OutputRing::new(0); // a cap of 0 is taken as 1
        z.push(b"ab");
        assert_eq!(z.read(0, 9), Ok(slice(1, b"b", 2, 1)));
    }

    #[test]
    fn a_reply_never_ends_inside_a_character_it_can_end_before() {
        let euro = "a€".as_bytes(); // 1 + 3 bytes
        assert_eq!(utf8_cut(euro, false), 4);
        assert_eq!(utf8_cut(&euro[..3], false), 1);
        assert_eq!(utf8_cut(&euro[..2], false), 1);
        // The stream ended: the cut character goes as it is.
        assert_eq!(utf8_cut(&euro[..3], true), 3);
        // Nothing would be left: everything goes.
        assert_eq!(utf8_cut(&euro[1..3], false), 2);
        // Invalid bytes in the middle are not a cut character.
        assert_eq!(utf8_cut(&[b'a', 0xff, b'b'], false), 3);
        assert_eq!(utf8_cut(b"", false), 0);
    }
}
