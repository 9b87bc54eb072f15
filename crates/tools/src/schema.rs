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
/// A struct gives an object schema. An enum whose variants are all objects (internally or
/// adjacently tagged) gets `"type": "object"` added. The unit type `()` gives an empty object
/// (prefer [`NoArgs`]).
///
/// # Panics
///
/// When `T` is not described by an object (a string, a number, a list, an untagged enum of
/// those): providers require an object, so wrap the value in a struct. This is a programming
/// error, found when the tool is built.
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
    match map.get("type").and_then(Value::as_str) {
        Some("object") => {
            map.entry("properties")
                .or_insert_with(|| Value::Object(Map::new()));
        }
        Some("null") => return empty_object(),
        None if variants_are_objects(map) => {
            map.insert("type".into(), "object".into());
        }
        _ => panic!(
            "tool arguments must be a JSON object, but `{}` is not; wrap it in a struct",
            std::any::type_name::<T>()
        ),
    }
    value
}

/// Whether the schema is a `oneOf`/`anyOf` whose branches all describe objects.
fn variants_are_objects(map: &Map<String, Value>) -> bool {
    ["oneOf", "anyOf"].iter().any(|key| {
        map.get(*key)
            .and_then(Value::as_array)
            .is_some_and(|branches| {
                !branches.is_empty()
                    && branches
                        .iter()
                        .all(|b| b.get("type").and_then(Value::as_str) == Some("object"))
            })
    })
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

    #[derive(JsonSchema)]
    #[serde(tag = "op", rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Edit {
        Insert { text: String },
        Delete { count: u32 },
    }

    #[test]
    fn tagged_enums_are_objects() {
        let schema = parameters_schema::<Edit>();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["oneOf"].as_array().unwrap().len(), 2);
    }

    #[test]
    #[should_panic(
        expected = "tool arguments must be a JSON object, but `alloc::string::String` is not"
    )]
    fn scalars_are_refused_when_the_tool_is_built() {
        let _ = parameters_schema::<String>();
    }

    #[test]
    fn no_args_is_an_empty_object() {
        let schema = parameters_schema::<NoArgs>();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["properties"], json!({}));
        assert_eq!(parameters_schema::<()>()["type"], "object");
    }
}
