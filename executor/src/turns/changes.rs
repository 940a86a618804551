//! `coder::change-diff` as a view of the turn records (CODER-72, 73): one history, not two.
//!
//! A `coder::create-file`, `update-file` or (file) `delete-file` entry that changed a file is
//! recorded with the rest of its call, in the turn the call records into (`calls`: the open
//! turn, else a one-call turn of [`super::calls::OUTSIDE_TURNS`]). Beside the file's `post`,
//! [`super::Turns::finish`] appends a `change` record ([`change_record`]): the change id, the
//! canonical path the coder reported, the turn's file record it belongs to (`file`) and the
//! revisions of the exact bytes before and after. Both bodies are blobs of the store
//! ([`Turns::keep_body`]), under `turns.max_blob_bytes` and its eviction like every pre-image;
//! the id goes to the store's index (`changes/`, [`super::store::Store::index_change`]).
//!
//! [`Turns::change_diff_by_id`] answers from those records only: the id's newest index line
//! names a session and turn, the `change` record must be in that session's log, the turn must
//! still list the file, and both bodies must still be blobs. So a diff is there exactly as long
//! as its turn record and bodies are, across executor restarts, and an id is gone (C211 for the
//! caller) when the turn history has no record of the change or reads `stored: false`.

use serde_json::{json, Value};

use super::history::fold;
use super::model::revision;
use super::reach::Reach;
use super::state::Turns;
use crate::policy::Policy;
use iii_shell_files::error::ExecError;
use iii_shell_protocol::clock::now_ms;

/// One change a coder call made to a file: its id (the revision of the bytes it left, or
/// `deleted:<canonical path>`), the canonical path, and the revisions of the exact bytes
/// before and after (a missing side is the empty body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub id: String,
    pub path: String,
    pub old: String,
    pub new: String,
}

/// `coder::change-diff`'s answer for two bodies (CODER-72): both contents when both sides are
/// UTF-8 (a missing side is the empty body), neither and `is_binary: true` otherwise.
pub fn change_diff_output(path: &str, old: Option<&[u8]>, new: Option<&[u8]>) -> Value {
    let o = std::str::from_utf8(old.unwrap_or_default());
    let n = std::str::from_utf8(new.unwrap_or_default());
    match (o, n) {
        (Ok(o), Ok(n)) => {
            json!({"path": path, "is_binary": false, "old_contents": o, "new_contents": n})
        }
        _ => json!({"path": path, "is_binary": true}),
    }
}

/// The `change` record of `change` in `turn`, filed under the turn's record of `file`.
pub fn change_record(turn: &str, file: &str, change: &Change) -> Value {
    json!({"t": "change", "turn_id": turn, "change_id": change.id, "path": change.path,
        "file": file, "old": change.old, "new": change.new, "at": now_ms()})
}

impl Turns {
    /// Keeps `body` as a blob of the store and returns its revision (`None` when it is over
    /// `turns.max_blob_bytes` or cannot be written).
    pub fn keep_body(&self, policy: &Policy, body: &[u8]) -> Option<String> {
        let rev = revision(body);
        self.with_store(policy, |s| s.put_blob(&rev, body))
            .ok()
            .filter(|kept| *kept)
            .map(|_| rev)
    }

    /// `coder::change-diff` of `id` from the turn records: `Ok(None)` when no turn record
    /// holds the change, one of its bodies is no longer kept, or `reach` refuses its path (the
    /// path the coder reported or the turn's record of it: denied, outside the roots or the
    /// caller's scope now); `Err` when the store cannot be opened.
    pub fn change_diff_by_id(
        &self,
        policy: &Policy,
        reach: &Reach<'_>,
        id: &str,
    ) -> Result<Option<Value>, ExecError> {
        self.with_store(policy, |s| {
            let (session, turn) = s.find_change(id)?;
            let records = s.records(&session);
            let change = records.iter().rev().find(|r| {
                r["t"].as_str() == Some("change")
                    && r["turn_id"].as_str() == Some(turn.as_str())
                    && r["change_id"].as_str() == Some(id)
            })?;
            let (path, file) = (change["path"].as_str()?, change["file"].as_str()?);
            if !reach.allows(path) {
                return None;
            }
            let turns = fold(&records);
            let record = turns
                .iter()
                .filter(|t| t.turn_id == turn)
                .flat_map(|t| t.files.iter())
                .find(|f| f.path == file)?;
            if !reach.allows_file(record) {
                return None;
            }
            let old = s.read_blob(change["old"].as_str()?)?;
            let new = s.read_blob(change["new"].as_str()?)?;
            Some(change_diff_output(path, Some(&old), Some(&new)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_output_has_both_bodies_only_when_both_are_utf8() {
        assert_eq!(
            change_diff_output("/x", Some(b"a\n"), Some(b"b\n")),
            json!({"path": "/x", "is_binary": false, "old_contents": "a\n", "new_contents": "b\n"})
        );
        assert_eq!(
            change_diff_output("/x", None, Some(b"b\n")),
            json!({"path": "/x", "is_binary": false, "old_contents": "", "new_contents": "b\n"})
        );
        assert_eq!(
            change_diff_output("/x", Some(&[0xff, 0xfe]), Some(b"b\n")),
            json!({"path": "/x", "is_binary": true})
        );
        assert_eq!(
            change_diff_output("/x", Some(b"a"), Some(&[0xff])),
            json!({"path": "/x", "is_binary": true})
        );
    }
}
