//! The response: a whole (unstreamed) answer, mapped to a `ModelResponse`.

use serde::Deserialize;
use serde_json::Value;
use tower_agent_core::{ContentPart, Error, FinishReason, ModelResponse, ToolCall, Usage};

use crate::wire::{invalid, nullable};

use super::{PROVIDER, REDACTED};

/// A whole (unstreamed) response body.
pub(super) fn decode(body: &[u8]) -> Result<ModelResponse, Error> {
    let response: WireResponse =
        serde_json::from_slice(body).map_err(|e| invalid(PROVIDER, "the response", e))?;
    let parts = response
        .content
        .into_iter()
        .filter_map(block_part)
        .collect();
    let mut res = ModelResponse::from_parts(parts).with_usage(response.usage.into());
    res.finish_reason = finish_reason(response.stop_reason.as_deref());
    res.set_origin(response.id, response.model);
    Ok(res)
}

#[derive(Deserialize)]
struct WireResponse {
    id: Option<String>,
    model: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    content: Vec<WireBlock>,
    stop_reason: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    usage: WireUsage,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum WireBlock {
    Text {
        #[serde(default, deserialize_with = "nullable")]
        text: String,
    },
    Thinking {
        #[serde(default, deserialize_with = "nullable")]
        thinking: String,
        #[serde(default, deserialize_with = "nullable")]
        signature: String,
    },
    RedactedThinking {
        #[serde(default, deserialize_with = "nullable")]
        data: String,
    },
    ToolUse {
        #[serde(default, deserialize_with = "nullable")]
        id: String,
        #[serde(default, deserialize_with = "nullable")]
        name: String,
        #[serde(default, deserialize_with = "nullable")]
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default, Clone, Copy)]
pub(super) struct WireUsage {
    #[serde(default, deserialize_with = "nullable")]
    input_tokens: u64,
    #[serde(default, deserialize_with = "nullable")]
    output_tokens: u64,
    #[serde(default, deserialize_with = "nullable")]
    cache_read_input_tokens: u64,
    #[serde(default, deserialize_with = "nullable")]
    cache_creation_input_tokens: u64,
}

impl WireUsage {
    /// Take the counts `usage` holds (the cumulative counts of a `message_delta`).
    pub(super) fn update(&mut self, usage: &Value) {
        let count = |key: &str| usage.get(key).and_then(Value::as_u64);
        for (key, field) in [
            ("input_tokens", &mut self.input_tokens),
            ("output_tokens", &mut self.output_tokens),
            ("cache_read_input_tokens", &mut self.cache_read_input_tokens),
            (
                "cache_creation_input_tokens",
                &mut self.cache_creation_input_tokens,
            ),
        ] {
            if let Some(n) = count(key) {
                *field = n;
            }
        }
    }
}

impl From<WireUsage> for Usage {
    fn from(u: WireUsage) -> Usage {
        let input = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;
        Usage::new(input, u.output_tokens)
            .with_cached(u.cache_read_input_tokens)
            .with_cache_writes(u.cache_creation_input_tokens)
    }
}

pub(super) fn block_part(block: WireBlock) -> Option<ContentPart> {
    match block {
        WireBlock::Text { text } if !text.is_empty() => Some(ContentPart::Text { text }),
        WireBlock::Thinking {
            thinking,
            signature,
        } => Some(ContentPart::Reasoning {
            text: thinking,
            signature: (!signature.is_empty()).then_some(signature),
        }),
        WireBlock::RedactedThinking { data } => Some(ContentPart::Reasoning {
            text: String::new(),
            signature: Some(format!("{REDACTED}{data}")),
        }),
        WireBlock::ToolUse { id, name, input } => {
            let arguments = match input {
                Value::Null => "{}".to_owned(),
                input => input.to_string(),
            };
            Some(ContentPart::ToolCall(ToolCall::raw(id, name, arguments)))
        }
        _ => None,
    }
}

pub(super) fn finish_reason(reason: Option<&str>) -> FinishReason {
    match reason {
        None | Some("end_turn" | "stop_sequence") => FinishReason::Stop,
        Some("tool_use") => FinishReason::ToolCalls,
        Some("max_tokens") => FinishReason::Length,
        Some("refusal") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_owned()),
    }
}
