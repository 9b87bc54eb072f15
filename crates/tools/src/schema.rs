//! JSON schemas for tool arguments.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::Deserialize;
use serde_json::{Map, Value};
use tower_agent_core::ResponseFormat;

/// The arguments of a tool that takes none. Accepts `{}` (and empty text).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
pub struct NoArgs {}

/// The JSON Schema of `T` as tool parameters: subschemas inlined (no `$ref`), no `$schema` or
/// `title` keys, always an object schema — the shape every provider accepts.
///
/// Written for a model, not for rustdoc: descriptions (from doc comments) lose their link
/// markup (`` [`Item`] `` becomes `` `Item` ``, `[text](target)` becomes `text`), and the
/// `format` schemars gives Rust's number types (`uint`, `int32`, `double`, ...) is left out
/// (an unsigned type keeps its `"minimum": 0`).
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
    for_a_model(&mut value);
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

/// A [`ResponseFormat`] for answers of type `T`, named `name`: the JSON Schema of `T`, written
/// as [`parameters_schema`] writes it (an object schema, subschemas inlined); not strict. Read
/// the answer back with `serde_json::from_str::<T>(&res.message.text())`.
///
/// # Panics
///
/// When `T` is not described by an object, as [`parameters_schema`]: providers want an
/// object at the top of a response format too.
///
/// ```
/// use schemars::JsonSchema;
/// use tower_agent_core::ResponseFormat;
/// use tower_agent_tools::response_format;
///
/// /// A trip.
/// #[derive(JsonSchema)]
/// struct Trip {
///     city: String,
///     days: u8,
/// }
///
/// let ResponseFormat::JsonSchema { name, schema, strict, .. } = response_format::<Trip>("trip")
/// else { unreachable!() };
/// assert_eq!((name.as_str(), strict), ("trip", false));
/// assert_eq!(schema["required"], serde_json::json!(["city", "days"]));
/// ```
pub fn response_format<T: JsonSchema>(name: impl Into<String>) -> ResponseFormat {
    ResponseFormat::json_schema(name, parameters_schema::<T>())
}

/// The `format`s schemars gives Rust's number types: meaningless to a model, and refused by
/// some providers' schema checks.
const RUST_FORMATS: &[&str] = &[
    "int", "int8", "int16", "int32", "int64", "int128", "uint", "uint8", "uint16", "uint32",
    "uint64", "uint128", "float", "double",
];

/// Every description without rustdoc link markup, no Rust number format, all the way down.
fn for_a_model(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(text)) = map.get_mut("description") {
                *text = without_links(text);
            }
            if map
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|format| RUST_FORMATS.contains(&format))
            {
                map.remove("format");
            }
            map.values_mut().for_each(for_a_model);
        }
        Value::Array(items) => items.iter_mut().for_each(for_a_model),
        _ => {}
    }
}

/// `text` with rustdoc's link markup taken out: `` [`Item`] `` → `` `Item` ``,
/// `[text](target)` and `[text][target]` → `text`. Other brackets stay.
fn without_links(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find(']') else {
            out.push_str(&rest[open..]);
            return out;
        };
        let label = &after[..close];
        let tail = &after[close + 1..];
        // `[label](target)` or `[label][target]`: the label alone.
        let target = match tail.chars().next() {
            Some('(') => tail.find(')').map(|end| end + 1),
            Some('[') => tail.find(']').map(|end| end + 1),
            _ => None,
        };
        let is_code = label.len() > 1 && label.starts_with('`') && label.ends_with('`');
        match target {
            Some(end) => {
                out.push_str(label);
                rest = &tail[end..];
            }
            // An intra-doc link to an item: `[`Item`]`.
            None if is_code => {
                out.push_str(label);
                rest = tail;
            }
            // Brackets that are text: `[1, 200]`.
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
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

    /// The path ([`PATH`], see [the guide](crate::guide)).
    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Documented {
        /// Lines to show ([`LIMIT`][crate::LIMIT]), e.g. [1, 200], or [`usize::MAX`].
        limit: usize,
        /// A ratio.
        ratio: f64,
        /// When, [as text].
        #[schemars(extend("format" = "date-time"))]
        when: String,
    }

    #[test]
    fn a_schema_is_written_for_a_model() {
        let schema = parameters_schema::<Documented>();
        assert_eq!(schema["description"], "The path (`PATH`, see the guide).");
        let limit = &schema["properties"]["limit"];
        assert_eq!(
            limit["description"],
            "Lines to show (`LIMIT`), e.g. [1, 200], or `usize::MAX`."
        );
        assert_eq!(limit.get("format"), None, "{limit}");
        assert_eq!(limit["minimum"], 0);
        assert_eq!(schema["properties"]["ratio"].get("format"), None);
        // Formats that mean something to a model stay, and so do plain brackets.
        assert_eq!(schema["properties"]["when"]["format"], "date-time");
        assert_eq!(
            schema["properties"]["when"]["description"],
            "When, [as text]."
        );
        assert_eq!(without_links("a [b"), "a [b");
        assert_eq!(
            without_links("[`x`] and [y](z) and [w][v]"),
            "`x` and y and w"
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

#[cfg(test)]
mod order {
    use super::*;

    #[derive(serde::Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Refund {
        order_id: String,
        amount: u32,
        currency: String,
    }

    /// A small model follows a schema's keys in the order it reads them: they stay in
    /// declaration order, in the value and in the JSON sent.
    #[test]
    fn properties_keep_their_declaration_order() {
        let schema = parameters_schema::<Refund>();
        let keys: Vec<&str> = schema["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["order_id", "amount", "currency"]);
        let text = schema.to_string();
        let at = |key: &str| text.find(&format!("\"{key}\"")).expect("the key");
        assert!(
            at("order_id") < at("amount") && at("amount") < at("currency"),
            "{text}"
        );
    }
}
