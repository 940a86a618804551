//! Wire shapes of `shell::turns::*` (the seed schemas) and which calls change which files.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `sha256:<hex>` of some bytes.
pub fn revision(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentRef {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PreImage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    #[serde(default)]
    pub stored: bool,
    #[serde(default)]
    pub missing: bool,
    #[serde(default)]
    pub binary: bool,
    #[serde(default)]
    pub truncated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRecord {
    pub path: String,
    pub kind: String,
    pub cause: String,
    pub first_seen: u64,
    pub last_seen: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<PreImage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<PreImage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_revision: Option<String>,
    /// While folding: the kind (and cause) of a later call on this path, applied once its
    /// `post` shows it completed; a failed call that changed nothing leaves the record as it
    /// was. Never on the wire.
    #[serde(skip)]
    pub pending: Option<(String, String)>,
    /// Where the path resolved when its pre-image was read (the `pre` record's `real`, when
    /// it differed from `path`): a body is served only while both names are reachable
    /// (`super::reach`). Never on the wire.
    #[serde(skip)]
    pub real: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub turn_id: String,
    pub started_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default)]
    pub files: Vec<FileRecord>,
    /// Structure before the turn (`tree`: directories, modes, links), first record per path
    /// wins. Never on the wire.
    #[serde(skip)]
    pub metas: Vec<Meta>,
}

/// A `meta` record: the state of one entry before the turn that its body record cannot hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub path: String,
    /// `dir`, `file` or `link`.
    pub kind: String,
    /// Whether the entry existed before the turn (`false`: a directory the turn created).
    pub existed: bool,
    pub mode: Option<u32>,
    pub link: Option<String>,
}

pub use iii_shell_protocol::turns::{HookCall, HookInput, ParentRef, TurnEvent};

/// One file a call is about to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touch {
    /// As the caller wrote it (relative or absolute).
    pub path: String,
    pub kind: &'static str,
    pub from: Option<String>,
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn field(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(String::from)
}

/// Which files `function_id` called with `args` changes (a pure function; exact-value tests).
/// Calls not listed (exec, chmod, reads) change nothing that can be pre-imaged.
pub fn touches(function_id: &str, args: &Value) -> Vec<Touch> {
    let t = |path: String, kind: &'static str| Touch {
        path,
        kind,
        from: None,
    };
    match function_id {
        "shell::fs::write" => {
            let mut v: Vec<Touch> = Vec::new();
            if let Some(p) = field(args, "path") {
                v.push(t(p, "modified"));
            }
            if let Some(files) = args.get("files").and_then(Value::as_array) {
                v.extend(
                    files
                        .iter()
                        .filter_map(|f| field(f, "path"))
                        .map(|p| t(p, "modified")),
                );
            }
            v
        }
        "shell::fs::rm" => field(args, "path")
            .map(|p| t(p, "deleted"))
            .into_iter()
            .collect(),
        "shell::fs::mv" => {
            let from = field(args, "src").or_else(|| field(args, "from"));
            let to = field(args, "dst").or_else(|| field(args, "to"));
            match (from, to) {
                (Some(f), Some(to)) => vec![Touch {
                    path: to,
                    kind: "moved",
                    from: Some(f),
                }],
                _ => Vec::new(),
            }
        }
        "shell::fs::sed" => {
            let files = strs(args.get("files").unwrap_or(&Value::Null));
            if files.is_empty() {
                field(args, "path")
                    .map(|p| t(p, "modified"))
                    .into_iter()
                    .collect()
            } else {
                files.into_iter().map(|p| t(p, "modified")).collect()
            }
        }
        "coder::create-file" | "coder::update-file" => {
            let kind = if function_id == "coder::create-file" {
                "created"
            } else {
                "modified"
            };
            args.get("files")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|f| field(f, "path"))
                        .map(|p| t(p, kind))
                        .collect()
                })
                .unwrap_or_default()
        }
        "coder::delete-file" => strs(args.get("paths").unwrap_or(&Value::Null))
            .into_iter()
            .map(|p| t(p, "deleted"))
            .collect(),
        "coder::move" => args
            .get("files")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|f| {
                        Some(Touch {
                            path: field(f, "to")?,
                            kind: "moved",
                            from: Some(field(f, "from")?),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The net kind of a path changed twice in one turn (TURNS-20): a deletion wins; a path the
/// turn created stays created; a path deleted then written again was modified.
pub fn compose(earlier: &str, later: &str) -> &'static str {
    match (earlier, later) {
        (_, "deleted") => "deleted",
        ("created", _) => "created",
        ("deleted", _) => "modified",
        ("moved", _) => "moved",
        (_, "moved") => "moved",
        (_, "created") => "created",
        _ => "modified",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_files_a_call_changes() {
        assert_eq!(
            touches("shell::fs::write", &json!({"path": "a", "content": "x"})),
            vec![Touch {
                path: "a".into(),
                kind: "modified",
                from: None
            }]
        );
        assert_eq!(
            touches("shell::fs::mv", &json!({"src": "a", "dst": "b"})),
            vec![Touch {
                path: "b".into(),
                kind: "moved",
                from: Some("a".into())
            }]
        );
        assert_eq!(
            touches("coder::delete-file", &json!({"paths": ["x", "y"]})).len(),
            2
        );
        assert_eq!(
            touches(
                "coder::create-file",
                &json!({"files": [{"path": "n", "content": ""}]})
            )[0]
            .kind,
            "created"
        );
        assert!(touches("shell::exec", &json!({"command": "rm -rf x"})).is_empty());
        assert!(touches("shell::fs::chmod", &json!({"path": "a", "mode": "0600"})).is_empty());
    }

    #[test]
    fn kinds_compose_within_a_turn() {
        assert_eq!(compose("created", "modified"), "created");
        assert_eq!(compose("created", "deleted"), "deleted");
        assert_eq!(compose("deleted", "created"), "modified");
        assert_eq!(compose("modified", "modified"), "modified");
        assert_eq!(compose("modified", "deleted"), "deleted");
    }

    #[test]
    fn revisions_are_sha256_hex() {
        assert_eq!(
            revision(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
