//! The durable turn store under `turns.data_dir`.
//!
//! ```text
//! <data_dir>/objects/<hh>/<64 hex>   pre-image bodies, content-addressed (sha256)
//! <data_dir>/sessions/<stem>.jsonl   one append-only log per top-level session
//! <data_dir>/changes/<hh>.jsonl      which session log holds each coder::change-diff id
//! ```
//!
//! A log's first line names its session (`{"t": "session", "session_id": …}`, written with
//! the first record), so the sessions can be listed when the stem is a hash.
//!
//! * A blob is written to a temp file, fsynced, renamed into place and its directory fsynced;
//!   a blob that exists already only has its mtime refreshed.
//! * A log record is one JSON line, appended and fsynced before the call is answered. Appends
//!   to one session's log are serialized by one of [`APPEND_STRIPES`] locks (chosen by the
//!   log's name), so a new log's header is its first line; nothing else is locked: a reader
//!   reads the log as it is (a line being appended is a torn last line, skipped). A crash
//!   at any point leaves at most a torn last line, which loading skips: the store always opens
//!   and lists what was recorded before.
//! * `turns.max_blob_bytes` bounds the blob store (the sum of blob sizes). A body larger than
//!   the cap is not kept (`stored: false`). When a write takes the store past the cap, blobs are
//!   evicted **oldest first** (by mtime: a blob's mtime is refreshed whenever a later turn keeps
//!   the same body, so this is the order of the turns that last needed them) down to 90 % of
//!   the cap; the blob just written is never evicted. An evicted body reads `stored: false`
//!   and its revert fails with an error; it is never guessed.
//! * The change-id index (`changes/`, bucketed by the first byte of the id's sha256) holds one
//!   line `{id, session, turn}` per `coder::*` change, appended and fsynced like a log record;
//!   the newest line of an id wins. It only says where to look: the change itself is a record
//!   of that session's log (`super::changes`).

use std::io::Write;
use std::path::{Path, PathBuf};

/// `<stem>` of a session's log: the id itself when it is 1-128 of `[A-Za-z0-9_.-]` not
/// starting with `.`, else `h-<sha256 hex of the id>`.
pub fn session_stem(id: &str) -> String {
    if iii_shell_protocol::turns::is_stem_shape(id) {
        id.to_string()
    } else {
        let r = super::model::revision(id.as_bytes());
        format!("h-{}", &r["sha256:".len()..])
    }
}

/// How many locks serialize appends to the session logs (a log takes the one its name hashes
/// to): a fixed number, whatever the number of sessions.
pub const APPEND_STRIPES: usize = 64;

pub struct Store {
    dir: PathBuf,
    /// Appends to a session log hold the stripe of its name.
    appending: [std::sync::Mutex<()>; APPEND_STRIPES],
    /// One eviction at a time (two at once would each evict down to 90 % from what they saw).
    evicting: std::sync::Mutex<()>,
    max_blob_bytes: u64,
    /// The blobs' total size as last walked plus what was written since: the directory is
    /// walked again only when this passes the cap (so a write costs no directory scan).
    total: std::sync::atomic::AtomicU64,
}

fn hex_of(rev: &str) -> Option<&str> {
    let h = rev.strip_prefix("sha256:")?;
    (h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())).then_some(h)
}

impl Store {
    pub fn open(dir: &Path, max_blob_bytes: u64) -> std::io::Result<Store> {
        std::fs::create_dir_all(dir.join("objects"))?;
        std::fs::create_dir_all(dir.join("sessions"))?;
        std::fs::create_dir_all(dir.join("changes"))?;
        let s = Store {
            dir: dir.to_path_buf(),
            appending: std::array::from_fn(|_| std::sync::Mutex::new(())),
            evicting: std::sync::Mutex::new(()),
            max_blob_bytes,
            total: Default::default(),
        };
        let total = s.blobs().iter().map(|b| b.1).sum();
        s.total.store(total, std::sync::atomic::Ordering::Relaxed);
        Ok(s)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn blob_path(&self, rev: &str) -> Option<PathBuf> {
        let h = hex_of(rev)?;
        Some(self.dir.join("objects").join(&h[..2]).join(h))
    }

    pub fn has_blob(&self, rev: &str) -> bool {
        self.blob_path(rev).is_some_and(|p| p.is_file())
    }

    pub fn read_blob(&self, rev: &str) -> Option<Vec<u8>> {
        let data = std::fs::read(self.blob_path(rev)?).ok()?;
        (super::model::revision(&data) == rev).then_some(data)
    }

    /// Keeps `data` (whose revision is `rev`). False when it is over the cap or failed.
    pub fn put_blob(&self, rev: &str, data: &[u8]) -> bool {
        if data.len() as u64 > self.max_blob_bytes {
            return false;
        }
        let Some(path) = self.blob_path(rev) else {
            return false;
        };
        if path.is_file() {
            if let Ok(f) = std::fs::File::options().append(true).open(&path) {
                let _ = f.set_modified(std::time::SystemTime::now());
            }
            return true;
        }
        let Some(parent) = path.parent() else {
            return false;
        };
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(parent)?;
            // 0o666 before the umask, as File::create made them.
            iii_shell_files::fs::atomic::replace_own_file(&path, data, 0o666)
        };
        if let Err(e) = write() {
            tracing::error!(error = %e, dir = %self.dir.display(), "cannot keep a pre-image in the turn store; check that turns.data_dir is writable and has space");
            return false;
        }
        let total = self
            .total
            .fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed)
            + data.len() as u64;
        if total > self.max_blob_bytes {
            self.evict(&path);
        }
        true
    }

    /// Every blob: (mtime, size, path).
    fn blobs(&self) -> Vec<(std::time::SystemTime, u64, PathBuf)> {
        let mut blobs: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
        let Ok(dirs) = std::fs::read_dir(self.dir.join("objects")) else {
            return blobs;
        };
        for d in dirs.flatten() {
            let Ok(files) = std::fs::read_dir(d.path()) else {
                continue;
            };
            for f in files.flatten() {
                if let Ok(m) = f.metadata() {
                    if m.is_file() {
                        let t = m.modified().unwrap_or(std::time::UNIX_EPOCH);
                        blobs.push((t, m.len(), f.path()));
                    }
                }
            }
        }
        blobs
    }

    /// Oldest-first eviction down to 90 % of the cap, sparing `keep`.
    fn evict(&self, keep: &Path) {
        let _one = iii_shell_policy::sync::lock(&self.evicting);
        let mut blobs = self.blobs();
        let mut total: u64 = blobs.iter().map(|b| b.1).sum();
        if total <= self.max_blob_bytes {
            self.total
                .store(total, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        let target = self.max_blob_bytes / 10 * 9;
        blobs.sort();
        for (_, len, p) in blobs {
            if total <= target {
                break;
            }
            if p == keep {
                continue;
            }
            if std::fs::remove_file(&p).is_ok() {
                total -= len;
                tracing::info!(blob = %p.display(), "turn store over turns.max_blob_bytes: evicted the oldest pre-image");
            }
        }
        self.total
            .store(total, std::sync::atomic::Ordering::Relaxed);
    }

    fn log_path(&self, session: &str) -> PathBuf {
        self.dir
            .join("sessions")
            .join(format!("{}.jsonl", session_stem(session)))
    }

    /// Appends one record (one line) and fsyncs it. A new log starts with a [`HEADER`] line
    /// naming the session, so `shell::turns::sessions` can list a session whose stem is a hash.
    pub fn append(&self, session: &str, record: &serde_json::Value) -> std::io::Result<()> {
        self.append_all(session, std::slice::from_ref(record))
    }

    /// Appends records (one line each) with one write and one fsync.
    pub fn append_all(&self, session: &str, records: &[serde_json::Value]) -> std::io::Result<()> {
        let path = self.log_path(session);
        let _serial = iii_shell_policy::sync::lock(&self.appending[stripe(&path)]);
        let mut buf = Vec::new();
        let mut f = match std::fs::File::options()
            .create_new(true)
            .append(true)
            .open(&path)
        {
            Ok(f) => {
                serde_json::to_writer(&mut buf, &header(session))?;
                buf.push(b'\n');
                f
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::File::options().append(true).open(&path)?
            }
            Err(e) => return Err(e),
        };
        for r in records {
            serde_json::to_writer(&mut buf, r)?;
            buf.push(b'\n');
        }
        f.write_all(&buf)?;
        f.sync_data()
    }

    fn index_path(&self, id: &str) -> PathBuf {
        let h = super::model::revision(id.as_bytes());
        self.dir
            .join("changes")
            .join(format!("{}.jsonl", &h["sha256:".len()..][..2]))
    }

    /// Notes that the change `id` is recorded in `session`'s log under `turn`.
    pub fn index_change(&self, id: &str, session: &str, turn: &str) -> std::io::Result<()> {
        let line = serde_json::json!({"id": id, "session": session, "turn": turn});
        append_lines(&self.index_path(id), &[line])
    }

    /// The (session, turn) whose log holds the change `id`, from its newest index line.
    pub fn find_change(&self, id: &str) -> Option<(String, String)> {
        let data = std::fs::read(self.index_path(id)).ok()?;
        // The id as it is written in a line (JSON-escaped): lines without it are not parsed.
        let needle = serde_json::to_vec(id).ok()?;
        let finder = memchr::memmem::Finder::new(&needle);
        data.split(|b| *b == b'\n')
            .rev()
            .filter(|l| finder.find(l).is_some())
            .filter_map(|l| serde_json::from_slice::<serde_json::Value>(l).ok())
            .find(|v| v["id"].as_str() == Some(id))
            .and_then(|v| {
                Some((
                    v["session"].as_str()?.to_string(),
                    v["turn"].as_str()?.to_string(),
                ))
            })
    }

    /// Every complete turn record of a session, oldest first (a torn last line is skipped, and
    /// so is the header).
    pub fn records(&self, session: &str) -> Vec<serde_json::Value> {
        let mut v = read_log(&self.log_path(session));
        v.retain(|r| !is_header(r));
        v
    }
}

/// The append lock of the log at `path` (FNV-1a of its name).
fn stripe(path: &Path) -> usize {
    use std::os::unix::ffi::OsStrExt;
    let h = path
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    (h % APPEND_STRIPES as u64) as usize
}

/// Appends `records` to the file at `path`, one JSON line each, in one write, then fsyncs.
/// A crash leaves at most a torn last line, which readers skip.
fn append_lines(path: &Path, records: &[serde_json::Value]) -> std::io::Result<()> {
    let mut buf = Vec::new();
    for r in records {
        serde_json::to_writer(&mut buf, r)?;
        buf.push(b'\n');
    }
    let mut f = std::fs::File::options()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(&buf)?;
    f.sync_data()
}

/// The `t` of the first line of a session's log: `{"t": "session", "session_id": <id>}`
/// (logs written before it have none). Folding skips it: it has no `turn_id`.
pub const HEADER: &str = "session";

fn header(session: &str) -> serde_json::Value {
    serde_json::json!({"t": HEADER, "session_id": session})
}

/// Whether `record` is a log's [`HEADER`] line.
pub fn is_header(record: &serde_json::Value) -> bool {
    record.get("t").and_then(serde_json::Value::as_str) == Some(HEADER)
}

/// Every complete record of the log at `path`, oldest first (a torn last line is skipped).
pub fn read_log(path: &Path) -> Vec<serde_json::Value> {
    let Ok(data) = std::fs::read(path) else {
        return Vec::new();
    };
    data.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems() {
        assert_eq!(session_stem("console-3f2a"), "console-3f2a");
        assert!(session_stem("../x").starts_with("h-"));
        assert!(session_stem(".hidden").starts_with("h-"));
        assert!(session_stem("").starts_with("h-"));
    }

    #[test]
    fn a_torn_last_line_is_skipped() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), 1 << 20).unwrap();
        s.append("s", &serde_json::json!({"t": "start", "turn_id": "a"}))
            .unwrap();
        let mut f = std::fs::File::options()
            .append(true)
            .open(d.path().join("sessions/s.jsonl"))
            .unwrap();
        f.write_all(b"{\"t\": \"sta").unwrap();
        assert_eq!(s.records("s").len(), 1);
    }

    #[test]
    fn the_change_index_answers_with_the_newest_line_of_an_id() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), 1 << 20).unwrap();
        let odd = "deleted:/w/a \"quoted\" \\ ü";
        s.index_change("sha256:aa", "s1", "t1").unwrap();
        s.index_change(odd, "s2", "t9").unwrap();
        s.index_change("sha256:aa", "s3", "t2").unwrap();
        assert_eq!(s.find_change("sha256:aa"), Some(("s3".into(), "t2".into())));
        assert_eq!(s.find_change(odd), Some(("s2".into(), "t9".into())));
        assert_eq!(s.find_change("sha256:a"), None, "a prefix is another id");
        assert_eq!(s.find_change("never"), None);
        // A torn last line (a crash mid-append) is skipped.
        let bucket = s.index_path("sha256:aa");
        let mut f = std::fs::File::options().append(true).open(&bucket).unwrap();
        f.write_all(b"{\"id\":\"sha256:aa\",\"sess").unwrap();
        assert_eq!(s.find_change("sha256:aa"), Some(("s3".into(), "t2".into())));
    }

    #[test]
    fn the_blob_cap_evicts_oldest_first_and_refuses_bodies_over_it() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), 100).unwrap();
        let a = vec![b'a'; 40];
        let b = vec![b'b'; 40];
        let c = vec![b'c'; 40];
        let (ra, rb, rc) = (
            super::super::model::revision(&a),
            super::super::model::revision(&b),
            super::super::model::revision(&c),
        );
        assert!(s.put_blob(&ra, &a));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(s.put_blob(&rb, &b));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(s.put_blob(&rc, &c));
        assert!(!s.has_blob(&ra), "the oldest is evicted");
        assert!(s.has_blob(&rb) && s.has_blob(&rc));
        let big = vec![b'x'; 101];
        assert!(!s.put_blob(&super::super::model::revision(&big), &big));
    }
}
