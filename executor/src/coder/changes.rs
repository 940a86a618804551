//! The change snapshots `coder::change-diff` serves, kept in the turn store (CODER-72, 73).
//!
//! Every successful `create-file`, `update-file` and (file) `delete-file` entry records the
//! exact bytes before and after. The id of a change is the revision of the bytes it left
//! (`sha256:<hex>`, the `revision` a create returns and a later `read-file` reports); a
//! deletion's id is `deleted:<canonical path>`. Both bodies go to the turn store's blob store
//! under `turns.data_dir` ([`crate::turns::Turns::record_change`]): content-addressed, under
//! `turns.max_blob_bytes` and its oldest-first eviction, shared with the turns' pre-images.
//! The id → revisions map is in memory ([`crate::turns::CHANGE_IDS`] newest ids), so an id
//! does not survive an executor restart; an unknown or evicted id is C211.
//!
//! The store a coder call records into is bound for the call's thread with [`bind`] by the
//! executor's dispatch, so the write paths only call [`record`]; with nothing bound (a coder
//! call outside an executor) nothing is recorded.

use std::cell::RefCell;
use std::sync::Arc;

use iii_shell_protocol::coder::ChangeDiffOutput;
use iii_shell_protocol::Code;

use super::paths::CErr;
use crate::policy::Policy;
use crate::turns::Turns;

thread_local! {
    static BOUND: RefCell<Option<(Arc<Turns>, Arc<Policy>)>> = const { RefCell::new(None) };
}

/// Unbinds on drop.
pub struct Bound(());

impl Drop for Bound {
    fn drop(&mut self) {
        BOUND.with(|b| *b.borrow_mut() = None);
    }
}

/// Binds the turn store (and the policy naming its directory) for coder calls on this thread.
pub fn bind(turns: Arc<Turns>, policy: Arc<Policy>) -> Bound {
    BOUND.with(|b| *b.borrow_mut() = Some((turns, policy)));
    Bound(())
}

fn bound() -> Option<(Arc<Turns>, Arc<Policy>)> {
    BOUND.with(|b| b.borrow().clone())
}

/// Records a change (bodies the blob store cannot keep leave the id unknown).
pub fn record(id: String, path: String, old: Vec<u8>, new: Vec<u8>) {
    if let Some((turns, policy)) = bound() {
        turns.record_change(&policy, &id, &path, &old, &new);
    }
}

fn gone(id: &str) -> CErr {
    CErr::new(
        Code::C211,
        format!("change diff is no longer available for {id}: unknown id, or the snapshot was evicted from the turn store (turns.max_blob_bytes) or lost with an executor restart"),
    )
}

/// The before/after of a change; an unknown or evicted id is C211.
pub fn diff(id: &str) -> Result<ChangeDiffOutput, CErr> {
    let (turns, policy) = bound().ok_or_else(|| gone(id))?;
    match turns.change_diff_by_id(&policy, id) {
        Some(Ok(v)) => serde_json::from_value(v).map_err(|_| gone(id)),
        Some(Err(_)) | None => Err(gone(id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_come_from_the_turn_store_and_an_evicted_body_is_c211() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(base.join("root")).unwrap();
        let data = base.join("data");
        let v = serde_json::json!({"fs": {"host_roots": [base.join("root")]},
            "turns": {"data_dir": data, "max_blob_bytes": 1000}});
        let p = Arc::new(Policy::build(1, &v.to_string()).unwrap());
        let _b = bind(Arc::default(), p);
        let b200 = "b".repeat(200);
        record(
            "t1".into(),
            "/p".into(),
            b"a".to_vec(),
            b200.clone().into_bytes(),
        );
        let d = diff("t1").unwrap();
        assert_eq!(
            (
                d.old_contents.as_deref(),
                d.new_contents.as_deref(),
                d.is_binary
            ),
            (Some("a"), Some(b200.as_str()), false)
        );
        // The bodies are blobs of the turn store.
        let blob = data
            .join("objects")
            .join(&crate::turns::model::revision(b"a")[7..9]);
        assert!(blob.is_dir(), "{blob:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
        record("t2".into(), "/p".into(), b"a".to_vec(), b"\xff".to_vec());
        let d = diff("t2").unwrap();
        assert_eq!(
            (d.old_contents, d.new_contents, d.is_binary),
            (None, None, true)
        );
        assert_eq!(diff("nope").unwrap_err().code, Code::C211);
        // Bodies past the cap (1002 > 1000) evict the oldest down to 90 %: t1's after-body
        // goes (802 left), so its diff is C211; t2 and t3 stay.
        std::thread::sleep(std::time::Duration::from_millis(20));
        record("t3".into(), "/q".into(), vec![b'x'; 400], vec![b'y'; 400]);
        assert_eq!(diff("t1").unwrap_err().code, Code::C211);
        assert!(diff("t2").unwrap().is_binary);
        assert_eq!(diff("t3").unwrap().new_contents.unwrap().len(), 400);
    }

    #[test]
    fn nothing_bound_records_nothing() {
        record("u".into(), "/p".into(), b"a".to_vec(), b"b".to_vec());
        assert_eq!(diff("u").unwrap_err().code, Code::C211);
    }
}
