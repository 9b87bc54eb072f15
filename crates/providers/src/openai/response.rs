//! The response: a whole (unstreamed) answer, mapped to a `ModelResponse`.

use serde::Deserialize;
use tower_agent_core::{
    ContentPart, Error, ErrorKind, FinishReason, ModelResponse, ToolCall, Usage,
};

use crate::wire::{invalid, nullable};

use super::PROVIDER;

/// A whole (unstreamed) response body.
pub(super) fn decode(body: &[u8]) -> Result<ModelResponse, Error> {
    let response: WireResponse =
        serde_json::from_slice(body).map_err(|e| invalid(PROVIDER, "the response", e))?;
    let usage = response.usage.map(Into::into).unwrap_or_default();
    let Some(choice) = response.choices.into_iter().next() else {
        return Err(Error::new(
            ErrorKind::EmptyResponse,
            format!("{PROVIDER}: the response has no choices"),
        ));
    };
    let message = choice.message;
    let reasoning = message.reasoning_content.or(message.reasoning);
    let calls = message
        .tool_calls
        .into_iter()
        .map(|c| ToolCall::raw(c.id, c.function.name, c.function.arguments));
    let mut res = response_of(
        reasoning,
        message.content,
        calls,
        choice.finish_reason.as_deref(),
        usage,
    );
    res.set_origin(response.id, response.model);
    Ok(res)
}

#[derive(Deserialize)]
struct WireResponse {
    id: Option<String>,
    model: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    choices: Vec<WireChoice>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    #[serde(default, deserialize_with = "nullable")]
    message: WireResponseMessage,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireResponseMessage {
    content: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    tool_calls: Vec<WireResponseCall>,
    reasoning_content: Option<String>,
    reasoning: Option<String>,
}

#[derive(Deserialize)]
struct WireResponseCall {
    #[serde(default, deserialize_with = "nullable")]
    id: String,
    #[serde(default, deserialize_with = "nullable")]
    function: WireResponseFunction,
}

#[derive(Deserialize, Default)]
struct WireResponseFunction {
    #[serde(default, deserialize_with = "nullable")]
    name: String,
    #[serde(default, deserialize_with = "nullable")]
    arguments: String,
}

#[derive(Deserialize, Default, Clone, Copy)]
pub(super) struct WireUsage {
    #[serde(default, deserialize_with = "nullable")]
    prompt_tokens: u64,
    #[serde(default, deserialize_with = "nullable")]
    completion_tokens: u64,
    prompt_tokens_details: Option<WireUsageDetails>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct WireUsageDetails {
    #[serde(default, deserialize_with = "nullable")]
    cached_tokens: u64,
}

impl From<WireUsage> for Usage {
    fn from(usage: WireUsage) -> Usage {
        Usage::new(usage.prompt_tokens, usage.completion_tokens)
            .with_cached(usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens))
    }
}

pub(super) fn finish_reason(reason: Option<&str>, has_calls: bool) -> FinishReason {
    match reason {
        Some("stop") | None if !has_calls => FinishReason::Stop,
        Some("tool_calls" | "function_call") | None => FinishReason::ToolCalls,
        Some("length") => FinishReason::Length,
        Some("content_filter") => FinishReason::ContentFilter,
        Some("stop") => FinishReason::ToolCalls,
        Some(other) => FinishReason::Other(other.to_owned()),
    }
}

pub(super) fn response_of(
    reasoning: Option<String>,
    text: Option<String>,
    calls: impl Iterator<Item = ToolCall>,
    reason: Option<&str>,
    usage: Usage,
) -> ModelResponse {
    let mut parts = Vec::new();
    if let Some(text) = reasoning.filter(|r| !r.is_empty()) {
        parts.push(ContentPart::Reasoning {
            text,
            signature: None,
        });
    }
    if let Some(text) = text.filter(|t| !t.is_empty()) {
        parts.push(ContentPart::Text { text });
    }
    parts.extend(calls.map(ContentPart::ToolCall));
    let has_calls = parts.iter().any(|p| matches!(p, ContentPart::ToolCall(_)));
    let mut response = ModelResponse::from_parts(parts).with_usage(usage);
    response.finish_reason = finish_reason(reason, has_calls);
    response
}
