//! The console page's per-pane state (`shell::ui-state::*`): one JSON file per pane.
//!
//! Where: `ui-state/` beside the turn store (`iii_shell_files::state_place`: beside
//! `turns.data_dir`, or in the worker's state directory when that lies in commands' reach).
//! Each pane's file is `<stem>.json`, where the
//! stem is the key with every byte outside `[A-Za-z0-9_-]` written `%XX` ([`file_stem`]): a key
//! cannot name another directory, and two keys never share a file. A stem that would be longer
//! than a file name allows is `~<sha256 of the key>` instead (`~` never appears in an encoded
//! key).
//!
//! The directory is opened once per call and every pane file relative to it
//! ([`crate::private_dir`]): a link, a hardlink, a FIFO or a device planted at a pane's name is
//! never followed, read or written through; the directory is 0700 and the files 0600.
//!
//! Writes: a temp file created exclusively (mode 0600), written, fsynced, renamed over the
//! pane's file and the directory fsynced, under one store-wide lock; a reader sees the old
//! document or the new one, never a mix, and panes never clobber each other. Reads take no
//! lock; a file that is missing, unusable, over the cap, not JSON or not an object reads as
//! "nothing stored".

use std::path::Path;
use std::sync::Mutex;

use iii_shell_policy::sync::lock;
use iii_shell_protocol::ui_state::{
    key_problem, UiStateOp, UiStateReply, MAX_PANES, MAX_STATE_BYTES,
};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sha2::{Digest, Sha256};

use iii_shell_files::error::ExecError;

use crate::private_dir::PrivateDir;

/// Longest stem written as an encoding; longer ones are hashed (a file name is at most 255
/// bytes, and the temp suffix needs room).
const MAX_ENCODED_STEM: usize = 200;

/// What a stem keeps as it is; every other byte of the key is `%XX`.
const STEM_SAFE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'_').remove(b'-');

/// The file stem of a key (a pure, injective function: exact-value tests below).
pub fn file_stem(key: &str) -> String {
    let out = utf8_percent_encode(key, STEM_SAFE).to_string();
    if out.len() > MAX_ENCODED_STEM {
        return format!("~{}", hex::encode(Sha256::digest(key.as_bytes())));
    }
    out
}

/// The store (one per executor; writes serialized).
#[derive(Default)]
pub struct UiState {
    write_lock: Mutex<()>,
}

impl UiState {
    /// Serves one request against the store in `dir`.
    pub fn handle(&self, dir: &Path, op: UiStateOp) -> Result<UiStateReply, ExecError> {
        match op {
            UiStateOp::Get { key, legacy_key } => {
                check_key(&key)?;
                // A store that is not there (or is not a directory of ours) holds nothing.
                let store = PrivateDir::open(dir, false).ok();
                let read = |k: &str| store.as_ref().and_then(|d| read_pane(d, k));
                let mut state = read(&key);
                if state.is_none() {
                    if let Some(legacy) = legacy_key.filter(|k| key_problem(k).is_none()) {
                        state = read(&legacy);
                    }
                }
                Ok(UiStateReply::Got {
                    key,
                    state_json: state,
                })
            }
            UiStateOp::Set { key, state_json } => {
                check_key(&key)?;
                // The executor trusts nothing the broker checked: parse and cap again.
                let value: serde_json::Value = serde_json::from_str(&state_json)
                    .map_err(|e| ExecError::Invalid(format!("'state' is not JSON: {e}")))?;
                if let Some((too_large, why)) =
                    iii_shell_protocol::ui_state::state_problem(&value, state_json.len())
                {
                    return Err(if too_large {
                        ExecError::TooLarge(why)
                    } else {
                        ExecError::Invalid(why)
                    });
                }
                let _guard = lock(&self.write_lock);
                let cannot = |e: std::io::Error| {
                    ExecError::Internal(format!(
                        "cannot store the pane state in {}: {e}; make the worker's state directory (see turns.data_dir in docs/configuration.md) writable by the command user",
                        dir.display()
                    ))
                };
                let store = PrivateDir::open(dir, true).map_err(cannot)?;
                let name = pane_name(&key);
                if !store.has_file(&name) && pane_count(&store) >= MAX_PANES {
                    return Err(ExecError::TooLarge(format!(
                        "{MAX_PANES} panes are stored already; a new pane key is refused (reuse a key, or remove files from {})",
                        dir.display()
                    )));
                }
                store
                    .replace(&name, state_json.as_bytes())
                    .map_err(cannot)?;
                Ok(UiStateReply::Set {
                    key,
                    bytes: state_json.len() as u64,
                })
            }
        }
    }
}

fn check_key(key: &str) -> Result<(), ExecError> {
    match key_problem(key) {
        Some(why) => Err(ExecError::Invalid(why)),
        None => Ok(()),
    }
}

/// Number of pane files in the store (temp files excluded).
fn pane_count(store: &PrivateDir) -> usize {
    store
        .entries()
        .map(|v| v.iter().filter(|e| e.name.ends_with(".json")).count())
        .unwrap_or(0)
}

fn pane_name(key: &str) -> String {
    format!("{}.json", file_stem(key))
}

/// The stored document of `key`, if there is a usable one.
fn read_pane(store: &PrivateDir, key: &str) -> Option<String> {
    let data = store.read(&pane_name(key), MAX_STATE_BYTES as u64).ok()??;
    let text = String::from_utf8(data).ok()?;
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(v) if v.is_object() => Some(text),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_keep_safe_bytes_and_encode_the_rest() {
        assert_eq!(file_stem("pane-1_A"), "pane-1_A");
        assert_eq!(file_stem("../etc/passwd"), "%2E%2E%2Fetc%2Fpasswd");
        assert_eq!(file_stem("a.b"), "a%2Eb");
        assert_eq!(
            file_stem("%2E"),
            "%252E",
            "a literal percent is encoded too"
        );
        assert_eq!(file_stem("é"), "%C3%A9");
        assert_eq!(file_stem("a\0b"), "a%00b");
        assert_eq!(file_stem("~x"), "%7Ex");
    }

    #[test]
    fn long_stems_are_hashed_and_distinct() {
        let a = file_stem(&"/".repeat(100));
        let b = file_stem(&"/".repeat(101));
        assert!(a.starts_with('~') && a.len() == 65, "{a}");
        assert_ne!(a, b);
        assert_eq!(file_stem(&"x".repeat(200)), "x".repeat(200));
        assert!(file_stem(&"x".repeat(201)).starts_with('~'));
    }

    /// The longest stem that is not hashed still gets a temp file (`.<stem>.json.iii-<32
    /// hex>.tmp`, cut to fit a file name), so such a pane is written.
    #[test]
    fn a_pane_with_the_longest_unhashed_stem_is_written() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("ui-state");
        let key = "x".repeat(MAX_ENCODED_STEM);
        let reply = UiState::default()
            .handle(
                &dir,
                UiStateOp::Set {
                    key: key.clone(),
                    state_json: "{}".into(),
                },
            )
            .unwrap();
        assert_eq!(reply, UiStateReply::Set { key, bytes: 2 });
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [format!("{}.json", "x".repeat(MAX_ENCODED_STEM))]);
    }

    #[test]
    fn set_then_get_round_trips_one_file_per_pane_and_falls_back_to_the_legacy_key() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("ui-state");
        let s = UiState::default();
        let set = |k: &str, v: &str| {
            s.handle(
                &dir,
                UiStateOp::Set {
                    key: k.into(),
                    state_json: v.into(),
                },
            )
        };
        let get = |k: &str, legacy: Option<&str>| match s
            .handle(
                &dir,
                UiStateOp::Get {
                    key: k.into(),
                    legacy_key: legacy.map(str::to_string),
                },
            )
            .unwrap()
        {
            UiStateReply::Got { state_json, .. } => state_json,
            other => panic!("{other:?}"),
        };
        assert_eq!(get("p1", None), None);
        assert_eq!(
            set("p1", r#"{"a":1}"#).unwrap(),
            UiStateReply::Set {
                key: "p1".into(),
                bytes: 7
            }
        );
        set("../p2", r#"{"b":2}"#).unwrap();
        assert_eq!(get("p1", None).as_deref(), Some(r#"{"a":1}"#));
        assert_eq!(get("../p2", None).as_deref(), Some(r#"{"b":2}"#));
        assert_eq!(get("new-pane", Some("p1")).as_deref(), Some(r#"{"a":1}"#));
        set("p1", r#"{"a":3}"#).unwrap();
        assert_eq!(get("p1", Some("../p2")).as_deref(), Some(r#"{"a":3}"#));
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["%2E%2E%2Fp2.json", "p1.json"], "no temp file left");
        assert!(!d.path().join("p2.json").exists());
    }

    #[test]
    fn bad_input_is_refused_with_its_code_and_nothing_is_written() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("ui-state");
        let s = UiState::default();
        let set = |k: &str, v: String| {
            s.handle(
                &dir,
                UiStateOp::Set {
                    key: k.into(),
                    state_json: v,
                },
            )
            .unwrap_err()
            .code()
        };
        use iii_shell_protocol::Code;
        assert_eq!(set("", "{}".into()), Code::S210);
        assert_eq!(set(&"k".repeat(513), "{}".into()), Code::S210);
        assert_eq!(set("k", "[1]".into()), Code::S210);
        assert_eq!(set("k", "{".into()), Code::S210);
        let big = format!(r#"{{"x":"{}"}}"#, "a".repeat(MAX_STATE_BYTES));
        assert_eq!(set("k", big), Code::S218);
        assert!(!dir.exists());
    }

    #[test]
    fn a_new_pane_past_the_cap_is_refused_and_existing_panes_still_write() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        for i in 0..MAX_PANES {
            std::fs::write(dir.join(format!("p{i}.json")), "{}").unwrap();
        }
        let s = UiState::default();
        let set = |k: &str| {
            s.handle(
                &dir,
                UiStateOp::Set {
                    key: k.into(),
                    state_json: "{}".into(),
                },
            )
        };
        assert_eq!(
            set("one-more").unwrap_err().code(),
            iii_shell_protocol::Code::S218
        );
        assert!(!dir.join("one-more.json").exists());
        assert!(set("p7").is_ok(), "an existing pane is replaced");
    }

    #[test]
    fn unusable_files_read_as_nothing_stored() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let s = UiState::default();
        std::fs::write(dir.join("arr.json"), "[1,2]").unwrap();
        std::fs::write(dir.join("junk.json"), "not json").unwrap();
        std::fs::write(d.path().join("secret"), r#"{"secret":1}"#).unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), dir.join("link.json")).unwrap();
        for key in ["arr", "junk", "link", "missing"] {
            let got = s
                .handle(
                    &dir,
                    UiStateOp::Get {
                        key: key.into(),
                        legacy_key: None,
                    },
                )
                .unwrap();
            assert_eq!(
                got,
                UiStateReply::Got {
                    key: key.into(),
                    state_json: None
                },
                "{key}"
            );
        }
    }

    /// A hardlink, a symlink or a FIFO planted at a pane's name is never served, never
    /// written through and never blocks; the store is private (0700, files 0600).
    #[test]
    fn links_and_fifos_at_a_pane_are_neither_served_nor_written_through() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("ui-state");
        let s = UiState::default();
        let set = |k: &str| {
            s.handle(
                &dir,
                UiStateOp::Set {
                    key: k.into(),
                    state_json: r#"{"mine":1}"#.into(),
                },
            )
            .unwrap()
        };
        let get = |k: &str| match s
            .handle(
                &dir,
                UiStateOp::Get {
                    key: k.into(),
                    legacy_key: None,
                },
            )
            .unwrap()
        {
            UiStateReply::Got { state_json, .. } => state_json,
            other => panic!("{other:?}"),
        };
        set("first");
        let secret = d.path().join("secret.json");
        std::fs::write(&secret, r#"{"secret":1}"#).unwrap();
        std::fs::hard_link(&secret, dir.join("hard.json")).unwrap();
        std::os::unix::fs::symlink(&secret, dir.join("sym.json")).unwrap();
        nix::unistd::mkfifo(&dir.join("fifo.json"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        for k in ["hard", "sym", "fifo"] {
            assert_eq!(get(k), None, "{k} was served");
        }
        for k in ["hard", "sym", "fifo"] {
            set(k);
            assert_eq!(get(k).as_deref(), Some(r#"{"mine":1}"#), "{k}");
        }
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), r#"{"secret":1}"#);
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        assert_eq!(
            std::fs::metadata(dir.join("first.json")).unwrap().mode() & 0o777,
            0o600
        );
    }
}
