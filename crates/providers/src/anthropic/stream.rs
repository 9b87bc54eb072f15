//! The stream: server-sent events decoded into deltas and a final `ModelResponse`.

use serde::Deserialize;
use serde_json::Value;
use tower_agent_core::{ContentPart, Error, ModelResponse, ToolCall};

use crate::classify::stream_error;
use crate::wire::{Delta, StreamDecoder, invalid, truncated};

use super::PROVIDER;
use super::response::{WireBlock, WireUsage, block_part, finish_reason};

/// A block being streamed.
enum Open {
    Text(String),
    Thinking(String, String),
    Redacted(String),
    ToolUse {
        id: String,
        name: String,
        json: String,
        start: Value,
    },
    /// A `tool_use` block that stopped: its call, as sent up.
    Call(ToolCall),
    Other,
}

#[derive(Default)]
pub(super) struct Decoder {
    blocks: Vec<(usize, Open)>,
    usage: WireUsage,
    stop_reason: Option<String>,
    done: bool,
    /// The message's id and model (`message_start`).
    id: Option<String>,
    model: Option<String>,
}

impl Decoder {
    fn block(&mut self, index: usize) -> Option<&mut Open> {
        self.blocks
            .iter_mut()
            .find(|(i, _)| *i == index)
            .map(|(_, block)| block)
    }
}

fn index_of(value: &Value) -> usize {
    value
        .get("index")
        .and_then(Value::as_u64)
        .and_then(|i| usize::try_from(i).ok())
        .unwrap_or(0)
}

fn str_of<'v>(value: &'v Value, key: &str) -> &'v str {
    value.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// A streamed `tool_use` block as a call: the arguments as the model wrote them, valid JSON or
/// not (the tool service reports malformed arguments to the model), else the block's input.
fn tool_call(id: String, name: String, json: String, start: Value) -> Option<ToolCall> {
    if !json.trim().is_empty() {
        return Some(ToolCall::raw(id, name, json));
    }
    let block = WireBlock::ToolUse {
        id,
        name,
        input: start,
    };
    match block_part(block) {
        Some(ContentPart::ToolCall(call)) => Some(call),
        _ => None,
    }
}

impl StreamDecoder for Decoder {
    fn feed(&mut self, event: &str, data: &str, deltas: &mut Vec<Delta>) -> Result<(), Error> {
        if data.trim().is_empty() {
            return Ok(());
        }
        let value: Value =
            serde_json::from_str(data).map_err(|e| invalid(PROVIDER, "a stream event", e))?;
        let kind = value.get("type").and_then(Value::as_str).unwrap_or(event);
        match kind {
            "message_start" => {
                let text = |pointer: &str| {
                    value
                        .pointer(pointer)
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                };
                self.id = text("/message/id");
                self.model = text("/message/model");
                if let Some(usage) = value.pointer("/message/usage").filter(|u| !u.is_null()) {
                    self.usage = WireUsage::deserialize(usage)
                        .map_err(|e| invalid(PROVIDER, "the usage", e))?;
                }
            }
            "content_block_start" => {
                let block = value.get("content_block").unwrap_or(&Value::Null);
                let open = match str_of(block, "type") {
                    "text" => {
                        let text = str_of(block, "text").to_owned();
                        if !text.is_empty() {
                            deltas.push(Delta::Text(text.clone()));
                        }
                        Open::Text(text)
                    }
                    "thinking" => Open::Thinking(
                        str_of(block, "thinking").to_owned(),
                        str_of(block, "signature").to_owned(),
                    ),
                    "redacted_thinking" => Open::Redacted(str_of(block, "data").to_owned()),
                    "tool_use" => Open::ToolUse {
                        id: str_of(block, "id").to_owned(),
                        name: str_of(block, "name").to_owned(),
                        json: String::new(),
                        start: block.get("input").cloned().unwrap_or(Value::Null),
                    },
                    _ => Open::Other,
                };
                self.blocks.push((index_of(&value), open));
            }
            "content_block_delta" => {
                let delta = value.get("delta").unwrap_or(&Value::Null);
                let index = index_of(&value);
                let Some(block) = self.block(index) else {
                    return Err(invalid(
                        PROVIDER,
                        "the stream",
                        format!("a delta for block {index}, which never started"),
                    ));
                };
                match (str_of(delta, "type"), block) {
                    ("text_delta", Open::Text(text)) => {
                        let piece = str_of(delta, "text");
                        text.push_str(piece);
                        deltas.push(Delta::Text(piece.to_owned()));
                    }
                    ("thinking_delta", Open::Thinking(text, _)) => {
                        let piece = str_of(delta, "thinking");
                        text.push_str(piece);
                        deltas.push(Delta::Reasoning(piece.to_owned()));
                    }
                    ("signature_delta", Open::Thinking(_, signature)) => {
                        signature.push_str(str_of(delta, "signature"));
                    }
                    ("input_json_delta", Open::ToolUse { json, .. }) => {
                        json.push_str(str_of(delta, "partial_json"));
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let Some(block) = self.block(index_of(&value)) else {
                    return Ok(());
                };
                if !matches!(block, Open::ToolUse { .. }) {
                    return Ok(());
                }
                // The call's arguments are closed: as it will stand in the message.
                if let Open::ToolUse {
                    id,
                    name,
                    json,
                    start,
                } = std::mem::replace(block, Open::Other)
                {
                    if let Some(call) = tool_call(id, name, json, start) {
                        deltas.push(Delta::ToolCall(call.clone()));
                        *block = Open::Call(call);
                    }
                }
            }
            "message_delta" => {
                if let Some(reason) = value.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                // Cumulative counts: they replace those of `message_start` (which differ when
                // server tools ran).
                if let Some(usage) = value.get("usage") {
                    self.usage.update(usage);
                }
            }
            "message_stop" => self.done = true,
            "error" => return Err(stream_error(PROVIDER, &super::ERRORS, data, None)),
            _ => {}
        }
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(self: Box<Self>) -> Result<ModelResponse, Error> {
        if !self.done {
            return Err(truncated(PROVIDER));
        }
        let mut blocks = self.blocks;
        blocks.sort_by_key(|(index, _)| *index);
        let mut parts = Vec::with_capacity(blocks.len());
        for (_, block) in blocks {
            let part = match block {
                Open::Text(text) => WireBlock::Text { text },
                Open::Thinking(thinking, signature) => WireBlock::Thinking {
                    thinking,
                    signature,
                },
                Open::Redacted(data) => WireBlock::RedactedThinking { data },
                Open::ToolUse {
                    id,
                    name,
                    json,
                    start,
                } => {
                    parts.extend(tool_call(id, name, json, start).map(ContentPart::ToolCall));
                    continue;
                }
                Open::Call(call) => {
                    parts.push(ContentPart::ToolCall(call));
                    continue;
                }
                Open::Other => continue,
            };
            parts.extend(block_part(part));
        }
        let mut res = ModelResponse::from_parts(parts).with_usage(self.usage.into());
        res.finish_reason = finish_reason(self.stop_reason.as_deref());
        res.set_origin(self.id, self.model);
        Ok(res)
    }
}
