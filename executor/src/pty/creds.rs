//! Session credentials: 256 random bits each, compared in constant time.

use std::fmt::Write;

/// Random bytes per credential (256 bits).
pub const CREDENTIAL_BYTES: usize = 32;

/// A fresh credential: [`CREDENTIAL_BYTES`] from the kernel's CSPRNG, as lowercase hex.
pub fn fresh() -> std::io::Result<String> {
    let mut buf = [0u8; CREDENTIAL_BYTES];
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: getrandom writes at most `len` bytes into the buffer it is given.
        let n = unsafe {
            libc::getrandom(
                buf[filled..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - filled,
                0,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    let mut s = String::with_capacity(CREDENTIAL_BYTES * 2);
    for b in buf {
        let _ = write!(s, "{b:02x}");
    }
    Ok(s)
}

/// Compares a presented credential with the real one in time that depends only on their
/// lengths (a credential's length is public: it is always 64), never on where they differ.
pub fn matches(presented: &str, real: &str) -> bool {
    let (a, b) = (presented.as_bytes(), real.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_long_random_and_distinct() {
        let a = fresh().unwrap();
        let b = fresh().unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn matching() {
        let a = fresh().unwrap();
        assert!(matches(&a, &a.clone()));
        let mut wrong = a.clone().into_bytes();
        wrong[63] = if wrong[63] == b'0' { b'1' } else { b'0' };
        assert!(!matches(std::str::from_utf8(&wrong).unwrap(), &a));
        assert!(!matches("", &a));
        assert!(!matches(&a[..63], &a));
    }
}
