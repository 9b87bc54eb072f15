//! The request: the body sent to the API, built from a `ModelRequest`.

use serde::Serialize;
use serde_json::{Map, Value, json};
use tower_agent_core::{
    ContentPart, Error, Message, ModelRequest, ResponseFormat, Role, ToolChoice,
};

use crate::wire::{self, Frame, Items, text_of};

use super::PROVIDER;

/// The wire form of one message, written to `out` (a message's bytes are cached per run);
/// the role it goes under, when the API groups messages by role.
pub(super) fn encode_message(message: &Message, out: &mut Vec<u8>) -> Result<Items, Error> {
    if message.role == Role::System {
        // In the system instruction (see `frame`).
        return Ok(Items::ALONE);
    }
    let model = message.role == Role::Assistant;
    let mut first = true;
    for part in parts_of(message, model) {
        wire::item(out, &mut first, &part, PROVIDER)?;
    }
    Ok(Items::of(if model { "model" } else { "user" }))
}

/// The body around the contents. A request that names a context cache
/// ([`PromptCache::stored`](tower_agent_core::PromptCache::stored)) sends its name instead of
/// the prefix (system instruction, tools, tool config): the API refuses both at once.
pub(super) fn frame(req: &ModelRequest, max_tokens: u32) -> Result<Frame, Error> {
    let mut body = match &req.cache.stored {
        Some(name) => Map::from_iter([("cachedContent".to_owned(), Value::from(&**name))]),
        None => prefix(req),
    };
    body.extend(options(req, max_tokens));
    Frame::around(&Map::new(), "contents", &Value::Object(body), PROVIDER)
}

/// The system instruction, the tools and the tool config: what a context cache holds.
pub(super) fn prefix(req: &ModelRequest) -> Map<String, Value> {
    // System messages of the history join the system instruction.
    let mut system = req.system.as_deref().unwrap_or_default().to_owned();
    for message in req.messages.iter().filter(|m| m.role == Role::System) {
        let text = text_of(message);
        if !text.is_empty() {
            if !system.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(&text);
        }
    }
    let mut body = Map::new();
    if !system.is_empty() {
        body.insert(
            "systemInstruction".into(),
            json!({ "parts": [{ "text": system }] }),
        );
    }
    if !req.tools.is_empty() {
        let declarations: Vec<Value> = req
            .tools
            .iter()
            .map(|spec| {
                json!({
                    "name": spec.name,
                    "description": spec.description,
                    "parametersJsonSchema": spec.parameters,
                })
            })
            .collect();
        body.insert(
            "tools".into(),
            json!([{ "functionDeclarations": declarations }]),
        );
    }
    let options = &req.options;
    if let Some(choice) = &options.tool_choice {
        let config = match choice {
            ToolChoice::Auto => json!({ "mode": "AUTO" }),
            ToolChoice::None => json!({ "mode": "NONE" }),
            ToolChoice::Required => json!({ "mode": "ANY" }),
            ToolChoice::Tool(name) => json!({ "mode": "ANY", "allowedFunctionNames": [name] }),
        };
        body.insert(
            "toolConfig".into(),
            json!({ "functionCallingConfig": config }),
        );
    }
    body
}

/// The generation options.
fn options(req: &ModelRequest, max_tokens: u32) -> Map<String, Value> {
    let options = &req.options;
    let mut body = Map::new();
    let mut generation = Map::new();
    if let Some(t) = options.temperature {
        generation.insert("temperature".into(), json!(t));
    }
    if let Some(p) = options.top_p {
        generation.insert("topP".into(), json!(p));
    }
    generation.insert("maxOutputTokens".into(), json!(max_tokens));
    if !options.stop.is_empty() {
        generation.insert("stopSequences".into(), json!(options.stop));
    }
    if let Some(ResponseFormat::JsonSchema { schema, .. }) = &options.response_format {
        generation.insert("responseMimeType".into(), json!("application/json"));
        generation.insert("responseJsonSchema".into(), schema.clone());
    }
    if !generation.is_empty() {
        body.insert("generationConfig".into(), Value::Object(generation));
    }
    body
}

/// One part of a content, as the API reads it.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct Part<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    thought: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    thought_signature: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    function_call: Option<FunctionCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    function_response: Option<FunctionResponse<'a>>,
}

#[derive(Serialize)]
struct FunctionCall<'a> {
    name: &'a str,
    args: Value,
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
}

#[derive(Serialize)]
struct FunctionResponse<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
    response: Outcome<'a>,
}

/// `{"result": ..}` or, for a failed call, `{"error": ..}`.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum Outcome<'a> {
    Result(&'a str),
    Error(&'a str),
}

fn parts_of(message: &Message, model: bool) -> Vec<Part<'_>> {
    let mut parts = Vec::with_capacity(message.content.len());
    for result in message.tool_results() {
        parts.push(Part {
            function_response: Some(FunctionResponse {
                name: &result.name,
                id: &result.call_id,
                response: if result.is_error {
                    Outcome::Error(&result.content)
                } else {
                    Outcome::Result(&result.content)
                },
            }),
            ..Part::default()
        });
    }
    // A signature waiting for the part it belongs to.
    let mut signature: Option<&str> = None;
    for part in &message.content {
        let mut wire = match part {
            ContentPart::Reasoning {
                text,
                signature: sig,
            } if model => {
                if text.is_empty() {
                    signature = sig.as_deref();
                    continue;
                }
                let Some(sig) = sig else { continue };
                Part {
                    text: Some(text),
                    thought: true,
                    thought_signature: Some(sig),
                    ..Part::default()
                }
            }
            ContentPart::Text { text } if !text.is_empty() => Part {
                text: Some(text),
                ..Part::default()
            },
            ContentPart::ToolCall(call) if model => {
                let args = crate::wire::arguments_object(call);
                Part {
                    function_call: Some(FunctionCall {
                        name: &call.name,
                        args,
                        id: &call.id,
                    }),
                    ..Part::default()
                }
            }
            _ => continue,
        };
        if let Some(sig) = signature.take() {
            wire.thought_signature = Some(sig);
        }
        parts.push(wire);
    }
    parts
}
