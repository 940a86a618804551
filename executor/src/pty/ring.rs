//! A session's output ring: frames with strictly increasing sequence numbers, at most
//! [`RING_BYTES`] of data and [`RING_FRAMES`] frames, oldest evicted first.
//!
//! Data lives in one contiguous byte queue and frames are `(sequence, length)` entries over
//! it, so a flood of one-byte reads costs 16 bytes of index per frame, not an allocation.
//! A frame nobody has seen yet (not pushed, not replayed: not *sealed*) grows in place when
//! more output arrives, up to [`MAX_FRAME`]: a slow or absent consumer finds few large frames
//! instead of many small ones, and no sequence number it could have seen ever changes.

use std::collections::VecDeque;

/// Bytes of output a session keeps for replay.
pub const RING_BYTES: usize = 2 * 1024 * 1024;
/// Frames a session keeps for replay (bounds the index under a flood of tiny reads).
pub const RING_FRAMES: usize = 65_536;
/// An unsealed frame grows in place up to this size.
pub const MAX_FRAME: usize = 64 * 1024;

#[derive(Debug, Default)]
pub struct Ring {
    data: VecDeque<u8>,
    /// `(sequence, absolute start offset)` of every frame held, oldest first. A frame ends
    /// where the next one starts (the newest at `end`).
    frames: VecDeque<(u64, u64)>,
    /// Absolute offset of `data[0]`, and of the end of the data.
    start: u64,
    end: u64,
    /// Sequence of the newest frame ever produced (0: none yet).
    last: u64,
    /// Highest sequence evicted (0: nothing evicted).
    evicted_through: u64,
    /// Frames up to this sequence have been seen and never change again.
    sealed_through: u64,
}

/// What a replay from `after_sequence` found.
#[derive(Debug, PartialEq, Eq)]
pub struct Replay {
    pub frames: Vec<(u64, Vec<u8>)>,
    /// The sequence the next frame will have.
    pub next_sequence: u64,
    /// Frames after `after_sequence` were evicted before this replay.
    pub truncated: bool,
}

impl Ring {
    pub fn new() -> Ring {
        Ring::default()
    }

    /// Appends output, growing the newest frame when it is unsealed and small enough, and
    /// evicts the oldest frames past the caps. Returns the sequence now holding the bytes.
    pub fn push(&mut self, bytes: &[u8]) -> u64 {
        if bytes.is_empty() {
            return self.last;
        }
        // Output larger than the ring keeps only its tail.
        let bytes = &bytes[bytes.len().saturating_sub(RING_BYTES)..];
        let grow = match self.frames.back() {
            Some(&(seq, start)) => {
                seq > self.sealed_through && (self.end - start) as usize + bytes.len() <= MAX_FRAME
            }
            None => false,
        };
        if !grow {
            self.last += 1;
            self.frames.push_back((self.last, self.end));
        }
        self.data.extend(bytes);
        self.end += bytes.len() as u64;
        while self.data.len() > RING_BYTES || self.frames.len() > RING_FRAMES {
            self.evict_oldest();
        }
        self.last
    }

    fn evict_oldest(&mut self) {
        if let Some((seq, _)) = self.frames.pop_front() {
            let next = self.frames.front().map(|f| f.1).unwrap_or(self.end);
            self.data.drain(..(next - self.start) as usize);
            self.start = next;
            self.evicted_through = seq;
        }
    }

    /// Marks every frame produced so far as seen: later output starts a new frame.
    pub fn seal(&mut self) {
        self.sealed_through = self.last;
    }

    /// Sequence of the newest frame produced (0 before any output).
    pub fn last(&self) -> u64 {
        self.last
    }

    pub fn frame_count(&self) -> usize {
        self.frames.len()
    }

    pub fn byte_count(&self) -> usize {
        self.data.len()
    }

    /// Bytes held in frames with a sequence above `after`.
    pub fn bytes_after(&self, after: u64) -> usize {
        let i = self.frames.partition_point(|f| f.0 <= after);
        match self.frames.get(i) {
            Some(&(_, start)) => (self.end - start) as usize,
            None => 0,
        }
    }

    /// Whether a replay from the start would miss evicted frames.
    pub fn truncated(&self) -> bool {
        self.evicted_through > 0
    }

    /// Frames with a sequence above `after_sequence`, sealing them (they have been seen).
    pub fn replay(&mut self, after_sequence: u64) -> Replay {
        let frames = self
            .span(after_sequence, usize::MAX)
            .map(|(first, n, _)| {
                (first..first + n)
                    .map(|i| {
                        let (seq, a, b) = self.frame(i);
                        (seq, self.bytes(a, b))
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.seal();
        Replay {
            truncated: after_sequence < self.evicted_through,
            next_sequence: self.last + 1,
            frames,
        }
    }

    /// `(sequence, start, end)` of the frame at index `i`.
    fn frame(&self, i: usize) -> (u64, u64, u64) {
        let (seq, a) = self.frames[i];
        let b = self.frames.get(i + 1).map(|f| f.1).unwrap_or(self.end);
        (seq, a, b)
    }

    /// A copy of the data between two absolute offsets (two `memcpy`s at most: the queue's
    /// two halves).
    fn bytes(&self, a: u64, b: u64) -> Vec<u8> {
        let (a, b) = ((a - self.start) as usize, (b - self.start) as usize);
        let (head, tail) = self.data.as_slices();
        let mut out = Vec::with_capacity(b - a);
        if a < head.len() {
            out.extend_from_slice(&head[a..b.min(head.len())]);
        }
        if b > head.len() {
            out.extend_from_slice(&tail[a.saturating_sub(head.len())..b - head.len()]);
        }
        out
    }

    /// The frames above `after`, whole, until `budget` bytes (at least one): `(index of the
    /// first, how many, bytes)`. `None` when there is none.
    fn span(&self, after: u64, budget: usize) -> Option<(usize, usize, usize)> {
        let first = self.frames.partition_point(|f| f.0 <= after);
        if first >= self.frames.len() {
            return None;
        }
        let mut n = 0;
        let mut taken = 0usize;
        while first + n < self.frames.len() {
            let (_, a, b) = self.frame(first + n);
            let len = (b - a) as usize;
            if n > 0 && taken + len > budget {
                break;
            }
            taken += len;
            n += 1;
        }
        Some((first, n, taken))
    }

    /// Output above `after` through `through`, coalesced (a push repeated with the bounds it
    /// had the first time, so a receiver can tell it from new output by its sequence).
    pub fn take_range(&mut self, after: u64, through: u64) -> Option<(u64, u64, Vec<u8>, bool)> {
        let i = self.frames.partition_point(|f| f.0 <= after);
        let j = self.frames.partition_point(|f| f.0 <= through);
        if i >= j {
            return None;
        }
        let (first, a, _) = self.frame(i);
        let (last, _, b) = self.frame(j - 1);
        if last > self.sealed_through {
            self.sealed_through = last;
        }
        Some((first, last, self.bytes(a, b), after < self.evicted_through))
    }

    /// Output above `after` coalesced into one chunk of at most about `budget` bytes (whole
    /// frames, at least one), sealing what it takes. `None` when there is nothing above
    /// `after`. Returns `(first, last, data, gap)`: `gap` when frames above `after` were
    /// evicted before being taken.
    pub fn take_after(&mut self, after: u64, budget: usize) -> Option<(u64, u64, Vec<u8>, bool)> {
        let (i, n, _) = self.span(after, budget)?;
        let (first, a, _) = self.frame(i);
        let (last, _, b) = self.frame(i + n - 1);
        if last > self.sealed_through {
            self.sealed_through = last;
        }
        Some((first, last, self.bytes(a, b), after < self.evicted_through))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsealed_frames_grow_sealed_ones_do_not() {
        let mut r = Ring::new();
        assert_eq!(r.push(b"ab"), 1);
        assert_eq!(r.push(b"cd"), 1);
        r.seal();
        assert_eq!(r.push(b"ef"), 2);
        let rep = r.replay(0);
        assert_eq!(rep.frames, vec![(1, b"abcd".to_vec()), (2, b"ef".to_vec())]);
        assert_eq!(rep.next_sequence, 3);
        assert!(!rep.truncated);
        // The replay sealed frame 2.
        assert_eq!(r.push(b"g"), 3);
        assert_eq!(r.replay(2).frames, vec![(3, b"g".to_vec())]);
        assert_eq!(r.replay(3).frames, vec![]);
        assert_eq!(r.replay(99).frames, vec![]);
    }

    #[test]
    fn a_full_frame_starts_a_new_one() {
        let mut r = Ring::new();
        r.push(&vec![b'a'; MAX_FRAME - 1]);
        assert_eq!(r.push(b"b"), 1);
        assert_eq!(r.push(b"c"), 2);
    }

    #[test]
    fn eviction_by_bytes_reports_truncation_exactly() {
        let mut r = Ring::new();
        let chunk = vec![b'x'; MAX_FRAME];
        let n = RING_BYTES / MAX_FRAME; // frames that fit exactly
        for _ in 0..n {
            r.seal();
            r.push(&chunk);
        }
        assert_eq!(r.byte_count(), RING_BYTES);
        assert!(!r.truncated());
        assert!(!r.replay(0).truncated);
        r.seal();
        r.push(b"y");
        // Frame 1 was evicted to make room.
        assert!(r.truncated());
        let rep = r.replay(0);
        assert!(rep.truncated);
        assert_eq!(rep.frames.first().unwrap().0, 2);
        assert_eq!(rep.frames.last().unwrap(), &(n as u64 + 1, b"y".to_vec()));
        // From the evicted frame on, nothing is missing.
        assert!(!r.replay(1).truncated);
        let total: usize = r.replay(1).frames.iter().map(|f| f.1.len()).sum();
        assert_eq!(total, RING_BYTES - MAX_FRAME + 1);
    }

    #[test]
    fn eviction_by_frame_count() {
        let mut r = Ring::new();
        for _ in 0..RING_FRAMES + 10 {
            r.seal();
            r.push(b"z");
        }
        assert_eq!(r.frame_count(), RING_FRAMES);
        let rep = r.replay(0);
        assert_eq!(rep.frames.first().unwrap().0, 11);
        assert!(rep.truncated);
        assert!(!r.replay(10).truncated);
        assert!(r.replay(9).truncated);
    }

    #[test]
    fn output_larger_than_the_ring_keeps_its_tail() {
        let mut r = Ring::new();
        let mut big = vec![b'a'; RING_BYTES];
        big.extend_from_slice(b"tail");
        r.push(&big);
        assert_eq!(r.byte_count(), RING_BYTES);
        let rep = r.replay(0);
        assert!(rep.frames.concat_data().ends_with(b"tail"));
    }

    trait Concat {
        fn concat_data(&self) -> Vec<u8>;
    }
    impl Concat for Vec<(u64, Vec<u8>)> {
        fn concat_data(&self) -> Vec<u8> {
            self.iter().flat_map(|f| f.1.clone()).collect()
        }
    }

    #[test]
    fn take_after_coalesces_and_seals() {
        let mut r = Ring::new();
        r.push(b"a");
        r.seal();
        r.push(b"b");
        r.seal();
        r.push(b"c");
        assert_eq!(r.take_after(0, 1024), Some((1, 3, b"abc".to_vec(), false)));
        // Sealed: new output is a new frame.
        assert_eq!(r.push(b"d"), 4);
        assert_eq!(r.take_after(3, 1024), Some((4, 4, b"d".to_vec(), false)));
        assert_eq!(r.take_after(4, 1024), None);
        // The budget stops at whole frames but always takes one.
        r.push(b"eee");
        r.seal();
        r.push(b"ff");
        assert_eq!(r.take_after(4, 1), Some((5, 5, b"eee".to_vec(), false)));
        assert_eq!(r.take_after(5, 1), Some((6, 6, b"ff".to_vec(), false)));
    }

    #[test]
    fn bytes_after_counts_whole_frames_above_a_sequence() {
        let mut r = Ring::new();
        assert_eq!(r.bytes_after(0), 0);
        r.push(b"abc");
        r.seal();
        r.push(b"de");
        assert_eq!(r.bytes_after(0), 5);
        assert_eq!(r.bytes_after(1), 2);
        assert_eq!(r.bytes_after(2), 0);
        assert_eq!(r.bytes_after(99), 0);
        // Evicted frames are not counted.
        for _ in 0..RING_BYTES / MAX_FRAME {
            r.seal();
            r.push(&vec![b'z'; MAX_FRAME]);
        }
        assert_eq!(r.bytes_after(0), r.byte_count());
        assert!(r.byte_count() <= RING_BYTES);
    }

    /// Frames read back across the byte queue's wrap-around are the bytes pushed, with
    /// eviction: the ring against a plain model over thousands of pushes of varying sizes.
    #[test]
    fn replay_matches_a_model_across_wraps() {
        let mut r = Ring::new();
        let mut model: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
        let mut x = 7u32;
        for i in 0..4000u32 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let len = 1 + (x >> 8) as usize % 40_000;
            let bytes: Vec<u8> = (0..len).map(|k| (k as u32 ^ i) as u8).collect();
            r.seal();
            let seq = r.push(&bytes);
            model.push_back((seq, bytes));
            while model.iter().map(|f| f.1.len()).sum::<usize>() > RING_BYTES {
                model.pop_front();
            }
            if i % 97 == 0 {
                let after = model.front().map(|f| f.0 - 1).unwrap_or(0);
                assert_eq!(r.replay(after).frames, Vec::from(model.clone()), "push {i}");
                let (first, last, data, _) = r.take_after(after, usize::MAX).unwrap();
                assert_eq!((first, last), (model[0].0, model.back().unwrap().0));
                assert_eq!(
                    data,
                    model.iter().flat_map(|f| f.1.clone()).collect::<Vec<u8>>()
                );
            }
        }
    }

    #[test]
    fn take_range_repeats_earlier_bounds() {
        let mut r = Ring::new();
        for chunk in [b"a", b"b", b"c", b"d"] {
            r.push(chunk);
            r.seal();
        }
        assert_eq!(r.take_range(1, 3), Some((2, 3, b"bc".to_vec(), false)));
        assert_eq!(r.take_range(3, 3), None);
        assert_eq!(r.take_range(3, 9), Some((4, 4, b"d".to_vec(), false)));
    }

    #[test]
    fn take_after_reports_a_gap_when_unsent_frames_were_evicted() {
        let mut r = Ring::new();
        for _ in 0..RING_FRAMES + 1 {
            r.seal();
            r.push(b"q");
        }
        let (first, _, _, gap) = r.take_after(0, usize::MAX).unwrap();
        assert_eq!(first, 2);
        assert!(gap);
        let (_, _, _, gap) = r.take_after(1, 10).unwrap();
        assert!(!gap);
    }
}
