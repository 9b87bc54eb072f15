//! The request: the body sent to the API, built from a `ModelRequest`.

use serde::Serialize;
use serde_json::Value;
use tower_agent_core::{
    ContentPart, Error, Message, ModelRequest, ResponseFormat, Role, ToolCall, ToolChoice,
};

use crate::wire::{self, Frame, text_of};

use super::{PROVIDER, REDACTED};

/// The wire form of one message, written to `out` (a message's bytes are cached per run);
/// the role it goes under, when the API groups messages by role.
pub(super) fn encode_message(
    message: &Message,
    out: &mut Vec<u8>,
) -> Result<Option<&'static str>, Error> {
    if message.role == Role::System {
        // In the system prompt (see `frame`).
        return Ok(None);
    }
    let (role, blocks) = blocks_of(message);
    let mut first = true;
    for block in &blocks {
        wire::item(out, &mut first, block, PROVIDER)?;
    }
    Ok(Some(role))
}

#[derive(Serialize)]
struct Head<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "String::is_empty")]
    system: String,
}

/// The fields after the messages.
#[derive(Serialize)]
struct Rest<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    /// Structured output: `{"format": {"type": "json_schema", "schema": ..}}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    output_config: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f32>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

pub(super) fn frame(
    model: &str,
    max_tokens: u32,
    req: &ModelRequest,
    stream: bool,
) -> Result<Frame, Error> {
    // System messages of the history join the system prompt.
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
    let head = Head {
        model,
        max_tokens: req.options.max_tokens.unwrap_or(max_tokens),
        system,
    };
    Frame::around(&head, "messages", &rest(req, stream), PROVIDER)
}

fn rest(req: &ModelRequest, stream: bool) -> Rest<'_> {
    let options = &req.options;
    Rest {
        tools: req
            .tools
            .iter()
            .map(|spec| WireTool {
                name: &spec.name,
                description: &spec.description,
                input_schema: &spec.parameters,
            })
            .collect(),
        tool_choice: options.tool_choice.as_ref().map(|choice| match choice {
            ToolChoice::Auto => serde_json::json!({ "type": "auto" }),
            ToolChoice::None => serde_json::json!({ "type": "none" }),
            ToolChoice::Required => serde_json::json!({ "type": "any" }),
            ToolChoice::Tool(name) => serde_json::json!({ "type": "tool", "name": name }),
        }),
        output_config: options
            .response_format
            .as_ref()
            .and_then(|format| match format {
                ResponseFormat::JsonSchema { schema, .. } => Some(serde_json::json!({
                    "format": { "type": "json_schema", "schema": schema }
                })),
                _ => None,
            }),
        temperature: options.temperature,
        top_p: options.top_p,
        stop_sequences: &options.stop,
        stream,
    }
}

/// The role and the blocks of one message.
fn blocks_of(message: &Message) -> (&'static str, Vec<Block<'_>>) {
    let role = if message.role == Role::Assistant {
        "assistant"
    } else {
        "user"
    };
    let mut blocks = Vec::with_capacity(message.content.len());
    // Results open a user turn: the API wants them before any text of the turn.
    for result in message.tool_results() {
        blocks.push(Block::ToolResult {
            tool_use_id: &result.call_id,
            content: &result.content,
            is_error: result.is_error,
        });
    }
    for part in &message.content {
        match part {
            ContentPart::Text { text } if !text.is_empty() => blocks.push(Block::Text { text }),
            ContentPart::Reasoning {
                text,
                signature: Some(signature),
            } if role == "assistant" => match signature.strip_prefix(REDACTED) {
                Some(data) => blocks.push(Block::RedactedThinking { data }),
                None => blocks.push(Block::Thinking {
                    thinking: text,
                    signature,
                }),
            },
            ContentPart::ToolCall(call) if role == "assistant" => blocks.push(Block::ToolUse {
                id: &call.id,
                name: &call.name,
                input: input_of(call),
            }),
            _ => {}
        }
    }
    (role, blocks)
}

/// A call's arguments as the JSON object the API requires.
fn input_of(call: &ToolCall) -> Value {
    match call.parse_arguments::<Value>() {
        Ok(value @ Value::Object(_)) => value,
        _ => serde_json::json!({ "_arguments": call.arguments }),
    }
}
