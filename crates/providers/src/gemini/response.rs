//! The response: chunks, one for a whole answer or many in a stream, decoded into a
//! `ModelResponse` (and, streamed, into deltas as they arrive).

use serde::Deserialize;
use serde_json::Value;
use tower_agent_core::{
    ContentPart, Error, ErrorKind, FinishReason, ModelResponse, ToolCall, Usage,
};

use crate::classify::stream_error;
use crate::wire::{Delta, StreamDecoder, invalid, nullable, truncated};

use super::PROVIDER;

/// A whole (unstreamed) response body.
pub(super) fn decode(body: &[u8]) -> Result<ModelResponse, Error> {
    let chunk: Chunk =
        serde_json::from_slice(body).map_err(|e| invalid(PROVIDER, "the response", e))?;
    let mut decoder = Decoder::default();
    decoder.absorb(chunk, &mut Vec::new())?;
    Box::new(decoder).finish()
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Chunk {
    response_id: Option<String>,
    model_version: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    candidates: Vec<Candidate>,
    usage_metadata: Option<WireUsage>,
    prompt_feedback: Option<Value>,
    error: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    content: Option<WireContent>,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireContent {
    #[serde(default, deserialize_with = "nullable")]
    parts: Vec<WirePart>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct WirePart {
    text: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    thought: bool,
    thought_signature: Option<String>,
    function_call: Option<WireCall>,
}

#[derive(Deserialize)]
struct WireCall {
    #[serde(default, deserialize_with = "nullable")]
    id: String,
    #[serde(default, deserialize_with = "nullable")]
    name: String,
    #[serde(default, deserialize_with = "nullable")]
    args: Value,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct WireUsage {
    #[serde(default, deserialize_with = "nullable")]
    prompt_token_count: u64,
    #[serde(default, deserialize_with = "nullable")]
    candidates_token_count: u64,
    #[serde(default, deserialize_with = "nullable")]
    thoughts_token_count: u64,
    #[serde(default, deserialize_with = "nullable")]
    cached_content_token_count: u64,
}

impl From<WireUsage> for Usage {
    fn from(u: WireUsage) -> Usage {
        Usage::new(
            u.prompt_token_count,
            u.candidates_token_count + u.thoughts_token_count,
        )
        .with_cached(u.cached_content_token_count)
    }
}

pub(super) fn finish_reason(reason: &str, has_calls: bool) -> FinishReason {
    match reason {
        "STOP" if has_calls => FinishReason::ToolCalls,
        "STOP" => FinishReason::Stop,
        "MAX_TOKENS" => FinishReason::Length,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => {
            FinishReason::ContentFilter
        }
        other => FinishReason::Other(other.to_owned()),
    }
}

/// Accumulates chunks: a streamed answer is the same response in pieces.
#[derive(Default)]
pub(super) struct Decoder {
    parts: Vec<ContentPart>,
    usage: Option<WireUsage>,
    finish: Option<String>,
    blocked: Option<String>,
    calls: usize,
    /// The response's id and model version, as the chunks say.
    id: Option<String>,
    model: Option<String>,
}

impl Decoder {
    fn absorb(&mut self, chunk: Chunk, deltas: &mut Vec<Delta>) -> Result<(), Error> {
        if chunk.usage_metadata.is_some() {
            self.usage = chunk.usage_metadata;
        }
        if chunk.response_id.is_some() {
            self.id = chunk.response_id;
        }
        if chunk.model_version.is_some() {
            self.model = chunk.model_version;
        }
        if let Some(reason) = chunk
            .prompt_feedback
            .as_ref()
            .and_then(|f| f.get("blockReason"))
            .and_then(Value::as_str)
        {
            self.blocked = Some(reason.to_owned());
        }
        let Some(candidate) = chunk.candidates.into_iter().next() else {
            return Ok(());
        };
        for part in candidate.content.map(|c| c.parts).unwrap_or_default() {
            self.part(part, deltas);
        }
        if candidate.finish_reason.is_some() {
            self.finish = candidate.finish_reason;
        }
        Ok(())
    }

    fn part(&mut self, part: WirePart, deltas: &mut Vec<Delta>) {
        if part.thought {
            let text = part.text.unwrap_or_default();
            if !text.is_empty() {
                deltas.push(Delta::Reasoning(text.clone()));
            }
            // Consecutive pieces of one thought are one reasoning part.
            if let Some(ContentPart::Reasoning {
                text: last,
                signature,
            }) = self.parts.last_mut()
            {
                if signature.is_none() && !last.is_empty() {
                    last.push_str(&text);
                    *signature = part.thought_signature;
                    return;
                }
            }
            self.parts.push(ContentPart::Reasoning {
                text,
                signature: part.thought_signature,
            });
            return;
        }
        if let Some(signature) = part.thought_signature {
            self.parts.push(ContentPart::Reasoning {
                text: String::new(),
                signature: Some(signature),
            });
        }
        if let Some(call) = part.function_call {
            self.calls += 1;
            let arguments = match call.args {
                Value::Null => "{}".to_owned(),
                args => args.to_string(),
            };
            let call = ToolCall::raw(call.id, call.name, arguments);
            // A call comes whole in one part.
            deltas.push(Delta::ToolCall(call.clone()));
            self.parts.push(ContentPart::ToolCall(call));
        } else if let Some(text) = part.text.filter(|t| !t.is_empty()) {
            deltas.push(Delta::Text(text.clone()));
            match self.parts.last_mut() {
                Some(ContentPart::Text { text: last }) => last.push_str(&text),
                _ => self.parts.push(ContentPart::Text { text }),
            }
        }
    }
}

impl StreamDecoder for Decoder {
    fn feed(&mut self, _event: &str, data: &str, deltas: &mut Vec<Delta>) -> Result<(), Error> {
        if data.trim().is_empty() {
            return Ok(());
        }
        let chunk: Chunk =
            serde_json::from_str(data).map_err(|e| invalid(PROVIDER, "a stream chunk", e))?;
        if chunk.error.is_some() {
            return Err(stream_error(PROVIDER, &super::ERRORS, data, None));
        }
        self.absorb(chunk, deltas)
    }

    fn is_done(&self) -> bool {
        false
    }

    fn finish(self: Box<Self>) -> Result<ModelResponse, Error> {
        if let Some(reason) = self.blocked {
            return Err(Error::bad_request(format!(
                "{PROVIDER}: the prompt was blocked ({reason})"
            )));
        }
        let empty = !self
            .parts
            .iter()
            .any(|p| matches!(p, ContentPart::Text { .. } | ContentPart::ToolCall(_)));
        if self.finish.is_none() && !empty {
            return Err(truncated(PROVIDER));
        }
        if empty {
            return Err(Error::new(
                ErrorKind::EmptyResponse,
                format!(
                    "{PROVIDER}: the response has no content (finish reason {})",
                    self.finish.as_deref().unwrap_or("none")
                ),
            ));
        }
        let reason = finish_reason(self.finish.as_deref().unwrap_or("STOP"), self.calls > 0);
        let mut res = ModelResponse::from_parts(self.parts)
            .with_usage(self.usage.map(Into::into).unwrap_or_default());
        res.finish_reason = reason;
        res.set_origin(self.id, self.model);
        Ok(res)
    }
}
