//! `shell::turns::sessions`: the sessions with recorded turns, newest first, a page at a time.
//!
//! The order is the logs' modification time (the last record appended), newest first, then
//! the log's stem: one `lstat` per log, and only the page's own logs are read and folded. The
//! directory is walked whole for every page, but at most `limit + 1` entries are held
//! ([`select_page`]), so memory does not grow with the number of sessions. It runs outside
//! the store's lock: a torn last line is skipped, as when loading.

use std::collections::BinaryHeap;

use iii_shell_protocol::turns::{
    is_stem_shape, SessionSummary, SessionsCursor, SessionsPage, SessionsResponse,
};
use serde_json::Value;

use super::history::fold;
use super::store::{is_header, read_log, session_stem};
use crate::private_dir::PrivateDir;

/// A session id recorded in a log's header longer than this is listed under the log's stem,
/// which opens the same history (the stem of a hashed stem is itself): a page stays small.
pub const MAX_LISTED_ID: usize = 1024;

/// One session log: its stem and when it was last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub mtime_ns: u64,
    pub stem: String,
}

impl LogEntry {
    /// The position in the list: smaller comes first (newest, then by stem).
    fn key(&self) -> (std::cmp::Reverse<u64>, &str) {
        (std::cmp::Reverse(self.mtime_ns), &self.stem)
    }
}

impl Ord for LogEntry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

impl PartialOrd for LogEntry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The page of `entries` after `after` (all of them without one): at most `limit`, newest
/// first, and whether more follow. Holds at most `limit + 1` entries whatever the input.
pub fn select_page(
    entries: impl IntoIterator<Item = LogEntry>,
    after: Option<&SessionsCursor>,
    limit: usize,
) -> (Vec<LogEntry>, bool) {
    let after = after.map(|c| LogEntry {
        mtime_ns: c.mtime_ns,
        stem: c.stem.clone(),
    });
    // A max-heap of the first `limit + 1`: the last in list order is on top, and goes first.
    let mut heap: BinaryHeap<LogEntry> = BinaryHeap::with_capacity(limit + 2);
    for e in entries {
        if after.as_ref().is_some_and(|a| e <= *a) {
            continue;
        }
        heap.push(e);
        if heap.len() > limit + 1 {
            heap.pop();
        }
    }
    let mut page = heap.into_sorted_vec();
    let more = page.len() > limit;
    page.truncate(limit);
    (page, more)
}

/// The session id a log lists under: the id its header names, when that id's stem is this
/// log's and it is at most [`MAX_LISTED_ID`] bytes; otherwise the stem itself (a log written
/// before headers, or an oversized id), which opens the same log.
pub fn listed_id(stem: &str, records: &[Value]) -> String {
    records
        .iter()
        .take_while(|r| is_header(r))
        .filter_map(|r| r.get("session_id").and_then(Value::as_str))
        .find(|id| id.len() <= MAX_LISTED_ID && session_stem(id) == stem)
        .map_or_else(|| stem.to_string(), String::from)
}

/// A log's line in the list; `None` when it holds no turn.
pub fn summary(entry: &LogEntry, records: &[Value]) -> Option<SessionSummary> {
    let turns = fold(records);
    let (first, last) = (turns.first()?, turns.last()?);
    Some(SessionSummary {
        session_id: listed_id(&entry.stem, records),
        turn_count: turns.len(),
        first_started_at: first.started_at,
        last_started_at: last.started_at,
        updated_at: entry.mtime_ns / 1_000_000,
        last_title: last.title.clone(),
    })
}

/// Every `<stem>.jsonl` regular file in `dir` (symlinks and anything else are not logs).
fn logs(dir: &PrivateDir) -> impl Iterator<Item = LogEntry> {
    dir.entries().into_iter().flatten().filter_map(|e| {
        let stem = e.name.strip_suffix(".jsonl")?;
        if !is_stem_shape(stem) || !e.is_file {
            return None;
        }
        Some(LogEntry {
            mtime_ns: e.mtime_ns,
            stem: stem.to_string(),
        })
    })
}

/// `shell::turns::sessions` over the logs in `sessions_dir` (the store's `sessions/`).
pub fn list(sessions_dir: &PrivateDir, page: &SessionsPage) -> SessionsResponse {
    let (entries, more) = select_page(logs(sessions_dir), page.after.as_ref(), page.limit);
    let sessions = entries
        .iter()
        .filter_map(|e| summary(e, &read_log(sessions_dir, &e.stem)))
        .collect();
    let next_cursor = more.then(|| entries.last()).flatten().map(|e| {
        SessionsCursor {
            mtime_ns: e.mtime_ns,
            stem: e.stem.clone(),
        }
        .encode()
    });
    SessionsResponse {
        sessions,
        next_cursor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn e(mtime_ns: u64, stem: &str) -> LogEntry {
        LogEntry {
            mtime_ns,
            stem: stem.into(),
        }
    }

    fn stems(v: &[LogEntry]) -> Vec<&str> {
        v.iter().map(|x| x.stem.as_str()).collect()
    }

    #[test]
    fn a_page_is_newest_first_then_by_stem_and_resumes_after_its_cursor() {
        let all = || vec![e(5, "b"), e(9, "old"), e(20, "new"), e(9, "a"), e(1, "z")];
        let (p, more) = select_page(all(), None, 10);
        assert_eq!(stems(&p), ["new", "a", "old", "b", "z"]);
        assert!(!more);
        let (p, more) = select_page(all(), None, 2);
        assert_eq!(stems(&p), ["new", "a"]);
        assert!(more);
        let c = SessionsCursor {
            mtime_ns: 9,
            stem: "a".into(),
        };
        let (p, more) = select_page(all(), Some(&c), 2);
        assert_eq!(stems(&p), ["old", "b"]);
        assert!(more);
        let c = SessionsCursor {
            mtime_ns: 5,
            stem: "b".into(),
        };
        let (p, more) = select_page(all(), Some(&c), 2);
        assert_eq!(stems(&p), ["z"]);
        assert!(!more);
        // Exactly `limit` left: no next page.
        let (p, more) = select_page(all(), None, 5);
        assert_eq!(p.len(), 5);
        assert!(!more);
        assert_eq!(select_page(Vec::new(), None, 3), (Vec::new(), false));
    }

    #[test]
    fn a_page_holds_at_most_limit_plus_one_entries() {
        // A million logs, a page of 3: the heap never holds more than 4.
        let many = (0..1_000_000u64).map(|i| e(i, "s"));
        let (p, more) = select_page(many, None, 3);
        assert_eq!(
            p.iter().map(|x| x.mtime_ns).collect::<Vec<_>>(),
            [999_999, 999_998, 999_997]
        );
        assert!(more);
    }

    #[test]
    fn a_log_lists_under_its_headers_id_when_it_hashes_to_the_stem() {
        let long = "x".repeat(MAX_LISTED_ID + 1);
        let hashed = session_stem("chat/1 with spaces");
        assert!(hashed.starts_with("h-"));
        let rec = |id: &str| {
            vec![
                json!({"t": "session", "session_id": id}),
                json!({"t": "start", "turn_id": "t"}),
            ]
        };
        assert_eq!(
            listed_id(&hashed, &rec("chat/1 with spaces")),
            "chat/1 with spaces"
        );
        assert_eq!(listed_id("plain", &rec("plain")), "plain");
        // No header (a log from before them), a header naming another session, one too long.
        assert_eq!(listed_id("plain", &rec("plain")[1..]), "plain");
        assert_eq!(listed_id(&hashed, &rec("someone else")), hashed);
        let long_stem = session_stem(&long);
        assert_eq!(listed_id(&long_stem, &rec(&long)), long_stem);
        // Only a first line is a header.
        let late = vec![
            json!({"t": "start", "turn_id": "t"}),
            json!({"t": "session", "session_id": "chat/1 with spaces"}),
        ];
        assert_eq!(listed_id(&hashed, &late), hashed);
    }

    #[test]
    fn a_summary_counts_the_turns_list_lists_with_their_first_and_last_times() {
        let records = vec![
            json!({"t": "session", "session_id": "s"}),
            json!({"t": "start", "turn_id": "t1", "started_at": 1000, "title": "first"}),
            json!({"t": "end", "turn_id": "t1", "ended_at": 1500}),
            json!({"t": "start", "turn_id": "t2", "started_at": 2000, "title": "second"}),
            json!({"t": "pre", "turn_id": "t2", "path": "/r/a", "kind": "modified", "cause": "shell::fs::write", "at": 2100}),
        ];
        assert_eq!(
            summary(&e(3_000_999_999, "s"), &records),
            Some(SessionSummary {
                session_id: "s".into(),
                turn_count: 2,
                first_started_at: 1000,
                last_started_at: 2000,
                updated_at: 3000,
                last_title: Some("second".into()),
            })
        );
        assert_eq!(summary(&e(1, "s"), &records[..1]), None);
        assert_eq!(summary(&e(1, "s"), &[]), None);
    }

    #[test]
    fn only_regular_jsonl_logs_with_a_stem_shape_are_listed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::write(
            p.join("good.jsonl"),
            "{\"t\":\"start\",\"turn_id\":\"t\",\"started_at\":7}\n",
        )
        .unwrap();
        std::fs::write(
            p.join(".hidden.jsonl"),
            "{\"t\":\"start\",\"turn_id\":\"t\"}\n",
        )
        .unwrap();
        std::fs::write(p.join("notes.txt"), "x").unwrap();
        std::fs::create_dir(p.join("dir.jsonl")).unwrap();
        std::os::unix::fs::symlink(p.join("good.jsonl"), p.join("link.jsonl")).unwrap();
        std::fs::write(p.join("empty.jsonl"), "{\"t\": \"sta").unwrap();
        let got = list(
            &PrivateDir::open(p, false).unwrap(),
            &SessionsPage {
                limit: 10,
                after: None,
            },
        );
        assert_eq!(
            got.sessions
                .iter()
                .map(|s| s.session_id.as_str())
                .collect::<Vec<_>>(),
            ["good"]
        );
        assert_eq!(got.next_cursor, None);
    }
}
