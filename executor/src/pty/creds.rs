//! Session credentials: 256 random bits each, compared in constant time.
//!
//! The bytes come from the kernel's CSPRNG through `getrandom`, are written as lowercase hex
//! by `hex`, and a presented credential is compared by `subtle`, whose time depends only on
//! the lengths (a credential's length is public: it is always 64), never on where they differ.

use subtle::ConstantTimeEq;

/// Random bytes per credential (256 bits).
pub const CREDENTIAL_BYTES: usize = 32;

/// A fresh credential: [`CREDENTIAL_BYTES`] from the kernel's CSPRNG, as lowercase hex.
pub fn fresh() -> std::io::Result<String> {
    let mut buf = [0u8; CREDENTIAL_BYTES];
    getrandom::fill(&mut buf)?;
    Ok(hex::encode(buf))
}

/// Whether a presented credential is the real one, in time that does not depend on where
/// they differ.
pub fn matches(presented: &str, real: &str) -> bool {
    presented.as_bytes().ct_eq(real.as_bytes()).into()
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
        assert_eq!(a, a.to_lowercase());
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
