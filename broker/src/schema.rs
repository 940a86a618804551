//! JSON Schemas (draft-07, with `definitions`) generated from the handlers' own types.

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::Value;

/// The draft-07 schema of `T`.
pub fn schema_for<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft07().into_generator();
    let schema = generator.into_root_schema_for::<T>();
    schema.to_value()
}
