//! MCP's types to tower-agent's and back.

use std::collections::HashMap;
use std::fmt::Write as _;

use rmcp::model::{
    CallToolResult, ContentBlock, JsonObject, ResourceContents, Tool, ToolAnnotations,
};
use serde_json::Value;
use tower_agent_core::ToolSpec;

use crate::{Route, Routes};

/// The routes to every server's tools: `(server index, server name, its tools)`. A name two
/// servers share becomes `{server}_{tool}` for each of them.
/// The routes of the tools each server lists: `(index, name, whether its hints are trusted,
/// tools)`.
pub(crate) fn routes<'a>(
    servers: impl Iterator<Item = (usize, &'a str, bool, &'a [Tool])>,
) -> Routes {
    let servers: Vec<_> = servers.collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for (_, _, _, tools) in &servers {
        for tool in *tools {
            *count.entry(tool.name.as_ref()).or_default() += 1;
        }
    }
    let mut specs = Vec::new();
    let mut by_name = HashMap::new();
    for (index, server, trusted, tools) in servers {
        for tool in tools {
            let name = if count[tool.name.as_ref()] > 1 {
                format!("{server}_{}", tool.name)
            } else {
                tool.name.to_string()
            };
            if by_name.contains_key(&name) {
                tracing::warn!(tool = %name, server, "MCP tool name taken by another tool: not offered");
                continue;
            }
            let spec = spec(&name, tool, trusted);
            let may_repeat = spec.may_repeat();
            specs.push(spec);
            by_name.insert(
                name,
                Route {
                    server: index,
                    remote: tool.name.to_string(),
                    annotations: tool.annotations.clone(),
                    may_repeat,
                },
            );
        }
    }
    Routes {
        specs: specs.into(),
        by_name,
    }
}

/// The spec the model is offered: the input schema as the server gave it; the hints only
/// when the server is `trusted`.
fn spec(name: &str, tool: &Tool, trusted: bool) -> ToolSpec {
    let description = match (&tool.description, &tool.title) {
        (Some(description), _) => description.to_string(),
        (None, Some(title)) => title.clone(),
        (None, None) => String::new(),
    };
    let mut spec = ToolSpec::new(
        name,
        description,
        Value::Object(tool.input_schema.as_ref().clone()),
    );
    let hint = |hint: fn(&ToolAnnotations) -> Option<bool>| {
        trusted && tool.annotations.as_ref().and_then(hint).unwrap_or(false)
    };
    spec.read_only = hint(|a| a.read_only_hint);
    spec.idempotent = hint(|a| a.idempotent_hint);
    spec
}

/// The call's arguments as MCP wants them: a JSON object (empty text is no arguments).
pub(crate) fn arguments(text: &str) -> Result<Option<JsonObject>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(object)) => Ok(Some(object)),
        Ok(Value::Null) => Ok(None),
        Ok(other) => Err(format!(
            "the arguments must be a JSON object, not {}",
            kind(&other)
        )),
        Err(error) => Err(format!("the arguments are not valid JSON: {error}")),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What the model reads of a result: its text blocks, one per line; other blocks named;
/// the structured content as JSON when no block has text.
pub(crate) fn content(result: &CallToolResult) -> String {
    let mut out = String::new();
    let mut texts = 0;
    for block in &result.content {
        if !out.is_empty() {
            out.push('\n');
        }
        match block {
            ContentBlock::Text(text) => {
                texts += 1;
                out.push_str(&text.text);
            }
            ContentBlock::Image(image) => {
                let _ = write!(
                    out,
                    "[image: {}, {} bytes base64]",
                    image.mime_type,
                    image.data.len()
                );
            }
            ContentBlock::Audio(audio) => {
                let _ = write!(
                    out,
                    "[audio: {}, {} bytes base64]",
                    audio.mime_type,
                    audio.data.len()
                );
            }
            ContentBlock::Resource(embedded) => match &embedded.resource {
                ResourceContents::TextResourceContents { uri, text, .. } => {
                    texts += 1;
                    let _ = write!(out, "[resource {uri}]\n{text}");
                }
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => {
                    let _ = write!(
                        out,
                        "[resource {uri}: {}, {} bytes base64]",
                        mime_type.as_deref().unwrap_or("binary"),
                        blob.len()
                    );
                }
                other => {
                    let _ = write!(
                        out,
                        "[resource: {}]",
                        serde_json::to_string(other).unwrap_or_default()
                    );
                }
            },
            ContentBlock::ResourceLink(link) => {
                let _ = write!(out, "[resource link {}: {}]", link.uri, link.name);
            }
            other => {
                let _ = write!(
                    out,
                    "[{}]",
                    serde_json::to_string(other).unwrap_or_default()
                );
            }
        }
    }
    if texts == 0 {
        if let Some(structured) = &result.structured_content {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&structured.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ToolAnnotations;
    use serde_json::json;
    use std::sync::Arc;

    fn tool(name: &'static str, read_only: Option<bool>) -> Tool {
        let schema = json!({"type": "object", "properties": {"q": {"type": "string"}}});
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        let mut tool = Tool::new(name, "does things", Arc::new(schema));
        if let Some(read_only) = read_only {
            let mut annotations = ToolAnnotations::new();
            annotations.read_only_hint = Some(read_only);
            tool.annotations = Some(annotations);
        }
        tool
    }

    #[test]
    fn a_shared_name_is_prefixed_with_each_server() {
        let a = [tool("search", Some(true)), tool("echo", None)];
        let b = [tool("search", None)];
        let routes = routes([(0, "web", true, &a[..]), (1, "docs", true, &b[..])].into_iter());
        let names: Vec<_> = routes.specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["web_search", "echo", "docs_search"]);
        assert_eq!(routes.by_name["docs_search"].server, 1);
        assert_eq!(routes.by_name["docs_search"].remote, "search");
        assert!(routes.specs[0].read_only, "readOnlyHint becomes read_only");
        assert!(routes.by_name["web_search"].may_repeat);
        assert!(!routes.specs[2].read_only);
        assert!(!routes.by_name["docs_search"].may_repeat);
        assert_eq!(
            routes.specs[0].parameters["properties"]["q"]["type"],
            "string"
        );
    }

    #[test]
    fn the_hints_of_a_server_not_trusted_decide_nothing() {
        let a = [tool("search", Some(true))];
        let routes = routes([(0, "web", false, &a[..])].into_iter());
        assert!(!routes.specs[0].read_only);
        assert!(!routes.by_name["search"].may_repeat);
        let kept = routes.by_name["search"].annotations.as_ref();
        assert_eq!(
            kept.and_then(|a| a.read_only_hint),
            Some(true),
            "still readable"
        );
    }

    #[test]
    fn arguments_must_be_an_object() {
        assert_eq!(arguments("").unwrap(), None);
        assert_eq!(arguments("{\"a\": 1}").unwrap().unwrap()["a"], 1);
        let error = arguments("[1]").unwrap_err();
        assert!(error.contains("an array"), "{error}");
        let error = arguments("{\"a\": ").unwrap_err();
        assert!(error.contains("not valid JSON"), "{error}");
    }

    #[test]
    fn structured_content_is_read_when_there_is_no_text() {
        // A server that writes the JSON as a text block too: the model reads it once.
        let mut result = CallToolResult::success(vec![ContentBlock::text("{\"temperature\":21}")]);
        result.structured_content = Some(json!({"temperature": 21}));
        assert_eq!(content(&result).matches("temperature").count(), 1);
        let mut only = CallToolResult::success(vec![]);
        only.structured_content = Some(json!({"a": 1}));
        assert_eq!(content(&only), "{\"a\":1}");
        let image = CallToolResult::success(vec![
            ContentBlock::text("before"),
            ContentBlock::image("aGVsbG8=", "image/png"),
        ]);
        assert_eq!(
            content(&image),
            "before\n[image: image/png, 8 bytes base64]"
        );
    }
}
