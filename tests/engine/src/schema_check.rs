//! A deliberately small JSON-Schema checker for `configuration::*`.
//!
//! Checked keywords: boolean schemas, `type` (string or array; `integer` =
//! number without fraction), `enum`, `const`, `required`, `properties`,
//! `additionalProperties` (`false` or a schema), `items` (single schema),
//! `minimum` / `maximum`, `allOf` / `anyOf` / `oneOf`, and `$ref` to
//! `#/definitions/…` or `#/$defs/…` of the root schema. Every other keyword
//! (formats, patterns, lengths, `if/then`, remote refs, …) is ignored, i.e.
//! treated as valid. Messages imitate the engine's validator
//! (e.g. `0 is less than the minimum of 1`).

use serde_json::Value;

/// Nesting limit that stops `$ref` cycles.
const MAX_DEPTH: usize = 64;

/// `Ok(())` or every violation found, in schema-keyword order.
pub fn validate(schema: &Value, value: &Value) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    check(schema, schema, value, 0, &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn show(v: &Value) -> String {
    v.to_string()
}

fn is_valid(root: &Value, schema: &Value, value: &Value, depth: usize) -> bool {
    let mut errors = Vec::new();
    check(root, schema, value, depth, &mut errors);
    errors.is_empty()
}

fn type_matches(name: &str, value: &Value) -> bool {
    match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => match value {
            Value::Number(n) => {
                n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
            }
            _ => false,
        },
        _ => true,
    }
}

fn resolve_ref<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let path = reference.strip_prefix("#/")?;
    path.split('/')
        .map(|p| p.replace("~1", "/").replace("~0", "~"))
        .try_fold(root, |node, part| node.get(part.as_str()))
}

fn check(root: &Value, schema: &Value, value: &Value, depth: usize, errors: &mut Vec<String>) {
    if depth > MAX_DEPTH {
        return;
    }
    let obj = match schema {
        Value::Bool(true) => return,
        Value::Bool(false) => {
            errors.push(format!("False schema does not allow {}", show(value)));
            return;
        }
        Value::Object(obj) => obj,
        _ => return,
    };
    for (keyword, arg) in obj {
        match keyword.as_str() {
            "$ref" => match arg.as_str().and_then(|r| resolve_ref(root, r)) {
                Some(target) => check(root, target, value, depth + 1, errors),
                None => tracing::debug!(reference = %arg, "unresolvable $ref ignored"),
            },
            "type" => {
                let names: Vec<&str> = match arg {
                    Value::String(s) => vec![s.as_str()],
                    Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                    _ => continue,
                };
                if !names.iter().any(|n| type_matches(n, value)) {
                    let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
                    if quoted.len() == 1 {
                        errors.push(format!("{} is not of type {}", show(value), quoted[0]));
                    } else {
                        errors.push(format!(
                            "{} is not of types {}",
                            show(value),
                            quoted.join(", ")
                        ));
                    }
                }
            }
            "enum" => {
                if let Some(options) = arg.as_array() {
                    if !options.contains(value) {
                        errors.push(format!("{} is not one of {}", show(value), show(arg)));
                    }
                }
            }
            "const" if arg != value => errors.push(format!("{} was expected", show(arg))),
            "minimum" | "maximum" => {
                if let (Some(limit), Some(n)) = (arg.as_f64(), value.as_f64()) {
                    if keyword == "minimum" && n < limit {
                        errors.push(format!(
                            "{} is less than the minimum of {}",
                            show(value),
                            show(arg)
                        ));
                    }
                    if keyword == "maximum" && n > limit {
                        errors.push(format!(
                            "{} is greater than the maximum of {}",
                            show(value),
                            show(arg)
                        ));
                    }
                }
            }
            "required" => {
                if let (Some(names), Some(map)) = (arg.as_array(), value.as_object()) {
                    for name in names.iter().filter_map(Value::as_str) {
                        if !map.contains_key(name) {
                            errors.push(format!("\"{name}\" is a required property"));
                        }
                    }
                }
            }
            "properties" => {
                if let (Some(props), Some(map)) = (arg.as_object(), value.as_object()) {
                    for (name, sub) in props {
                        if let Some(v) = map.get(name) {
                            check(root, sub, v, depth + 1, errors);
                        }
                    }
                }
            }
            "additionalProperties" => {
                let Some(map) = value.as_object() else {
                    continue;
                };
                let declared = obj.get("properties").and_then(Value::as_object);
                let extra: Vec<&String> = map
                    .keys()
                    .filter(|k| declared.is_none_or(|d| !d.contains_key(*k)))
                    .collect();
                match arg {
                    Value::Bool(false) if !extra.is_empty() => {
                        let names: Vec<String> = extra.iter().map(|k| format!("'{k}'")).collect();
                        let verb = if names.len() == 1 { "was" } else { "were" };
                        errors.push(format!(
                            "Additional properties are not allowed ({} {verb} unexpected)",
                            names.join(", ")
                        ));
                    }
                    Value::Object(_) => {
                        for k in extra {
                            check(root, arg, &map[k], depth + 1, errors);
                        }
                    }
                    _ => {}
                }
            }
            "items" => {
                if let (Some(items), true) = (value.as_array(), arg.is_object() || arg.is_boolean())
                {
                    for item in items {
                        check(root, arg, item, depth + 1, errors);
                    }
                }
            }
            "allOf" => {
                for sub in arg.as_array().into_iter().flatten() {
                    check(root, sub, value, depth + 1, errors);
                }
            }
            "anyOf" => {
                if let Some(subs) = arg.as_array() {
                    if !subs.iter().any(|s| is_valid(root, s, value, depth + 1)) {
                        errors.push(format!(
                            "{} is not valid under any of the schemas listed in the 'anyOf' keyword",
                            show(value)
                        ));
                    }
                }
            }
            "oneOf" => {
                if let Some(subs) = arg.as_array() {
                    match subs.iter().filter(|s| is_valid(root, s, value, depth + 1)).count() {
                        1 => {}
                        0 => errors.push(format!(
                            "{} is not valid under any of the schemas listed in the 'oneOf' keyword",
                            show(value)
                        )),
                        _ => errors.push(format!(
                            "{} is valid under more than one of the schemas listed in the 'oneOf' keyword",
                            show(value)
                        )),
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn demo_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "max_items": {"type": "integer", "minimum": 1},
                "mode": {"type": "string", "enum": ["fast", "safe"]},
                "endpoint": {"type": "string"}
            },
            "required": ["max_items", "mode"],
            "additionalProperties": false
        })
    }

    #[test]
    fn accepts_valid_values() {
        assert!(validate(&demo_schema(), &json!({"max_items": 10, "mode": "safe"})).is_ok());
        assert!(validate(&json!({}), &json!(null)).is_ok());
        assert!(validate(&json!(true), &json!(1)).is_ok());
    }

    #[test]
    fn reports_like_the_engine() {
        // Same message as recorded from the real engine (c_configuration.jsonl).
        let errors =
            validate(&demo_schema(), &json!({"max_items": 0, "mode": "turbo"})).unwrap_err();
        assert_eq!(
            errors.join("; "),
            "0 is less than the minimum of 1; \"turbo\" is not one of [\"fast\",\"safe\"]"
        );
        let errors = validate(&demo_schema(), &json!({"mode": "fast", "x": 1})).unwrap_err();
        assert_eq!(
            errors,
            vec![
                "Additional properties are not allowed ('x' was unexpected)".to_string(),
                "\"max_items\" is a required property".to_string(),
            ]
        );
        let errors = validate(&demo_schema(), &json!(null)).unwrap_err();
        assert_eq!(errors, vec!["null is not of type \"object\"".to_string()]);
    }

    #[test]
    fn type_arrays_integers_refs() {
        let schema = json!({
            "definitions": {"Port": {"type": "integer"}},
            "type": "object",
            "properties": {
                "port": {"$ref": "#/definitions/Port"},
                "host": {"type": ["string", "null"]},
                "tags": {"type": "array", "items": {"type": "string"}}
            }
        });
        assert!(validate(&schema, &json!({"port": 80, "host": null, "tags": ["a"]})).is_ok());
        assert!(validate(&schema, &json!({"port": 80.0})).is_ok());
        assert_eq!(
            validate(&schema, &json!({"port": 1.5, "host": 3, "tags": [1]})).unwrap_err(),
            vec![
                "3 is not of types \"string\", \"null\"".to_string(),
                "1.5 is not of type \"integer\"".to_string(),
                "1 is not of type \"string\"".to_string(),
            ]
        );
    }

    #[test]
    fn ref_cycles_terminate() {
        let schema =
            json!({"definitions": {"A": {"$ref": "#/definitions/A"}}, "$ref": "#/definitions/A"});
        assert!(validate(&schema, &json!(1)).is_ok());
    }
}
