//! The request: the body sent to the API, built from a `ModelRequest`.

use serde::Serialize;
use serde_json::Value;
use tower_agent_core::{
    ContentPart, Error, Message, ModelRequest, PromptCache, ResponseFormat, Role, ToolCall,
    ToolChoice,
};

use crate::wire::{self, Frame, Items, text_of};

use super::{CacheTtl, PROVIDER, REDACTED};

/// The wire form of one message, written to `out` (a message's bytes are cached per run);
/// the role it goes under, when the API groups messages by role.
pub(super) fn encode_message(message: &Message, out: &mut Vec<u8>) -> Result<Items, Error> {
    if message.role == Role::System {
        // In the system prompt (see `frame`).
        return Ok(Items::ALONE);
    }
    let (role, blocks) = blocks_of(message);
    let mut first = true;
    for block in &blocks {
        wire::item(out, &mut first, block, PROVIDER)?;
    }
    Ok(Items {
        turn: Some(role),
        last_takes_fields: takes_marker(&blocks),
    })
}

#[derive(Serialize)]
struct Head<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "System::is_empty")]
    system: System,
}

/// The system prompt: text, or text blocks with cache markers.
#[derive(Serialize)]
#[serde(untagged)]
enum System {
    Text(String),
    Blocks(Vec<SystemBlock>),
}

impl System {
    fn is_empty(&self) -> bool {
        match self {
            System::Text(text) => text.is_empty(),
            System::Blocks(blocks) => blocks.is_empty(),
        }
    }
}

#[derive(Serialize)]
struct SystemBlock {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

/// A cache breakpoint: the prompt up to and including the block it is on is cached.
#[derive(Serialize, Clone, Copy)]
pub(super) struct CacheControl {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl: Option<&'static str>,
}

impl CacheControl {
    pub(super) fn new(ttl: CacheTtl) -> Self {
        Self {
            kind: "ephemeral",
            ttl: match ttl {
                CacheTtl::FiveMinutes => None,
                CacheTtl::OneHour => Some("1h"),
            },
        }
    }
}

/// The most cache breakpoints a request may carry.
const BREAKPOINTS: usize = 4;

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
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

/// The body around the messages. With a cache TTL, the cache markers are planned here, once
/// every layer has shaped the request: at the ends of the system prompt's last stable blocks
/// (those [`PromptCache`](tower_agent_core::PromptCache) names; the last tool's when there is
/// no system prompt) and on the last block of the history, unless a volatile block in the
/// system prompt makes every history after it new. Four at most, the latest kept.
pub(super) fn frame(
    model: &str,
    max_tokens: u32,
    cache: Option<CacheTtl>,
    req: &ModelRequest,
    stream: bool,
) -> Result<Frame, Error> {
    let own = req.system.as_deref().unwrap_or_default();
    // System messages of the history join the system prompt, after its own blocks.
    let mut joined = String::new();
    for message in req.messages.iter().filter(|m| m.role == Role::System) {
        let text = text_of(message);
        if !text.is_empty() {
            if !joined.is_empty() || !own.is_empty() {
                joined.push_str("\n\n");
            }
            joined.push_str(&text);
        }
    }
    let Some(ttl) = cache else {
        let head = Head {
            model,
            max_tokens: req.options.max_tokens.unwrap_or(max_tokens),
            system: System::Text(format!("{own}{joined}")),
        };
        return Frame::around(&head, "messages", &rest(req, stream, None), PROVIDER);
    };
    let control = CacheControl::new(ttl);
    let history = !req.cache.volatile && last_block_takes_marker(req);
    // Two for the history: its end, and where the run's previous request ended (a round that
    // adds more than the API's 20-block lookback would miss it otherwise).
    let budget = BREAKPOINTS - 2 * usize::from(history);
    let marks = marks(&req.cache, own);
    let marked = &marks[marks.len().saturating_sub(budget)..];
    // Each block keeps the blank line after it: the blocks join to the prompt as it was.
    let mut blocks = Vec::with_capacity(marks.len() + 1);
    let mut start = 0;
    for &end in &marks {
        let end_with_gap = if own[end..].starts_with("\n\n") {
            end + 2
        } else {
            end
        };
        let text = &own[start..end_with_gap];
        // The API refuses a block with no text but whitespace.
        if !text.trim().is_empty() {
            blocks.push(SystemBlock {
                kind: "text",
                text: text.to_owned(),
                cache_control: marked.contains(&end).then_some(control),
            });
        }
        start = end_with_gap;
    }
    let rest_of_system = format!("{}{joined}", &own[start..]);
    if !rest_of_system.trim().is_empty() {
        blocks.push(SystemBlock {
            kind: "text",
            text: rest_of_system,
            cache_control: None,
        });
    }
    // No stable system block: the tools are the prefix to keep.
    let tools = blocks
        .iter()
        .all(|b| b.cache_control.is_none())
        .then_some(control);
    let head = Head {
        model,
        max_tokens: req.options.max_tokens.unwrap_or(max_tokens),
        system: System::Blocks(blocks),
    };
    let mut frame = Frame::around(&head, "messages", &rest(req, stream, tools), PROVIDER)?;
    if history {
        let mut suffix = b",\"cache_control\":".to_vec();
        serde_json::to_writer(&mut suffix, &control)
            .map_err(|e| crate::wire::invalid(PROVIDER, "a cache marker", e))?;
        frame.last_item = Some(suffix);
        frame.previous_item = true;
    }
    Ok(frame)
}

/// Whether the last block the history sends can carry a cache marker.
fn last_block_takes_marker(req: &ModelRequest) -> bool {
    req.messages
        .iter()
        .rev()
        .filter(|m| m.role != Role::System)
        .map(|m| blocks_of(m).1)
        .find(|blocks| !blocks.is_empty())
        .is_some_and(|blocks| takes_marker(&blocks))
}

/// Whether the last block of `message` can carry a cache marker: text, a tool call or a
/// result can; a thinking block cannot.
fn takes_marker(blocks: &[Block<'_>]) -> bool {
    matches!(
        blocks.last(),
        Some(Block::Text { .. } | Block::ToolUse { .. } | Block::ToolResult { .. })
    )
}

fn rest(req: &ModelRequest, stream: bool, cache: Option<CacheControl>) -> Rest<'_> {
    let options = &req.options;
    let last = req.tools.len().saturating_sub(1);
    Rest {
        tools: req
            .tools
            .iter()
            .enumerate()
            .map(|(index, spec)| WireTool {
                name: &spec.name,
                description: &spec.description,
                input_schema: &spec.parameters,
                cache_control: cache.filter(|_| index == last),
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
    crate::wire::arguments_object(call)
}

/// The ends of the stable blocks of `system` to mark: the marks that fall on character
/// boundaries inside it, each after the one before (a layer that rewrote the prompt may have
/// left others), or the whole prompt when no layer said anything.
pub(super) fn marks(cache: &PromptCache, system: &str) -> Vec<usize> {
    if cache.stable.is_empty() && !cache.volatile {
        return if system.is_empty() {
            Vec::new()
        } else {
            vec![system.len()]
        };
    }
    let mut marks: Vec<usize> = Vec::with_capacity(cache.stable.len());
    for &end in &cache.stable {
        let after = marks.last().is_none_or(|&last| end > last);
        if after && end > 0 && end <= system.len() && system.is_char_boundary(end) {
            marks.push(end);
        }
    }
    marks
}
