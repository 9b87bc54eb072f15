//! The stream: server-sent events decoded into deltas and a final `ModelResponse`.

use serde::Deserialize;
use serde_json::Value;
use tower_agent_core::{Error, ModelResponse, ToolCall};

use crate::classify::stream_error;
use crate::wire::{Delta, StreamDecoder, invalid, nullable, truncated};

use super::PROVIDER;
use super::response::{WireUsage, response_of};

#[derive(Default)]
pub(super) struct Decoder {
    text: String,
    reasoning: String,
    /// Calls by their stream index (none when the server sends none): id, name, argument
    /// fragments joined.
    calls: Vec<(Option<usize>, ToolCall)>,
    /// How many of `calls` were sent up as complete (a call is, once the next one starts or
    /// the choice finishes).
    closed: usize,
    finish: Option<String>,
    usage: Option<WireUsage>,
    done: bool,
    /// The response's id and model, as the first chunk that has them says.
    id: Option<String>,
    model: Option<String>,
}

#[derive(Deserialize)]
struct Chunk {
    id: Option<String>,
    model: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    choices: Vec<ChunkChoice>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default, deserialize_with = "nullable")]
    delta: ChunkDelta,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct ChunkDelta {
    content: Option<String>,
    reasoning_content: Option<String>,
    reasoning: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    tool_calls: Vec<ChunkCall>,
}

#[derive(Deserialize)]
struct ChunkCall {
    /// Absent from some servers (Gemini's OpenAI-compatible endpoint): then calls are told
    /// apart by their ids.
    index: Option<usize>,
    id: Option<String>,
    function: Option<ChunkFunction>,
}

#[derive(Deserialize)]
struct ChunkFunction {
    name: Option<String>,
    arguments: Option<String>,
}

impl Decoder {
    /// Send up the calls before `end` not yet sent: their arguments are closed.
    fn close_calls(&mut self, end: usize, deltas: &mut Vec<Delta>) {
        let closed = self.calls[self.closed..end].iter();
        deltas.extend(closed.map(|(_, call)| Delta::ToolCall(call.clone())));
        self.closed = end;
    }

    /// Whether a new call with `index`, at `at`, comes after every open call (by index, or
    /// without indexes): then those are complete. Servers send calls in index order; when one
    /// does not, its calls are sent up at the finish.
    fn after_open(&self, at: usize, index: Option<usize>) -> bool {
        let mut open = self.calls[self.closed..at].iter();
        open.all(|(open, _)| !matches!((open, index), (Some(open), Some(new)) if open >= &new))
    }

    /// Where the call a fragment belongs to is: by its index; without one, by its id (a new
    /// id is a new call); with neither, the call before.
    fn call_for(&mut self, fragment: &ChunkCall) -> usize {
        let id = fragment.id.as_deref().filter(|id| !id.is_empty());
        let found = match (fragment.index, id) {
            (Some(index), _) => self.calls.iter().position(|(i, _)| *i == Some(index)),
            (None, Some(id)) => self.calls.iter().position(|(_, call)| call.id == id),
            (None, None) => self.calls.len().checked_sub(1),
        };
        found.unwrap_or_else(|| {
            self.calls.push((fragment.index, ToolCall::raw("", "", "")));
            self.calls.len() - 1
        })
    }
}

impl StreamDecoder for Decoder {
    fn feed(&mut self, _event: &str, data: &str, deltas: &mut Vec<Delta>) -> Result<(), Error> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let chunk: Chunk =
            serde_json::from_str(data).map_err(|e| invalid(PROVIDER, "a stream chunk", e))?;
        if chunk.error.is_some() {
            return Err(stream_error(PROVIDER, &super::ERRORS, data, None));
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        if self.id.is_none() {
            self.id = chunk.id.filter(|id| !id.is_empty());
        }
        if self.model.is_none() {
            self.model = chunk.model.filter(|model| !model.is_empty());
        }
        for choice in chunk.choices {
            let delta = choice.delta;
            if let Some(text) = delta
                .reasoning_content
                .or(delta.reasoning)
                .filter(|t| !t.is_empty())
            {
                self.reasoning.push_str(&text);
                deltas.push(Delta::Reasoning(text));
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                self.text.push_str(&text);
                deltas.push(Delta::Text(text));
            }
            for fragment in delta.tool_calls {
                let new = self.calls.len();
                let at = self.call_for(&fragment);
                if at == new && self.after_open(at, fragment.index) {
                    self.close_calls(at, deltas);
                }
                let call = &mut self.calls[at].1;
                if let Some(id) = fragment.id.filter(|id| !id.is_empty()) {
                    call.id = id;
                }
                if let Some(function) = fragment.function {
                    if let Some(name) = function.name {
                        call.name.push_str(&name);
                    }
                    if let Some(arguments) = function.arguments {
                        call.arguments.push_str(&arguments);
                    }
                }
            }
            if choice.finish_reason.is_some() {
                // A call still open when the answer was cut off at its length limit is cut
                // too: it is never sent up as complete.
                if choice.finish_reason.as_deref() != Some("length") {
                    self.close_calls(self.calls.len(), deltas);
                }
                self.finish = choice.finish_reason;
            }
        }
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(self: Box<Self>) -> Result<ModelResponse, Error> {
        if !self.done && self.finish.is_none() {
            return Err(truncated(PROVIDER));
        }
        let mut calls = self.calls;
        calls.sort_by_key(|(index, _)| *index);
        let mut res = response_of(
            Some(self.reasoning),
            Some(self.text),
            calls.into_iter().map(|(_, call)| call),
            self.finish.as_deref(),
            self.usage.map(Into::into).unwrap_or_default(),
        );
        res.set_origin(self.id, self.model);
        Ok(res)
    }
}
