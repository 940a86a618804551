//! Schema conformance with the published contract of the original worker (ide 0.12.9).
//!
//! `data/ide-0.12.9-api.json` is the api reference embedded in the ide 0.12.9 registry page
//! (`/work/shared/seeds/ide-0.12.9-registry-page.md`, the JSON block after "## api reference"),
//! copied verbatim. `data/ide-0.12.9-config.yaml` is the configuration block of the same page,
//! also verbatim.
//!
//! Every function this worker publishes ([`all_function_defs`]) must have a seed entry of the
//! same name, and its description, metadata flags, request schema and response schema must
//! match it, except the few functions listed in [`ADDITIONS`] (added beyond the contract, each
//! with its reason; their schemas are checked for draft-07 shape). The schemas are compared structurally and recursively, following `$ref` into
//! `definitions` on both sides: types (with nullability), property names, `required`,
//! `default`, `format`, `minimum` and every other validation keyword, enums (`const: x` and
//! `enum: [x]` are equivalent), `additionalProperties`, `items`, `oneOf`/`anyOf`/`allOf`, and
//! titles / descriptions wherever the seed has one.
//!
//! The configuration schema registered with the configuration worker is checked too: every
//! knob is documented, and the shipped config and the seed's config validate against it.

use std::collections::{BTreeMap, BTreeSet};

use iii_shell_broker::lifecycle::{all_function_defs, Lifecycle};
use iii_shell_protocol::config::{Config, SHIPPED_CONFIG_YAML};
use iii_test_engine::schema_check::validate;
use serde_json::{json, Value};

const SEED_API: &str = include_str!("data/ide-0.12.9-api.json");
const SEED_CONFIG_YAML: &str = include_str!("data/ide-0.12.9-config.yaml");
const DRAFT07: &str = "http://json-schema.org/draft-07/schema#";

/// An accepted difference between our published schema and the seed.
struct Allowed {
    /// Function id.
    function: &'static str,
    /// JSON pointer into the function entry (`/request_schema/...`, `/response_schema/...`,
    /// `/description`, `/metadata`) where the difference is reported.
    pointer: &'static str,
    /// Why the difference is accepted.
    reason: &'static str,
}

/// Accepted differences. Keep this as small as possible: prefer changing our types so they
/// match. An entry that no longer matches any difference fails the test, so the list cannot
/// go stale.
const ALLOWED: &[Allowed] = &[
    Allowed {
        function: "shell::exec",
        pointer: "/request_schema/properties",
        reason: "an addition: the optional per-call `limits` (memory_max_bytes, cpu_max_percent, pids_max) tightens the worker's confinement.job_limits for this call's job; a value above the worker's is S210 naming the field",
    },
    Allowed {
        function: "shell::exec_bg",
        pointer: "/request_schema/properties",
        reason: "an addition: the optional per-call `limits` (memory_max_bytes, cpu_max_percent, pids_max) tightens the worker's confinement.job_limits for this call's job; a value above the worker's is S210 naming the field",
    },
    Allowed {
        function: "shell::pty::open",
        pointer: "/request_schema/properties",
        reason: "an addition: the optional per-call `limits` (memory_max_bytes, cpu_max_percent, pids_max) tightens the worker's confinement.job_limits for this call's job; a value above the worker's is S210 naming the field",
    },
];

/// Functions this worker publishes that the ide 0.12.9 contract does not have, with why. Each
/// must stay out of the seed (a seed entry would be the contract to match), still be
/// published (a stale entry fails), have a description, and draft-07 schemas.
const ADDITIONS: &[(&str, &str)] = &[
    (
        "shell::turns::sessions",
        "ide 0.12.9 has no function that lists the sessions with recorded turns; the console page needs it to offer them instead of asking for an id",
    ),
    (
        "shell::job::start",
        "ide 0.12.9 jobs cannot be fed input: a job started here keeps its stdin open as a pipe for shell::job::write",
    ),
    (
        "shell::job::write",
        "ide 0.12.9 has no way to write to a running job's stdin (an agent driving an interactive program)",
    ),
    (
        "shell::job::read",
        "ide 0.12.9 only returns a job's whole capture (shell::status); an agent needs output from an offset, with long polling and an exact count of what it missed",
    ),
    (
        "shell::job::signal",
        "ide 0.12.9 can only kill a job (shell::kill); an agent needs INT, TERM, STOP/CONT and the other documented signals",
    ),
    (
        "shell::job::wait",
        "ide 0.12.9 can only poll shell::status; an agent waits for a job's end instead of busy-polling",
    ),
];

/// Request fields added to functions of the contract (function, field, why). The seed's
/// fields must all still match; these are left out of the property-name comparison of the
/// top-level request schema only, must still be published (a stale entry fails), and carry a
/// description.
const FIELD_ADDITIONS: &[(&str, &str, &str)] = &[
    (
        "shell::exec",
        "network",
        "a call tightens confinement.network for itself (never widens it)",
    ),
    (
        "shell::exec_bg",
        "network",
        "a job tightens confinement.network for itself (never widens it)",
    ),
    (
        "shell::pty::open",
        "network",
        "a terminal session tightens confinement.network for itself (never widens it)",
    ),
];

fn is_field_addition(function: &str, base: &str, ptr: &str, name: &str) -> bool {
    base == "/request_schema"
        && ptr.is_empty()
        && FIELD_ADDITIONS
            .iter()
            .any(|&(f, n, _)| f == function && n == name)
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Diff {
    function: String,
    pointer: String,
    message: String,
}

impl std::fmt::Display for Diff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.function, self.pointer, self.message)
    }
}

fn seed_api() -> Value {
    serde_json::from_str(SEED_API).expect("seed api JSON parses")
}

fn seed_functions() -> BTreeMap<String, Value> {
    let api = seed_api();
    let functions = api["functions"]
        .as_array()
        .expect("seed has a functions array");
    let mut by_name = BTreeMap::new();
    for f in functions {
        let name = f["name"]
            .as_str()
            .expect("seed function has a name")
            .to_string();
        assert!(
            by_name.insert(name.clone(), f.clone()).is_none(),
            "seed lists {name} twice"
        );
    }
    by_name
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn show(v: Option<&Value>) -> String {
    match v {
        Some(v) => v.to_string(),
        None => "(absent)".to_string(),
    }
}

/// `type` as a set: `"x"` and `["x"]` are the same; absent is the empty set (any type).
fn type_set(node: &Value) -> BTreeSet<String> {
    match node.get("type") {
        Some(Value::String(s)) => BTreeSet::from([s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| t.to_string())
            })
            .collect(),
        Some(other) => BTreeSet::from([other.to_string()]),
        None => BTreeSet::new(),
    }
}

/// `enum` values (or a `const`, as a one-value enum) as a set of canonical JSON texts.
fn enum_set(node: &Value) -> Option<BTreeSet<String>> {
    let mut set: Option<BTreeSet<String>> = None;
    if let Some(values) = node.get("enum").and_then(Value::as_array) {
        set.get_or_insert_with(BTreeSet::new)
            .extend(values.iter().map(Value::to_string));
    }
    if let Some(value) = node.get("const") {
        set.get_or_insert_with(BTreeSet::new)
            .insert(value.to_string());
    }
    set
}

fn string_set(node: &Value, key: &str) -> BTreeSet<String> {
    node.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The definition name of `#/definitions/<name>`.
fn ref_name(reference: &str) -> Option<&str> {
    reference.strip_prefix("#/definitions/")
}

/// A `$ref` carried by `node`, either bare or as draft-07's `allOf: [{"$ref": …}]` wrapper
/// (the form used when the reference has sibling keywords). Returns the reference and whether
/// the `allOf` wrapper was used.
fn node_ref(node: &Value) -> Option<(String, bool)> {
    if let Some(r) = node.get("$ref").and_then(Value::as_str) {
        return Some((r.to_string(), false));
    }
    let all_of = node.get("allOf")?.as_array()?;
    match all_of.as_slice() {
        [only] if only.as_object().is_some_and(|o| o.len() == 1) => only
            .get("$ref")
            .and_then(Value::as_str)
            .map(|r| (r.to_string(), true)),
        _ => None,
    }
}

/// Keywords handled structurally by [`Comparator::compare`]; every other keyword is compared
/// by exact JSON equality.
const STRUCTURAL: &[&str] = &[
    "$schema",
    "$ref",
    "definitions",
    "$defs",
    "title",
    "description",
    "type",
    "enum",
    "const",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "oneOf",
    "anyOf",
    "allOf",
];

struct Comparator<'a> {
    function: &'a str,
    /// `/request_schema` or `/response_schema`.
    base: &'a str,
    ours_root: &'a Value,
    seed_root: &'a Value,
    /// Definitions (ours) already compared, so recursive types terminate.
    visited: BTreeSet<String>,
    diffs: Vec<Diff>,
    /// Harmless extras (a title or description the seed does not have).
    notes: Vec<String>,
}

impl<'a> Comparator<'a> {
    fn diff(&mut self, pointer: &str, message: String) {
        self.diffs.push(Diff {
            function: self.function.to_string(),
            pointer: format!("{}{}", self.base, pointer),
            message,
        });
    }

    fn resolve(root: &'a Value, reference: &str) -> Option<&'a Value> {
        root.get("definitions")?.get(ref_name(reference)?)
    }

    fn compare(&mut self, ours: &Value, seed: &Value, ptr: &str) {
        if ours.is_boolean() || seed.is_boolean() {
            if ours != seed {
                self.diff(ptr, format!("schema {ours} != seed {seed}"));
            }
            return;
        }
        let (Some(o), Some(s)) = (ours.as_object(), seed.as_object()) else {
            self.diff(ptr, format!("not both schemas: ours {ours}, seed {seed}"));
            return;
        };

        // References: compared by name, then the definitions themselves (once).
        let our_ref = node_ref(ours);
        let seed_ref = node_ref(seed);
        match (&our_ref, &seed_ref) {
            (Some((or, _)), Some((sr, _))) => {
                if or != sr {
                    self.diff(ptr, format!("$ref {or} != seed {sr}"));
                }
                let key = or.clone();
                if self.visited.insert(key) {
                    match (
                        Self::resolve(self.ours_root, or),
                        Self::resolve(self.seed_root, sr),
                    ) {
                        (Some(od), Some(sd)) => {
                            let def_ptr =
                                format!("/definitions/{}", escape(ref_name(or).unwrap_or(or)));
                            self.compare(od, sd, &def_ptr);
                        }
                        (None, _) => self.diff(
                            ptr,
                            format!("$ref {or} does not resolve into our definitions"),
                        ),
                        (_, None) => self.diff(ptr, format!("seed $ref {sr} does not resolve")),
                    }
                }
            }
            (None, None) => {}
            (Some((or, _)), None) => {
                self.diff(ptr, format!("ours is a $ref to {or}, the seed is inline"))
            }
            (None, Some((sr, _))) => {
                self.diff(ptr, format!("the seed is a $ref to {sr}, ours is inline"))
            }
        }
        // An `allOf: [{$ref}]` wrapper is consumed by the reference handling above (a bare
        // `$ref` and a wrapped one are equivalent; a bare one with siblings is flagged by
        // `check_draft07`).
        let wrapped =
            our_ref.as_ref().is_some_and(|r| r.1) || seed_ref.as_ref().is_some_and(|r| r.1);

        // title / description: must equal the seed's wherever the seed has one; an extra one
        // of ours is only noted.
        for key in ["title", "description"] {
            match (o.get(key), s.get(key)) {
                (ov, Some(sv)) if ov != Some(sv) => self.diff(
                    &format!("{ptr}/{key}"),
                    format!("{} != seed {sv}", show(ov)),
                ),
                (Some(ov), None) => self.notes.push(format!(
                    "{} {}{ptr}/{key}: ours adds {ov}",
                    self.function, self.base
                )),
                _ => {}
            }
        }

        // type, with nullability.
        let (ot, st) = (type_set(ours), type_set(seed));
        if ot != st {
            self.diff(&format!("{ptr}/type"), format!("{ot:?} != seed {st:?}"));
        }

        // enum / const.
        let (oe, se) = (enum_set(ours), enum_set(seed));
        if oe != se {
            self.diff(&format!("{ptr}/enum"), format!("{oe:?} != seed {se:?}"));
        }

        // required.
        let (orq, srq) = (string_set(ours, "required"), string_set(seed, "required"));
        if orq != srq {
            self.diff(
                &format!("{ptr}/required"),
                format!("{orq:?} != seed {srq:?}"),
            );
        }

        // properties.
        let empty = serde_json::Map::new();
        let op = o
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let sp = s
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let on: BTreeSet<&String> = op
            .keys()
            .filter(|n| !is_field_addition(self.function, self.base, ptr, n))
            .collect();
        let sn: BTreeSet<&String> = sp.keys().collect();
        if on != sn {
            let extra: Vec<_> = on.difference(&sn).collect();
            let missing: Vec<_> = sn.difference(&on).collect();
            self.diff(
                &format!("{ptr}/properties"),
                format!("property names differ: ours only {extra:?}, seed only {missing:?}"),
            );
        }
        for name in on.intersection(&sn) {
            self.compare(
                &op[*name],
                &sp[*name],
                &format!("{ptr}/properties/{}", escape(name)),
            );
        }

        // additionalProperties (absent = true).
        let oa = o
            .get("additionalProperties")
            .cloned()
            .unwrap_or(Value::Bool(true));
        let sa = s
            .get("additionalProperties")
            .cloned()
            .unwrap_or(Value::Bool(true));
        self.compare(&oa, &sa, &format!("{ptr}/additionalProperties"));

        // items.
        match (o.get("items"), s.get("items")) {
            (None, None) => {}
            (Some(Value::Array(oi)), Some(Value::Array(si))) => {
                self.compare_list(oi, si, &format!("{ptr}/items"))
            }
            (Some(oi), Some(si)) => self.compare(oi, si, &format!("{ptr}/items")),
            (oi, si) => self.diff(
                &format!("{ptr}/items"),
                format!("{} != seed {}", show(oi), show(si)),
            ),
        }

        // Combinators.
        for key in ["oneOf", "anyOf", "allOf"] {
            if key == "allOf" && wrapped {
                continue;
            }
            match (
                o.get(key).and_then(Value::as_array),
                s.get(key).and_then(Value::as_array),
            ) {
                (None, None) => {}
                (Some(ol), Some(sl)) => self.compare_list(ol, sl, &format!("{ptr}/{key}")),
                _ => self.diff(
                    &format!("{ptr}/{key}"),
                    format!("{} != seed {}", show(o.get(key)), show(s.get(key))),
                ),
            }
        }

        // Every other keyword (default, format, minimum, maximum, pattern, …): exact.
        let keys: BTreeSet<&String> = o
            .keys()
            .chain(s.keys())
            .filter(|k| !STRUCTURAL.contains(&k.as_str()))
            .collect();
        for key in keys {
            if o.get(key) != s.get(key) {
                self.diff(
                    &format!("{ptr}/{}", escape(key)),
                    format!("{} != seed {}", show(o.get(key)), show(s.get(key))),
                );
            }
        }
    }

    fn compare_list(&mut self, ours: &[Value], seed: &[Value], ptr: &str) {
        if ours.len() != seed.len() {
            self.diff(
                ptr,
                format!("{} entries != seed {}", ours.len(), seed.len()),
            );
        }
        for (i, (o, s)) in ours.iter().zip(seed).enumerate() {
            self.compare(o, s, &format!("{ptr}/{i}"));
        }
    }
}

/// Draft-07 shape checks of one of our schemas: `$schema`, `definitions` (never `$defs`),
/// no `$ref` with siblings (draft-07 ignores them), every `$ref` resolves.
fn check_draft07(function: &str, base: &str, root: &Value, diffs: &mut Vec<Diff>) {
    let mut push = |pointer: String, message: String| {
        diffs.push(Diff {
            function: function.to_string(),
            pointer: format!("{base}{pointer}"),
            message,
        })
    };
    if root.get("$schema").and_then(Value::as_str) != Some(DRAFT07) {
        push(
            "/$schema".into(),
            format!("{} is not {DRAFT07}", show(root.get("$schema"))),
        );
    }
    fn walk(root: &Value, node: &Value, ptr: String, push: &mut dyn FnMut(String, String)) {
        match node {
            Value::Object(map) => {
                if map.contains_key("$defs") {
                    push(
                        format!("{ptr}/$defs"),
                        "uses $defs; draft-07 schemas use definitions".into(),
                    );
                }
                if let Some(r) = map.get("$ref") {
                    if map.len() > 1 {
                        let siblings: Vec<_> = map.keys().filter(|k| *k != "$ref").collect();
                        push(ptr.clone(), format!("$ref has sibling keywords {siblings:?}, which draft-07 ignores (wrap it in allOf)"));
                    }
                    let resolves = r
                        .as_str()
                        .and_then(ref_name)
                        .is_some_and(|n| root.get("definitions").and_then(|d| d.get(n)).is_some());
                    if !resolves {
                        push(
                            ptr.clone(),
                            format!("$ref {r} does not resolve into #/definitions"),
                        );
                    }
                }
                for (k, v) in map {
                    // Skip values that are data, not schemas.
                    if matches!(
                        k.as_str(),
                        "default" | "enum" | "const" | "examples" | "required"
                    ) {
                        continue;
                    }
                    walk(root, v, format!("{ptr}/{}", escape(k)), push);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(root, v, format!("{ptr}/{i}"), push);
                }
            }
            _ => {}
        }
    }
    walk(root, root, String::new(), &mut push);
}

/// Metadata flags; an absent flag is false.
fn metadata_flags(metadata: &Value) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    if let Some(map) = metadata.as_object() {
        for (k, v) in map {
            if v != &Value::Bool(false) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    for flag in ["internal", "trace_hidden", "display"] {
        out.entry(flag.to_string()).or_insert(Value::Bool(false));
    }
    out
}

/// Every difference between one published function and its seed entry.
fn function_diffs(
    id: &str,
    description: &str,
    metadata: &Value,
    request: &Value,
    response: &Value,
    seed: &Value,
) -> Vec<Diff> {
    let mut diffs = Vec::new();
    if seed["description"].as_str() != Some(description) {
        diffs.push(Diff {
            function: id.into(),
            pointer: "/description".into(),
            message: format!("{description:?} != seed {}", seed["description"]),
        });
    }
    let (om, sm) = (metadata_flags(metadata), metadata_flags(&seed["metadata"]));
    if om != sm {
        diffs.push(Diff {
            function: id.into(),
            pointer: "/metadata".into(),
            message: format!("{om:?} != seed {sm:?}"),
        });
    }
    for (base, ours, seed_schema) in [
        ("/request_schema", request, &seed["request_schema"]),
        ("/response_schema", response, &seed["response_schema"]),
    ] {
        assert_eq!(
            seed_schema.get("$schema").and_then(Value::as_str),
            Some(DRAFT07),
            "seed {id}{base} is draft-07"
        );
        check_draft07(id, base, ours, &mut diffs);
        let mut cmp = Comparator {
            function: id,
            base,
            ours_root: ours,
            seed_root: seed_schema,
            visited: BTreeSet::new(),
            diffs: Vec::new(),
            notes: Vec::new(),
        };
        cmp.compare(ours, seed_schema, "");
        for note in &cmp.notes {
            eprintln!("note: {note}");
        }
        diffs.extend(cmp.diffs);
    }
    diffs
}

#[test]
fn every_field_addition_is_published_with_a_description() {
    let defs = all_function_defs();
    for &(function, field, why) in FIELD_ADDITIONS {
        let f = defs
            .iter()
            .find(|f| f.id == function)
            .unwrap_or_else(|| panic!("{function} is not published"));
        let schema = &f.request_format;
        let p = &schema["properties"][field];
        assert!(
            p["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{function}.{field} ({why}) is not published with a description: {schema}"
        );
    }
}

#[test]
fn every_published_function_matches_the_ide_0_12_9_seed() {
    let seed = seed_functions();
    let defs = all_function_defs();
    assert!(!defs.is_empty());

    let mut ids = BTreeSet::new();
    let mut missing = Vec::new();
    let mut diffs = Vec::new();
    for f in &defs {
        assert!(ids.insert(f.id), "{} is published twice", f.id);
        if let Some((_, why)) = ADDITIONS.iter().find(|(id, _)| *id == f.id) {
            assert!(
                !seed.contains_key(f.id),
                "{} is in the seed: match it instead of listing it as an addition",
                f.id
            );
            assert!(!f.description.is_empty(), "{} has no description", f.id);
            check_draft07(f.id, "/request_schema", &f.request_format, &mut diffs);
            check_draft07(f.id, "/response_schema", &f.response_format, &mut diffs);
            eprintln!("addition to the contract: {} ({why})", f.id);
            continue;
        }
        let Some(entry) = seed.get(f.id) else {
            missing.push(f.id);
            continue;
        };
        diffs.extend(function_diffs(
            f.id,
            f.description,
            &f.metadata,
            &f.request_format,
            &f.response_format,
            entry,
        ));
    }
    assert!(missing.is_empty(), "published functions without an ide 0.12.9 seed entry (not part of the contract): {missing:?}");
    let unpublished: Vec<&str> = ADDITIONS
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| !ids.contains(id))
        .collect();
    assert!(
        unpublished.is_empty(),
        "additions that are not published (remove them): {unpublished:?}"
    );

    let mut used = vec![false; ALLOWED.len()];
    let mut unexpected = Vec::new();
    for d in diffs {
        match ALLOWED
            .iter()
            .position(|a| a.function == d.function && a.pointer == d.pointer)
        {
            Some(i) => {
                used[i] = true;
                eprintln!("allowed difference: {d} ({})", ALLOWED[i].reason);
            }
            None => unexpected.push(d),
        }
    }
    let stale: Vec<String> = ALLOWED
        .iter()
        .zip(&used)
        .filter(|(_, u)| !**u)
        .map(|(a, _)| format!("{} {} ({})", a.function, a.pointer, a.reason))
        .collect();

    let not_yet: Vec<&String> = seed.keys().filter(|k| !ids.contains(k.as_str())).collect();
    eprintln!(
        "{} published functions checked; seed functions not implemented yet: {not_yet:?}",
        defs.len()
    );

    assert!(
        unexpected.is_empty(),
        "{} difference(s) from the ide 0.12.9 published schemas:\n  {}",
        unexpected.len(),
        unexpected
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    assert!(
        stale.is_empty(),
        "allow-list entries that match no difference (remove them): {stale:?}"
    );
}

/// Edits a (request, response) schema pair.
type Mutation = Box<dyn Fn(&mut Value, &mut Value)>;

/// The comparator itself: each kind of drift is caught, equivalent spellings are not.
#[test]
fn the_comparator_catches_drift_and_accepts_equivalent_spellings() {
    let seed = seed_functions();
    let exec = &seed["shell::exec"];
    let request = exec["request_schema"].clone();
    let response = exec["response_schema"].clone();
    let diffs_for = |request: &Value, response: &Value| -> Vec<String> {
        function_diffs(
            "shell::exec",
            exec["description"].as_str().unwrap(),
            &exec["metadata"],
            request,
            response,
            exec,
        )
        .into_iter()
        .map(|d| d.pointer)
        .collect()
    };
    assert_eq!(
        diffs_for(&request, &response),
        Vec::<String>::new(),
        "the seed matches itself"
    );

    // `const: x` is the same as `enum: [x]`.
    let mut same = request.clone();
    let kind = &mut same["definitions"]["Target"]["oneOf"][0]["properties"]["kind"];
    *kind = json!({"const": "host", "type": "string"});
    assert_eq!(diffs_for(&same, &response), Vec::<String>::new());

    let cases: Vec<(&str, Mutation, &str)> = vec![
        (
            "nullability",
            Box::new(|q, _| q["properties"]["cwd"]["type"] = json!("string")),
            "/request_schema/properties/cwd/type",
        ),
        (
            "nullability (response)",
            Box::new(|_, r| r["properties"]["exit_code"]["type"] = json!("integer")),
            "/response_schema/properties/exit_code/type",
        ),
        (
            "default",
            Box::new(|q, _| q["properties"]["target"]["default"] = json!({"kind": "sandbox"})),
            "/request_schema/properties/target/default",
        ),
        (
            "format",
            Box::new(|_, r| r["properties"]["duration_ms"]["format"] = json!("uint32")),
            "/response_schema/properties/duration_ms/format",
        ),
        (
            "minimum",
            Box::new(|q, _| {
                q["properties"]["timeout_ms"]
                    .as_object_mut()
                    .unwrap()
                    .remove("minimum")
                    .map(|_| ())
                    .unwrap()
            }),
            "/request_schema/properties/timeout_ms/minimum",
        ),
        (
            "enum",
            Box::new(|q, _| {
                q["definitions"]["Target"]["oneOf"][1]["properties"]["kind"]["enum"] = json!(["vm"])
            }),
            "/request_schema/definitions/Target/oneOf/1/properties/kind/enum",
        ),
        (
            "required",
            Box::new(|_, r| {
                r["required"]
                    .as_array_mut()
                    .unwrap()
                    .pop()
                    .map(|_| ())
                    .unwrap()
            }),
            "/response_schema/required",
        ),
        (
            "property names",
            Box::new(|q, _| q["properties"]["extra"] = json!({"type": "string"})),
            "/request_schema/properties",
        ),
        (
            "map values",
            Box::new(|q, _| {
                q["properties"]["env"]["additionalProperties"] = json!({"type": "integer"})
            }),
            "/request_schema/properties/env/additionalProperties/type",
        ),
        (
            "items",
            Box::new(|q, _| q["properties"]["args"]["items"] = json!({"type": "number"})),
            "/request_schema/properties/args/items/type",
        ),
        (
            "title",
            Box::new(|q, _| q["title"] = json!("Other")),
            "/request_schema/title",
        ),
        (
            "description",
            Box::new(|q, _| q["properties"]["command"]["description"] = json!("x")),
            "/request_schema/properties/command/description",
        ),
        (
            "$defs",
            Box::new(|q, _| q["$defs"] = json!({})),
            "/request_schema/$defs",
        ),
        (
            "$schema",
            Box::new(|q, _| q["$schema"] = json!("https://json-schema.org/draft/2020-12/schema")),
            "/request_schema/$schema",
        ),
        (
            "$ref with siblings",
            Box::new(|q, _| {
                let t = &mut q["properties"]["target"];
                t.as_object_mut().unwrap().remove("allOf");
                t["$ref"] = json!("#/definitions/Target");
            }),
            "/request_schema/properties/target",
        ),
    ];
    for (what, mutate, pointer) in cases {
        let (mut q, mut r) = (request.clone(), response.clone());
        mutate(&mut q, &mut r);
        let found = diffs_for(&q, &r);
        assert!(
            found.iter().any(|p| p == pointer),
            "{what}: expected a difference at {pointer}, got {found:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The configuration schema registered with the configuration worker.
// ---------------------------------------------------------------------------------------------

/// The seed's configuration block, as a JSON value. The registry page renders it as a
/// one-element YAML sequence of unquoted scalars, and `**/.git/**` is not a valid YAML plain
/// scalar (`*` starts an alias): quote every sequence item that is a scalar, parse, and unwrap
/// the sequence. Nothing else is changed (`host_roots:` with no value stays null).
fn seed_config_value() -> Value {
    let repaired: Vec<String> = SEED_CONFIG_YAML
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let indent = line.len() - trimmed.len();
            match trimmed.strip_prefix("- ") {
                Some(item) if indent > 0 && !item.ends_with(':') && !item.contains(": ") => {
                    format!("{}- '{}'", " ".repeat(indent), item.replace('\'', "''"))
                }
                _ => line.to_string(),
            }
        })
        .collect();
    let parsed: Value =
        serde_norway::from_str(&repaired.join("\n")).expect("repaired seed config YAML parses");
    match parsed {
        Value::Array(mut items) if items.len() == 1 => items.remove(0),
        other => panic!("seed config block is not a one-element sequence: {other}"),
    }
}

fn shipped_config_value() -> Value {
    serde_norway::from_str(SHIPPED_CONFIG_YAML).expect("shipped config.yaml parses")
}

/// CFG-24: the console documents each knob inline, so every field at every level (and every
/// object type) carries a non-empty description.
#[test]
fn config_schema_documents_every_field() {
    let schema = Lifecycle::config_schema();
    assert_eq!(schema["$schema"], DRAFT07);
    assert!(schema.get("$defs").is_none(), "draft-07 uses definitions");

    fn described(node: &Value) -> bool {
        node.get("description")
            .and_then(Value::as_str)
            .is_some_and(|d| !d.trim().is_empty())
    }
    fn walk(node: &Value, ptr: &str, missing: &mut Vec<String>) {
        let Some(map) = node.as_object() else { return };
        if let Some(props) = map.get("properties").and_then(Value::as_object) {
            for (name, prop) in props {
                let p = format!("{ptr}/properties/{}", escape(name));
                if !described(prop) {
                    missing.push(p.clone());
                }
                walk(prop, &p, missing);
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(sub) = map.get(key) {
                walk(sub, &format!("{ptr}/{key}"), missing);
            }
        }
        for key in ["oneOf", "anyOf", "allOf"] {
            for (i, sub) in map
                .get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                walk(sub, &format!("{ptr}/{key}/{i}"), missing);
            }
        }
    }

    let mut missing = Vec::new();
    if !described(&schema) {
        missing.push(String::new());
    }
    walk(&schema, "", &mut missing);
    let definitions = schema
        .get("definitions")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (name, def) in &definitions {
        let p = format!("/definitions/{}", escape(name));
        if !described(def) {
            missing.push(p.clone());
        }
        walk(def, &p, &mut missing);
    }
    assert!(
        !definitions.is_empty()
            && schema["properties"]
                .as_object()
                .is_some_and(|p| p.len() > 5),
        "schema looks empty: {schema}"
    );
    assert!(
        missing.is_empty(),
        "config schema entries without a description: {missing:?}"
    );
}

#[test]
fn shipped_and_seed_configs_validate_against_the_config_schema() {
    let schema = Lifecycle::config_schema();

    let shipped = shipped_config_value();
    if let Err(errors) = validate(&schema, &shipped) {
        panic!("shipped config.yaml does not validate against the config schema: {errors:?}");
    }

    let seed = seed_config_value();
    assert!(
        seed["fs"]["host_roots"].is_null(),
        "the seed's `host_roots:` has no value: {}",
        seed["fs"]
    );
    assert_eq!(seed["code"]["default_exclude_globs"][0], "**/.git/**");
    if let Err(errors) = validate(&schema, &seed) {
        panic!(
            "the ide 0.12.9 seed config does not validate against the config schema: {errors:?}"
        );
    }
    // Our own parser accepts it too (null lists read as empty).
    let parsed = Config::from_value(&seed).expect("the seed config parses");
    assert!(parsed.fs.host_roots.is_empty());

    // Every list knob that reads YAML null as empty also admits null in the schema.
    for (section, key) in [
        ("fs", "host_roots"),
        ("fs", "denylist_paths"),
        ("code", "default_exclude_globs"),
        ("code", "non_accessible_globs"),
    ] {
        let mut v = shipped.clone();
        v[section][key] = Value::Null;
        assert!(
            validate(&schema, &v).is_ok(),
            "{section}.{key}: null is refused by the schema"
        );
        assert!(
            Config::from_value(&v).is_ok(),
            "{section}.{key}: null is refused by the parser"
        );
    }
}

#[test]
fn config_schema_refuses_removed_and_unknown_keys() {
    let schema = Lifecycle::config_schema();
    let shipped = shipped_config_value();
    let cases = [
        (
            "top-level `allowlist` (removed)",
            json!({"allowlist": []}),
            None,
        ),
        (
            "top-level `allowed_env` (removed)",
            json!({"allowed_env": ["PATH"]}),
            None,
        ),
        (
            "`fs.host_root` (removed)",
            json!({"host_root": "/srv"}),
            Some("fs"),
        ),
        (
            "`code.base_paths` (removed)",
            json!({"base_paths": ["/x"]}),
            Some("code"),
        ),
        ("a misspelt key", json!({"max_timout_ms": 5}), None),
    ];
    for (what, extra, section) in cases {
        let mut v = shipped.clone();
        let target = match section {
            Some(s) => &mut v[s],
            None => &mut v,
        };
        for (k, val) in extra.as_object().unwrap() {
            target[k] = val.clone();
        }
        assert!(
            validate(&schema, &v).is_err(),
            "{what}: the schema accepts it"
        );
        assert!(
            Config::from_value(&v).is_err(),
            "{what}: the parser accepts it"
        );
    }
}

/// The extra `config_id` and `warnings` of `shell::config-status` are allowed by the seed's
/// own schema: a reply with them validates against the seed's response schema.
#[test]
fn config_status_with_its_config_id_and_warnings_fits_the_seed_schema() {
    let seed = seed_functions();
    let schema = &seed["shell::config-status"]["response_schema"];
    let reply = serde_json::to_value(iii_shell_broker::snapshot::ReloadStatus {
        last_outcome: iii_shell_broker::snapshot::ReloadOutcome::Applied,
        last_error: None,
        rejected_reloads: 0,
        config_id: "shell-host-a".into(),
        warnings: vec!["the root /srv cannot be entered by uid 65534".into()],
    })
    .unwrap();
    assert_eq!(reply["config_id"], "shell-host-a");
    assert_eq!(
        reply["warnings"][0],
        "the root /srv cannot be entered by uid 65534"
    );
    validate(schema, &reply).expect("fits the seed's schema");
}

/// The whole `coder::*` surface is published (and therefore checked above against
/// the seed, with the allow-list still empty).
#[test]
fn every_coder_function_of_the_seed_is_published() {
    let published: BTreeSet<String> = all_function_defs()
        .iter()
        .map(|f| f.id.to_string())
        .collect();
    let coder: Vec<String> = seed_functions()
        .into_keys()
        .filter(|k| k.starts_with("coder::"))
        .collect();
    assert_eq!(coder.len(), 10, "{coder:?}");
    let missing: Vec<&String> = coder.iter().filter(|c| !published.contains(*c)).collect();
    assert!(
        missing.is_empty(),
        "coder functions not published: {missing:?}"
    );
    assert!(ALLOWED.iter().all(|a| !a.function.starts_with("coder::")));
}
