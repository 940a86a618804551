//! The console page: the assets this worker contributes to the iii console and their
//! `console:script` / `console:style` trigger bindings.
//!
//! The assets are built from `web/` (npm, pinned by `web/package-lock.json`) into `web/dist/`,
//! committed, and embedded here at compile time, so `cargo build` needs no npm. The console
//! fetches them through the content function `shell::ui-content` when a binding reaches it.
//!
//! Bindings go out as ordinary `registertrigger` frames through the engine link, so they are
//! replayed on every reconnect and die with the connection; before the console is up the
//! engine parks them. A binding the console rejects (`triggerregistrationresult` with an
//! error) is logged with its reason by the link ([`rejection_hint`]).

use serde_json::{json, Value};

/// The content function.
pub const CONTENT_FUNCTION: &str = "shell::ui-content";
/// The console's page id: the page shows at `#/ext/shell`.
pub const PAGE_ID: &str = "shell";

/// One embedded asset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asset {
    /// The path in the trigger config and the content request.
    pub path: &'static str,
    /// `console:script` or `console:style`.
    pub trigger_type: &'static str,
    pub content_type: &'static str,
    pub content: &'static str,
}

/// Every asset, in registration order (the style first, so the page never shows unstyled).
pub const ASSETS: &[Asset] = &[
    Asset {
        path: "shell/page.css",
        trigger_type: "console:style",
        content_type: "text/css; charset=utf-8",
        content: include_str!("../../web/dist/page.css"),
    },
    Asset {
        path: "shell/page.js",
        trigger_type: "console:script",
        content_type: "text/javascript; charset=utf-8",
        content: include_str!("../../web/dist/page.js"),
    },
];

/// The asset at `path`, or the error the content function answers with.
pub fn content_for(path: &str) -> Result<&'static Asset, String> {
    ASSETS.iter().find(|a| a.path == path).ok_or_else(|| {
        let known: Vec<&str> = ASSETS.iter().map(|a| a.path).collect();
        format!(
            "UNKNOWN_UI_ASSET: '{path}' is not one of this worker's ui assets (expected one of: {})",
            known.join(", ")
        )
    })
}

/// The console's path rules for a binding of `trigger_type` (a pure function: exact-value
/// tests below): non-empty, at most 512 characters, no leading `/`, no empty, `.` or `..`
/// segment, each segment only `[a-z0-9._-]`, and `.js` for a script, `.css` for a style.
pub fn path_problem(trigger_type: &str, path: &str) -> Option<String> {
    if path.is_empty() {
        return Some("the asset path is empty".into());
    }
    if path.chars().count() > 512 {
        return Some("the asset path is longer than 512 characters".into());
    }
    if path.starts_with('/') {
        return Some(format!("the asset path {path:?} starts with '/'"));
    }
    for seg in path.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Some(format!(
                "the asset path {path:?} has an empty, '.' or '..' segment"
            ));
        }
        if let Some(c) = seg.chars().find(|c| {
            !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
        }) {
            return Some(format!(
                "the asset path {path:?} has {c:?}; segments take only [a-z0-9._-]"
            ));
        }
    }
    let ext = match trigger_type {
        "console:script" => ".js",
        "console:style" => ".css",
        other => return Some(format!("{other} is not a console asset trigger type")),
    };
    if !path.ends_with(ext) {
        return Some(format!(
            "a {trigger_type} asset path must end with {ext}: got {path:?}"
        ));
    }
    None
}

/// The binding id of an asset: stable per process, so a replay after a reconnect re-uses it.
pub fn binding_id(instance: &str, asset: &Asset) -> String {
    format!("{instance}-ui-{}", asset.path.replace('/', "-"))
}

/// The `registertrigger` frame of one asset.
pub fn binding_frame(id: &str, asset: &Asset, namespace: Option<&str>) -> Value {
    let mut frame = json!({
        "type": "registertrigger",
        "id": id,
        "trigger_type": asset.trigger_type,
        "function_id": CONTENT_FUNCTION,
        "config": {"path": asset.path},
    });
    if let Some(ns) = namespace {
        frame["namespace"] = json!(ns);
    }
    frame
}

/// What the log says next to a refused binding of `trigger_type`, or `None` when it is not a
/// console asset type.
pub fn rejection_hint(trigger_type: &str) -> Option<&'static str> {
    match trigger_type {
        "console:script" | "console:style" => Some(
            "the console refused this worker's page asset, so #/ext/shell will not show it; check the console's log, and that it can call shell::ui-content",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_obeys_the_path_rules_and_is_scoped() {
        for a in ASSETS {
            assert_eq!(path_problem(a.trigger_type, a.path), None, "{}", a.path);
            assert!(a.path.starts_with("shell/"));
        }
        let css = content_for("shell/page.css").unwrap().content;
        assert!(css.contains("[data-iii-ui=shell]") || css.contains("[data-iii-ui=\"shell\"]"));
    }

    #[test]
    fn path_rules_exact_values() {
        let s = "console:script";
        assert_eq!(path_problem(s, "shell/page.js"), None);
        assert_eq!(path_problem("console:style", "shell/a-b_c.1.css"), None);
        assert_eq!(path_problem(s, ""), Some("the asset path is empty".into()));
        assert_eq!(
            path_problem(s, &format!("{}.js", "a".repeat(510))),
            Some("the asset path is longer than 512 characters".into())
        );
        assert_eq!(path_problem(s, &format!("{}.js", "a".repeat(509))), None);
        assert_eq!(
            path_problem(s, "/shell/page.js"),
            Some("the asset path \"/shell/page.js\" starts with '/'".into())
        );
        for bad in ["shell//page.js", "shell/./page.js", "shell/../page.js"] {
            assert_eq!(
                path_problem(s, bad),
                Some(format!(
                    "the asset path {bad:?} has an empty, '.' or '..' segment"
                ))
            );
        }
        assert_eq!(
            path_problem(s, "Shell/page.js"),
            Some("the asset path \"Shell/page.js\" has 'S'; segments take only [a-z0-9._-]".into())
        );
        assert_eq!(
            path_problem(s, "shell/page.css"),
            Some("a console:script asset path must end with .js: got \"shell/page.css\"".into())
        );
        assert_eq!(
            path_problem("console:style", "shell/page.js"),
            Some("a console:style asset path must end with .css: got \"shell/page.js\"".into())
        );
        assert_eq!(
            path_problem("console:assets", "shell/page.js"),
            Some("console:assets is not a console asset trigger type".into())
        );
    }

    #[test]
    fn an_unknown_asset_is_an_error_naming_the_known_ones() {
        assert_eq!(
            content_for("shell/other.js").unwrap_err(),
            "UNKNOWN_UI_ASSET: 'shell/other.js' is not one of this worker's ui assets (expected one of: shell/page.css, shell/page.js)"
        );
        assert_eq!(
            content_for("shell/page.js").unwrap().content_type,
            "text/javascript; charset=utf-8"
        );
    }

    #[test]
    fn binding_frames_name_the_content_function() {
        let a = &ASSETS[1];
        assert_eq!(
            binding_frame(&binding_id("i", a), a, Some("ns")),
            json!({"type": "registertrigger", "id": "i-ui-shell-page.js", "trigger_type": "console:script",
                   "function_id": "shell::ui-content", "config": {"path": "shell/page.js"}, "namespace": "ns"})
        );
    }
}
