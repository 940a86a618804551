//! Where a coder write reports what it changed: the [`ChangeRecorder`] each mutating
//! operation (`create-file`, `update-file`, `delete-file`) is handed, and that
//! `coder::change-diff` asks.
//!
//! The turn store implements it (`turns::coder_calls`, in the executor): the call's files
//! record into the open turn, and a diff is served from the turn history. [`NoRecorder`] is
//! the value for a call outside any turn store: it keeps nothing, and every diff is gone.

use iii_shell_protocol::coder::ChangeDiffOutput;
use iii_shell_protocol::Code;

use super::paths::CErr;

/// Receives the exact bytes before and after of every file a coder call changed, and serves
/// `coder::change-diff` from what it kept.
pub trait ChangeRecorder: Sync {
    /// A change the call made. The id of a change is the revision of the bytes it left
    /// (`sha256:<hex>`); a deletion's id is `deleted:<canonical path>`.
    fn record(&self, id: String, path: String, old: &[u8], new: &[u8]);

    /// The before/after of a change; an unknown or evicted id is C211 ([`gone`]).
    fn diff(&self, id: &str) -> Result<ChangeDiffOutput, CErr>;
}

/// Records nothing; every change id is gone.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoRecorder;

impl ChangeRecorder for NoRecorder {
    fn record(&self, _id: String, _path: String, _old: &[u8], _new: &[u8]) {}

    fn diff(&self, id: &str) -> Result<ChangeDiffOutput, CErr> {
        Err(gone(id))
    }
}

/// The C211 of a change id no record holds.
pub fn gone(id: &str) -> CErr {
    CErr::new(
        Code::C211,
        format!("change diff is no longer available for {id}: no turn record holds this change id, or its bodies were evicted from the turn store (turns.max_blob_bytes)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_recorder_keeps_nothing_and_every_id_is_gone() {
        let r = NoRecorder;
        r.record("sha256:00".into(), "/r/a".into(), b"one", b"two");
        let e = r.diff("sha256:00").unwrap_err();
        assert_eq!(e.code, Code::C211);
        assert_eq!(
            e.message,
            "change diff is no longer available for sha256:00: no turn record holds this change id, or its bodies were evicted from the turn store (turns.max_blob_bytes)"
        );
    }
}
