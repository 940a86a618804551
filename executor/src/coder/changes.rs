//! The change snapshots `coder::change-diff` serves (a minimal store; the change-history
//! issue replaces it with the turns store).
//!
//! Every successful `create-file`, `update-file` and (file) `delete-file` entry records the
//! exact bytes before and after. The id of a change is the revision of the bytes it left
//! (`sha256:<hex>`, the `revision` a create returns and a later `read-file` reports); a
//! deletion's id is `deleted:<canonical path>`. The store is in memory, bounded by
//! [`CHANGE_STORE_ENTRIES`] and [`CHANGE_STORE_BYTES`] (oldest dropped first), and does not
//! survive an executor restart.

use std::collections::VecDeque;
use std::sync::Mutex;

use iii_shell_protocol::coder::{ChangeDiffOutput, CHANGE_STORE_BYTES, CHANGE_STORE_ENTRIES};
use iii_shell_protocol::error::not_found_message;
use iii_shell_protocol::Code;

use super::paths::CErr;

struct Change {
    id: String,
    path: String,
    old: Vec<u8>,
    new: Vec<u8>,
}

static STORE: Mutex<VecDeque<Change>> = Mutex::new(VecDeque::new());

fn lock() -> std::sync::MutexGuard<'static, VecDeque<Change>> {
    STORE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records a change (bodies larger than the whole store are not kept).
pub fn record(id: String, path: String, old: Vec<u8>, new: Vec<u8>) {
    if old.len() + new.len() > CHANGE_STORE_BYTES {
        return;
    }
    let mut s = lock();
    s.retain(|c| c.id != id);
    s.push_back(Change { id, path, old, new });
    let mut bytes: usize = s.iter().map(|c| c.old.len() + c.new.len()).sum();
    while s.len() > CHANGE_STORE_ENTRIES || bytes > CHANGE_STORE_BYTES {
        match s.pop_front() {
            Some(c) => bytes -= c.old.len() + c.new.len(),
            None => break,
        }
    }
}

/// The before/after of a change; an unknown id is C211.
pub fn diff(id: &str) -> Result<ChangeDiffOutput, CErr> {
    let s = lock();
    let c = s
        .iter()
        .rev()
        .find(|c| c.id == id)
        .ok_or_else(|| CErr::new(Code::C211, not_found_message(&format!("change {id}"))))?;
    let (old, new) = (std::str::from_utf8(&c.old), std::str::from_utf8(&c.new));
    let text = old.is_ok() && new.is_ok();
    Ok(ChangeDiffOutput {
        path: c.path.clone(),
        is_binary: !text,
        old_contents: if text {
            old.ok().map(str::to_string)
        } else {
            None
        },
        new_contents: if text {
            new.ok().map(str::to_string)
        } else {
            None
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_roundtrip_and_binary() {
        record("t1".into(), "/p".into(), b"a".to_vec(), b"b".to_vec());
        let d = diff("t1").unwrap();
        assert_eq!(
            (
                d.old_contents.as_deref(),
                d.new_contents.as_deref(),
                d.is_binary
            ),
            (Some("a"), Some("b"), false)
        );
        record("t2".into(), "/p".into(), b"a".to_vec(), b"\xff".to_vec());
        let d = diff("t2").unwrap();
        assert_eq!(
            (d.old_contents, d.new_contents, d.is_binary),
            (None, None, true)
        );
        assert_eq!(diff("nope").unwrap_err().code, Code::C211);
    }
}
