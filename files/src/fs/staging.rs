//! Staged batches: `shell::fs::write` with `files[]` whose entries are streamed (a ContentRef,
//! or inline content too large for one frame) is all-or-nothing across requests.
//!
//! The broker sends each entry as [`FsOp::WriteStage`](iii_shell_protocol::fs::FsOp) with its
//! bytes on the request's input stream; the executor validates it exactly as a single write
//! (path, jail, mode, `fs.max_write_bytes`), writes it to an unnamed (`O_TMPFILE`), fsynced
//! temp file beside its target, and keeps it here under the batch's id. Nothing is renamed
//! until `WriteCommit`, which installs every entry in order and puts the earlier ones back
//! if a rename fails ([`super::atomic::install_all`]). A failing entry fails its stage
//! request with an error naming it (`files[i] (path): …; no file was written`), and the broker
//! then sends `WriteAbort`, which drops the batch.
//!
//! Bounds: at most [`STAGED_MAX_ENTRIES`] entries and [`STAGED_MAX_BYTES`] bytes staged per
//! broker connection, across all its open batches (S218 past either). Clean-up: a dropped
//! entry's temp file has no name, so the kernel frees it when its descriptor closes: on abort,
//! when the broker's connection ends (the table belongs to it), and when the executor dies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use iii_shell_policy::sync::lock;
use iii_shell_protocol::fs::{WriteFileResult, WriteResponse};
use tokio::sync::mpsc;

use super::atomic::{install_all, TempFile};
use super::ops::{
    batch_error, check_write_cap, display, echo_input, name_entry, temp_for, write_target,
};
use super::stream::{StreamItem, STREAM_IDLE};
use crate::error::ExecError;
use crate::FsPolicy;

/// Most entries staged at once per broker connection (each holds two descriptors).
pub const STAGED_MAX_ENTRIES: usize = 256;
/// Most bytes staged at once per broker connection (on disk, in the temp files).
pub const STAGED_MAX_BYTES: u64 = 1 << 30;

struct Entry {
    path: String,
    input: String,
    temp: TempFile,
}

/// The open batches of one broker connection.
#[derive(Default)]
pub struct Batches {
    open: HashMap<u64, Vec<Entry>>,
    bytes: u64,
    entries: usize,
}

pub type Staging = Arc<Mutex<Batches>>;

/// Why staging `add_bytes` more (and `add_entries` more entries) would pass the caps, if it
/// would.
pub fn over_cap(bytes: u64, entries: usize, add_bytes: u64, add_entries: usize) -> Option<String> {
    if entries + add_entries > STAGED_MAX_ENTRIES {
        return Some(format!(
            "more than {STAGED_MAX_ENTRIES} files staged at once (the cap on a streamed files[] batch); split the batch"
        ));
    }
    if bytes.saturating_add(add_bytes) > STAGED_MAX_BYTES {
        return Some(format!(
            "more than {STAGED_MAX_BYTES} bytes staged at once (the cap on a streamed files[] batch); split the batch"
        ));
    }
    None
}

/// What is staged now: (bytes, entries).
pub fn usage(s: &Staging) -> (u64, usize) {
    let b = lock(s);
    (b.bytes, b.entries)
}

/// Receives entry `index` of `count` of batch `batch` into an unnamed temp file and keeps it
/// staged. Returns the entry's resolved path and size; the target is untouched.
#[allow(clippy::too_many_arguments)]
pub async fn stage(
    staging: &Staging,
    policy: &FsPolicy,
    batch: u64,
    index: usize,
    count: usize,
    path: &str,
    mode: u32,
    parents: bool,
    inbound: &mut mpsc::Receiver<StreamItem>,
    ack: impl Fn(),
) -> Result<WriteResponse, ExecError> {
    let name = |e| name_entry(e, index, count.max(2), path);
    let (bytes, entries) = usage(staging);
    if let Some(why) = over_cap(bytes, entries, 0, 1) {
        return Err(name(ExecError::TooLarge(why)));
    }
    let parent = write_target(policy, path, mode, parents)
        .map_err(|e| echo_input(e, path))
        .map_err(name)?;
    let mut tmp = temp_for(&parent, mode)
        .map_err(|e| echo_input(e, path))
        .map_err(name)?;
    loop {
        let item = tokio::time::timeout(STREAM_IDLE, inbound.recv())
            .await
            .map_err(|_| {
                name(ExecError::Internal(format!(
                    "write stream idle for {STREAM_IDLE:?}; abandoned"
                )))
            })?;
        match item {
            Some(StreamItem::Data(chunk)) => {
                let len = chunk.len() as u64;
                check_write_cap(policy, tmp.written + len, path).map_err(name)?;
                let (bytes, entries) = usage(staging);
                if let Some(why) = over_cap(bytes, entries, tmp.written + len, 1) {
                    return Err(name(ExecError::TooLarge(why)));
                }
                tmp.write(&chunk).map_err(name)?;
                ack();
            }
            Some(StreamItem::End(None)) => break,
            Some(StreamItem::End(Some(e))) => {
                return Err(name(ExecError::Internal(format!(
                    "write stream failed: {e}"
                ))))
            }
            None => {
                return Err(name(ExecError::Internal(
                    "write stream ended without a close".into(),
                )))
            }
        }
    }
    tmp.stage().map_err(name)?;
    let written = tmp.written;
    let resolved = display(&parent.path);
    let mut b = lock(staging);
    // Another batch of this connection may have staged meanwhile.
    if let Some(why) = over_cap(b.bytes, b.entries, written, 1) {
        return Err(name(ExecError::TooLarge(why)));
    }
    b.bytes += written;
    b.entries += 1;
    b.open.entry(batch).or_default().push(Entry {
        path: resolved.clone(),
        input: path.to_string(),
        temp: tmp,
    });
    Ok(WriteResponse {
        bytes_written: written,
        path: resolved,
        files: Vec::new(),
    })
}

fn take(staging: &Staging, batch: u64) -> Vec<Entry> {
    let mut b = lock(staging);
    let entries = b.open.remove(&batch).unwrap_or_default();
    b.bytes -= entries.iter().map(|e| e.temp.written).sum::<u64>();
    b.entries -= entries.len();
    entries
}

/// Installs every staged entry of `batch`, in the order staged, all or nothing: a rename that
/// fails puts the entries before it back ([`install_all`]).
pub fn commit(staging: &Staging, batch: u64) -> Result<WriteResponse, ExecError> {
    let entries = take(staging, batch);
    if entries.is_empty() {
        return Err(ExecError::Invalid(
            "no staged batch with that id (aborted, or its connection ended)".into(),
        ));
    }
    let n = entries.len();
    let mut names = Vec::with_capacity(n);
    let mut temps = Vec::with_capacity(n);
    for e in entries {
        names.push((e.path, e.input));
        temps.push(e.temp);
    }
    let written = install_all(temps).map_err(|f| {
        let input = names.get(f.index).map_or("", |(_, input)| input.as_str());
        batch_error(f, n.max(2), input)
    })?;
    let files: Vec<WriteFileResult> = names
        .into_iter()
        .zip(written)
        .map(|((path, _), bytes_written)| WriteFileResult {
            path,
            bytes_written,
        })
        .collect();
    Ok(WriteResponse {
        bytes_written: files.iter().map(|f| f.bytes_written).sum(),
        path: String::new(),
        files,
    })
}

/// Drops `batch`: its temp files go with their descriptors. Unknown ids are fine.
pub fn abort(staging: &Staging, batch: u64) {
    drop(take(staging, batch));
}

/// Drops every batch (the broker's connection ended).
pub fn clear(staging: &Staging) {
    let mut b = lock(staging);
    b.open.clear();
    b.bytes = 0;
    b.entries = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_are_exact() {
        assert_eq!(over_cap(0, 0, STAGED_MAX_BYTES, 1), None);
        assert_eq!(over_cap(0, STAGED_MAX_ENTRIES - 1, 0, 1), None);
        assert!(over_cap(0, STAGED_MAX_ENTRIES, 0, 1)
            .unwrap()
            .starts_with("more than 256 files staged"));
        assert!(over_cap(1, 0, STAGED_MAX_BYTES, 1)
            .unwrap()
            .starts_with("more than 1073741824 bytes staged"));
        assert!(over_cap(u64::MAX, 0, u64::MAX, 0).is_some());
    }
}
