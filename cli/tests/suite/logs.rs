//! Logs: stderr, one line per event, `RUST_LOG` filters, no colour codes in a file or the
//! journal, and under systemd a syslog priority prefix journald understands.

use crate::common;

use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};

use common::BIN;

/// Runs an executor that cannot bind its socket (one ERROR, exit 2) with stderr in a file;
/// `journal` sets JOURNAL_STREAM to that file (as systemd does for its journal stream).
fn failing_executor(journal: Option<bool>, rust_log: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr");
    let file = std::fs::File::create(&log).unwrap();
    let md = file.metadata().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["executor", "--socket"])
        .arg(dir.path().join("missing-dir/executor.sock"))
        .env_remove("RUST_LOG")
        .env_remove("JOURNAL_STREAM")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(file));
    match journal {
        Some(true) => {
            cmd.env("JOURNAL_STREAM", format!("{}:{}", md.dev(), md.ino()));
        }
        Some(false) => {
            cmd.env("JOURNAL_STREAM", format!("{}:{}", md.dev(), md.ino() + 1));
        }
        None => {}
    }
    if let Some(f) = rust_log {
        cmd.env("RUST_LOG", f);
    }
    let status = cmd.status().unwrap();
    assert_eq!(status.code(), Some(2));
    std::fs::read_to_string(&log).unwrap()
}

fn the_error(text: &str) -> &str {
    text.lines()
        .find(|l| l.contains("cannot bind the executor socket"))
        .unwrap_or_else(|| panic!("no bind error in {text:?}"))
}

#[test]
fn under_journald_every_line_carries_its_priority_and_no_timestamp() {
    let text = failing_executor(Some(true), None);
    assert!(!text.contains('\x1b'), "colour codes: {text:?}");
    for line in text.lines() {
        assert!(
            ["<3>", "<4>", "<6>", "<7>"]
                .iter()
                .any(|p| line.starts_with(p)),
            "{line:?}"
        );
    }
    let line = the_error(&text);
    assert!(line.starts_with("<3>ERROR "), "{line:?}");
    // What to do comes with it.
    assert!(line.contains("RuntimeDirectory=iii-shell"), "{line:?}");
}

#[test]
fn in_a_file_lines_are_plain_and_stamped() {
    for journal in [None, Some(false)] {
        let text = failing_executor(journal, None);
        assert!(!text.contains('\x1b'), "colour codes: {text:?}");
        let line = the_error(&text);
        assert!(
            line.starts_with("20") && line.contains(" ERROR "),
            "a timestamp, then the level: {line:?}"
        );
    }
}

#[test]
fn rust_log_filters() {
    assert_eq!(failing_executor(Some(true), Some("off")), "");
    let text = failing_executor(None, Some("error"));
    assert_eq!(text.lines().count(), 1, "{text:?}");
    the_error(&text);
}
