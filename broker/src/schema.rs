//! JSON Schemas (draft-07, with `definitions`) generated from the handlers' own types.

use schemars::generate::SchemaSettings;
use schemars::transform::ReplaceConstValue;
use schemars::JsonSchema;
use serde_json::Value;

/// The draft-07 schema of `T`.
///
/// schemars' draft-07 settings already use `definitions` and wrap a `$ref` that has sibling
/// keywords (description, default) in `allOf`. On top of them, `const: x` is written as
/// `enum: [x]` (unit enum variants, internally tagged `kind`), as the published ide 0.12.9
/// schemas do.
pub fn schema_for<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft07()
        .with_transform(ReplaceConstValue::default())
        .into_generator();
    let schema = generator.into_root_schema_for::<T>();
    schema.to_value()
}
