//! Line arithmetic shared by reads and edits.
//!
//! A line is a run of bytes ending in `\n` (kept as part of the line), or the run after the
//! last `\n` when the file does not end in one. So `""` has 0 lines, `"a"` 1, `"a\n"` 1 and
//! `"a\nb"` 2. `\r\n` is an ordinary line end whose `\r` stays in the line.

use std::io::BufRead;

/// Lines of `bytes` by the rule above.
pub fn count_lines(bytes: &[u8]) -> u64 {
    let n = memchr_count(bytes);
    n + u64::from(!bytes.is_empty() && bytes.last() != Some(&b'\n'))
}

fn memchr_count(bytes: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', bytes).count() as u64
}

/// The lines of `bytes`, each with its terminator.
pub fn split_lines(bytes: &[u8]) -> Vec<&[u8]> {
    bytes.split_inclusive(|&b| b == b'\n').collect()
}

/// A line without its `\n` / `\r\n`, as text (invalid UTF-8 as U+FFFD).
pub fn line_text(line: &[u8]) -> String {
    let l = line.strip_suffix(b"\n").unwrap_or(line);
    let l = l.strip_suffix(b"\r").unwrap_or(l);
    String::from_utf8_lossy(l).into_owned()
}

/// A window read out of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub content: String,
    pub lines: u64,
    /// Content exists beyond what was returned (window end before EOF, or the cap).
    pub more: bool,
    /// Known when the read reached EOF.
    pub total: Option<u64>,
    /// The returned content was valid UTF-8 as read.
    pub utf8: bool,
    /// Bytes of the stream consumed before the line the window stopped at (where the next
    /// line starts, or the line that did not fit).
    pub offset: u64,
}

/// Reads lines `from..=to` (1-based; `to: None` = to EOF) of `r`, keeping whole lines only,
/// while the returned text (after U+FFFD replacement, with `N→` prefixes when `numbered`)
/// stays within `cap` bytes. Lines before `from` are skipped without being kept, and reading
/// stops as soon as the window is complete: one look-ahead decides `more` (and `total` when
/// the stream ends right there). Memory stays within `cap` plus one buffer.
pub fn read_window<R: BufRead>(
    r: &mut R,
    from: u64,
    to: Option<u64>,
    cap: u64,
    numbered: bool,
) -> std::io::Result<Window> {
    let from = from.max(1);
    let mut w = Window {
        content: String::new(),
        lines: 0,
        more: false,
        total: None,
        utf8: true,
        offset: 0,
    };
    // Skip to line `from`, a buffer at a time: count the buffer's line ends, and when the
    // window starts inside it, consume up to the end of line `from - 1`.
    let mut line_no: u64 = 1;
    let mut partial = false;
    while line_no < from {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            w.total = Some(line_no - 1 + u64::from(partial));
            return Ok(w);
        }
        let need = usize::try_from(from - line_no).unwrap_or(usize::MAX);
        let mut ends = memchr::memchr_iter(b'\n', buf);
        match ends.nth(need - 1) {
            Some(i) => {
                r.consume(i + 1);
                w.offset += i as u64 + 1;
                line_no = from;
                partial = false;
            }
            None => {
                let (n, seen) = (buf.len(), memchr_count(buf));
                partial = buf.last() != Some(&b'\n');
                r.consume(n);
                w.offset += n as u64;
                line_no += seen;
            }
        }
    }
    // Collect lines from..=to.
    let mut line: Vec<u8> = Vec::new();
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    loop {
        if to.is_some_and(|t| line_no > t) {
            // Window complete: is there anything after it?
            if r.fill_buf()?.is_empty() {
                w.total = Some(line_no - 1);
            } else {
                w.more = true;
            }
            return Ok(w);
        }
        // Read one line, but never keep more than the remaining cap of it.
        line.clear();
        let room = cap.saturating_sub(w.content.len());
        let mut too_long = false;
        let mut ended = false;
        loop {
            let buf = r.fill_buf()?;
            if buf.is_empty() {
                break;
            }
            let (take, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            if line.len() + take > room {
                too_long = true;
                break;
            }
            line.extend_from_slice(&buf[..take]);
            r.consume(take);
            if done {
                ended = true;
                break;
            }
        }
        if too_long {
            w.more = true;
            return Ok(w);
        }
        if line.is_empty() {
            // EOF at a line boundary.
            w.total = Some(line_no - 1);
            return Ok(w);
        }
        let text = String::from_utf8_lossy(&line);
        let valid = matches!(text, std::borrow::Cow::Borrowed(_));
        let prefix = if numbered {
            format!("{line_no}→")
        } else {
            String::new()
        };
        if w.content.len() + prefix.len() + text.len() > cap {
            // The line fit as bytes, but not with its prefix or its replacement characters.
            w.more = true;
            return Ok(w);
        }
        w.offset += line.len() as u64;
        w.content.push_str(&prefix);
        w.content.push_str(&text);
        w.utf8 &= valid;
        w.lines += 1;
        line_no += 1;
        if !ended {
            // The last line had no terminator: this is EOF.
            w.total = Some(line_no - 1);
            return Ok(w);
        }
    }
}

/// The size of `bytes` as a read returns it: invalid UTF-8 replaced by U+FFFD, and with the
/// `N→` prefix of each line when `numbered`.
pub fn rendered_len(bytes: &[u8], numbered: bool) -> u64 {
    let text = String::from_utf8_lossy(bytes).len() as u64;
    if !numbered {
        return text;
    }
    let arrow = '→'.len_utf8() as u64;
    let prefixes: u64 = (1..=count_lines(bytes))
        .map(|n| n.to_string().len() as u64 + arrow)
        .sum();
    text + prefixes
}

/// Streaming line count and UTF-8 check of a reader, up to `limit` bytes. Returns
/// `(lines, utf8)` when the stream ended within the limit, `None` when it did not.
pub fn scan<R: std::io::Read>(r: R, limit: u64) -> std::io::Result<Option<(u64, bool)>> {
    let mut r = std::io::BufReader::with_capacity(64 * 1024, r.take(limit.saturating_add(1)));
    let mut total: u64 = 0;
    let mut lines: u64 = 0;
    let mut last: Option<u8> = None;
    let mut utf8 = true;
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        total += buf.len() as u64;
        if total > limit {
            return Ok(None);
        }
        lines += memchr_count(buf);
        last = buf.last().copied();
        if utf8 {
            carry.extend_from_slice(buf);
            match std::str::from_utf8(&carry) {
                Ok(_) => carry.clear(),
                Err(e) if e.error_len().is_none() => {
                    // An incomplete sequence at the end: keep it for the next chunk.
                    let keep = carry.split_off(e.valid_up_to());
                    carry = keep;
                }
                Err(_) => utf8 = false,
            }
        }
        let n = buf.len();
        r.consume(n);
    }
    if !carry.is_empty() {
        utf8 = false;
    }
    if last.is_some_and(|b| b != b'\n') {
        lines += 1;
    }
    Ok(Some((lines, utf8)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn win(s: &str, from: u64, to: Option<u64>, cap: u64, numbered: bool) -> Window {
        read_window(&mut s.as_bytes(), from, to, cap, numbered).unwrap()
    }

    #[test]
    fn counting() {
        assert_eq!(count_lines(b""), 0);
        assert_eq!(count_lines(b"a"), 1);
        assert_eq!(count_lines(b"a\n"), 1);
        assert_eq!(count_lines(b"a\nb"), 2);
        assert_eq!(count_lines(b"\n\n"), 2);
        assert_eq!(scan(&b"a\nb"[..], 100).unwrap(), Some((2, true)));
        assert_eq!(scan(&b"a\n\xff"[..], 100).unwrap(), Some((2, false)));
        assert_eq!(scan(&b"abc"[..], 2).unwrap(), None);
        assert_eq!(scan("é\n".as_bytes(), 100).unwrap(), Some((1, true)));
    }

    #[test]
    fn rendered_lengths() {
        assert_eq!(rendered_len(b"a\nb", false), 3);
        assert_eq!(rendered_len(b"a\nb", true), 3 + 2 * 4);
        assert_eq!(rendered_len(b"\xff\n", false), 4);
        let ten: Vec<u8> = b"x\n".repeat(10);
        assert_eq!(rendered_len(&ten, true), 20 + 9 * 4 + 5);
    }

    #[test]
    fn windows() {
        let text = "l1\nl2\nl3\nl4\n";
        let w = win(text, 2, Some(3), 1000, false);
        assert_eq!(
            (w.content.as_str(), w.lines, w.more, w.total),
            ("l2\nl3\n", 2, true, None)
        );
        let w = win(text, 3, None, 1000, false);
        assert_eq!(
            (w.content.as_str(), w.lines, w.more, w.total),
            ("l3\nl4\n", 2, false, Some(4))
        );
        let w = win(text, 3, Some(4), 1000, false);
        assert_eq!((w.more, w.total), (false, Some(4)));
        let w = win(text, 9, None, 1000, false);
        assert_eq!((w.content.as_str(), w.lines, w.total), ("", 0, Some(4)));
        let w = win("a\nb", 1, None, 1000, true);
        assert_eq!((w.content.as_str(), w.total), ("1→a\n2→b", Some(2)));
        // The cap keeps whole lines only.
        let w = win(text, 1, None, 7, false);
        assert_eq!(
            (w.content.as_str(), w.lines, w.more, w.total),
            ("l1\nl2\n", 2, true, None)
        );
        // Invalid UTF-8 is replaced and reported.
        let w = read_window(&mut &b"ok\n\xffx\n"[..], 1, None, 100, false).unwrap();
        assert_eq!((w.content.as_str(), w.utf8), ("ok\n\u{fffd}x\n", false));
        let w = read_window(&mut &b"ok\n\xffx\n"[..], 1, Some(1), 100, false).unwrap();
        assert!(w.utf8);
    }

    /// The skip counts line ends a buffer at a time: with buffers of 1 to 8 bytes (so lines
    /// and windows straddle buffer ends) every window equals the one-buffer answer.
    #[test]
    fn windows_across_buffer_ends() {
        let texts = [
            "l1\nl2\nl3\nl4\n",
            "a\n\n\nbb\nccc",
            "x",
            "\n\n\n",
            "long line\nz\n",
        ];
        for text in texts {
            for from in 1..=6 {
                for to in [None, Some(from), Some(from + 1)] {
                    let whole = win(text, from, to, 1000, true);
                    for cap in 1..=8 {
                        let mut r = std::io::BufReader::with_capacity(cap, text.as_bytes());
                        let got = read_window(&mut r, from, to, 1000, true).unwrap();
                        assert_eq!(got, whole, "{text:?} {from} {to:?} buffer {cap}");
                    }
                }
            }
        }
        assert_eq!(win("a\nbb\nccc", 3, None, 100, false).content, "ccc");
        assert_eq!(win("a\nbb\nccc", 5, None, 100, false).total, Some(3));
        assert_eq!(win("a\nbb\n", 5, None, 100, false).total, Some(2));
    }
}
