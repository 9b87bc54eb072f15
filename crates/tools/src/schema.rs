//! JSON schemas for tool arguments.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The arguments of a tool that takes none. Accepts `{}` (and empty text).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
pub struct NoArgs {}

/// The JSON Schema of `T` as tool parameters: subschemas inlined (no `$ref`), no `$schema` or
/// `title` keys, always an object schema — the shape every provider accepts.
///
/// ```
/// use schemars::JsonSchema;
/// use tower_agent_tools::parameters_schema;
///
/// /// Where to look.
/// #[derive(JsonSchema)]
/// struct Args {
///     /// A city.
///     city: String,
///     days: Option<u8>,
/// }
///
/// let schema = parameters_schema::<Args>();
/// assert_eq!(schema["type"], "object");
/// assert_eq!(schema["properties"]["city"]["description"], "A city.");
/// assert_eq!(schema["required"], serde_json::json!(["city"]));
/// assert!(schema.get("$schema").is_none());
/// ```
pub fn parameters_schema<T: JsonSchema>() -> Value {
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.inline_subschemas = true;
        s.meta_schema = None;
    });
    let mut value = settings
        .for_deserialize()
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value();
    let Value::Object(map) = &mut value else {
        return empty_object();
    };
    map.remove("title");
    if map.get("type").and_then(Value::as_str) != Some("object") {
        // Not an object (e.g. `()`): providers need an object schema.
        return empty_object();
    }
    map.entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    value
}

fn empty_object() -> Value {
    let mut object = Map::new();
    object.insert("type".into(), "object".into());
    object.insert("properties".into(), Value::Object(Map::new()));
    Value::Object(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Inner {
        x: i32,
    }

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Outer {
        inner: Inner,
        tags: Vec<String>,
    }

    #[test]
    fn nested_types_are_inlined() {
        let schema = parameters_schema::<Outer>();
        assert!(!schema.to_string().contains("$ref"), "{schema}");
        assert_eq!(
            schema["properties"]["inner"]["properties"]["x"]["type"],
            "integer"
        );
    }

    #[test]
    fn no_args_is_an_empty_object() {
        let schema = parameters_schema::<NoArgs>();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["properties"], json!({}));
        assert_eq!(parameters_schema::<()>()["type"], "object");
    }
}
