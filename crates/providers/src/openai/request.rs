//! The request: the body sent to the API, built from a `ModelRequest`.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::Value;
use tower_agent_core::{Error, Message, ModelRequest, ResponseFormat, Role, ToolChoice};

use crate::wire::{self, Frame, Items, arguments_text, text_of};

use super::PROVIDER;

#[derive(Serialize)]
struct Head<'a> {
    model: &'a str,
}

/// The fields after the messages.
#[derive(Serialize)]
struct Rest<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    /// OpenAI's own name for it, which its reasoning models require.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<&'a str>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum WireMessage<'a> {
    System {
        content: Cow<'a, str>,
    },
    User {
        content: Cow<'a, str>,
    },
    Assistant {
        content: Option<Cow<'a, str>>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

#[derive(Serialize)]
struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: Cow<'a, str>,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireToolSpec<'a>,
}

#[derive(Serialize)]
struct WireToolSpec<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// The body around the messages; `completion_tokens`: the length limit goes as
/// `max_completion_tokens` (OpenAI's own API) rather than `max_tokens` (every other server).
pub(super) fn frame(
    model: &str,
    max_tokens: u32,
    req: &ModelRequest,
    stream: bool,
    completion_tokens: bool,
    cache_key: bool,
) -> Result<Frame, Error> {
    let mut rest = rest(req, max_tokens, stream, completion_tokens);
    // A context with no session has no key worth sharing.
    if cache_key && !req.ctx.session_id().is_empty() {
        rest.prompt_cache_key = Some(req.ctx.session_id());
    }
    let mut frame = Frame::around(&Head { model }, "messages", &rest, PROVIDER)?;
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        let system = WireMessage::System {
            content: Cow::Borrowed(system),
        };
        wire::item(&mut frame.head, &mut true, &system, PROVIDER)?;
        frame.head_has_items = true;
    }
    Ok(frame)
}

fn rest(req: &ModelRequest, max_tokens: u32, stream: bool, completion_tokens: bool) -> Rest<'_> {
    let options = &req.options;
    Rest {
        tools: req
            .tools
            .iter()
            .map(|spec| WireTool {
                kind: "function",
                function: WireToolSpec {
                    name: &spec.name,
                    description: &spec.description,
                    parameters: &spec.parameters,
                },
            })
            .collect(),
        tool_choice: options.tool_choice.as_ref().map(|choice| match choice {
            ToolChoice::Auto => Value::from("auto"),
            ToolChoice::None => Value::from("none"),
            ToolChoice::Required => Value::from("required"),
            ToolChoice::Tool(name) => {
                serde_json::json!({ "type": "function", "function": { "name": name } })
            }
        }),
        response_format: options
            .response_format
            .as_ref()
            .and_then(|format| match format {
                ResponseFormat::JsonSchema {
                    name,
                    schema,
                    strict,
                } => Some(serde_json::json!({
                    "type": "json_schema",
                    "json_schema": { "name": name, "schema": schema, "strict": strict }
                })),
                _ => None,
            }),
        temperature: options.temperature,
        top_p: options.top_p,
        max_tokens: (!completion_tokens).then_some(max_tokens),
        max_completion_tokens: completion_tokens.then_some(max_tokens),
        stop: &options.stop,
        stream,
        stream_options: stream.then_some(StreamOptions {
            include_usage: true,
        }),
        prompt_cache_key: None,
    }
}

/// The wire messages of one message, written to `out` (a message's bytes are cached per run).
pub(super) fn encode_message(message: &Message, out: &mut Vec<u8>) -> Result<Items, Error> {
    let mut items = Vec::with_capacity(2);
    wire_messages(message, &mut items);
    let mut first = true;
    for item in &items {
        wire::item(out, &mut first, item, PROVIDER)?;
    }
    Ok(Items::ALONE)
}

fn wire_messages<'a>(message: &'a Message, out: &mut Vec<WireMessage<'a>>) {
    // Results first: a result in a user message (a stored Anthropic-style turn) answers the
    // calls before it.
    for result in message.tool_results() {
        out.push(WireMessage::Tool {
            tool_call_id: &result.call_id,
            content: &result.content,
        });
    }
    let text = text_of(message);
    match message.role {
        Role::System if !text.is_empty() => out.push(WireMessage::System { content: text }),
        Role::User if !text.is_empty() => out.push(WireMessage::User { content: text }),
        Role::Assistant => {
            let tool_calls: Vec<WireCall<'a>> = message
                .tool_calls()
                .map(|call| WireCall {
                    id: &call.id,
                    kind: "function",
                    function: WireFunction {
                        name: &call.name,
                        arguments: arguments_text(call),
                    },
                })
                .collect();
            if tool_calls.is_empty() && text.is_empty() {
                return;
            }
            out.push(WireMessage::Assistant {
                content: (!text.is_empty()).then_some(text),
                tool_calls,
            });
        }
        _ => {}
    }
}
