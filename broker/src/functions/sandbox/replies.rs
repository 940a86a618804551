//! Typed validation of what the sandbox worker answers (contract §6.4).
//!
//! Every reply is deserialized into the shell's own response type, so a missing or mistyped
//! required field is S216 `bad engine response: …`, host-only fields get their documented
//! defaults (`path: ""`, `already_existed: false`, …), legacy names are accepted (chmod's
//! `updated`, grep/sed `file`), and fields the shell does not publish (read's `body`, exec's
//! `success`) are dropped.

use iii_shell_protocol::fs::{
    ChmodResponse, FsEntry, FsMatch, FsSedFileResult, GrepResponse, LsResponse, MkdirResponse,
    MvResponse, ReadResponseWire, RmResponse, SedResponse, WriteResponse,
};
use iii_shell_protocol::{Code, WireError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// The `sandbox::fs::*` operations the shell forwards.
pub const FS_OPS: [&str; 10] = [
    "ls", "stat", "mkdir", "rm", "chmod", "mv", "grep", "sed", "write", "read",
];

pub fn bad_reply(detail: impl std::fmt::Display) -> WireError {
    WireError::new(Code::S216, format!("bad engine response: {detail}"))
}

fn typed<T: DeserializeOwned>(v: Value) -> Result<T, WireError> {
    serde_json::from_value(v).map_err(bad_reply)
}

fn normalized<T: DeserializeOwned + Serialize>(v: Value) -> Result<Value, WireError> {
    let t: T = typed(v)?;
    serde_json::to_value(t).map_err(bad_reply)
}

#[derive(Deserialize)]
struct GrepWire {
    matches: Vec<MatchWire>,
    truncated: bool,
}

#[derive(Deserialize)]
struct MatchWire {
    #[serde(alias = "file")]
    path: String,
    line: u64,
    content: String,
}

#[derive(Deserialize)]
struct SedWire {
    results: Vec<SedFileWire>,
    total_replacements: u64,
}

#[derive(Deserialize)]
struct SedFileWire {
    #[serde(alias = "file")]
    path: String,
    replacements: u64,
    success: bool,
    #[serde(default)]
    error: Option<String>,
}

/// The validated, normalized reply of `sandbox::fs::<op>`.
pub fn fs_reply(op: &str, v: Value) -> Result<Value, WireError> {
    match op {
        "ls" => normalized::<LsResponse>(v),
        "stat" => normalized::<FsEntry>(v),
        "mkdir" => normalized::<MkdirResponse>(v),
        "rm" => normalized::<RmResponse>(v),
        "chmod" => normalized::<ChmodResponse>(v),
        "mv" => normalized::<MvResponse>(v),
        "write" => normalized::<WriteResponse>(v),
        "read" => normalized::<ReadResponseWire>(v),
        "grep" => {
            let g: GrepWire = typed(v)?;
            let matches = g
                .matches
                .into_iter()
                .map(|m| FsMatch {
                    path: m.path,
                    line: m.line,
                    content: m.content,
                })
                .collect();
            serde_json::to_value(GrepResponse {
                matches,
                truncated: g.truncated,
            })
            .map_err(bad_reply)
        }
        "sed" => {
            let s: SedWire = typed(v)?;
            let results = s
                .results
                .into_iter()
                .map(|r| FsSedFileResult {
                    path: r.path,
                    replacements: r.replacements,
                    success: r.success,
                    error: r.error,
                })
                .collect();
            serde_json::to_value(SedResponse {
                results,
                total_replacements: s.total_replacements,
            })
            .map_err(bad_reply)
        }
        other => Err(bad_reply(format!(
            "no reply shape is known for sandbox::fs::{other}"
        ))),
    }
}

/// A successful `sandbox::exec` answer. Every field is required; `exit_code` must be present
/// but may be null (a signal-killed process).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ExecReply {
    pub stdout: String,
    pub stderr: String,
    #[serde(deserialize_with = "present_nullable")]
    pub exit_code: Option<i32>,
    pub duration_ms: u64,
    pub timed_out: bool,
}

/// `Option` without serde's implicit "missing means None".
fn present_nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
    Option::<i32>::deserialize(d)
}

pub fn exec_reply(v: Value) -> Result<ExecReply, WireError> {
    typed(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_and_aliases() {
        assert_eq!(
            fs_reply("mkdir", json!({"created": true})).unwrap(),
            json!({"created": true, "path": "", "already_existed": false})
        );
        assert_eq!(
            fs_reply("rm", json!({"removed": true})).unwrap(),
            json!({"removed": true, "path": "", "was_present": false})
        );
        assert_eq!(
            fs_reply("chmod", json!({"updated": 3})).unwrap(),
            json!({"entries_changed": 3, "path": "", "recursive": false})
        );
        assert_eq!(
            fs_reply("mv", json!({"moved": true})).unwrap(),
            json!({"moved": true, "src": "", "dst": "", "overwrote": false})
        );
        assert_eq!(
            fs_reply(
                "grep",
                json!({"matches": [{"file": "/a", "line": 1, "content": "x"}], "truncated": false})
            )
            .unwrap(),
            json!({"matches": [{"path": "/a", "line": 1, "content": "x"}], "truncated": false})
        );
        let read = json!({"content": {"channel_id": "c", "access_key": "k"}, "body": "hi", "size": 2, "mode": "0644", "mtime": 5});
        assert_eq!(
            fs_reply("read", read).unwrap(),
            json!({"content": {"channel_id": "c", "access_key": "k", "direction": "read"}, "size": 2, "mode": "0644", "mtime": 5})
        );
        assert_eq!(
            fs_reply("write", json!({"bytes_written": 4, "path": "/g"})).unwrap(),
            json!({"bytes_written": 4, "path": "/g", "files": []})
        );
    }

    #[test]
    fn malformed() {
        for (op, v) in [
            ("ls", json!({"entries": [{"name": "a"}]})),
            ("stat", json!({"name": "a", "is_dir": false})),
            ("mkdir", json!({})),
            ("chmod", json!({"entries_changed": "one"})),
            ("sed", json!({"results": []})),
            ("write", json!({"bytes_written": 1})),
            ("read", json!({"size": 1, "mode": "0644", "mtime": 1})),
            ("ls", json!(null)),
        ] {
            let e = fs_reply(op, v).unwrap_err();
            assert!(
                e.is(Code::S216) && e.message.starts_with("bad engine response: "),
                "{op}: {e:?}"
            );
        }
        let ok = json!({"stdout": "a", "stderr": "", "exit_code": 0, "duration_ms": 3, "timed_out": false, "success": true});
        assert_eq!(exec_reply(ok).unwrap().exit_code, Some(0));
        let null_code = json!({"stdout": "", "stderr": "", "exit_code": null, "duration_ms": 3, "timed_out": false});
        assert_eq!(exec_reply(null_code).unwrap().exit_code, None);
        for missing in ["stdout", "stderr", "exit_code", "duration_ms", "timed_out"] {
            let mut v = json!({"stdout": "", "stderr": "", "exit_code": 0, "duration_ms": 3, "timed_out": false});
            v.as_object_mut().unwrap().remove(missing);
            assert!(exec_reply(v).unwrap_err().message.contains(missing));
        }
    }
}
