//! The response: a whole (unstreamed) answer, mapped to a `ModelResponse`.

use serde::Deserialize;
use serde_json::Value;
use tower_agent_core::{ContentPart, Error, FinishReason, ModelResponse, ToolCall, Usage};

use crate::http::invalid;

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
    Ok(res)
}

#[derive(Deserialize)]
struct WireResponse {
    #[serde(default)]
    content: Vec<WireBlock>,
    stop_reason: Option<String>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum WireBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    RedactedThinking {
        #[serde(default)]
        data: String,
    },
    ToolUse {
        #[serde(default)]
        id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default, Clone, Copy)]
pub(super) struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    pub(super) output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: u64,
}

impl From<WireUsage> for Usage {
    fn from(u: WireUsage) -> Usage {
        let input = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;
        Usage::new(input, u.output_tokens).with_cached(u.cache_read_input_tokens)
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
