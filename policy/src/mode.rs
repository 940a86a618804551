//! File-mode and owner rules of the fs surface (`mkdir`, `chmod`, `write`, `coder::*`).

use crate::error::PolicyError;

/// Parses an octal mode string (`"0644"`, `"755"`): S210 on anything else. Special bits
/// (setuid, setgid, sticky) are refused unless `allow_special_bits`.
pub fn parse_mode(s: &str, allow_special_bits: bool) -> Result<u32, String> {
    let t = s.trim();
    if t.is_empty() || t.len() > 5 || !t.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(format!(
            "bad octal mode {s:?}: expected an octal string such as \"0644\""
        ));
    }
    let mode = u32::from_str_radix(t, 8).map_err(|_| format!("bad octal mode {s:?}"))?;
    if mode > 0o7777 {
        return Err(format!("bad octal mode {s:?}: above 07777"));
    }
    if mode & 0o7000 != 0 && !allow_special_bits {
        return Err(format!(
            "mode {s:?} carries setuid/setgid/sticky bits, which fs.allow_special_bits does not permit"
        ));
    }
    Ok(mode)
}

/// The octal string form of a mode's permission bits (`"0644"`).
pub fn mode_string(mode: u32) -> String {
    format!("{:04o}", mode & 0o7777)
}

/// The owner ids of `shell::fs::chmod` (S210 when refused). `u32::MAX` is `(uid_t)-1`, which
/// chown(2) reads as "leave unchanged": a caller asking for it would get a reply saying the
/// owner changed when it did not, so it is refused rather than passed to the kernel. Checked
/// by the broker and again by the executor.
pub fn check_owner_ids(uid: Option<u32>, gid: Option<u32>) -> Result<(), PolicyError> {
    for (key, id) in [("uid", uid), ("gid", gid)] {
        if id == Some(u32::MAX) {
            return Err(PolicyError::Invalid(format!(
                "{key} 4294967295 is not an id: it is (uid_t)-1, which chown reads as \"no change\"; omit {key} to keep the current owner"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(parse_mode("0644", false), Ok(0o644));
        assert_eq!(parse_mode("755", false), Ok(0o755));
        for bad in ["", "abc", "0999", "77777", "-1", "0o644"] {
            assert!(parse_mode(bad, false).is_err(), "{bad}");
        }
        assert!(parse_mode("4755", false).unwrap_err().contains("setuid"));
        assert_eq!(parse_mode("4755", true), Ok(0o4755));
        assert_eq!(mode_string(0o100644), "0644");
    }

    #[test]
    fn owner_ids() {
        let cases: [(Option<u32>, Option<u32>, Option<&str>); 6] = [
            (None, None, None),
            (Some(0), Some(0), None),
            (Some(1000), None, None),
            (Some(u32::MAX - 1), Some(u32::MAX - 1), None),
            (Some(u32::MAX), None, Some("uid 4294967295 is not an id")),
            (Some(5), Some(u32::MAX), Some("gid 4294967295 is not an id")),
        ];
        for (uid, gid, want) in cases {
            let got = check_owner_ids(uid, gid);
            match want {
                None => assert_eq!(got, Ok(()), "{uid:?} {gid:?}"),
                Some(w) => {
                    let e = got.unwrap_err();
                    assert_eq!(e.code(), crate::Code::S210);
                    assert!(e.to_string().starts_with(w), "{e}");
                }
            }
        }
    }
}
