//! File-mode and owner rules of the fs surface (`mkdir`, `chmod`, `write`, `coder::*`), and
//! what a rewritten file keeps of the one it replaces.

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

/// Who replaces a file: the executor's ids, its supplementary groups and whether it holds
/// `CAP_CHOWN`.
#[derive(Debug, Clone, Copy)]
pub struct Writer<'a> {
    pub euid: u32,
    pub egid: u32,
    pub groups: &'a [u32],
    pub cap_chown: bool,
}

/// The owner and group a replacement keeps from the file it replaces. `None`: what the
/// kernel gives the writer's new file (its own uid; its gid, or the directory's when that is
/// setgid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptOwner {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// Which of a replaced file's owner `uid` and group `gid` its replacement (a new inode made
/// by the writer, renamed over it) keeps.
///
/// * The owner is kept when it is the writer's own. Another user's is kept only with
///   `CAP_CHOWN`, and only for a file the writer `may_write` (the kernel's `W_OK` answer for
///   the replaced file): a chown must never make content look like the owner's when the
///   writer could not have written it in place. A move passes `may_write: true` (the bytes
///   are the owner's own, as after a rename).
/// * The group is kept when it is one of the writer's groups (any owner may give its file
///   one of them), else under the same conditions as the owner.
///
/// What cannot be kept is the writer's: the write goes ahead, it is never refused for it.
pub fn kept_owner(uid: u32, gid: u32, w: &Writer<'_>, may_write: bool) -> KeptOwner {
    let privileged = w.cap_chown && may_write;
    KeptOwner {
        uid: (uid == w.euid || privileged).then_some(uid),
        gid: (gid == w.egid || w.groups.contains(&gid) || privileged).then_some(gid),
    }
}

/// Whether a `coder::*` rewrite of a file owned by `uid` must be refused: its replacement
/// would keep the owner `kept_uid` ([`KeptOwner::uid`]), and anything but `uid` itself means
/// the file would change hands. `shell::fs::write` and `sed` go ahead and leave such a file
/// the executor's (with its mode and ACL); an agent's edit never changes who owns a file.
pub fn edit_changes_owner(uid: u32, kept_uid: Option<u32>) -> bool {
    kept_uid != Some(uid)
}

/// The mode a rewrite keeps from the replaced file's `mode`: its permission bits and sticky
/// bit, setuid and setgid only when `allow_special_bits` (the executor's seccomp rule would
/// refuse setting them otherwise), setuid only when the owner is kept and setgid only when
/// the group is: a set-id file never changes hands with its bit on (as a chown clears it).
pub fn kept_mode(mode: u32, allow_special_bits: bool, kept: KeptOwner) -> u32 {
    let mut m = mode & 0o7777;
    if !allow_special_bits {
        m &= 0o1777;
    }
    if kept.uid.is_none() {
        m &= !0o4000;
    }
    if kept.gid.is_none() {
        m &= !0o2000;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_that_would_change_the_owner_is_refused() {
        assert!(!edit_changes_owner(1234, Some(1234)));
        assert!(edit_changes_owner(1234, None));
        assert!(edit_changes_owner(1234, Some(0)));
        let w = Writer {
            euid: 4242,
            egid: 4242,
            groups: &[],
            cap_chown: false,
        };
        assert!(edit_changes_owner(
            1234,
            kept_owner(1234, 1234, &w, true).uid
        ));
        assert!(!edit_changes_owner(
            4242,
            kept_owner(4242, 1234, &w, true).uid
        ));
        let root = Writer {
            euid: 0,
            egid: 0,
            groups: &[],
            cap_chown: true,
        };
        assert!(!edit_changes_owner(
            1234,
            kept_owner(1234, 1234, &root, true).uid
        ));
        // CAP_CHOWN, but a file the executor may not write: not handed back, so refused.
        assert!(edit_changes_owner(
            1234,
            kept_owner(1234, 1234, &root, false).uid
        ));
    }

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

    #[test]
    fn owners_a_replacement_keeps() {
        let groups = [100, 27];
        let plain = Writer {
            euid: 1000,
            egid: 100,
            groups: &groups,
            cap_chown: false,
        };
        let chown = Writer {
            cap_chown: true,
            ..plain
        };
        let kept = |uid, gid| KeptOwner { uid, gid };
        // (file uid, file gid, writer, may_write) -> kept
        let cases = [
            (1000, 100, plain, false, kept(Some(1000), Some(100))),
            (1000, 27, plain, true, kept(Some(1000), Some(27))),
            (1000, 5, plain, true, kept(Some(1000), None)),
            (4343, 4343, plain, true, kept(None, None)),
            (4343, 27, plain, true, kept(None, Some(27))),
            (4343, 27, plain, false, kept(None, Some(27))),
            (4343, 4343, chown, true, kept(Some(4343), Some(4343))),
            (0, 0, chown, true, kept(Some(0), Some(0))),
            // A file it may not write is not chowned to its owner, even with CAP_CHOWN.
            (4343, 4343, chown, false, kept(None, None)),
            (4343, 100, chown, false, kept(None, Some(100))),
            (1000, 4343, chown, false, kept(Some(1000), None)),
        ];
        for (uid, gid, w, may_write, want) in cases {
            assert_eq!(
                kept_owner(uid, gid, &w, may_write),
                want,
                "{uid}:{gid} cap_chown={} may_write={may_write}",
                w.cap_chown
            );
        }
    }

    #[test]
    fn modes_a_rewrite_keeps() {
        let both = KeptOwner {
            uid: Some(1),
            gid: Some(2),
        };
        let no_owner = KeptOwner { uid: None, ..both };
        let no_group = KeptOwner { gid: None, ..both };
        let neither = KeptOwner {
            uid: None,
            gid: None,
        };
        // (st_mode, allow_special_bits, kept) -> mode
        let cases = [
            (0o100640, false, both, 0o640),
            (0o100640, true, neither, 0o640),
            (0o106755, false, both, 0o755),
            (0o101644, false, both, 0o1644),
            (0o107755, false, neither, 0o1755),
            (0o107755, true, both, 0o7755),
            (0o106755, true, no_owner, 0o2755),
            (0o106755, true, no_group, 0o4755),
            (0o107755, true, neither, 0o1755),
        ];
        for (st_mode, allow, kept, want) in cases {
            assert_eq!(
                kept_mode(st_mode, allow, kept),
                want,
                "{st_mode:o} allow={allow} {kept:?}"
            );
        }
    }
}
